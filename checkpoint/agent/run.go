// Package agent is gpupack-ckpt, the in-pod supervisor that turns an
// eviction into "checkpoint, then stop". It is meant to be the container's
// PID 1 (or, when it is not, it makes itself a child subreaper), so every
// process of the container is below it:
//
//	request (SIGTERM to the agent, or gpupack.io/checkpoint-request in the
//	downward-API annotations file) at T0
//	→ checkpoint signal to every process of the container that has a
//	  handler for it (re-sent to processes that install one later); a
//	  launcher that does not handle it (torchrun, bash, a spawned DataLoader
//	  worker) is not killed by it
//	→ wait until a new gang-consistent checkpoint verifies (every rank's
//	  manifest, hashed in the background), or T0 + checkpoint timeout (the
//	  smaller of --checkpoint-timeout and the request's own bound)
//	→ (new checkpoint: report its step; give the processes ExitWait to exit)
//	→ SIGTERM to every process
//	→ SIGKILL to every process at T0 + grace − kill margin
//	→ exit once every descendant is gone: ExitPreempted after a checkpoint.
//
// Other signals the agent gets are forwarded to the command's process
// group. The agent reaps every process that ends up its child. The report
// (steps, outcome) goes to the pod annotation gpupack.io/checkpoint-step and
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
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/checkpoint/manifest"
	"github.com/gpupack/gpupack/preemption/policy"
)

// forwarded are the signals passed on to the command's process group as
// they are. SIGTERM is not among them: it is a checkpoint request.
var forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1,
	syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGCONT, syscall.SIGALRM,
}

// scanSteps is how many of the newest steps the background verifier keeps
// checked (and the report lists).
const scanSteps = 4

// procEvent is one reaped child, or (allGone) the end of all of them.
type procEvent struct {
	pid     int
	status  syscall.WaitStatus
	allGone bool
}

// Run supervises cfg.Command and returns the exit status.
func Run(cfg Config) int {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	r := &runner{cfg: cfg, ver: &manifest.Verifier{}, signalled: map[int]bool{}}
	return r.run()
}

type runner struct {
	cfg  Config
	ver  *manifest.Verifier
	pid1 bool
	self int
	pgid int

	mainDone   bool
	mainStatus syscall.WaitStatus

	requested   bool
	requestAt   time.Time
	termAtBound time.Time // T0 + effective checkpoint timeout
	baseline    map[string]bool
	signalled   map[int]bool // pids the checkpoint signal was sent to
	savedStep   *int64
	termSent    bool
	killSent    bool
	exitWaitEnd time.Time
	// drainAt: the command exited without a request but left processes;
	// they get SIGTERM at once and SIGKILL at drainAt.
	drainAt time.Time

	scans    []manifest.StepState
	reported chan error
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

	r.self = os.Getpid()
	r.pid1 = r.self == 1 && r.cfg.Init
	if !r.pid1 && r.cfg.Init {
		if err := becomeSubreaper(); err != nil {
			r.logf("subreaper-failed", "error", fmt.Sprintf("%q", err.Error()))
		}
	}

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
	r.logf("started", "pid", proc.Pid, "pid1", r.pid1)
	procCh := make(chan procEvent, 64)
	if r.cfg.Init {
		go reap(-1, procCh)
	} else {
		r.self = proc.Pid // signal the command's tree only
		go reap(proc.Pid, procCh)
	}

	// Checkpoints are verified in the background: hashing never holds up a
	// signal or a deadline.
	scanCtx, stopScan := context.WithCancel(context.Background())
	defer stopScan()
	scanCh := make(chan []manifest.StepState, 1)
	if r.cfg.CheckpointDir != "" {
		go r.scanLoop(scanCtx, scanCh)
	}

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
		case ev := <-procCh:
			if ev.allGone {
				if t != nil {
					t.Stop()
				}
				stopScan()
				return r.finish()
			}
			if ev.pid == proc.Pid {
				r.mainExited(ev.status)
			}
		case s := <-sigCh:
			if s == syscall.SIGTERM {
				r.request("SIGTERM", requestBound{})
			} else {
				r.forward(s.(syscall.Signal))
			}
		case st := <-scanCh:
			r.scans = st
			r.checkCheckpoint()
		case <-poll.C:
			r.checkAnnotation()
			r.redeliver()
			if r.killSent && !r.pid1 {
				r.signalAll(syscall.SIGKILL, true) // a fork that raced the first SIGKILL
			}
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		r.escalate(time.Now())
	}
}

