package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/policy"
)

// The request's bound (cluster policy, written by the coordinator) wins
// over a longer configured timeout; a longer bound does not lengthen it.
func TestRequestBoundShortensNeverLengthensTheWait(t *testing.T) {
	py := python(t)
	const configured = 8 * time.Second
	cases := map[string]struct {
		value    func(now time.Time) string
		wantTerm time.Duration
	}{
		"timeoutSeconds shorter": {func(time.Time) string { return `{"timeoutSeconds":1}` }, time.Second},
		"deadline shorter": {func(now time.Time) string {
			return `{"deadline":"` + now.Add(time.Second).UTC().Format(time.RFC3339Nano) + `"}`
		}, time.Second},
		"longer bound is ignored": {func(time.Time) string { return `{"timeoutSeconds":3600}` }, configured},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			ann, ev := filepath.Join(dir, "annotations"), filepath.Join(dir, "events")
			a := startAgent(t, []string{
				"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--checkpoint-timeout", configured.String(),
				"--grace", "12s", "--kill-margin", "1s", "--annotations-file", ann,
				"--termination-log", "", "--poll", "50ms",
			}, py, trainerPath(t), "--mode", "ignore", "--events", ev)
			a.waitReady(t)
			t0 := time.Now()
			tmp := ann + ".new"
			os.WriteFile(tmp, []byte(v1alpha1.AnnotationCheckpointRequest+"="+strconv.Quote(tc.value(t0))+"\n"), 0o644)
			os.Rename(tmp, ann)
			waitFor(t, func() bool { _, at := events(t, ev); return !at["SIGTERM"].IsZero() })
			_, at := events(t, ev)
			d := at["SIGTERM"].Sub(t0)
			t.Logf("SIGTERM at T0+%v", d.Round(time.Millisecond))
			if d < tc.wantTerm-100*time.Millisecond || d > tc.wantTerm+time.Second {
				t.Errorf("SIGTERM at T0+%v, want about T0+%v; log:\n%s", d, tc.wantTerm, a.stderr)
			}
			a.wait(t, 20*time.Second) // killed at T0 + grace - margin
		})
	}
}

// The coordinator writes the request as a plain time and the policy's
// deadline in gpupack.io/checkpoint-deadline beside it (preemption/policy):
// the agent must stop waiting at that deadline, not at its own timeout.
func TestCoordinatorDeadlineAnnotationBoundsTheWait(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	ann, ev := filepath.Join(dir, "annotations"), filepath.Join(dir, "events")
	a := startAgent(t, []string{
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--checkpoint-timeout", "8s",
		"--grace", "12s", "--kill-margin", "1s", "--annotations-file", ann,
		"--termination-log", "", "--poll", "50ms",
	}, py, trainerPath(t), "--mode", "ignore", "--events", ev)
	a.waitReady(t)
	t0 := time.Now()
	deadline := policy.FormatDeadline(t0.Add(2 * time.Second)) // rounded down: T0+1 s to T0+2 s
	tmp := ann + ".new"
	os.WriteFile(tmp, []byte(v1alpha1.AnnotationCheckpointRequest+"="+strconv.Quote(t0.UTC().Format(time.RFC3339))+"\n"+
		policy.AnnotationCheckpointDeadline+"="+strconv.Quote(deadline)+"\n"), 0o644)
	os.Rename(tmp, ann)
	waitFor(t, func() bool { _, at := events(t, ev); return !at["SIGTERM"].IsZero() })
	_, at := events(t, ev)
	d := at["SIGTERM"].Sub(t0)
	t.Logf("deadline %s, SIGTERM at T0+%v", deadline, d.Round(time.Millisecond))
	if d > 3*time.Second {
		t.Errorf("SIGTERM at T0+%v, want by the coordinator's deadline (T0+2 s at most); log:\n%s", d, a.stderr)
	}
	a.wait(t, 20*time.Second)
}

func TestParseRequest(t *testing.T) {
	for v, want := range map[string]requestBound{
		"2026-12-01T20:41:00Z":                       {},
		`{"timeoutSeconds":300}`:                     {Timeout: 300 * time.Second},
		`{"timeoutSeconds":0}`:                       {Timeout: time.Millisecond},
		`{"timeoutSeconds":-5}`:                      {Timeout: time.Millisecond},
		`{"deadline":"2026-12-01T20:46:00Z","x":1}`:  {Deadline: time.Date(2026, 12, 1, 20, 46, 0, 0, time.UTC)},
		`{"requestedAt":"2026-12-01T20:41:00Z"}`:     {},
		`{"deadline":"2026-12-01T20:46:00.5+01:00"}`: {Deadline: time.Date(2026, 12, 1, 19, 46, 0, 5e8, time.UTC)},
	} {
		got, err := ParseRequest(v)
		if err != nil || !got.Deadline.Equal(want.Deadline) || got.Timeout != want.Timeout {
			t.Errorf("ParseRequest(%s) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	for _, bad := range []string{`{"deadline":"tomorrow"}`, `{"timeoutSeconds":"5"}`, `{`} {
		if _, err := ParseRequest(bad); err == nil {
			t.Errorf("ParseRequest(%s) accepted", bad)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{"2026-12-01T20:41:00Z", `{"timeoutSeconds":300}`, `{"deadline":"2026-12-01T20:46:00Z"}`, `{"timeoutSeconds":1e308}`, `{}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		b, err := ParseRequest(v)
		if err != nil {
			return
		}
		if b.Timeout < 0 {
			t.Fatalf("ParseRequest(%q): negative timeout %v", v, b.Timeout)
		}
	})
}
