package devicehook

import (
	"fmt"
	"path/filepath"
	"testing"

	api "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Issue 15 L3: a step of the wall clock (what NVML stamps samples with)
// neither stalls nor unleashes the limiter. Two seconds in, the clock
// steps (clockstep.so, preloaded before the hook; the machine's clock is
// untouched) and at the same moment the kernels start taking 3x the device
// time per block, so the limiter must keep learning to hold 30 %. Before,
// the control ring was in wall-clock time and NVML's stamps compared with
// the last one seen: after a step back every sample looked stale, nothing
// was learnt, and the old rate let the heavy kernels take ~90 %.
func TestSMLimiterSurvivesAClockStep(t *testing.T) {
	for _, step := range []int{0, -30000, 30000} {
		t.Run(fmt.Sprintf("step=%dms", step), func(t *testing.T) {
			e := limitedAt(30, 167, 100000)
			e[api.EnvLDPreload] = filepath.Join(buildDir, "stub", "clockstep.so") + " " + hookLib
			e["FAKECLOCK_STEP_MS"] = fmt.Sprint(step)
			e["FAKECLOCK_STEP_AFTER_MS"] = "2000"
			e["HOOKTEST_HEAVY_AFTER_MS"] = "2000"
			got := shares(t, func() []float64 { return launchUtil(t, "kernel", 7, 4, e) }, 30)
			t.Logf("30%% limit, wall clock stepped by %d ms and kernels 3x heavier at 2 s: %.1f%%", step, got[0])
			within(t, "30% across a clock step", got[0], 30, smBand)
		})
	}
}
