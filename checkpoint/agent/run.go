// Package agent is gpupack-ckpt, the in-pod supervisor that turns an
// eviction into "checkpoint, then stop":
//
//	request (SIGTERM to the agent, or gpupack.io/checkpoint-request in the
//	downward-API annotations file) at T0
//	→ checkpoint signal to the trainer's process group
//	→ wait until a new checkpoint verifies, the trainer exits, or
//	  T0 + checkpoint timeout
//	→ (new checkpoint: report its step; give the trainer ExitWait to exit)
//	→ SIGTERM to the group
//	→ SIGKILL to the group at T0 + grace − kill margin
//
// Every other signal the agent gets is forwarded to the group. The report
// (step, outcome) goes to the pod annotation gpupack.io/checkpoint-step and
// to the termination message. Deadlines are counted from the request, so a
// later graceful delete (whose grace starts later) is always met.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/checkpoint/manifest"
)

// forwarded are the signals passed on to the trainer's group as they are.
// SIGTERM is not among them: it is a checkpoint request.
var forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1,
	syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGCONT, syscall.SIGALRM,
}

type childExit struct {
	status syscall.WaitStatus
}

// Run supervises cfg.Command and returns the exit status.
func Run(cfg Config) int {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	r := &runner{cfg: cfg, ver: &manifest.Verifier{}}
	return r.run()
}

type runner struct {
	cfg  Config
	ver  *manifest.Verifier
	pgid int

	requested   bool
	requestAt   time.Time
	baseline    string // manifest ID of the newest verified checkpoint at the request
	savedStep   *int64
	termSent    bool
	killSent    bool
	exitWaitEnd time.Time
}

func (r *runner) logf(event string, kv ...any) {
	var b strings.Builder
	fmt.Fprintf(&b, "gpupack-ckpt: %s %s", time.Now().UTC().Format(time.RFC3339Nano), event)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	b.WriteByte('\n')
	io.WriteString(r.cfg.Log, b.String())
}

func (r *runner) run() int {
	// Subscribe before the child exists so no signal is lost in between.
	sigCh := make(chan os.Signal, 16)
	signal.Notify(sigCh, append([]os.Signal{syscall.SIGTERM}, forwarded...)...)
	defer signal.Stop(sigCh)

	path, err := exec.LookPath(r.cfg.Command[0])
	if err != nil {
		r.logf("start-failed", "command", r.cfg.Command[0], "error", fmt.Sprintf("%q", err.Error()))
		if errors.Is(err, os.ErrPermission) {
			return ExitNotExecutable
		}
		return ExitNotFound
	}
	proc, err := os.StartProcess(path, r.cfg.Command, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		r.logf("start-failed", "command", path, "error", fmt.Sprintf("%q", err.Error()))
		if errors.Is(err, os.ErrPermission) {
			return ExitNotExecutable
		}
		return ExitAgentError
	}
	r.pgid = proc.Pid
	r.logf("started", "pid", proc.Pid)
	exitCh := make(chan childExit, 1)
	go reap(proc.Pid, exitCh)

	poll := time.NewTicker(r.cfg.Poll)
	defer poll.Stop()
	// The annotation may already be there (a container restarted during a
	// preemption): that is a request too.
	r.checkAnnotation()

	for {
		var timer <-chan time.Time
		var t *time.Timer
		if d, ok := r.nextDeadline(); ok {
			t = time.NewTimer(time.Until(d))
			timer = t.C
		}
		select {
		case ex := <-exitCh:
			return r.finish(ex.status)
		case s := <-sigCh:
			if s == syscall.SIGTERM {
				r.request("SIGTERM")
			} else {
				r.signal(s.(syscall.Signal))
			}
		case <-poll.C:
			r.checkAnnotation()
			r.checkCheckpoint()
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		r.escalate(time.Now())
	}
}

// reap waits for the trainer. As PID 1 (the agent is often the container's
// entrypoint) it also reaps orphans the trainer leaves behind, which would
// otherwise stay zombies.
func reap(pid int, out chan<- childExit) {
	waitFor := pid
	if os.Getpid() == 1 {
		waitFor = -1
	}
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(waitFor, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: nothing left to wait for; report what we know.
			out <- childExit{status: ws}
			return
		}
		if got == pid {
			out <- childExit{status: ws}
			return
		}
	}
}

func (r *runner) signal(s syscall.Signal) {
	if err := syscall.Kill(-r.pgid, s); err != nil && !errors.Is(err, syscall.ESRCH) {
		r.logf("signal-failed", "signal", SignalName(s), "error", fmt.Sprintf("%q", err.Error()))
		return
	}
	r.logf("signal-sent", "signal", SignalName(s))
}

func (r *runner) request(source string) {
	if r.requested {
		return
	}
	r.requested = true
	r.requestAt = time.Now()
	if r.cfg.CheckpointDir != "" {
		// Unverified on purpose: hashing a large checkpoint here would eat
		// the grace period. A new checkpoint is one with another manifest.
		r.baseline, _ = manifest.NewestID(r.cfg.CheckpointDir)
	}
	r.logf("checkpoint-requested", "source", source, "timeout", r.cfg.CheckpointTimeout, "grace", r.cfg.Grace)
	if r.cfg.CheckpointTimeout >= r.cfg.Grace-r.cfg.KillMargin {
		r.logf("warning", "msg", fmt.Sprintf("%q", "checkpoint timeout does not fit in the grace period; the kill deadline comes first"))
	}
	r.signal(r.cfg.CheckpointSignal)
}

