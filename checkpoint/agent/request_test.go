package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// The policy deadline must bound the kill too, not only the wait: a trainer
// that ignores SIGTERM was SIGKILLed at T0 + grace − margin (+58 s against
// a 3 s policy in the review, /tmp/revA2).
func TestPolicyDeadlineBoundsTheKill(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	ann, ev := filepath.Join(dir, "annotations"), filepath.Join(dir, "events")
	a := startAgent(t, []string{
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--checkpoint-timeout", "20s",
		"--grace", "60s", "--kill-margin", "2s", "--policy-kill-margin", "1s", "--annotations-file", ann,
		"--termination-log", "", "--poll", "50ms",
	}, py, trainerPath(t), "--mode", "ignore", "--events", ev)
	a.waitReady(t)
	t0 := time.Now()
	deadline := policy.FormatDeadline(t0.Add(2 * time.Second))
	tmp := ann + ".new"
	os.WriteFile(tmp, []byte(v1alpha1.AnnotationCheckpointRequest+"="+strconv.Quote(t0.UTC().Format(time.RFC3339))+"\n"+
		policy.AnnotationCheckpointDeadline+"="+strconv.Quote(deadline)+"\n"), 0o644)
	os.Rename(tmp, ann)
	a.wait(t, 30*time.Second) // without the bound: SIGKILL at T0+58 s
	d := a.exitAt.Sub(t0)
	t.Logf("deadline %s, agent exited %d at T0+%v", deadline, a.code, d.Round(time.Millisecond))
	if d > 10*time.Second {
		t.Errorf("agent exited at T0+%v, want the SIGKILL by the policy deadline + 1 s (T0+3 s); log:\n%s", d, a.stderr)
	}
	if a.code != ExitKilled {
		t.Errorf("exit %d, want %d (killed without a checkpoint); log:\n%s", a.code, ExitKilled, a.stderr)
	}
}

func TestParseRequest(t *testing.T) {
	for v, want := range map[string]requestBound{
		"2026-12-01T20:41:00Z":                       {RequestedAt: time.Date(2026, 12, 1, 20, 41, 0, 0, time.UTC)},
		"not a time":                                 {},
		`{"timeoutSeconds":300}`:                     {Timeout: 300 * time.Second},
		`{"timeoutSeconds":0}`:                       {Timeout: time.Millisecond},
		`{"timeoutSeconds":-5}`:                      {Timeout: time.Millisecond},
		`{"deadline":"2026-12-01T20:46:00Z","x":1}`:  {Deadline: time.Date(2026, 12, 1, 20, 46, 0, 0, time.UTC)},
		`{"requestedAt":"2026-12-01T20:41:00Z"}`:     {RequestedAt: time.Date(2026, 12, 1, 20, 41, 0, 0, time.UTC)},
		`{"requestedAt":"soon","timeoutSeconds":1}`:  {Timeout: time.Second},
		`{"deadline":"2026-12-01T20:46:00.5+01:00"}`: {Deadline: time.Date(2026, 12, 1, 19, 46, 0, 5e8, time.UTC)},
	} {
		got, err := ParseRequest(v)
		if err != nil || !got.Deadline.Equal(want.Deadline) || got.Timeout != want.Timeout || !got.RequestedAt.Equal(want.RequestedAt) {
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

// The policy deadline and the request time are the coordinator's clock;
// the agent counts the policy's duration from when it saw the request and
// waits no longer than the deadline + the tolerated skew on its own clock.
func TestClockSkewBound(t *testing.T) {
	seen := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC) // this node's clock when the request appeared
	const skew = 2 * time.Second
	for name, tc := range map[string]struct {
		requestedAt, deadline time.Time // the coordinator's clock
		want                  time.Time
	}{
		"clocks agree, delivered at once": {seen, seen.Add(5 * time.Minute), seen.Add(5 * time.Minute)},
		"node clock behind by 10 min: the duration, not the later-looking deadline": {
			seen.Add(10 * time.Minute), seen.Add(15 * time.Minute), seen.Add(5 * time.Minute)},
		"node clock ahead by 1 s (within the tolerance): the whole duration": {
			seen.Add(-time.Second), seen.Add(5*time.Minute - time.Second), seen.Add(5 * time.Minute)},
		"node clock ahead by 10 s: cut short by 10 s - tolerance": {
			seen.Add(-10 * time.Second), seen.Add(5*time.Minute - 10*time.Second), seen.Add(5*time.Minute - 8*time.Second)},
		"request delivered 30 s late: no more than tolerance past the deadline": {
			seen.Add(-30 * time.Second), seen.Add(5*time.Minute - 30*time.Second), seen.Add(5*time.Minute - 28*time.Second)},
		"deadline before the request: already past (no time at all)": {seen, seen.Add(-time.Minute), seen.Add(-time.Minute + skew)},
		"request time unknown: the deadline alone":                   {time.Time{}, seen.Add(time.Hour), seen.Add(time.Hour)},
	} {
		if got := ClockSkewBound(seen, tc.requestedAt, tc.deadline, skew); !got.Equal(tc.want) {
			t.Errorf("%s: ClockSkewBound = %v, want %v (seen + %v)", name, got, tc.want, tc.want.Sub(seen))
		}
	}
}

// This node's clock is 60 s behind the coordinator's: the request time and
// the policy deadline (2 s later) both look a minute away. The agent must
// stop waiting ~2 s after it saw the request, not at its own 8 s timeout
// (nor, with a longer one, a minute later), and kill by that + the policy
// kill margin.
func TestPolicyDeadlineOnANodeClockBehindTheCoordinators(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	ann, ev := filepath.Join(dir, "annotations"), filepath.Join(dir, "events")
	a := startAgent(t, []string{
		"--checkpoint-dir", filepath.Join(dir, "ckpt"), "--checkpoint-timeout", "8s",
		"--grace", "12s", "--kill-margin", "1s", "--policy-kill-margin", "1s", "--annotations-file", ann,
		"--termination-log", "", "--poll", "50ms",
	}, py, trainerPath(t), "--mode", "ignore", "--events", ev)
	a.waitReady(t)
	t0 := time.Now()
	coord := t0.Add(time.Minute) // the coordinator's clock now
	tmp := ann + ".new"
	os.WriteFile(tmp, []byte(v1alpha1.AnnotationCheckpointRequest+"="+strconv.Quote(coord.UTC().Format(time.RFC3339Nano))+"\n"+
		policy.AnnotationCheckpointDeadline+"="+strconv.Quote(policy.FormatDeadline(coord.Add(2*time.Second)))+"\n"), 0o644)
	os.Rename(tmp, ann)
	waitFor(t, func() bool { _, at := events(t, ev); return !at["SIGTERM"].IsZero() })
	_, at := events(t, ev)
	d := at["SIGTERM"].Sub(t0)
	t.Logf("SIGTERM at T0+%v", d.Round(time.Millisecond))
	if d > 3500*time.Millisecond {
		t.Errorf("SIGTERM at T0+%v, want by T0+2 s (the policy's 2 s from the request, whatever this node's clock says); log:\n%s", d, a.stderr)
	}
	a.wait(t, 20*time.Second)
	if k := a.exitAt.Sub(t0); k > 5*time.Second {
		t.Errorf("agent exited at T0+%v, want the kill by T0+2 s + 1 s policy kill margin; log:\n%s", k, a.stderr)
	}
	if !strings.Contains(a.stderr.String(), "clock-skew") {
		t.Errorf("no clock-skew line in the log:\n%s", a.stderr)
	}
}
