package devicehook

import (
	"fmt"
	"path/filepath"
	"testing"
)

// Session 13 review: NVML's smUtil is a whole percent, and a 0 % sample
// taught the limiter nothing. Before calibration a process is paced by
// the fail-closed duty cycle, whose synchronisation next to a busy
// neighbour also waits out the neighbour's queued work; it ran under 1 %,
// was listed at 0 % and never calibrated: 0.12 % under a 10 % limit and
// 0.03 % under 5 % next to an unlimited neighbour. A 0 % sample now bounds
// what a launch costs (the limiter calibrates from the bound and raises
// its rate from it while the bound stands).
func TestSMLimiterLowLimitNextToABusyNeighbour(t *testing.T) {
	neighbour := env{"FAKENVML_SAMPLE_MS": "167", "FAKECUDA_PID_OFFSET": "300000"}.hooked()
	for _, pct := range []int{10, 5} {
		t.Run(fmt.Sprintf("%d%%", pct), func(t *testing.T) {
			got := shares(t, func() []float64 { return launchUtil(t, "kernel", 6, 3, limited(pct), neighbour) }, float64(pct))
			t.Logf("%d%% next to an unlimited neighbour: %.2f / %.1f", pct, got[0], got[1])
			lowShare(t, fmt.Sprintf("the %d%% container", pct), got[0], pct)
		})
	}
}

// The same bound must not lock a light start low: a process that
// calibrates from a few launches (warm-up, a server before its traffic)
// has a rate far below what its later demand needs, and a calibrated
// limiter that learnt nothing more from 0 % samples kept it (the rule
// first tried: 0.20 % under a 10 % limit). While the rate holds the
// process back and NVML reads it at 0 %, the bound raises the rate again.
func TestSMLimiterLightStartGrowsWithDemand(t *testing.T) {
	light := func(pct int) env {
		e := limited(pct)
		// 100 us kernels every 20 ms (0.5 %) for 2.5 s, then flat out.
		e["HOOKTEST_FIRST"] = "k1000:2500"
		e["HOOKTEST_FIRST_GAP_US"] = "20000"
		return e
	}
	t.Run("alone", func(t *testing.T) {
		got := shares(t, func() []float64 { return launchUtil(t, "kernel", 8, 5, light(10)) }, 10)
		t.Logf("10%% after a light start, alone: %.2f", got[0])
		lowShare(t, "10% after a light start", got[0], 10)
	})
	t.Run("next to an unlimited neighbour", func(t *testing.T) {
		neighbour := env{"FAKENVML_SAMPLE_MS": "167", "FAKECUDA_PID_OFFSET": "300000"}.hooked()
		got := shares(t, func() []float64 { return launchUtil(t, "kernel", 8, 5, light(10), neighbour) }, 10)
		t.Logf("10%% after a light start, next to an unlimited neighbour: %.2f / %.1f", got[0], got[1])
		lowShare(t, "10% after a light start next to a neighbour", got[0], 10)
	})
}

// lowShare asserts a low limit's share: smBand either side would accept a
// 5 % container starved to 0, so the share must also be at least half the
// limit.
func lowShare(t *testing.T, what string, got float64, pct int) {
	t.Helper()
	if got < float64(pct)/2 || got > float64(pct)+smBand {
		t.Errorf("%s: got %.2f%% of the device, want %d%% (at least %.1f, at most %d)", what, got, pct,
			float64(pct)/2, pct+smBand)
	}
}

// Session 13 review: the container's budget summed NVML's whole-percent
// smUtil, so each process kept just under 1 % of every window was charged
// nothing, and m such processes took about m % beyond the limit. Here 24
// processes of one container under a 10 % limit each launch a 100 us
// kernel every 12 ms (~0.8 % each, ~19 % together, every one read at
// 0 %). A listed process of the container read at 0 % is now charged 1 %.
func TestSMBudgetChargesSharesUnderOnePercent(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	envs := make([]env, 24)
	for i := range envs {
		e := limited(10)
		e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache
		e["HOOKTEST_GAP_US"] = "12000"
		e["GPUPACK_SM_PERIOD_MS"] = "100" // 24 control threads at 10 ms would starve the 2-core box
		envs[i] = e
	}
	measure := func() []float64 {
		got := launchUtil(t, "kernel", 7, 3, envs...)
		sum := 0.0
		for _, g := range got {
			sum += g
		}
		return []float64{sum}
	}
	got := shares(t, measure, 10)
	t.Logf("24 processes of one container at 10%%, each under 1%%: %.1f%% together", got[0])
	// Their demand is ~19 %; the limit itself is the bound (without the
	// 1 % charge 11.3-13.2 % here, with it ~3 %: see docs/devicehook.md
	// for what this costs a container of many sparse processes).
	if got[0] > 10 {
		t.Errorf("a container limited to 10%% used %.1f%% of the device in processes NVML reads at 0 %%", got[0])
	}
}
