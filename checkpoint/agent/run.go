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
//	→ (new checkpoint: report its step; give the processes ExitWait to exit;
//	  tiered: saved once this pod's ranks verify in the local directory,
//	  reported once uploaded to the shared one)
//	→ SIGTERM to the ranks (processes handling the checkpoint signal) and
//	  to every process neither above nor below a live rank; the launchers
//	  and DataLoader workers of a live rank get it once that rank is gone
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
	r := &runner{cfg: cfg, ver: &manifest.Verifier{JobID: jobID()}, signalled: map[int]bool{}, termed: map[int]bool{},
		spared: map[int]bool{}, freedAt: map[int]time.Time{}}
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
	mainExitAt time.Time

	requested bool
	requestAt time.Time
	// annRequest, annSeenAt: the request annotation's value and when this
	// agent first saw it (the start of a policy deadline's duration).
	annRequest string
	annSeenAt  time.Time
	// policyKillAt: the cluster policy's deadline + PolicyKillMargin (zero:
	// none); killAt is the earlier of it and T0 + grace − margin.
	policyKillAt time.Time
	termAtBound  time.Time // T0 + effective checkpoint timeout
	baseline     map[string]bool
	signalled    map[int]bool // pids the checkpoint signal was sent to
	termed       map[int]bool // pids the SIGTERM step reached
	spared       map[int]bool // pids the last SIGTERM step spared
	freedAt      map[int]time.Time
	// savedLocal: the trainer's checkpoint for the request verified (in
	// the local directory of a tiered checkpoint, else the shared one);
	// savedStep: that step is in the shared directory, so it is reported.
	savedLocal    *int64
	savedLocalIDs []string
	savedStep     *int64
	termSent      bool
	killSent      bool
	exitWaitEnd   time.Time
	// drainAt: the command exited without a request but left processes;
	// they get SIGTERM at once and SIGKILL at drainAt.
	drainAt time.Time

	scans      []manifest.StepState
	localScans []manifest.StepState
	upload     uploadState
	uploadCh   chan uploadState
	reported   chan error
}

// uploadState is what the background uploader has done (tiered checkpoints).
type uploadState struct {
	uploaded  map[string]bool // IDs of local rank manifests now in the shared directory
	pending   int             // verified local rank checkpoints not uploaded at the end of the last pass
	passDone  bool            // at least one whole pass finished
	passStart time.Time       // when the last finished pass began
}

