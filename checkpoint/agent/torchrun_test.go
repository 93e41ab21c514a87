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
}

func newDDPRun(t *testing.T, save string) *ddpRun {
	dir := t.TempDir()
	return &ddpRun{py: torchPython(t), dir: dir, ckdir: filepath.Join(dir, "ckpt"), losses: filepath.Join(dir, "losses"), save: save}
}

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

// lossLog is what the trainer's ranks wrote.
type lossLog struct {
	loss    map[int]map[int]float64 // rank → step → loss
	saved   map[int][]int
	resumed map[int][]int
}

func readLosses(t *testing.T, path string) lossLog {
	t.Helper()
	l := lossLog{loss: map[int]map[int]float64{}, saved: map[int][]int{}, resumed: map[int][]int{}}
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
	job := d.torchrun(t, d.ckdir, d.losses, 100000, 4, "0.02")
	c := startContainer(t, e2eFlags(d.ckdir, tlog), nil, wrap(job)...)

	// Preempt in the middle of training, after a periodic checkpoint.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		l := readLosses(t, d.losses)
		if len(l.saved[0]) > 0 && len(l.saved[1]) > 0 && len(l.loss[0]) > 5 && len(l.loss[1]) > 5 {
			break
		}
		select {
		case <-c.done:
			t.Fatalf("job ended (%d) before it was preempted; log:\n%s", c.code, c.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("job did not train and save in 60s; log:\n%s", c.stderr)
		}
	}
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
	if rep.Outcome != OutcomeSaved || rep.CheckpointStep == nil || *rep.CheckpointStep != step || rep.WorldSize != 2 {
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

	want := reference(t, d)
	if _, ok := want.loss[0][int(step)+1]; !ok {
		t.Fatalf("saved step %d is past the reference run's %d steps", step, refSteps)
	}

	// The restart: a stale GPUPACK_RESUME_STEP must not win over the disk.
	rlog := filepath.Join(d.dir, "restart-termination-log")
	rc := startContainer(t, e2eFlags(d.ckdir, rlog), []string{"GPUPACK_RESUME_STEP=1"},
		wrap(d.torchrun(t, d.ckdir, d.losses+".restart", int(step)+2, 1000000, "0"))...)
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

func TestTorchrunDCPSave(t *testing.T) {
	preemptAndResume(t, "dcp", func(c []string) []string { return c })
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
