package devicehook

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A pool destroyed while one of its blocks is live: its handle is dead.
// The hook must forget it (before, it asked the driver about the dead
// handle when an allocation was refused: the fake deadlocked), keep the
// live block charged until it is freed, then give everything back.
func TestDestroyedPoolIsForgotten(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, hooktest, mode, "pooldead", fmt.Sprint(4*mib))
		cmd.Env = e.list()
		out, err := cmd.CombinedOutput()
		hung := ctx.Err() == context.DeadlineExceeded
		cancel()
		if hung {
			t.Fatalf("via %s: hung after a pool was destroyed: %s", mode, out)
		}
		if err != nil {
			t.Fatalf("via %s: %v: %s", mode, err, out)
		}
		if d := cmp.Diff(map[string]string{"with_dead_pool": "15", "after_free": "16"}, parseKV(string(out))); d != "" {
			t.Errorf("via %s (-want +got):\n%s", mode, d)
		}
	}
}

// A SIGKILLed process's charge is not reported as used: cuMemGetInfo and
// NVML in the next process show the whole limit free at once (before,
// free read 0 until some allocation had been refused).
func TestDeadProcessChargeIsNotReported(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": filepath.Join(t.TempDir(), "cache")}.hooked()
	holder := command(e, "direct", "hold", fmt.Sprint(8*mib))
	stdin, _ := holder.StdinPipe()
	defer stdin.Close()
	stdout, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(line, "held=8") {
		t.Fatalf("holder said %q, %v", line, err)
	}
	holder.Process.Signal(syscall.SIGKILL)
	holder.Wait()
	kv := run(t, e, "direct", "query", "0")
	for _, k := range []string{"free", "nvml_free"} {
		if got := num(t, kv, k); got != 64*mib {
			t.Errorf("%s after the holder was SIGKILLed: %d MiB, want the whole 64 MiB", k, got/mib)
		}
	}
}

// The default pool gives its memory back at a synchronisation (the
// driver's default release threshold is 0): the container must not keep
// seeing it as used (before: free was the limit minus a 32 MiB granule
// until some allocation was refused).
func TestPoolMemoryReleasedAtSyncIsNotCharged(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		if got := num(t, run(t, e, mode, "poolsync", fmt.Sprint(4*mib)), "free"); got != 64*mib {
			t.Errorf("via %s: free after the pool released at sync: %d MiB, want 64", mode, got/mib)
		}
	}
}

// A pool located on the host holds host memory: its allocations are not
// charged to the GPU (before, the hook charged them to the current device:
// 16 of 32 host chunks, and then no device memory at all).
func TestHostPoolIsNotCharged(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		if d := cmp.Diff(map[string]string{"host": "32", "dev": "16"}, run(t, e, mode, "hostpool", fmt.Sprint(4*mib))); d != "" {
			t.Errorf("via %s (-want +got):\n%s", mode, d)
		}
	}
}

// cuGetProcAddress: the wrapper's ABI is taken from the pointer the driver
// returned, not from the hook's own table. A driver that answers with an
// ABI the hook does not know (the fake hands out cuMemGetInfo_v3 from
// version 13020) gets its pointer back untouched, with one error line;
// before, it was wrapped with the _v2 ABI (a corrupted call). A call that
// would take memory or SM time under a limit fails closed instead (M6).
func TestGetProcAddressChecksTheReturnedABI(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.hooked()
	out, err := command(e, "direct", "gpanewer").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	kv := parseKV(string(out))
	if kv["v3_untouched"] != "1" || kv["v3_rc"] != "0" || kv["v2_found"] != "1" {
		t.Errorf("got %v, want the driver's cuMemGetInfo_v3 untouched and working", kv)
	}
	if !strings.Contains(string(out), "an ABI this hook does not know") {
		t.Errorf("want one error line naming the unknown ABI, got:\n%s", out)
	}
	// Issue 15 M6: an unknown ABI of a call that takes memory under a
	// memory limit fails closed (before, cuMemAlloc_v3 was handed out
	// and allocated past the hook); without a limit it passes through.
	if kv["alloc3_gpa_rc"] != "500" || kv["alloc3_null"] != "1" || kv["alloc3_status"] != "1" {
		t.Errorf("got %v, want cuGetProcAddress(cuMemAlloc, 13020) refused with CUDA_ERROR_NOT_FOUND, "+
			"a NULL pointer and CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND under a memory limit", kv)
	}
	if !strings.Contains(string(out), "cuMemAlloc_v3, an ABI this hook does not know: refused") {
		t.Errorf("want an error line saying cuMemAlloc_v3 was refused, got:\n%s", out)
	}
	out, err = command(env{"FAKECUDA_MEM": fmt.Sprint(1 * gib)}.hooked(), "direct", "gpanewer").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if kv := parseKV(string(out)); kv["alloc3_gpa_rc"] != "0" || kv["alloc3_untouched"] != "1" || kv["alloc3_rc"] != "0" {
		t.Errorf("no limit: got %v, want the driver's cuMemAlloc_v3 untouched and working", kv)
	}
}