func (r *runner) tiered() bool { return r.cfg.LocalCheckpointDir != "" }

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

	if r.tiered() {
		// Whatever an earlier run on this node saved locally and did not
		// upload goes to the shared directory before the trainer looks there.
		r.uploadAtStart()
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
	localScanCh := make(chan []manifest.StepState, 1)
	if r.cfg.CheckpointDir != "" {
		go r.scanLoop(scanCtx, r.cfg.CheckpointDir, scanCh)
	}
	uploadCtx, stopUpload := context.WithCancel(context.Background())
	defer stopUpload()
	r.uploadCh = make(chan uploadState, 1)
	if r.tiered() {
		go r.scanLoop(scanCtx, r.cfg.LocalCheckpointDir, localScanCh)
		go r.uploadLoop(uploadCtx, r.uploadCh)
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
		case st := <-localScanCh:
			r.localScans = st
			r.checkCheckpoint()
		case up := <-r.uploadCh:
			r.upload = up
			r.checkUploaded()
		case <-poll.C:
			r.checkAnnotation()
			r.redeliver()
			if r.requested && r.termSent && !r.killSent {
				r.terminate(true) // processes no live rank spares any more
			}
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

func (r *runner) scanLoop(ctx context.Context, dir string, out chan []manifest.StepState) {
	for {
		st, err := r.ver.Scan(ctx, dir, scanSteps)
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
	r.mainDone, r.mainStatus, r.mainExitAt = true, ws, time.Now()
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

// terminate is the SIGTERM step of a request. The ranks (processes that
// handle the checkpoint signal) get SIGTERM; while a rank lives, the
// processes above it (torchrun, which forwards SIGTERM to its workers and
// SIGKILLs them 30 s later; a wrapper shell) and below it (its DataLoader
// workers: killed, they make the rank's DataLoader raise in the middle of
// a save) are spared; every other process gets it. Called again at every
// poll, it reaches the processes a rank no longer spares (its workers
// after it exited, torchrun once its ranks are gone), each ExitWait after
// it stopped being spared, so a launcher whose ranks all left can exit on
// its own first (torchrun notices within its monitor interval and exits 0).
// SIGKILL at the kill deadline reaches everything.
func (r *runner) terminate(again bool) {
	ps, err := r.targets()
	if err != nil {
		if !again {
			r.logf("proc-unreadable", "error", fmt.Sprintf("%q", err.Error()))
			r.signalAll(syscall.SIGTERM, false)
		}
		return
	}
	ranks := map[int]bool{}
	for _, p := range ps {
		if r.signalled[p.pid] {
			ranks[p.pid] = true
		} else if ok, err := catches(r.cfg.ProcDir, p.pid, r.cfg.CheckpointSignal); err == nil && ok {
			ranks[p.pid] = true
		}
	}
	var sent, spared []int
	now := time.Now()
	targets := termTargets(ps, ranks)
	if r.savedLocal != nil {
		targets = launchersInstead(ps, ranks, targets)
	}
	isTarget := map[int]bool{}
	for _, pid := range targets {
		isTarget[pid] = true
		if r.termed[pid] {
			continue
		}
		if r.spared[pid] {
			if r.freedAt[pid].IsZero() {
				r.freedAt[pid] = now
			}
			if now.Sub(r.freedAt[pid]) < r.cfg.ExitWait {
				continue
			}
		}
		if err := syscall.Kill(pid, syscall.SIGTERM); err == nil {
			r.termed[pid] = true
			sent = append(sent, pid)
		}
	}
	for _, p := range ps {
		if !r.termed[p.pid] {
			spared = append(spared, p.pid)
		}
		if !isTarget[p.pid] {
			r.spared[p.pid] = true
		}
	}
	if !again || len(sent) > 0 {
		r.logf("signal-sent", "signal", "SIGTERM", "pids", joinInts(sent), "ranks", joinInts(sortedKeys(ranks)), "spared", joinInts(spared))
	}
}

// launchersInstead is the SIGTERM step after the request's checkpoint
// verified: a rank whose parent is a launcher (a process of the container
// that is not a rank: torchrun) is left to it, and the launcher gets the
// SIGTERM instead. torchrun restarts workers that die of a signal
// (--max_restarts), and a rank still exiting after its save (the
// interpreter's shutdown has reset the helper's handler; torch 1.13 lingers
// there for seconds) dies of SIGTERM, so SIGTERM to the ranks started a new
// worker group into a finished job, again at each poll; SIGTERM to torchrun
// itself stops its workers and ends it. A rank whose launcher is gone
// (reparented to the agent) is a target again, and SIGKILL at the kill
// deadline reaches everything.
func launchersInstead(ps []procInfo, ranks map[int]bool, targets []int) []int {
	byPid := make(map[int]procInfo, len(ps))
	for _, p := range ps {
		byPid[p.pid] = p
	}
	set := map[int]bool{}
	for _, pid := range targets {
		if ranks[pid] {
			if l, ok := byPid[byPid[pid].ppid]; ok && !ranks[l.pid] {
				set[l.pid] = true
				continue
			}
		}
		set[pid] = true
	}
	return sortedKeys(set)
}

// termTargets are the processes of ps the SIGTERM step may signal now:
// every rank, and every process that is neither an ancestor nor a
// descendant of a live rank.
func termTargets(ps []procInfo, ranks map[int]bool) []int {
	byPid := make(map[int]procInfo, len(ps))
	for _, p := range ps {
		byPid[p.pid] = p
	}
	spared := map[int]bool{}
	for rank := range ranks {
		if _, live := byPid[rank]; !live {
			continue
		}
		// Ancestors: the launcher chain up to the agent.
		seen := map[int]bool{rank: true}
		for p := byPid[rank].ppid; !seen[p]; p = byPid[p].ppid {
			seen[p] = true
			if _, ok := byPid[p]; !ok {
				break
			}
			spared[p] = true
		}
	}
	children := map[int][]int{}
	for _, p := range ps {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	for rank := range ranks {
		queue := append([]int(nil), children[rank]...)
		for len(queue) > 0 {
			c := queue[0]
			queue = queue[1:]
			if spared[c] || ranks[c] {
				continue
			}
			spared[c] = true
			queue = append(queue, children[c]...)
		}
	}
	var out []int
	for _, p := range ps {
		if ranks[p.pid] || !spared[p.pid] {
			out = append(out, p.pid)
		}
	}
	sort.Ints(out)
	return out
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
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
	if r.requested && !r.termSent && r.savedLocal == nil {
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
	// RequestedAt: when the coordinator asked, by its clock (the plain
	// form's time, the JSON form's requestedAt); zero: unknown.
	RequestedAt time.Time
}

// ClockSkewBound is when a wait that a cluster-policy deadline bounds
// ends, by this node's clock. deadline and requestedAt come from the
// coordinator's clock, seen is when this agent first saw the request: the
// wait lasts the policy's duration (deadline − requestedAt) from seen, and
// never past deadline + maxSkew on the node's clock. So a node clock
// behind the coordinator's (the deadline looks later than it is) no longer
// holds the preemptor past the policy by the skew: the overshoot is the
// request's delivery delay (kubelet's downward-API refresh), at most
// maxSkew; a node clock ahead by up to maxSkew does not cut the
// checkpoint short, one ahead by more cuts it short by the rest (skew
// and delivery delay cannot be told apart here). Without requestedAt the
// deadline alone bounds it.
func ClockSkewBound(seen, requestedAt, deadline time.Time, maxSkew time.Duration) time.Time {
	if requestedAt.IsZero() {
		return deadline
	}
	budget := max(deadline.Sub(requestedAt), 0)
	return minTime(seen.Add(budget), deadline.Add(maxSkew))
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
			if r.tiered() {
				for id := range manifest.ManifestIDs(r.cfg.LocalCheckpointDir) {
					r.baseline[id] = true
				}
			}
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
	if v != r.annRequest {
		r.annRequest, r.annSeenAt = v, time.Now()
		if !b.RequestedAt.IsZero() {
			if lag := r.annSeenAt.Sub(b.RequestedAt); lag < -r.cfg.MaxClockSkew || lag > time.Minute {
				r.logf("clock-skew", "requested-at", b.RequestedAt.UTC().Format(time.RFC3339Nano), "seen-after", lag.Round(time.Millisecond),
					"msg", fmt.Sprintf("%q", "this node's clock and the coordinator's disagree (or the request came late): policy deadlines count from when the request was seen"))
			}
		}
	}
	if !b.Deadline.IsZero() {
		b.Deadline = ClockSkewBound(r.annSeenAt, b.RequestedAt, b.Deadline, r.cfg.MaxClockSkew)
	}
	// The coordinator and the eviction webhook write the cluster policy's
	// deadline next to the request (preemption/policy); like the request's
	// own bound it only ever shortens the wait.
	if d, ok := ann[policy.AnnotationCheckpointDeadline]; ok {
		if t, err := policy.ParseDeadline(d); err != nil {
			r.logf("request-unparsed", "error", fmt.Sprintf("%q", err.Error()))
		} else {
			t = ClockSkewBound(r.annSeenAt, b.RequestedAt, t, r.cfg.MaxClockSkew)
			if b.Deadline.IsZero() || t.Before(b.Deadline) {
				b.Deadline = t
			}
			// Not only the wait: the kill too. Without this a trainer that
			// ignores SIGTERM kept the node until T0 + grace − margin,
			// long past a policy deadline of a few seconds.
			if k := t.Add(r.cfg.PolicyKillMargin); r.policyKillAt.IsZero() || k.Before(r.policyKillAt) {
				r.policyKillAt = k
				r.logf("kill-deadline", "source", policy.AnnotationCheckpointDeadline, "at", k.UTC().Format(time.RFC3339Nano))
			}
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
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return requestBound{}, nil // still a request, of unknown time
		}
		return requestBound{RequestedAt: t}, nil
	}
	var raw struct {
		RequestedAt    string   `json:"requestedAt"`
		Deadline       string   `json:"deadline"`
		TimeoutSeconds *float64 `json:"timeoutSeconds"`
	}
	if err := json.Unmarshal([]byte(v), &raw); err != nil {
		return requestBound{}, fmt.Errorf("checkpoint request %q: %w", v, err)
	}
	var b requestBound
	if t, err := time.Parse(time.RFC3339Nano, raw.RequestedAt); err == nil {
		b.RequestedAt = t // else unknown: the deadline alone bounds the wait
	}
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
// consistent checkpoint that was not there at the request (tiered: for a
// step whose ranks of this pod are complete in the local directory).
func (r *runner) checkCheckpoint() {
	if !r.requested || r.savedLocal != nil || r.cfg.CheckpointDir == "" {
		return
	}
	scans := r.scans
	if r.tiered() {
		scans = r.localScans
	}
	for _, st := range scans {
		var ids []string
		ranks := 0
		if r.tiered() {
			if !st.LocalComplete() {
				continue
			}
			for _, cp := range st.Verified {
				ids = append(ids, cp.ID)
			}
			ranks = len(st.Verified)
		} else {
			g, ok := st.Gang()
			if !ok {
				continue
			}
			ids, ranks = g.IDs(), g.WorldSize
		}
		if !r.isNew(ids) {
			continue
		}
		step := st.Step
		r.savedLocal, r.savedLocalIDs = &step, ids
		r.exitWaitEnd = time.Now().Add(r.cfg.ExitWait)
		where := "shared"
		if r.tiered() {
			where = "local"
		}
		r.logf("checkpoint-verified", "step", step, "ranks", ranks, "dir", where, "after", time.Since(r.requestAt).Round(time.Millisecond))
		r.checkUploaded()
		return
	}
}

// supersede, after the command exited and the final scan, moves the
// saved step to the newest gang-consistent step of that scan that was not
// there at the request, when it is newer than the one seen first (shared
// directory only: tiered, a step counts once uploaded). A periodic save
// that was committing when the request came is the first new step the
// background scan sees; the trainer then saves again on the request and
// exits, and the step to resume from, and to report, is that last one.
// The final scan verified it after the command exited, so it is not torn;
// it is reported again through the Reporter (the earlier report's patch
// named the older step).
func (r *runner) supersede() {
	if r.tiered() || r.savedStep == nil {
		return
	}
	var newest *manifest.StepState
	for i := range r.scans {
		st := &r.scans[i]
		g, ok := st.Gang()
		if !ok || st.Step <= *r.savedStep || !r.isNew(g.IDs()) || (newest != nil && st.Step <= newest.Step) {
			continue
		}
		newest = st
	}
	if newest == nil {
		return
	}
	g, _ := newest.Gang()
	r.logf("checkpoint-superseded", "step", newest.Step, "was", *r.savedStep, "ranks", g.WorldSize)
	step := newest.Step
	r.savedLocal, r.savedLocalIDs, r.savedStep = &step, g.IDs(), nil
	r.checkUploaded()
}

// checkUploaded reports the saved step once it is in the shared directory
// (at once without tiers; tiered, once the uploader copied every local
// rank of it).
func (r *runner) checkUploaded() {
	if r.savedLocal == nil || r.savedStep != nil {
		return
	}
	if r.tiered() {
		for _, id := range r.savedLocalIDs {
			if !r.upload.uploaded[id] {
				return
			}
		}
		r.logf("checkpoint-uploaded", "step", *r.savedLocal, "after", time.Since(r.requestAt).Round(time.Millisecond))
	}
	step := *r.savedLocal
	r.savedStep = &step
	if r.cfg.Reporter != nil {
		r.reported = make(chan error, 1)
		go func(ch chan<- error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ch <- r.cfg.Reporter.ReportStep(ctx, step)
		}(r.reported)
	}
}

// uploadLoop copies every verified local rank checkpoint the shared
// directory does not hold, newest step first, again every poll.
func (r *runner) uploadLoop(ctx context.Context, out chan uploadState) {
	st := uploadState{uploaded: map[string]bool{}}
	failed := map[string]bool{}
	publish := func() {
		cp := uploadState{uploaded: make(map[string]bool, len(st.uploaded)), pending: st.pending, passDone: st.passDone, passStart: st.passStart}
		for k := range st.uploaded {
			cp.uploaded[k] = true
		}
		select {
		case <-out:
		default:
		}
		out <- cp
	}
	for {
		passStart := time.Now()
		srcs, err := r.ver.LocalRanks(ctx, r.cfg.LocalCheckpointDir)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			pending := 0
			for _, src := range srcs {
				if st.uploaded[src.ID] {
					continue
				}
				t0 := time.Now()
				if _, err := r.ver.Upload(ctx, src, r.cfg.CheckpointDir); err != nil {
					if ctx.Err() != nil {
						return
					}
					if errors.Is(err, manifest.ErrSuperseded) {
						// The shared step stays as it is: nothing to upload.
						st.uploaded[src.ID] = true
						r.logf("upload-skipped", "dir", src.Dir, "reason", fmt.Sprintf("%q", err.Error()))
						continue
					}
					pending++
					if !failed[src.ID] {
						failed[src.ID] = true
						r.logf("upload-failed", "dir", src.Dir, "error", fmt.Sprintf("%q", err.Error()))
					}
					continue
				}
				st.uploaded[src.ID] = true
				r.logf("uploaded", "step", src.Manifest.Step, "rank", *src.Manifest.Rank, "took", time.Since(t0).Round(time.Millisecond))
				publish()
			}
			st.pending, st.passDone, st.passStart = pending, true, passStart
			publish()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.Poll):
		}
	}
}

// uploadAtStart uploads, before the command starts, what the local
// directory holds and the shared one does not (an earlier run on this node
// ran out of grace), bounded by UploadTimeout.
func (r *runner) uploadAtStart() {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.UploadTimeout)
	defer cancel()
	done := make(chan error, 1)
	var n int
	go func() {
		srcs, err := r.ver.LocalRanks(ctx, r.cfg.LocalCheckpointDir)
		for _, src := range srcs {
			if r.ver.Uploaded(ctx, src, r.cfg.CheckpointDir) {
				continue
			}
			if _, uerr := r.ver.Upload(ctx, src, r.cfg.CheckpointDir); uerr != nil {
				if errors.Is(uerr, manifest.ErrSuperseded) {
					r.logf("upload-skipped", "at", "start", "dir", src.Dir, "reason", fmt.Sprintf("%q", uerr.Error()))
					continue
				}
				err = errors.Join(err, uerr)
				continue
			}
			n++
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			r.logf("upload-failed", "at", "start", "error", fmt.Sprintf("%q", err.Error()))
		}
	case <-ctx.Done():
		r.logf("upload-failed", "at", "start", "error", `"upload timeout"`)
	}
	if n > 0 {
		r.logf("uploaded-at-start", "ranks", n, "took", time.Since(t0).Round(time.Millisecond))
	}
}

func (r *runner) isNew(ids []string) bool {
	for _, id := range ids {
		if !r.baseline[id] {
			return true
		}
	}
	return false
}

func (r *runner) termAt() time.Time {
	if r.savedLocal != nil {
		return minTime(r.exitWaitEnd, r.killAt())
	}
	return r.termAtBound
}

func (r *runner) killAt() time.Time {
	k := r.requestAt.Add(r.cfg.Grace - r.cfg.KillMargin)
	if !r.policyKillAt.IsZero() {
		// A deadline already past at T0 (skew, a late request) still
		// leaves the SIGTERM step PolicyKillMargin.
		p := r.policyKillAt
		if floor := r.requestAt.Add(r.cfg.PolicyKillMargin); p.Before(floor) {
			p = floor
		}
		k = minTime(k, p)
	}
	return k
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
		r.terminate(false)
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
		if r.tiered() {
			deadline = time.Now().Add(r.cfg.UploadTimeout)
		}
	}
	if r.tiered() {
		// The local save may have finished after the last local scan.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		done := make(chan []manifest.StepState, 1)
		go func() {
			st, _ := r.ver.Scan(ctx, r.cfg.LocalCheckpointDir, scanSteps)
			done <- st
		}()
		select {
		case st := <-done:
			if len(st) > 0 {
				r.localScans = st
			}
		case <-ctx.Done():
		}
		cancel()
		r.checkCheckpoint()
		r.awaitUploads(deadline)
	}
	if r.cfg.CheckpointDir != "" {
		// In a goroutine: a read that hangs (a dead NFS server, a FIFO)
		// ignores the context, and the agent must still exit on time.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		done := make(chan []manifest.StepState, 1)
		// The step about to be reported, looked at once more: the Verifier
		// re-hashes a rank whose files changed since it verified them (a
		// writer still writing after the commit, a prune killed halfway).
		var saved *manifest.StepState
		reported := r.savedStep
		if reported == nil && !r.tiered() {
			reported = r.savedLocal
		}
		var reportedStep int64
		if reported != nil {
			reportedStep = *reported
		}
		// Cheap first (lstat, no hashing): if the reported step's files
		// changed since they were hashed and the re-hash below does not
		// finish by the deadline, the step is not reported.
		unchanged := reported == nil || r.ver.Unchanged(r.cfg.CheckpointDir, reportedStep)
		go func() {
			st, _ := r.ver.Scan(ctx, r.cfg.CheckpointDir, scanSteps)
			if reported != nil && ctx.Err() == nil {
				if s, err := r.ver.StepState(ctx, r.cfg.CheckpointDir, reportedStep); err == nil {
					saved = &s
				}
			}
			done <- st
		}()
		select {
		case st := <-done:
			if len(st) > 0 {
				r.scans = st
			}
			if saved != nil && !saved.Consistent() {
				r.logf("checkpoint-torn", "step", reportedStep, "problems", fmt.Sprintf("%q", strings.Join(saved.Problems, "; ")),
					"msg", `"the step verified earlier no longer does; not reporting it"`)
				r.savedStep = nil
				if !r.tiered() {
					// Tiered, the local copy stands (UploadPending).
					r.savedLocal, r.savedLocalIDs = nil, nil
				}
			}
		case <-ctx.Done():
			if unchanged {
				r.logf("verification-unfinished", "msg", `"reporting the steps verified so far"`)
				break
			}
			r.logf("checkpoint-torn", "step", reportedStep,
				"msg", `"the step's files changed since they were verified and could not be hashed again in time; not reporting it"`)
			r.savedStep = nil
			if !r.tiered() {
				r.savedLocal, r.savedLocalIDs = nil, nil
			}
		}
		cancel()
		r.checkCheckpoint()
		r.supersede()
	}
	rep := Report{ExitCode: code, CommandStatus: &code, CheckpointStep: r.savedStep}
	if r.tiered() && r.savedLocal != nil {
		rep.LocalStep = r.savedLocal
		rep.UploadPending = r.savedStep == nil
	}
	switch {
	case r.savedLocal != nil:
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
			switch {
			case err != nil:
				r.logf("report-failed", "error", fmt.Sprintf("%q", err.Error()))
			case r.savedStep == nil:
				r.logf("report-stale", "msg", `"a step was reported before it tore; the exit code and report say no checkpoint"`)
			default:
				r.logf("step-reported", "step", *r.savedStep)
			}
		case <-time.After(time.Until(deadline)):
			r.logf("report-failed", "error", `"annotation patch still running at the deadline"`)
		}
	}
	r.writeReport(rep)
	return rep.ExitCode
}

// awaitUploads waits, until deadline, for the uploader to put the saved
// step (with a request) or every local checkpoint (without) into the
// shared directory.
func (r *runner) awaitUploads(deadline time.Time) {
	done := func() bool {
		if r.requested {
			return r.savedLocal == nil || r.savedStep != nil
		}
		// A whole pass that began after the command exited: its last
		// save is included.
		return r.upload.passDone && r.upload.pending == 0 && r.upload.passStart.After(r.mainExitAt)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for !done() {
		select {
		case up := <-r.uploadCh:
			r.upload = up
			r.checkUploaded()
		case <-timer.C:
			r.logf("upload-unfinished", "msg", `"the shared directory does not hold every local checkpoint yet; the next start on this node uploads them"`)
			return
		}
	}
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

// EnvJobID names the job (<namespace>:<Kind>.<group>:<name> of the top
// job, set by the pod webhook: stable across delete-and-reapply) in the
// manifests the helper writes; the agent ignores steps of another job when
// both are known.
const EnvJobID = "GPUPACK_JOB_ID"

func jobID() string {
	j := strings.TrimSpace(os.Getenv(EnvJobID))
	if manifest.ValidateRunID(j) != nil {
		return ""
	}
	return j
}