// reap waits for every child of the agent (which, -1): the command and,
// as PID 1 or subreaper, every orphan below it. ECHILD means none is left.
// With which > 0 only that child is waited for.
func reap(which int, out chan<- procEvent) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(which, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			out <- procEvent{allGone: true}
			return
		}
		out <- procEvent{pid: pid, status: ws}
	}
}

func (r *runner) scanLoop(ctx context.Context, out chan []manifest.StepState) {
	for {
		st, err := r.ver.Scan(ctx, r.cfg.CheckpointDir, scanSteps)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			select {
			case <-out: // drop the stale result
			default:
			}
			out <- st
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.Poll):
		}
	}
}

func (r *runner) mainExited(ws syscall.WaitStatus) {
	r.mainDone, r.mainStatus = true, ws
	r.logf("command-exited", "status", statusCode(ws))
	if !r.requested && r.drainAt.IsZero() {
		// Without a request the command's end is the container's end; what
		// it left behind gets SIGTERM, then SIGKILL after ExitWait.
		r.drainAt = time.Now().Add(r.cfg.ExitWait)
		r.signalAll(syscall.SIGTERM, false)
	}
}

func statusCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// forward passes a signal to the command's process group.
func (r *runner) forward(s syscall.Signal) {
	if err := syscall.Kill(-r.pgid, s); err != nil && !errors.Is(err, syscall.ESRCH) {
		r.logf("signal-failed", "signal", SignalName(s), "error", fmt.Sprintf("%q", err.Error()))
		return
	}
	r.logf("signal-sent", "signal", SignalName(s), "to", "group")
}

// targets are the processes the agent signals: every process of the pid
// namespace as PID 1, else every descendant.
func (r *runner) targets() ([]procInfo, error) {
	ps, err := descendants(r.cfg.ProcDir, r.self, r.pid1)
	if !r.cfg.Init && !r.mainDone && err == nil {
		ps = append([]procInfo{{pid: r.pgid, pgrp: r.pgid}}, ps...)
	}
	return ps, err
}

// signalAll sends s to every process below the agent (and to the command's
// group, which covers a fork racing the /proc walk).
func (r *runner) signalAll(s syscall.Signal, quiet bool) {
	n := 0
	if r.pid1 {
		// kill(-1) as PID 1 reaches every process of the namespace but 1.
		if err := syscall.Kill(-1, s); err == nil {
			n = -1
		}
	} else {
		pids, err := r.targets()
		if err != nil {
			r.logf("proc-unreadable", "error", fmt.Sprintf("%q", err.Error()))
		}
		// The command's group in one call (no fork in it can slip past),
		// then every descendant outside it (setsid'd workers, orphans).
		if syscall.Kill(-r.pgid, s) == nil {
			n++
		}
		for _, p := range pids {
			if p.pgrp != r.pgid && syscall.Kill(p.pid, s) == nil {
				n++
			}
		}
	}
	if !quiet {
		r.logf("signal-sent", "signal", SignalName(s), "to", "all", "processes", n)
	}
}

