package devicehook

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 15 H3a: with limits from the node's file, the SM limiter uses only
// the NVML beside the driver, and only a copy this process cannot change.
// The tenant's stub libnvidia-ml.so.1 (build/stub: every device "in MIG
// mode", never a utilisation sample) is on LD_LIBRARY_PATH ahead of the
// driver's folder, so the application itself loads it, as a hook loading
// NVML by soname did: the limiter then said "MIG, does not apply" and the
// 30 % container took the whole device.
func TestSMLimiterIgnoresATenantNVML(t *testing.T) {
	file := "CUDA_DEVICE_SM_LIMIT=30\n"
	launch := func(t *testing.T, setup string, path ...string) (float64, string) {
		ldpath := filepath.Join(buildDir, "stub") + ":" + fakeDir
		if len(path) > 0 {
			ldpath = path[0]
		}
		e := env{"LD_LIBRARY_PATH": ldpath,
			"FAKENVML_SAMPLE_MS": "167", "FAKECUDA_PID_OFFSET": "100000",
			"FAKECUDA_STATE": filepath.Join(t.TempDir(), "device")}.hooked()
		kv, logs := inLimitsNamespaceSetup(t, &file, setup, e, "gpa", "launch", "kernel", "5", "2.5")
		return float(t, kv, "util"), logs
	}
	// The driver's folder read-only, as the NVIDIA container toolkit
	// mounts it: that NVML is used and the limit holds at the production
	// period (100 ms; the file sets no other).
	t.Run("the driver's NVML on a read-only mount", func(t *testing.T) {
		ro := fmt.Sprintf("mount --bind %[1]s %[1]s && mount -o remount,bind,ro %[1]s", fakeDir)
		got, logs := launch(t, ro)
		t.Logf("30%% limit, tenant's NVML first on the path, driver's NVML read-only: %.1f%%", got)
		within(t, "30% with the driver's NVML", got, 30, smBand)
		if strings.Contains(logs, "MIG mode") || strings.Contains(logs, "not trusted") {
			t.Errorf("the limiter used the tenant's NVML or distrusted the driver's:\n%s", logs)
		}
	})
	// The NVML beside the driver is writable by this process (root, a
	// writable mount): not trusted either. The limit then holds by the
	// duty cycle, at most the target and never starved.
	t.Run("no trusted NVML: duty cycle", func(t *testing.T) {
		got, logs := launch(t, "")
		t.Logf("30%% limit, no trusted NVML (duty cycle): %.1f%%", got)
		if got > 30+smBand || got < 10 {
			t.Errorf("got %.1f%% of the device, want at most 30 (+%d) and not starved (at least 10)", got, smBand)
		}
		if n := strings.Count(logs, "NVML is not trusted"); n != 1 ||
			!strings.Contains(logs, "is on a writable mount and this process is root") ||
			!strings.Contains(logs, "duty cycle") {
			t.Errorf("want one line saying NVML is not trusted, why, and that the duty cycle applies; got %d:\n%s", n, logs)
		}
	})
	// The driver's folder read-only, but its libnvidia-ml.so.1 a symlink
	// (as ldconfig makes it, in the image's layer) to a stub on another
	// read-only mount (a configMap volume, say): not the driver's
	// filesystem, not trusted.
	t.Run("a symlink to a stub on another read-only mount", func(t *testing.T) {
		d := t.TempDir()
		a, b := filepath.Join(d, "a"), filepath.Join(d, "b")
		setup := fmt.Sprintf(`mkdir -p %[1]s %[2]s
mount -t tmpfs tmpfs %[1]s && mount -t tmpfs tmpfs %[2]s
cp %[3]s/libcuda.so.1 %[1]s/ && cp %[4]s/libnvidia-ml.so.1 %[2]s/stub.so
ln -s %[2]s/stub.so %[1]s/libnvidia-ml.so.1
mount -o remount,ro %[1]s && mount -o remount,ro %[2]s`, a, b, fakeDir, filepath.Join(buildDir, "stub"))
		got, logs := launch(t, setup, a)
		t.Logf("30%% limit, NVML beside the driver a symlink to another mount: %.1f%%", got)
		if got > 30+smBand || got < 10 {
			t.Errorf("got %.1f%% of the device, want the duty cycle: at most 30 (+%d), at least 10", got, smBand)
		}
		if !strings.Contains(logs, "is not on the driver's filesystem") {
			t.Errorf("want the log to say the NVML is not on the driver's filesystem:\n%s", logs)
		}
	})
}

// Review 15: the duty cycle's synchronisation waited for the current
// context only (cuCtxSynchronize). With the fake's per-context sync, as
// the real driver's, a process that launched empty kernels in its primary
// context and 300 ms ones from a second context of the same device paid
// off time for the empty ones only whenever the empty-kernel thread ended a
// phase (84–99 % under 30 %). The duty cycle now waits for every context
// the process holds on the device.
func TestDutyCycleWaitsForEveryContext(t *testing.T) {
	file := "CUDA_DEVICE_SM_LIMIT=30\n"
	e := env{"FAKENVML_SAMPLE_MS": "167", "FAKECUDA_PID_OFFSET": "100000", "FAKECUDA_CTX_SYNC": "1",
		"FAKECUDA_STATE": filepath.Join(t.TempDir(), "device")}.hooked()
	got := shares(t, func() []float64 {
		// No trusted NVML (the fake's folder is writable and we are
		// root in the namespace): the duty cycle holds the limit.
		kv, logs := inLimitsNamespaceSetup(t, &file, "", e, "gpa", "twoctx", "6")
		if !strings.Contains(logs, "duty cycle") {
			t.Fatalf("the duty cycle did not run:\n%s", logs)
		}
		return []float64{float(t, kv, "util")}
	}, 30)
	t.Logf("30%% limit, duty cycle, heavy kernels in a second context: %.1f%%", got[0])
	if got[0] > 30+smBand || got[0] < 10 {
		t.Errorf("got %.1f%% of the device, want at most 30 (+%d), not starved (at least 10)", got[0], smBand)
	}
}