func (r *runner) checkAnnotation() {
	if r.requested || r.cfg.AnnotationsFile == "" {
		return
	}
	f, err := os.Open(r.cfg.AnnotationsFile)
	if err != nil {
		return // not mounted (yet): only SIGTERM requests
	}
	defer f.Close()
	ann, err := ParseAnnotations(f)
	if err != nil {
		// The kubelet swaps the file atomically, so this is a real error;
		// say it once per poll and keep going.
		r.logf("annotations-unreadable", "error", fmt.Sprintf("%q", err.Error()))
		return
	}
	if v := ann[v1alpha1.AnnotationCheckpointRequest]; v != "" {
		r.request(v1alpha1.AnnotationCheckpointRequest + "=" + v)
	}
}

// checkCheckpoint looks for a new verified checkpoint after a request.
func (r *runner) checkCheckpoint() {
	if !r.requested || r.savedStep != nil || r.cfg.CheckpointDir == "" {
		return
	}
	cp, ok, err := r.ver.Latest(r.cfg.CheckpointDir)
	if err != nil || !ok || cp.ID == r.baseline {
		return
	}
	step := cp.Manifest.Step
	r.savedStep = &step
	r.exitWaitEnd = time.Now().Add(r.cfg.ExitWait)
	r.logf("checkpoint-verified", "step", step, "dir", cp.Dir)
	if r.cfg.Reporter != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.cfg.Reporter.ReportStep(ctx, step); err != nil {
			r.logf("report-failed", "error", fmt.Sprintf("%q", err.Error()))
		} else {
			r.logf("step-reported", "step", step)
		}
	}
}

func (r *runner) termAt() time.Time {
	if r.savedStep != nil {
		return r.exitWaitEnd
	}
	return r.requestAt.Add(r.cfg.CheckpointTimeout)
}

func (r *runner) killAt() time.Time {
	return r.requestAt.Add(r.cfg.Grace - r.cfg.KillMargin)
}

func (r *runner) nextDeadline() (time.Time, bool) {
	switch {
	case !r.requested || r.killSent:
		return time.Time{}, false
	case !r.termSent:
		if t := r.termAt(); t.Before(r.killAt()) {
			return t, true
		}
	}
	return r.killAt(), true
}

func (r *runner) escalate(now time.Time) {
	if !r.requested {
		return
	}
	if !r.termSent && !now.Before(r.termAt()) {
		r.termSent = true
		if r.savedStep == nil {
			r.checkCheckpoint() // a save that finished just now still counts
		}
		r.signal(syscall.SIGTERM)
	}
	if !r.killSent && !now.Before(r.killAt()) {
		r.killSent = true
		r.signal(syscall.SIGKILL)
	}
}

func (r *runner) finish(ws syscall.WaitStatus) int {
	code := ws.ExitStatus()
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	if r.requested && r.savedStep == nil {
		r.checkCheckpoint() // saved and exited between two polls
	}
	rep := Report{ExitCode: code, CheckpointStep: r.savedStep}
	switch {
	case r.savedStep != nil:
		rep.Outcome = OutcomeSaved
	case !r.requested:
		rep.Outcome = OutcomeExited
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL && r.killSent:
		rep.Outcome = OutcomeKilled
	default:
		rep.Outcome = OutcomeTimedOut
	}
	if ws.Signaled() && ws.Signal() == syscall.SIGKILL && r.killSent {
		rep.ExitCode = ExitKilled
	}
	r.logf("trainer-exited", "status", code, "outcome", rep.Outcome, "exit", rep.ExitCode)
	// Write the report at once, then again with the other verified steps
	// (for the coordinator's "every rank has it" check) while the grace
	// period leaves time to hash them.
	r.writeReport(rep)
	if r.cfg.CheckpointDir != "" {
		steps := r.verifiedSteps(4)
		if len(steps) > 0 {
			rep.VerifiedSteps = steps
			r.writeReport(rep)
		}
	}
	return rep.ExitCode
}

// verifiedSteps lists up to limit verified steps, newest first, stopping
// early when a request's kill deadline has come.
func (r *runner) verifiedSteps(limit int) []int64 {
	steps, err := manifest.Steps(r.cfg.CheckpointDir)
	if err != nil {
		return nil
	}
	var out []int64
	for _, s := range steps {
		if len(out) == limit || (r.requested && !time.Now().Before(r.killAt())) {
			break
		}
		if _, err := r.ver.Verify(filepath.Join(r.cfg.CheckpointDir, manifest.StepDirName(s))); err == nil {
			out = append(out, s)
		}
	}
	return out
}

func (r *runner) writeReport(rep Report) {
	if r.cfg.TerminationLog == "" {
		return
	}
	b, _ := json.Marshal(rep)
	if err := os.WriteFile(r.cfg.TerminationLog, b, 0o644); err != nil {
		r.logf("termination-log-failed", "error", fmt.Sprintf("%q", err.Error()))
	}
}
