package agent

// End-to-end: real torchrun (Debian's python3-torch, CPU, gloo) under
// gpupack-ckpt as PID 1 of a private pid namespace, as in a container.

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupack/gpupack/checkpoint/manifest"
	"github.com/gpupack/gpupack/test/testenv"
)

// torchPython is the python3 that has torch: Debian's /usr/bin/python3
// (python3-torch), or $GPUPACK_TORCH_PYTHON.
func torchPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("GPUPACK_TORCH_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	out, err := exec.Command(py, "-c", "import torch, torch.distributed.run").CombinedOutput()
	if err == nil {
		return py
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("torch not importable by %s in CI (.ci/run installs python3-torch): %v\n%s", py, err, out)
	}
	t.Skipf("torch not importable by %s (apt-get install python3-torch): %v", py, err)
	return ""
}

func pidNamespaces(t *testing.T) string {
	t.Helper()
	u := testenv.Command(t, "unshare", "runs gpupack-ckpt as PID 1 of a pid namespace")
	if out, err := exec.Command(u, "--pid", "--fork", "--mount-proc", "true").CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("unshare --pid in CI: %v\n%s", err, out)
		}
		t.Skipf("cannot make a pid namespace here (needs root): %v: %s", err, out)
	}
	return u
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type ddpRun struct {
	py, dir, ckdir, losses string
	save                   string // pt or dcp
	local                  string // tiered: the node-local directory ("" none)
}

func newDDPRun(t *testing.T, save string) *ddpRun {
	dir := t.TempDir()
	d := &ddpRun{py: torchPython(t), dir: dir, ckdir: filepath.Join(dir, "ckpt"), losses: filepath.Join(dir, "losses"), save: save}
	if newDDPRunHook != nil {
		newDDPRunHook(d)
	}
	return d
}

var newDDPRunHook func(*ddpRun)

// torchrun is the command line of a 2-rank job.
func (d *ddpRun) torchrun(t *testing.T, ckdir, losses string, total, saveEvery int, stepTime string) []string {
	return []string{d.py, "-m", "torch.distributed.run", "--nproc_per_node=2",
		"--master_port=" + strconv.Itoa(freePort(t)),
		// Debian's 1.13 on Python 3.11 cannot parse the default "0" of these.
		"--tee=1", "--redirects=1",
		// torchrun looks at its workers every monitor interval (default 5 s).
		"--monitor_interval=0.5",
		mustAbs(t, "../python/testdata/ddp_train.py"), "--dir", ckdir, "--losses", losses,
		"--total-steps", strconv.Itoa(total), "--save-every", strconv.Itoa(saveEvery),
		"--step-time", stepTime, "--save", d.save}
}

// withLocal adds the tiered checkpoint's local directory to a command
// line (of the trainer) or to the agent's flags.
func (d *ddpRun) withLocal(args []string, flag string) []string {
	if d.local == "" {
		return args
	}
	return append(args, flag, d.local)
}

// lossLog is what the trainer's ranks wrote.
type lossLog struct {
	loss    map[int]map[int]float64 // rank → step → loss
	saved   map[int][]int
	resumed map[int][]int
	saving  map[int][]int // --stop-save-time: the slow save began
	workers map[int][]int // --stop-save-time: DataLoader workers alive at its end
	started map[int][]int // pids of the rank's processes, written before torch is imported
}

func readLosses(t *testing.T, path string) lossLog {
	t.Helper()
	l := lossLog{loss: map[int]map[int]float64{}, saved: map[int][]int{}, resumed: map[int][]int{},
		saving: map[int][]int{}, workers: map[int][]int{}, started: map[int][]int{}}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return l
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			continue // a line being written
		}
		rank, err := strconv.Atoi(fs[0])
		if err != nil {
			continue
		}
		n, err := strconv.Atoi(fs[2])
		switch {
		case fs[1] == "saved" && err == nil:
			l.saved[rank] = append(l.saved[rank], n)
		case fs[1] == "resumed" && err == nil:
			l.resumed[rank] = append(l.resumed[rank], n)
		case fs[1] == "saving" && err == nil:
			l.saving[rank] = append(l.saving[rank], n)
		case fs[1] == "workers" && err == nil:
			l.workers[rank] = append(l.workers[rank], n)
		case fs[1] == "started" && err == nil:
			l.started[rank] = append(l.started[rank], n)
		default:
			step, err1 := strconv.Atoi(fs[1])
			v, err2 := strconv.ParseFloat(fs[2], 64)
			if err1 == nil && err2 == nil {
				if l.loss[rank] == nil {
					l.loss[rank] = map[int]float64{}
				}
				if _, seen := l.loss[rank][step]; !seen {
					l.loss[rank][step] = v
				}
			}
		}
	}
	return l
}

