package mutatecli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the .golden files")

func run(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestMain_Golden(t *testing.T) {
	cases := []struct {
		file       string
		args       []string
		wantCode   int
		wantStderr []string
	}{
		{file: "pytorchjob.yaml", wantCode: ExitOK, wantStderr: []string{"no GPU model is known"}},
		{file: "pod.yaml", wantCode: ExitOK, wantStderr: []string{`removed LD_PRELOAD`, "v1 ConfigMap is not handled"}},
		{file: "pod.yaml", args: []string{"--config", "testdata/deny-env.config.yaml"}, wantCode: ExitDenied, wantStderr: []string{"denied: ", "sets LD_PRELOAD, which gpupack owns"}},
		{file: "too-big.yaml", wantCode: ExitDenied, wantStderr: []string{"denied: pod template: container \"c\" asks for 80896 MiB per GPU, more than the 71903 MiB"}},
		// resources: hami writes HAMi's resources (per GPU) and injects no hook,
		// but still strips the tenant's hook env.
		{file: "hami.yaml", args: []string{"--config", "testdata/hami.config.yaml"}, wantCode: ExitOK, wantStderr: []string{"no GPU model is known", `removed LD_PRELOAD`, `removed CUDA_DISABLE_CONTROL`}},
		{file: "too-big.yaml", args: []string{"--config", "testdata/hami.config.yaml"}, wantCode: ExitDenied, wantStderr: []string{"more than the 71903 MiB"}},
		// A tenant's placement, owned env and gpupack-named volumes go.
		{file: "tenant.yaml", wantCode: ExitOK, wantStderr: []string{"removed annotation gpupack.io/devices", `removed CUDA_DISABLE_CONTROL`, `"helper": removed NVIDIA_VISIBLE_DEVICES`, `removed volume "gpupack-cache"`}},
		{file: "init-gpu.yaml", wantCode: ExitDenied, wantStderr: []string{`sidecar container (restartPolicy: Always) "warm" asks for GPUs`}},
		{file: "privileged-sidecar.yaml", wantCode: ExitDenied, wantStderr: []string{`container "helper" adds capability SYS_ADMIN`}},
	}
	for _, tc := range cases {
		name := tc.file + strings.Join(tc.args, "")
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := run(t, "", append([]string{"-f", filepath.Join("testdata", tc.file)}, tc.args...)...)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.wantCode, stderr)
			}
			for _, w := range tc.wantStderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			if code != ExitOK {
				if stdout != "" {
					t.Errorf("denial printed an object:\n%s", stdout)
				}
				return
			}
			golden := filepath.Join("testdata", strings.TrimSuffix(tc.file, ".yaml")+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(stdout), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(string(want), stdout); d != "" {
				t.Errorf("output (-want +got):\n%s", d)
			}
			// Feeding the output back (same configuration) changes nothing and
			// warns about nothing but the pass-through kinds.
			code, again, stderr := run(t, stdout, append([]string{"-f", "-"}, tc.args...)...)
			if code != ExitOK || again != stdout {
				t.Errorf("second pass: exit %d, diff %s", code, cmp.Diff(stdout, again))
			}
			if strings.Contains(stderr, "removed") {
				t.Errorf("second pass warned: %s", stderr)
			}
		})
	}
}

func TestMain_PodOutput(t *testing.T) {
	code, stdout, stderr := run(t, "", "-f", "testdata/pod.yaml")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var p corev1.Pod
	if err := yaml.Unmarshal([]byte(strings.Split(stdout, "---\n")[0]), &p); err != nil {
		t.Fatal(err)
	}
	lim := p.Spec.Containers[0].Resources.Limits
	for k, want := range map[corev1.ResourceName]int64{v1alpha1.ResourceVGPU: 1, v1alpha1.ResourceGPUMemory: 8192, v1alpha1.ResourceGPUCores: 25} {
		if q := lim[k]; q.Value() != want {
			t.Errorf("%s = %s, want %d", k, q.String(), want)
		}
	}
	if _, ok := lim[v1alpha1.ResourceNvidiaGPU]; ok {
		t.Errorf("nvidia.com/gpu kept on a fractional request")
	}
}

// A Kueue pod group's pod shows the creator stamp the webhook writes:
// --user's name, or DefaultUser (review 14 F3).
func TestMain_PodGroupCreator(t *testing.T) {
	const doc = `apiVersion: v1
kind: Pod
metadata:
  name: p
  labels:
    kueue.x-k8s.io/queue-name: lq
    kueue.x-k8s.io/pod-group-name: g
  annotations:
    gpupack.io/created-by: somebody-else
spec:
  containers:
  - name: c
    image: i
    resources:
      limits:
        nvidia.com/gpu: 1
`
	for _, tc := range []struct {
		args []string
		want string
	}{{nil, DefaultUser}, {[]string{"--user", "alice"}, "alice"}} {
		code, stdout, stderr := run(t, doc, append([]string{"-f", "-"}, tc.args...)...)
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var p corev1.Pod
		if err := yaml.Unmarshal([]byte(stdout), &p); err != nil {
			t.Fatal(err)
		}
		if got := p.Annotations[v1alpha1.AnnotationCreatedBy]; got != tc.want {
			t.Errorf("%v: %s = %q, want %q", tc.args, v1alpha1.AnnotationCreatedBy, got, tc.want)
		}
	}
}

func TestMain_Usage(t *testing.T) {
	for _, args := range [][]string{nil, {"-f"}, {"-f", "testdata/none.yaml"}, {"-f", "testdata/pod.yaml", "extra"}, {"-f", "testdata/pod.yaml", "--config", "testdata/pod.yaml"}} {
		if code, _, _ := run(t, "", args...); code != ExitUsage {
			t.Errorf("Main(%q) = %d, want %d", args, code, ExitUsage)
		}
	}
	if code, _, stderr := run(t, "apiVersion: v1\nkind: Pod\nspec:\n  bogus: 1\n", "-f", "-"); code != ExitUsage || !strings.Contains(stderr, "bogus") {
		t.Errorf("unknown field: %d %s", code, stderr)
	}
}
