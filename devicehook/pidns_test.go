package devicehook

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupack/gpupack/test/testenv"
)

// Issue 15, bug 6: "a nested pid namespace reclaims live slots". A
// process in a nested pid namespace of the container (`unshare -p -f`, as
// sandboxes and some launchers do) numbers processes differently: its pid
// is 1 there, and the container's pids do not exist for it. Before, the
// second nested process (pid 1 as well) took the first one's live slot for
// its own previous image and zeroed it, and a nested process that was
// about to be refused "reclaimed" every slot of the outer processes
// (kill(pid, 0) said ESRCH), so the container's limit was handed out again.

var (
	nestedNS  = []string{"-r", "-p", "-f", "--kill-child"}                 // the container's /proc
	ownProcNS = []string{"-r", "-p", "-f", "--kill-child", "--mount-proc"} // its own /proc too
)

func unsharePid(t *testing.T) {
	t.Helper()
	testenv.Command(t, "unshare", "nested pid namespaces are tested with unshare -p -f")
	if out, err := exec.Command("unshare", append(ownProcNS, "true")...).CombinedOutput(); err != nil {
		t.Skipf("no unprivileged pid namespaces here (%v: %s)", err, out)
	}
}

type nsHolder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startHolder runs `hooktest direct hold CHUNK N` (inside `unshare ns...`
// when ns is not nil) and waits until it holds its chunks.
func startHolder(t *testing.T, e env, ns []string, chunk int64, n int) *nsHolder {
	t.Helper()
	args := []string{"direct", "hold", fmt.Sprint(chunk), fmt.Sprint(n)}
	var cmd *exec.Cmd
	if ns == nil {
		cmd = exec.Command(hooktest, args...)
	} else {
		cmd = exec.Command("unshare", append(append(append([]string{}, ns...), hooktest), args...)...)
	}
	cmd.Env = e.list()
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &nsHolder{cmd, stdin}
	t.Cleanup(func() { h.stdin.Close(); h.cmd.Process.Kill(); h.cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != fmt.Sprintf("held=%d", n) {
		t.Fatalf("holder %v said %q (%v), want held=%d\n%s", ns, line, err, n, stderr.String())
	}
	return h
}

// kill SIGKILLs the holder and waits until it is reaped: inside unshare
// the holder is unshare's child (its namespace's pid 1), so that child is
// killed and unshare, which waits for it, exits after reaping it.
func (h *nsHolder) kill(t *testing.T) {
	t.Helper()
	pid := h.cmd.Process.Pid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil && len(strings.Fields(string(b))) == 1 {
		if child, err := strconv.Atoi(strings.Fields(string(b))[0]); err == nil {
			pid = child
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", pid, err)
	}
	h.cmd.Wait()
}

func TestNestedPidNamespaceSlots(t *testing.T) {
	unsharePid(t)
	const chunk = 4 * mib
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": filepath.Join(t.TempDir(), "cache")}.hooked()
	grab := func(ns []string) int64 {
		t.Helper()
		args := []string{"direct", "grab", fmt.Sprint(chunk)}
		var cmd *exec.Cmd
		if ns == nil {
			cmd = exec.Command(hooktest, args...)
		} else {
			cmd = exec.Command("unshare", append(append(append([]string{}, ns...), hooktest), args...)...)
		}
		cmd.Env = e.list()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("grab %v: %v: %s", ns, err, out)
		}
		return num(t, parseKV(string(out)), "n") * chunk
	}
	where := []struct {
		name string
		ns   []string
	}{{"outer", nil}, {"nested", nestedNS}, {"nested with its own /proc", ownProcNS}}

	a := startHolder(t, e, nil, chunk, 4)       // the container's namespace
	b := startHolder(t, e, nestedNS, chunk, 4)  // pid 1 of a nested namespace
	c := startHolder(t, e, ownProcNS, chunk, 4) // pid 1 of another, with its own /proc
	// 48 MiB held by three live processes: wherever a fourth runs, it
	// gets the remaining 16 MiB, and running it changes nobody's charge.
	for round := 0; round < 2; round++ {
		for _, w := range where {
			if got := grab(w.ns); got != 16*mib {
				t.Errorf("round %d, %s: got %d MiB next to 48 MiB held by live processes, want 16", round, w.name, got/mib)
			}
		}
	}
	// A dead nested process whose /proc entry the container sees is
	// reclaimed from outside; a dead outer one from a nested namespace.
	b.kill(t)
	if got := grab(nil); got != 32*mib {
		t.Errorf("after the nested holder was SIGKILLed: outer got %d MiB, want 32 (its slot reclaimed)", got/mib)
	}
	a.kill(t)
	if got := grab(nestedNS); got != 48*mib {
		t.Errorf("after the outer holder was SIGKILLed: nested got %d MiB, want 48 (its slot reclaimed)", got/mib)
	}
	// A dead process of a namespace with its own /proc cannot be looked
	// up from any other: its slot stays charged (refusing early, never
	// over the limit; docs/devicehook.md). Only the bound is asserted.
	c.kill(t)
	for _, w := range where {
		if got := grab(w.ns); got > 64*mib {
			t.Errorf("%s: got %d MiB under a 64 MiB limit", w.name, got/mib)
		} else {
			t.Logf("%s, after the own-/proc holder died: %d MiB", w.name, got/mib)
		}
	}
	// A zombie is dead: unshare killed (--kill-child SIGKILLs the holder),
	// nobody reaps the holder while it is reparented to a pid 1 that may
	// never wait. Its slot is reclaimed all the same.
	free := grab(nil)
	d := startHolder(t, e, nestedNS, chunk, 4)
	pid := d.cmd.Process.Pid
	b2, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	child, err := strconv.Atoi(strings.TrimSpace(string(b2)))
	if err != nil {
		t.Fatalf("no single child of unshare %d: %q", pid, b2)
	}
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil || strings.Contains(string(st), ") Z ") {
			break // reaped, or a zombie
		}
		if time.Now().After(deadline) {
			t.Fatalf("holder %d still running after its unshare was killed", child)
		}
	}
	if got := grab(nil); got != free {
		t.Errorf("after the nested holder became a zombie: outer got %d MiB, want %d as before it (its slot reclaimed)", got/mib, free/mib)
	}
}