// container is one gpupack-ckpt run as PID 1 of its own pid namespace.
type container struct {
	*agentProc
	agentPid int // the agent's pid as the host sees it
}

func startContainer(t *testing.T, flags []string, env []string, command ...string) *container {
	t.Helper()
	u := pidNamespaces(t)
	bin := os.Args[0]
	if b := os.Getenv("GPUPACK_TEST_AGENT_BIN"); b != "" {
		bin = b // another gpupack-ckpt build, e.g. an older one to show what fails
	}
	args := append([]string{"--pid", "--fork", "--mount-proc", bin}, flags...)
	args = append(append(args, "--"), command...)
	cmd := exec.Command(u, args...)
	cmd.Env = append(append(os.Environ(), envRunAgent+"=1", EnvPodName+"=", EnvPodNamespace+"=", "OMP_NUM_THREADS=1"), env...)
	a := &agentProc{cmd: cmd, stderr: &lockedBuf{}, ready: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = a.stderr
	cmd.Stdout = a.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		a.exitAt = time.Now()
		a.code = cmd.ProcessState.ExitCode()
		close(a.done)
	}()
	t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			cmd.Process.Kill() // unshare; the namespace goes with its PID 1
			if c := children(cmd.Process.Pid); len(c) > 0 {
				syscall.Kill(c[0], syscall.SIGKILL)
			}
			<-a.done
		}
	})
	c := &container{agentProc: a}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ch := children(cmd.Process.Pid); len(ch) > 0 {
			c.agentPid = ch[0]
			return c
		}
	}
	t.Fatalf("unshare started no agent; log:\n%s", a.stderr)
	return nil
}

func children(pid int) []int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

const (
	e2eTimeout = 20 * time.Second
	e2eGrace   = 30 * time.Second
)

func e2eFlags(ckdir, tlog string) []string {
	return []string{"--checkpoint-dir", ckdir, "--checkpoint-timeout", e2eTimeout.String(), "--grace", e2eGrace.String(),
		"--kill-margin", "2s", "--annotations-file", "", "--termination-log", tlog, "--poll", "50ms"}
}

