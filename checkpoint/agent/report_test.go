package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

func TestPodAnnotatorPatchesItsPod(t *testing.T) {
	var got struct {
		method, path, ctype, auth string
		body                      map[string]any
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path, got.ctype, got.auth = r.Method, r.URL.EscapedPath(), r.Header.Get("Content-Type"), r.Header.Get("Authorization")
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &got.body)
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("secret-token\n"), 0o600)
	p := &PodAnnotator{BaseURL: srv.URL, Namespace: "team-a", Name: "train-worker-0", TokenFile: tok, Client: srv.Client()}
	if err := p.ReportStep(context.Background(), 1200); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.AnnotationCheckpointStep: "1200"}}}
	if got.method != http.MethodPatch || got.path != "/api/v1/namespaces/team-a/pods/train-worker-0" ||
		got.ctype != "application/merge-patch+json" || got.auth != "Bearer secret-token" {
		t.Errorf("request %s %s (%s, %q)", got.method, got.path, got.ctype, got.auth)
	}
	if diff := cmp.Diff(want, got.body); diff != "" {
		t.Errorf("patch body (-want +got):\n%s", diff)
	}
}

func TestPodAnnotatorReportsForbidden(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"reason":"Forbidden"}`, http.StatusForbidden)
	}))
	defer srv.Close()
	p := &PodAnnotator{BaseURL: srv.URL, Namespace: "ns", Name: "p", Client: srv.Client()}
	err := p.ReportStep(context.Background(), 1)
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("ReportStep against a 403 = %v, want an error naming 403", err)
	}
}

func TestInClusterReporterNeedsTheEnvironment(t *testing.T) {
	t.Setenv(EnvPodName, "")
	if _, err := InClusterReporter(); err != ErrNotInCluster {
		t.Fatalf("InClusterReporter without POD_NAME = %v, want ErrNotInCluster", err)
	}
}

func TestParseAnnotations(t *testing.T) {
	// As the kubelet writes it: sorted keys, Go-quoted values.
	in := "gpupack.io/checkpoint=\"true\"\n" +
		v1alpha1.AnnotationCheckpointRequest + "=\"2026-11-30T05:00:00Z\"\n" +
		"kubectl.kubernetes.io/last-applied-configuration=\"{\\\"a\\\":\\\"b\\\\n\\\"}\"\n"
	got, err := ParseAnnotations(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"gpupack.io/checkpoint":                            "true",
		v1alpha1.AnnotationCheckpointRequest:               "2026-11-30T05:00:00Z",
		"kubectl.kubernetes.io/last-applied-configuration": "{\"a\":\"b\\n\"}",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseAnnotations (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"novalue\n", "k=unquoted\n", "=\"x\"\n"} {
		if _, err := ParseAnnotations(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseAnnotations(%q) accepted", bad)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]string{"SIGUSR1": "SIGUSR1", "usr2": "SIGUSR2", " SIGTERM ": "SIGTERM", "10": "SIGUSR1", "sigint": "SIGINT"} {
		s, err := ParseSignal(in)
		if err != nil || SignalName(s) != want {
			t.Errorf("ParseSignal(%q) = %v %v, want %s", in, SignalName(s), err, want)
		}
	}
	for _, bad := range []string{"KILL", "9", "19", "STOP", "0", "99", "USR3", ""} {
		if _, err := ParseSignal(bad); err == nil {
			t.Errorf("ParseSignal(%q) accepted", bad)
		}
	}
}

// Whatever the kubelet can write (key=%q per line), ParseAnnotations reads
// back exactly.
func FuzzParseAnnotations(f *testing.F) {
	f.Add("gpupack.io/checkpoint-request", "2026-11-30T05:00:00Z")
	f.Add("a", "line\nbreak \"quoted\" \x00 ünïcode")
	f.Fuzz(func(t *testing.T, k, v string) {
		if k == "" || strings.ContainsAny(k, "=\n\r") {
			return
		}
		in := fmt.Sprintf("other=%q\n%v=%q\n", "x", k, v)
		got, err := ParseAnnotations(strings.NewReader(in))
		if err != nil {
			t.Fatalf("ParseAnnotations(%q): %v", in, err)
		}
		if got[k] != v && k != "other" {
			t.Fatalf("value of %q = %q, want %q", k, got[k], v)
		}
	})
}

func FuzzParseReport(f *testing.F) {
	f.Add(`{"checkpointStep":9,"verifiedSteps":[9,8],"outcome":"Saved","exitCode":0}`)
	f.Add(`{"outcome":"Killed","exitCode":124}`)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseReport(s)
		if err != nil {
			return
		}
		switch r.Outcome {
		case OutcomeExited, OutcomeSaved, OutcomeTimedOut, OutcomeKilled:
		default:
			t.Fatalf("accepted outcome %q", r.Outcome)
		}
	})
}