// deliverCheckpoint sends the checkpoint signal to every process that has
// a handler for it and was not sent it yet.
func (r *runner) deliverCheckpoint() {
	pids, err := r.targets()
	if err != nil {
		// No /proc: fall back to the command's process group.
		r.logf("proc-unreadable", "error", fmt.Sprintf("%q", err.Error()))
		r.forward(r.cfg.CheckpointSignal)
		return
	}
	var sent, skipped []int
	for _, pi := range pids {
		p := pi.pid
		if r.signalled[p] {
			continue
		}
		ok, err := catches(r.cfg.ProcDir, p, r.cfg.CheckpointSignal)
		if err != nil || !ok {
			skipped = append(skipped, p)
			continue
		}
		if err := syscall.Kill(p, r.cfg.CheckpointSignal); err == nil {
			r.signalled[p] = true
			sent = append(sent, p)
		}
	}
	if len(sent) > 0 || len(r.signalled) == 0 {
		r.logf("signal-sent", "signal", SignalName(r.cfg.CheckpointSignal), "pids", joinInts(sent), "not-handling", joinInts(skipped))
	}
}

// redeliver reaches processes that installed their handler after the
// request (a worker still importing torch at T0).
func (r *runner) redeliver() {
	if r.requested && !r.termSent && r.savedStep == nil {
		r.deliverCheckpoint()
	}
}