// preemptAndResume runs the job under the agent, sends the agent SIGTERM
// as the kubelet would, checks the checkpoint and the exit, then restarts
// the job and compares its first loss with an uninterrupted run's.
func preemptAndResume(t *testing.T, save string, wrap func([]string) []string) {
	d := newDDPRun(t, save)
	tlog := filepath.Join(d.dir, "termination-log")
	job := d.withLocal(d.torchrun(t, d.ckdir, d.losses, 100000, 4, "0.02"), "--local-dir")
	c := startContainer(t, d.withLocal(e2eFlags(d.ckdir, tlog), "--local-checkpoint-dir"), nil, wrap(job)...)

	// Preempt in the middle of training, after a periodic checkpoint.
	c.waitTraining(t, d.losses, "train and save", func(l lossLog) bool {
		return len(l.saved[0]) > 0 && len(l.saved[1]) > 0 && len(l.loss[0]) > 5 && len(l.loss[1]) > 5
	})
	t0 := time.Now()
	if err := syscall.Kill(c.agentPid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.wait(t, e2eGrace+5*time.Second)
	took := c.exitAt.Sub(t0)
	t.Logf("SIGTERM to agent exit: %v", took.Round(time.Millisecond))
	if testing.Verbose() {
		t.Logf("agent log:\n%s", c.stderr)
	}

	if c.code != ExitPreempted {
		t.Fatalf("exit %d, want %d (preempted after a checkpoint); log:\n%s", c.code, ExitPreempted, c.stderr)
	}
	if took > e2eTimeout {
		t.Errorf("the job took %v to save and stop, more than the %v timeout; log:\n%s", took, e2eTimeout, c.stderr)
	}
	l := readLosses(t, d.losses)
	s0, s1 := l.saved[0], l.saved[1]
	if len(s0) == 0 || len(s1) == 0 || s0[len(s0)-1] != s1[len(s1)-1] {
		t.Fatalf("ranks' saved steps %v and %v do not end with the same step; log:\n%s", s0, s1, c.stderr)
	}
	step := int64(s0[len(s0)-1])
	rep := readReport(t, tlog)
	if rep.Outcome != OutcomeSaved || rep.CheckpointStep == nil || *rep.CheckpointStep != step || rep.WorldSize != 2 || rep.UploadPending {
		t.Fatalf("report %+v, want outcome %s at step %d of 2 ranks", rep, OutcomeSaved, step)
	}
	for _, r := range []string{"0", "1"} {
		if rs := rep.RankSteps[r]; len(rs) == 0 || rs[0] != step {
			t.Errorf("report: rank %s verified steps %v, want the newest to be %d", r, rs, step)
		}
	}
	g, ok, err := manifest.LatestConsistent(context.Background(), d.ckdir)
	if err != nil || !ok || g.Step != step {
		t.Fatalf("LatestConsistent = %+v, %v, %v; want step %d", g, ok, err, step)
	}
	if d.local != "" {
		for r, cp := range g.Ranks {
			if cp.Manifest.Tier != manifest.TierShared {
				t.Errorf("rank %d of step %d in the shared directory: tier %q, want %q (uploaded by the agent)", r, step, cp.Manifest.Tier, manifest.TierShared)
			}
		}
		if rep.LocalStep == nil || *rep.LocalStep != step {
			t.Errorf("report localStep %v, want %d", rep.LocalStep, step)
		}
		// The restart runs on another node: its local directory is empty.
		d.local = filepath.Join(d.dir, "local-of-another-node")
	}

	want := reference(t, d)
	if _, ok := want.loss[0][int(step)+1]; !ok {
		t.Fatalf("saved step %d is past the reference run's %d steps", step, refSteps)
	}

	// The restart: a stale GPUPACK_RESUME_STEP must not win over the disk.
	rlog := filepath.Join(d.dir, "restart-termination-log")
	rc := startContainer(t, d.withLocal(e2eFlags(d.ckdir, rlog), "--local-checkpoint-dir"), []string{"GPUPACK_RESUME_STEP=1"},
		wrap(d.withLocal(d.torchrun(t, d.ckdir, d.losses+".restart", int(step)+2, 1000000, "0"), "--local-dir"))...)
	rc.wait(t, 120*time.Second)
	if rc.code != 0 {
		t.Fatalf("restart exit %d, want 0 (trained to the end, no request); log:\n%s", rc.code, rc.stderr)
	}
	got := readLosses(t, d.losses+".restart")
	for r := 0; r < 2; r++ {
		if len(got.resumed[r]) != 1 || got.resumed[r][0] != int(step) {
			t.Errorf("rank %d resumed from %v, want %d", r, got.resumed[r], step)
		}
		first, ok1 := got.loss[r][int(step)+1]
		ref, ok2 := want.loss[r][int(step)+1]
		if !ok1 || !ok2 {
			t.Fatalf("rank %d: no loss at step %d (restart %v, reference %v)", r, step+1, ok1, ok2)
		}
		t.Logf("rank %d step %d: restart loss %.9f, uninterrupted %.9f", r, step+1, first, ref)
		if math.Abs(first-ref) > 1e-4 {
			t.Errorf("rank %d: first loss after the restart %.9f, uninterrupted run %.9f (> 1e-4 apart)", r, first, ref)
		}
	}
}

// refSteps: the uninterrupted run, without the agent, that every test's
// restart is compared with (the job is deterministic; pt and dcp saves
// train the same way). Run once per test binary.
const refSteps = 60

var (
	refOnce sync.Once
	refLoss lossLog
	refErr  string
)

func reference(t *testing.T, d *ddpRun) lossLog {
	t.Helper()
	refOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpupack-ddp-ref-")
		if err != nil {
			refErr = err.Error()
			return
		}
		defer os.RemoveAll(dir)
		ref := exec.Command(d.py, d.torchrun(t, filepath.Join(dir, "ckpt"), filepath.Join(dir, "losses"), refSteps, 1000000, "0")[1:]...)
		ref.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		if out, err := ref.CombinedOutput(); err != nil {
			refErr = fmt.Sprintf("reference run: %v\n%s", err, out)
			return
		}
		refLoss = readLosses(t, filepath.Join(dir, "losses"))
	})
	if refErr != "" {
		t.Fatal(refErr)
	}
	return refLoss
}

