package devicehook

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// launchUtil runs one `launch` process per env concurrently on one fake
// device and returns each one's share of the simulated device time.
func launchUtil(t testing.TB, api string, secs, warm float64, envs ...env) []float64 {
	t.Helper()
	return launchUtilMode(t, "gpa", api, secs, warm, envs...)
}

func launchUtilMode(t testing.TB, mode, api string, secs, warm float64, envs ...env) []float64 {
	t.Helper()
	state := filepath.Join(t.TempDir(), "device")
	utils := make([]float64, len(envs))
	var wg sync.WaitGroup
	errs := make([]error, len(envs))
	outs := make([]bytes.Buffer, len(envs))
	for i, e := range envs {
		e2 := env{"FAKECUDA_STATE": state}
		for k, v := range e {
			e2[k] = v
		}
		cmd := command(e2, mode, "launch", api, fmt.Sprint(secs), fmt.Sprint(warm))
		cmd.Stdout = &outs[i]
		cmd.Stderr = &outs[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Run()
		}()
	}
	wg.Wait()
	for i := range envs {
		if errs[i] != nil {
			t.Fatalf("launch %d: %v: %s", i, errs[i], outs[i].String())
		}
		utils[i] = float(t, parseKV(outs[i].String()), "util")
	}
	return utils
}

// limited is a container at pct % next to others on one device, as a real
// node shows it: NVML samples every cadence ms (NOT_FOUND in between) and
// numbers the container's processes with host pids (offset).
func limitedAt(pct, cadenceMs, pidOffset int) env {
	return env{"CUDA_DEVICE_SM_LIMIT": fmt.Sprint(pct), "GPUPACK_SM_PERIOD_MS": "10",
		"FAKENVML_SAMPLE_MS": fmt.Sprint(cadenceMs), "FAKECUDA_PID_OFFSET": fmt.Sprint(pidOffset)}.hooked()
}

func limited(pct int) env { return limitedAt(pct, 167, 100000+pct*1000) }

// How long a share test runs and how much of it is warm-up, for a cadence:
// the limiter calibrates on the second sample.
func spanFor(cadenceMs int) (secs, warm float64) {
	if cadenceMs >= 1000 {
		return 9, 4
	}
	return 4, 2
}

// smBand is what the limiter tests assert: wider than the ±5 points the
// limiter reaches (docs/bench/devicehook.md), because on a shared 2-core VM
// a starved launcher or NVML sampler shifts single runs; the old limiter's
// failures (100 %, 50/50) are far outside it.
const smBand = 8

// shares runs a share measurement and, if any share is outside smBand of
// its target, runs it once more and keeps the second (logging the first):
// a single run on the shared VM can be thrown off by a CPU stall, while
// the defect this guards against (100 %, 50/50) fails both runs.
func shares(t *testing.T, measure func() []float64, want ...float64) []float64 {
	t.Helper()
	got := measure()
	for i, w := range want {
		if math.Abs(got[i]-w) > smBand {
			t.Logf("shares %v outside ±%d of %v; measuring once more", got, smBand, want)
			return measure()
		}
	}
	return got
}

func within(t *testing.T, what string, got, want, band float64) {
	t.Helper()
	if math.Abs(got-want) > band {
		t.Errorf("%s: got %.1f%% of the device, want %.0f%% ± %.0f", what, got, want, band)
	}
}

// A 30 % container alone on an idle device stays at ~30 %: NOT_FOUND
// between NVML samples is no information, not "0 % busy" (which doubled
// the rate every period: 93.6 % at 1/6 s, 99.9 % at 1 s before).
func TestSMLimiterHoldsTheCapAlone(t *testing.T) {
	for _, cadence := range []int{167, 1000} {
		t.Run(fmt.Sprintf("cadence=%dms", cadence), func(t *testing.T) {
			secs, warm := spanFor(cadence)
			got := shares(t, func() []float64 {
				return launchUtil(t, "kernel", secs, warm, limitedAt(30, cadence, 100000))
			}, 30)
			t.Logf("30%% alone, NVML every %d ms, host pids: %.1f%%", cadence, got[0])
			within(t, "30% alone", got[0], 30, smBand)
		})
	}
}

