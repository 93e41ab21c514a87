package devicehook

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freshProcessShare runs, back to back for secs, one `onekernel kernel`
// process after another in one container (one shared cache, one fake
// device) and returns the container's share of the device: the device
// time of all of them over the wall time from the first start to the last
// exit.
func freshProcessShare(t *testing.T, kernel string, secs float64, e env) float64 {
	t.Helper()
	dir := t.TempDir()
	e2 := env{"FAKECUDA_STATE": filepath.Join(dir, "device"), "CUDA_DEVICE_MEMORY_SHARED_CACHE": filepath.Join(dir, "cache")}
	for k, v := range e {
		e2[k] = v
	}
	t0 := time.Now()
	var busy int64
	n := 0
	for time.Since(t0).Seconds() < secs {
		if e2["HOOKTEST_SIGKILL_AFTER_MS"] == "" {
			busy += num(t, run(t, e2, "gpa", "onekernel", kernel), "busy_ns")
		} else {
			// Killed by itself: only its stdout (the device time it
			// booked) is wanted, and the kill is the expected end.
			cmd := command(e2, "gpa", "onekernel", kernel)
			out, err := cmd.Output()
			var ee *exec.ExitError
			if err != nil && !(errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL) {
				t.Fatalf("onekernel: %v: %s", err, out)
			}
			busy += num(t, parseKV(string(out)), "busy_ns")
		}
		n++
	}
	share := 100 * float64(busy) / float64(time.Since(t0).Nanoseconds())
	t.Logf("%d processes, one %s each: %.1f%%", n, kernel, share)
	return share
}

// Review 15: the SM budget, its debt and the duty cycle were per process,
// so a container that ran each long kernel in a fresh process never paid
// for it: every process started with a clean budget, its first launch
// passed, and its debt died with it (96.5 % under a 30 % limit). The
// budget is now the container's, in the shared accounting region: a
// fresh process starts from the container's debt (and what the last
// process ran after its last sample is charged by the next one, which
// still finds its host pid among the container's recently departed).
func TestSMBudgetIsContainerWide(t *testing.T) {
	for _, c := range []struct {
		name    string
		kernel  string
		cadence int
	}{
		{"300ms kernels, NVML every 1/6 s", "k3000000", 167},
		{"300ms kernels, NVML every 1 s", "k3000000", 1000},
		{"300ms kernels, each process SIGKILLed 200 ms into its kernel", "k3000000", 167},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := limitedAt(30, c.cadence, 100000)
			if strings.Contains(c.name, "SIGKILL") {
				// No destructor: the reclaimer settles what it ran.
				e["HOOKTEST_SIGKILL_AFTER_MS"] = "200"
			}
			got := shares(t, func() []float64 {
				return []float64{freshProcessShare(t, c.kernel, 8, e)}
			}, 30)
			within(t, "a fresh process per 300 ms kernel at 30%", got[0], 30, smBand)
		})
	}
}

// hook15 review L5: CUDA_DEVICE_SM_LIMIT applies to every index, and the
// limiter asked NVML for each, one WARN line per device the driver does not
// have. Only devices below cuDeviceGetCount are looked up.
func TestSMLimiterLooksUpOnlyDevicesThatExist(t *testing.T) {
	e := limitedAt(30, 167, 100000)
	e["FAKECUDA_DEVICES"] = "2"
	cmd := command(e, "gpa", "launch", "kernel", "1", "0") // 1 s: the control thread ticks
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		t.Fatalf("onekernel: %v\n%s\n%s", err, out, stderr.String())
	}
	if strings.Contains(stderr.String(), "NVML cannot be asked") {
		t.Errorf("a WARN line for a device the driver does not have:\n%s", stderr.String())
	}
}