// waitTraining polls the job's loss log until ready says it has got far
// enough to be preempted; the job ending first, or 60 s, fails the test.
func (c *container) waitTraining(t *testing.T, losses, what string, ready func(lossLog) bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ready(readLosses(t, losses)) {
			return
		}
		select {
		case <-c.done:
			t.Fatalf("job ended (%d) before it was preempted; log:\n%s", c.code, c.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("job did not %s in 60s; log:\n%s", what, c.stderr)
		}
	}
}

func TestTorchrunPreemptedUnderPID1(t *testing.T) {
	preemptAndResume(t, "pt", func(c []string) []string { return c })
}

// Only rank 1 gets the signal (a late or lost delivery): should_stop()'s
// all-reduce makes both ranks save the same step and leave together,
// instead of rank 1 leaving while rank 0 waits in the next all-reduce.
func TestTorchrunRanksAgreeOnTheStopStep(t *testing.T) {
	d := newDDPRun(t, "pt")
	job := d.torchrun(t, d.ckdir, d.losses, 50, 1000000, "0")
	cmd := exec.Command(d.py, append(job[1:], "--self-signal", "1:3")...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("torchrun: %v\n%s", err, out)
	}
	l := readLosses(t, d.losses)
	if len(l.saved[0]) != 1 || len(l.saved[1]) != 1 || l.saved[0][0] != 3 || l.saved[1][0] != 3 {
		t.Fatalf("saved steps rank 0 %v, rank 1 %v; want both [3]\n%s", l.saved[0], l.saved[1], out)
	}
	if g, ok, err := manifest.LatestConsistent(context.Background(), d.ckdir); err != nil || !ok || g.Step != 3 {
		t.Fatalf("LatestConsistent = %+v %v %v, want step 3", g, ok, err)
	}
}

