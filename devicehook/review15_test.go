package devicehook

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// Review 15 (issue 15), finding 1: NVML reports usedGpuMemory as
// NVML_VALUE_NOT_AVAILABLE (~0) where it cannot tell per-process memory
// (MIG without privilege, vGPU guests); read as a size, after - before =
// 2^64-1 was "what the context took", the context did not fit, it was
// destroyed, and every CUDA program under a memory limit failed at its
// first context. The hook now charges the reserve only.
func TestContextMeasureWithNVMLMemoryNotAvailable(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"FAKECUDA_CTX_MEM": fmt.Sprint(24 * mib), "FAKECUDA_PID_OFFSET": "70000",
		"FAKENVML_MEM_NOT_AVAILABLE": "1"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		t.Run(mode, func(t *testing.T) {
			out, err := command(e, mode, "grab", fmt.Sprint(4*mib)).CombinedOutput()
			if err != nil {
				t.Errorf("a program under a 64 MiB limit, NVML not reporting per-process memory, fails: %v\n%s", err, out)
				return
			}
			t.Logf("%s", out)
		})
	}
}

// Review 15, finding 2: the legacy launch API (cuFuncSetBlockShape +
// cuLaunch / cuLaunchGrid / cuLaunchGridAsync, deprecated, still declared
// in CUDA 12's cuda.h and exported by its drivers) was not hooked: a 30 %
// container that launched through it ran unthrottled (100 %), by every
// road (direct, dlsym, cuGetProcAddress).
func TestLegacyLaunchAPIIsThrottled(t *testing.T) {
	for _, mode := range []string{"direct", "dlsym", "gpa"} {
		t.Run(mode, func(t *testing.T) {
			got := launchUtilMode(t, mode, "grid", 4, 2, limited(30))[0]
			t.Logf("30%% container launching through cuLaunchGridAsync (%s): %.1f%%", mode, got)
			within(t, "cuLaunchGridAsync at 30%", got, 30, smBand)
		})
	}
}

// The legacy launch names fail closed too: an ABI of them the hook does
// not know (the fake hands out cuLaunchGrid_v2 from 13020) is refused
// under an SM limit and passes through untouched without one.
func TestUnknownLegacyLaunchABIFailsClosed(t *testing.T) {
	kv := parseKV(string(mustOutput(t, command(limited(30), "direct", "gpanewer"))))
	if kv["grid2_gpa_rc"] != "500" || kv["grid2_null"] != "1" || kv["grid2_status"] != "1" {
		t.Errorf("got %v, want cuGetProcAddress(cuLaunchGrid, 13020) refused with CUDA_ERROR_NOT_FOUND, "+
			"a NULL pointer and CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND under an SM limit", kv)
	}
	kv = parseKV(string(mustOutput(t, command(env{}.hooked(), "direct", "gpanewer"))))
	if kv["grid2_gpa_rc"] != "0" || kv["grid2_untouched"] != "1" {
		t.Errorf("no limit: got %v, want the driver's cuLaunchGrid_v2 untouched", kv)
	}
}

func mustOutput(t *testing.T, cmd *exec.Cmd) []byte {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return out
}

// Review 15, finding (gpu-check): a probe that exited non-zero aborted
// gpu-check.sh under set -e at its first command: no FAIL line, no
// "N passed, M failed" summary. Here every context is refused (a 100 MiB
// limit, the fake's contexts take 300 MiB), so every probe dies: the
// script must say so and still end with its summary.
func TestGPUCheckEndsWithASummaryWhenAProbeDies(t *testing.T) {
	script := filepath.Join(buildDir, "..", "gpu-check.sh")
	cmd := exec.Command("bash", script)
	cmd.Env = append(env{}.list(), "GPU_CHECK_FAKE=1", "GPU_CHECK_SM_SECS=2", "GPU_CHECK_SM_WARM=0.5",
		"GPU_CHECK_LIMIT_MIB=100")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("gpu-check.sh passed with every context refused:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^FAIL: gpucheck info under the hook exited [1-9]`).Match(out) {
		t.Errorf("gpu-check.sh did not name the probe that died:\n%s", out)
	}
	// A figure the dead probes never printed is no pass ("+ + 0 <= L" is
	// true to awk).
	if regexp.MustCompile(`(?m)^PASS: two processes on one cache share the limit`).Match(out) {
		t.Errorf("gpu-check.sh passed a check whose figures were never printed:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^\d+ passed, [1-9]\d* failed`).Match(out) {
		t.Errorf("gpu-check.sh ended without its summary line:\n%s", out)
	}
}

// Review 15, finding 4: the hook asked NVML for at most 64 processes; on
// a device with more (NVML_ERROR_INSUFFICIENT_SIZE) the list counted as
// unavailable: this process's host pid was never found and its contexts
// went unmeasured (charged the reserve, 0 by default). The fake lists 100
// other processes before this one: the 24 MiB context is still measured.
func TestContextMeasuredWithMoreThan64ProcessesOnTheDevice(t *testing.T) {
	const ctxMem, chunk = 24 * mib, 4 * mib
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"FAKECUDA_CTX_MEM": fmt.Sprint(ctxMem), "FAKECUDA_PID_OFFSET": "70000",
		"FAKENVML_EXTRA_PROCS": "100"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		t.Run(mode, func(t *testing.T) {
			kv := run(t, e, mode, "grab", fmt.Sprint(chunk))
			if got, want := num(t, kv, "n"), int64((64*mib-ctxMem)/chunk); got != want {
				t.Errorf("100 other processes on the device: got %d chunks of 4 MiB next to a 24 MiB context under 64 MiB, want %d", got, want)
			}
		})
	}
}