func joinInts(v []int) string {
	if len(v) == 0 {
		return "-"
	}
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// requestBound is what a checkpoint request says about its own deadline.
type requestBound struct {
	Deadline time.Time     // absolute; zero: none
	Timeout  time.Duration // relative to when the agent sees it; 0: none
}

func (r *runner) request(source string, b requestBound) {
	now := time.Now()
	if !r.requested {
		r.requested = true
		r.requestAt = now
		r.termAtBound = now.Add(r.cfg.CheckpointTimeout)
		if r.cfg.CheckpointDir != "" {
			// Manifests only, unverified: hashing here would eat the grace
			// period. A new checkpoint has a manifest not seen now.
			r.baseline = manifest.ManifestIDs(r.cfg.CheckpointDir)
		}
		r.logf("checkpoint-requested", "source", source, "timeout", r.cfg.CheckpointTimeout, "grace", r.cfg.Grace)
		if r.cfg.CheckpointTimeout >= r.cfg.Grace-r.cfg.KillMargin {
			r.logf("warning", "msg", fmt.Sprintf("%q", "checkpoint timeout does not fit in the grace period; the kill deadline comes first"))
		}
		r.deliverCheckpoint()
	}
	// The request's own bound (cluster policy) only ever shortens the wait.
	bound := r.termAtBound
	if b.Timeout > 0 {
		bound = minTime(bound, now.Add(b.Timeout))
	}
	if !b.Deadline.IsZero() {
		bound = minTime(bound, b.Deadline)
	}
	if bound.Before(r.termAtBound) {
		r.termAtBound = bound
		r.logf("checkpoint-deadline", "source", "request", "timeout", bound.Sub(r.requestAt).Round(time.Millisecond))
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (r *runner) checkAnnotation() {
	if r.cfg.AnnotationsFile == "" || (r.requested && r.termSent) {
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
	v := ann[v1alpha1.AnnotationCheckpointRequest]
	if v == "" {
		return
	}
	b, err := ParseRequest(v)
	if err != nil {
		r.logf("request-unparsed", "error", fmt.Sprintf("%q", err.Error()))
	}
	// The coordinator and the eviction webhook write the cluster policy's
	// deadline next to the request (preemption/policy); like the request's
	// own bound it only ever shortens the wait.
	if d, ok := ann[policy.AnnotationCheckpointDeadline]; ok {
		if t, err := policy.ParseDeadline(d); err != nil {
			r.logf("request-unparsed", "error", fmt.Sprintf("%q", err.Error()))
		} else if b.Deadline.IsZero() || t.Before(b.Deadline) {
			b.Deadline = t
		}
	}
	src := v1alpha1.AnnotationCheckpointRequest
	if !r.requested {
		src += "=" + strconv.Quote(v)
	}
	r.request(src, b)
}

// ParseRequest reads the value of gpupack.io/checkpoint-request. Two forms:
//
//	2026-12-01T20:41:00Z                       (the time of the request; no bound)
//	{"requestedAt":"…","deadline":"2026-12-01T20:46:00Z","timeoutSeconds":300}
//
// In the JSON form, deadline (RFC 3339) and timeoutSeconds (counted from
// when the agent sees the request) are each optional; the agent waits for a
// checkpoint until the earliest of them and its own --checkpoint-timeout,
// so the request (cluster policy) can shorten the wait, never lengthen it.
// Unknown fields are ignored. Any non-empty value is a request; an error
// says only that its bound could not be read.
func ParseRequest(v string) (requestBound, error) {
	v = strings.TrimSpace(v)
	if !strings.HasPrefix(v, "{") {
		return requestBound{}, nil
	}
	var raw struct {
		Deadline       string   `json:"deadline"`
		TimeoutSeconds *float64 `json:"timeoutSeconds"`
	}
	if err := json.Unmarshal([]byte(v), &raw); err != nil {
		return requestBound{}, fmt.Errorf("checkpoint request %q: %w", v, err)
	}
	var b requestBound
	if raw.Deadline != "" {
		t, err := time.Parse(time.RFC3339Nano, raw.Deadline)
		if err != nil {
			return requestBound{}, fmt.Errorf("checkpoint request deadline %q is not RFC 3339", raw.Deadline)
		}
		b.Deadline = t
	}
	if raw.TimeoutSeconds != nil {
		s := *raw.TimeoutSeconds
		switch {
		case s <= 0:
			// "No time at all" is what the policy asked for: escalate at
			// once (a tiny positive bound, so it is still a bound).
			s = 0.001
		case s > 1<<31:
			s = 1 << 31 // no tighter than the agent's own timeout anyway
		}
		b.Timeout = time.Duration(s * float64(time.Second))
	}
	return b, nil
}

// checkCheckpoint looks, in the latest background scan, for a gang-
// consistent checkpoint that was not there at the request.
func (r *runner) checkCheckpoint() {
	if !r.requested || r.savedStep != nil || r.cfg.CheckpointDir == "" {
		return
	}
	for _, st := range r.scans {
		g, ok := st.Gang()
		if !ok || !r.isNew(g) {
			continue
		}
		step := g.Step
		r.savedStep = &step
		r.exitWaitEnd = time.Now().Add(r.cfg.ExitWait)
		r.logf("checkpoint-verified", "step", step, "ranks", g.WorldSize, "after", time.Since(r.requestAt).Round(time.Millisecond))
		if r.cfg.Reporter != nil {
			r.reported = make(chan error, 1)
			go func(ch chan<- error) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				ch <- r.cfg.Reporter.ReportStep(ctx, step)
			}(r.reported)
		}
		return
	}
}

func (r *runner) isNew(g manifest.Gang) bool {
	for _, id := range g.IDs() {
		if !r.baseline[id] {
			return true
		}
	}
	return false
}

func (r *runner) termAt() time.Time {
	if r.savedStep != nil {
		return minTime(r.exitWaitEnd, r.killAt())
	}
	return r.termAtBound
}

func (r *runner) killAt() time.Time {
	return r.requestAt.Add(r.cfg.Grace - r.cfg.KillMargin)
}

func (r *runner) nextDeadline() (time.Time, bool) {
	switch {
	case !r.requested:
		if !r.drainAt.IsZero() && !r.killSent {
			return r.drainAt, true
		}
		return time.Time{}, false
	case r.killSent:
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
		if !r.drainAt.IsZero() && !r.killSent && !now.Before(r.drainAt) {
			r.killSent = true
			r.signalAll(syscall.SIGKILL, false)
		}
		return
	}
	if !r.termSent && !now.Before(r.termAt()) {
		r.termSent = true
		r.signalAll(syscall.SIGTERM, false)
	}
	if !r.killSent && !now.Before(r.killAt()) {
		r.killSent = true
		r.signalAll(syscall.SIGKILL, false)
	}
}

// finish runs once every process below the agent is gone.
func (r *runner) finish() int {
	code := statusCode(r.mainStatus)
	killed := r.mainStatus.Signaled() && r.mainStatus.Signal() == syscall.SIGKILL && r.killSent
	// A last look, bounded: a save that finished between two scans counts,
	// and the report lists every rank's verified steps.
	var deadline time.Time
	if r.requested {
		deadline = r.killAt().Add(r.cfg.KillMargin / 2)
	} else {
		deadline = time.Now().Add(r.cfg.ExitWait)
	}
	if r.cfg.CheckpointDir != "" {
		// In a goroutine: a read that hangs (a dead NFS server, a FIFO)
		// ignores the context, and the agent must still exit on time.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		done := make(chan []manifest.StepState, 1)
		go func() {
			st, _ := r.ver.Scan(ctx, r.cfg.CheckpointDir, scanSteps)
			done <- st
		}()
		select {
		case st := <-done:
			if len(st) > 0 {
				r.scans = st
			}
		case <-ctx.Done():
			r.logf("verification-unfinished", "msg", `"reporting the steps verified so far"`)
		}
		cancel()
		r.checkCheckpoint()
	}
	rep := Report{ExitCode: code, CommandStatus: &code, CheckpointStep: r.savedStep}
	switch {
	case r.savedStep != nil:
		rep.Outcome = OutcomeSaved
		rep.ExitCode = ExitPreempted
	case !r.requested:
		rep.Outcome = OutcomeExited
	case killed:
		rep.Outcome = OutcomeKilled
		rep.ExitCode = ExitKilled
	default:
		rep.Outcome = OutcomeTimedOut
		if rep.ExitCode == 0 {
			// A preempted job is never Succeeded, checkpoint or not.
			rep.ExitCode = ExitPreemptedNoCheckpoint
		}
	}
	rep.VerifiedSteps, rep.WorldSize, rep.RankSteps = summarize(r.scans)
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	r.logf("exiting", "command-status", code, "outcome", rep.Outcome, "exit", rep.ExitCode,
		"verified-steps", fmt.Sprint(rep.VerifiedSteps),
		"agent-cpu", (time.Duration(ru.Utime.Nano()) + time.Duration(ru.Stime.Nano())).Round(time.Millisecond))
	if r.reported != nil {
		select {
		case err := <-r.reported:
			if err != nil {
				r.logf("report-failed", "error", fmt.Sprintf("%q", err.Error()))
			} else {
				r.logf("step-reported", "step", *r.savedStep)
			}
		case <-time.After(time.Until(deadline)):
			r.logf("report-failed", "error", `"annotation patch still running at the deadline"`)
		}
	}
	r.writeReport(rep)
	return rep.ExitCode
}

// summarize turns scans into the report's consistent steps, the world size
// and each rank's verified steps (newest first).
func summarize(scans []manifest.StepState) (consistent []int64, world int, ranks map[string][]int64) {
	ranks = map[string][]int64{}
	for _, st := range scans {
		if st.Consistent() {
			consistent = append(consistent, st.Step)
			world = max(world, st.WorldSize)
		}
		rs := make([]int, 0, len(st.Verified))
		for rk := range st.Verified {
			rs = append(rs, rk)
		}
		sort.Ints(rs)
		for _, rk := range rs {
			k := strconv.Itoa(rk)
			ranks[k] = append(ranks[k], st.Step)
		}
	}
	if len(ranks) == 0 {
		ranks = nil
	}
	return consistent, world, ranks
}

func (r *runner) writeReport(rep Report) {
	if r.cfg.TerminationLog == "" {
		return
	}
	b, _ := json.Marshal(rep)
	if len(b) > maxReportBytes {
		// The kubelet keeps 4096 bytes of a termination message: drop the
		// per-rank detail rather than the verdict.
		rep.RankSteps = nil
		rep.RankStepsTruncated = true
		b, _ = json.Marshal(rep)
	}
	if err := os.WriteFile(r.cfg.TerminationLog, b, 0o644); err != nil {
		r.logf("termination-log-failed", "error", fmt.Sprintf("%q", err.Error()))
	}
}

// maxReportBytes is the kubelet's termination message limit.
const maxReportBytes = 4096