func TestTorchrunInBashWrapper(t *testing.T) {
	preemptAndResume(t, "pt", func(c []string) []string {
		q := make([]string, len(c))
		for i, a := range c {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		return []string{"bash", "-c", strings.Join(q, " ") + "; echo done"}
	})
}

// Tiered: every rank saves to a node-local directory first; the agent
// uploads to the shared one, reports the step once it is there, and the
// restart on another node (an empty local directory) resumes from it.
func TestTorchrunTieredCheckpoint(t *testing.T) {
	preemptAndResumeTiered(t)
}

func preemptAndResumeTiered(t *testing.T) {
	orig := newDDPRunHook
	newDDPRunHook = func(d *ddpRun) { d.local = filepath.Join(d.dir, "local") }
	defer func() { newDDPRunHook = orig }()
	preemptAndResume(t, "pt", func(c []string) []string { return c })
}

func TestTorchrunDCPSave(t *testing.T) {
	preemptAndResume(t, "dcp", func(c []string) []string { return c })
}

// The save after the request outlasts the checkpoint timeout (a big model):
// the agent's SIGTERM step at T0 + timeout must not kill the ranks'
// DataLoader workers (their death makes the rank's DataLoader raise in the
// middle of the save) nor go to torchrun (which forwards it and SIGKILLs
// its workers 30 s later); the ranks finish the save, the agent reports it
// and everything ends before the grace period.
func TestTorchrunSlowSaveOutlastsTheTimeout(t *testing.T) {
	d := newDDPRun(t, "pt")
	tlog := filepath.Join(d.dir, "termination-log")
	const timeout, saveTime = 2 * time.Second, 6 * time.Second
	flags := []string{"--checkpoint-dir", d.ckdir, "--checkpoint-timeout", timeout.String(), "--grace", e2eGrace.String(),
		"--kill-margin", "2s", "--annotations-file", "", "--termination-log", tlog, "--poll", "50ms"}
	job := append(d.torchrun(t, d.ckdir, d.losses, 100000, 1000000, "0.02"), "--stop-save-time", "6")
	c := startContainer(t, flags, nil, job...)
	c.waitTraining(t, d.losses, "train", func(l lossLog) bool { return len(l.loss[0]) > 5 && len(l.loss[1]) > 5 })
	t0 := time.Now()
	if err := syscall.Kill(c.agentPid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.wait(t, e2eGrace+5*time.Second)
	took := c.exitAt.Sub(t0)
	t.Logf("SIGTERM to agent exit: %v (timeout %v, save %v)", took.Round(time.Millisecond), timeout, saveTime)
	l := readLosses(t, d.losses)
	if testing.Verbose() {
		t.Logf("agent log:\n%s", c.stderr)
	}
	if c.code != ExitPreempted {
		t.Fatalf("exit %d, want %d; saving %v, saved %v, workers alive %v; log:\n%s", c.code, ExitPreempted, l.saving, l.saved, l.workers, c.stderr)
	}
	if took >= e2eGrace-2*time.Second {
		t.Errorf("the job took %v to stop, past the kill deadline", took)
	}
	for r := 0; r < 2; r++ {
		if len(l.saving[r]) != 1 || len(l.saved[r]) != 1 || l.saved[r][0] != l.saving[0][0] {
			t.Errorf("rank %d: slow save began %v, saved %v; want one save of step %v on every rank", r, l.saving[r], l.saved[r], l.saving[0])
		}
		if len(l.workers[r]) != 1 || l.workers[r][0] != 2 {
			t.Errorf("rank %d: DataLoader workers alive at the end of the save %v, want [2]", r, l.workers[r])
		}
	}
	rep := readReport(t, tlog)
	if rep.Outcome != OutcomeSaved || rep.CheckpointStep == nil || len(l.saved[0]) == 0 || *rep.CheckpointStep != int64(l.saved[0][0]) {
		t.Fatalf("report %+v, want %s at step %v", rep, OutcomeSaved, l.saved[0])
	}
	// torchrun was never signalled: it saw its ranks exit 0 and exited 0.
	if rep.CommandStatus == nil || *rep.CommandStatus != 0 {
		t.Errorf("torchrun's status %v, want 0 (it left on its own once its ranks had); log:\n%s", rep.CommandStatus, c.stderr)
	}
}

// TestTorchrunTimings measures (does not assert) what docs/bench/preemption.md
// reports: SIGTERM to every rank's checkpoint verified, SIGTERM to the
// agent's exit, and the agent's overhead on a 2-rank job (wall time with and
// without the agent, the agent's own CPU time). Run with
// GPUPACK_BENCH_TORCHRUN=<runs>.
func TestTorchrunTimings(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("GPUPACK_BENCH_TORCHRUN"))
	if runs <= 0 {
		t.Skip("a measurement; set GPUPACK_BENCH_TORCHRUN=<runs>")
	}
	const steps, every = 300, 20
	for i := 0; i < runs; i++ {
		d := newDDPRun(t, "pt")
		// Bare torchrun, then the same job under the agent (PID 1, watching
		// and verifying the checkpoint directory).
		t0 := time.Now()
		bare := exec.Command(d.py, d.torchrun(t, filepath.Join(d.dir, "bare"), filepath.Join(d.dir, "bare-losses"), steps, every, "0")[1:]...)
		bare.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		if out, err := bare.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		bareWall := time.Since(t0)
		t0 = time.Now()
		c := startContainer(t, e2eFlags(d.ckdir, filepath.Join(d.dir, "tlog")), nil, d.torchrun(t, d.ckdir, d.losses, steps, every, "0")...)
		c.wait(t, 5*time.Minute)
		agentWall := time.Since(t0)
		t.Logf("run %d: %d steps, save every %d: bare torchrun %v, under gpupack-ckpt %v; agent %s",
			i, steps, every, bareWall.Round(time.Millisecond), agentWall.Round(time.Millisecond), grepField(c.stderr.String(), "agent-cpu="))

		// Preemption: SIGTERM in the middle of a job.
		p := newDDPRun(t, "pt")
		pc := startContainer(t, e2eFlags(p.ckdir, filepath.Join(p.dir, "tlog")), nil, p.torchrun(t, p.ckdir, p.losses, 100000, every, "0.02")...)
		for deadline := time.Now().Add(60 * time.Second); len(readLosses(t, p.losses).loss[1]) < 10; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no training; log:\n%s", pc.stderr)
			}
		}
		t0 = time.Now()
		syscall.Kill(pc.agentPid, syscall.SIGTERM)
		pc.wait(t, e2eGrace)
		t.Logf("run %d: SIGTERM to all ranks' checkpoint verified %s, to agent exit %v (exit %d); agent %s", i,
			grepField(pc.stderr.String(), "after="), pc.exitAt.Sub(t0).Round(time.Millisecond), pc.code, grepField(pc.stderr.String(), "agent-cpu="))
	}
}

