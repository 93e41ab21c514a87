package devicehook

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"testing"
)

// launchUtil runs one `launch` process per env concurrently on one fake
// device and returns each one's share of the simulated device time.
func launchUtil(t testing.TB, api string, secs, warm float64, envs ...env) []float64 {
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
		cmd := command(e2, "gpa", "launch", api, fmt.Sprint(secs), fmt.Sprint(warm))
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

func limited(pct int) env {
	return env{"CUDA_DEVICE_SM_LIMIT": fmt.Sprint(pct), "GPUPACK_SM_PERIOD_MS": "10"}.hooked()
}

// Two containers at 30 % and 70 % competing for one device get 30/70 of
// its time (± 5 points); without the hook they would split it 50/50.
func TestSMLimiterShare3070(t *testing.T) {
	got := launchUtil(t, "kernel", 3, 1, limited(30), limited(70))
	t.Logf("device share with limits 30/70: %.1f / %.1f", got[0], got[1])
	for i, want := range []float64{30, 70} {
		if math.Abs(got[i]-want) > 5 {
			t.Errorf("process limited to %.0f%% got %.1f%% of the device", want, got[i])
		}
	}
}

// Every launch API is throttled: a lone 30 % process does not take the
// idle device (the unthrottled baseline would be ~100 %).
func TestSMLimiterCoversEveryLaunchAPI(t *testing.T) {
	for _, api := range []string{"kernel", "ex", "coop", "graph"} {
		t.Run(api, func(t *testing.T) {
			got := launchUtil(t, api, 3, 1, limited(30))[0]
			if math.Abs(got-30) > 5 {
				t.Errorf("%s launches limited to 30%% used %.1f%% of the device", api, got)
			}
		})
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
	got := launchUtil(t, "kernel", 3, 1, e, e)
	t.Logf("two processes of one container at 30%%: %.1f + %.1f", got[0], got[1])
	if sum := got[0] + got[1]; math.Abs(sum-30) > 5 {
		t.Errorf("a container limited to 30%% used %.1f%% of the device (%.1f + %.1f)", sum, got[0], got[1])
	}
}