// Two containers at 30 % and 70 % competing for one device get 30/70 of
// its time: each is charged only its own host pids (before, the
// whole-device fallback charged each for the other: 0.7 % / 72 %).
func TestSMLimiterShare3070(t *testing.T) {
	for _, cadence := range []int{167, 1000} {
		t.Run(fmt.Sprintf("cadence=%dms", cadence), func(t *testing.T) {
			secs, warm := spanFor(cadence)
			got := shares(t, func() []float64 {
				return launchUtil(t, "kernel", secs, warm, limitedAt(30, cadence, 100000), limitedAt(70, cadence, 200000))
			}, 30, 70)
			t.Logf("30/70, NVML every %d ms, host pids: %.1f / %.1f", cadence, got[0], got[1])
			within(t, "the 30% container", got[0], 30, smBand)
			within(t, "the 70% container", got[1], 70, smBand)
		})
	}
}

// A 30 % container next to an unlimited one still gets its 30 % (before:
// 0.6 %, charged for its neighbour, no floor).
func TestSMLimiterNextToAnUnlimitedNeighbour(t *testing.T) {
	neighbour := env{"FAKENVML_SAMPLE_MS": "167", "FAKECUDA_PID_OFFSET": "300000"}.hooked()
	got := shares(t, func() []float64 { return launchUtil(t, "kernel", 4, 2, limited(30), neighbour) }, 30)
	t.Logf("30%% next to an unlimited neighbour: %.1f / %.1f", got[0], got[1])
	within(t, "the 30% container", got[0], 30, smBand)
}

// Every launch API is throttled: a lone 30 % process does not take the
// idle device (the unthrottled baseline would be ~100 %).
func TestSMLimiterCoversEveryLaunchAPI(t *testing.T) {
	for _, mode := range []string{"gpa", "gpa-ptsz"} {
		for _, api := range []string{"kernel", "ex", "coop", "graph"} {
			t.Run(mode+"/"+api, func(t *testing.T) {
				got := shares(t, func() []float64 { return launchUtilMode(t, mode, api, 3, 1.5, limited(30)) }, 30)[0]
				within(t, api+" launches limited to 30%", got, 30, smBand)
			})
		}
	}
	if got := launchUtil(t, "kernel", 1.5, 0.5, env{}.hooked())[0]; got < 80 {
		t.Errorf("unthrottled process used only %.1f%% of an idle device", got)
	}
}

// Two processes of one container (one shared cache file) share its SM
// limit: together they get 30 %, not 30 % each.
func TestSMLimitIsPerContainer(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	e := limited(30)
	e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache
	got := launchUtil(t, "kernel", 4, 2, e, e)
	t.Logf("two processes of one container at 30%%: %.1f + %.1f", got[0], got[1])
	if sum := got[0] + got[1]; math.Abs(sum-30) > smBand {
		t.Errorf("a container limited to 30%% used %.1f%% of the device (%.1f + %.1f)", sum, got[0], got[1])
	}
}

// On a MIG device the slice bounds the SMs and NVML has no per-process
// utilisation: the hook says once that the SM limit does not apply and
// does not throttle (before, it silently ran on whatever NVML gave).
func TestSMLimitOnMIGSaysItDoesNotApply(t *testing.T) {
	e := limited(30)
	e["FAKENVML_MIG"] = "1"
	state := filepath.Join(t.TempDir(), "device")
	e["FAKECUDA_STATE"] = state
	out, err := command(e, "gpa", "launch", "kernel", "1.5", "0.5").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if n := strings.Count(string(out), "device 0 is in MIG mode: CUDA_DEVICE_SM_LIMIT=30 does not apply"); n != 1 {
		t.Errorf("want one warning for device 0 that the SM limit does not apply on MIG, got %d:\n%s", n, out)
	}
	if got := float(t, parseKV(string(out)), "util"); got < 80 {
		t.Errorf("on MIG the process should run unthrottled, got %.1f%%", got)
	}
}