func grepField(log, key string) string {
	for _, line := range strings.Split(log, "\n") {
		if i := strings.Index(line, key); i >= 0 {
			f := strings.Fields(line[i:])
			return f[0]
		}
	}
	return key + "?"
}

// torchrun --max_restarts restarts workers that die of a signal. A rank
// still exiting after its save (here it lingers 6 s with SIGTERM at its
// default, as the interpreter's shutdown does) got the agent's SIGTERM at
// the end of --exit-wait and died of it, and torchrun started a new worker
// group into the finished job. After the request's checkpoint verified the
// SIGTERM goes to torchrun instead, which stops its workers and ends: every
// rank starts once.
func TestTorchrunMaxRestartsDoesNotRestartAPreemptedJob(t *testing.T) {
	d := newDDPRun(t, "pt")
	tlog := filepath.Join(d.dir, "termination-log")
	job := d.torchrun(t, d.ckdir, d.losses, 100000, 1000000, "0.02")
	job = append(append(append([]string{}, job[:4]...), "--max_restarts=2"), job[4:]...)
	job = append(job, "--exit-linger", "6")
	// A poll of 1 s gives a restarted worker time to say it started
	// before the agent's next SIGTERM step reaches it.
	flags := append(e2eFlags(d.ckdir, tlog), "--exit-wait", "1s", "--poll", "1s")
	c := startContainer(t, flags, nil, job...)
	c.waitTraining(t, d.losses, "train", func(l lossLog) bool { return len(l.loss[0]) > 5 && len(l.loss[1]) > 5 })
	if err := syscall.Kill(c.agentPid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.wait(t, e2eGrace+5*time.Second)
	l := readLosses(t, d.losses)
	if testing.Verbose() {
		t.Logf("agent log:\n%s", c.stderr)
	}
	if c.code != ExitPreempted {
		t.Fatalf("exit %d, want %d; log:\n%s", c.code, ExitPreempted, c.stderr)
	}
	for r := 0; r < 2; r++ {
		if len(l.started[r]) != 1 || len(l.resumed[r]) != 1 {
			t.Errorf("rank %d started as pids %v (resumed %v), want once: torchrun restarted the preempted job; log:\n%s", r, l.started[r], l.resumed[r], c.stderr)
		}
		if len(l.saved[r]) != 1 {
			t.Errorf("rank %d saved %v, want one save", r, l.saved[r])
		}
	}
	if rep := readReport(t, tlog); rep.Outcome != OutcomeSaved || rep.CheckpointStep == nil {
		t.Errorf("report %+v, want %s", rep, OutcomeSaved)
	}
}
