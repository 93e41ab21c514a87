package devicehook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The hook15 review's PoC "slots full": 1024 idle processes of a
// container hold every slot of its accounting file, and every later
// process ran without one: limited per process, its host pid in no slot
// (the container's other processes never count its utilisation) and its
// unreported span recorded nowhere (never charged). Its memory was
// already refused; under an SM limit its launches are now refused too,
// as they are when the file cannot be used at all. Without an SM limit
// nothing changes for launches.
func TestSlotlessProcessLaunchesAreRefusedUnderAnSMLimit(t *testing.T) {
	full := func(t *testing.T) string {
		// Every slot owned by a live process (this test's), with no start
		// time recorded: nobody may reclaim them.
		slots := make([]slot, 1024)
		for i := range slots {
			slots[i] = slot{owner: uint64(os.Getpid())}
		}
		cache := filepath.Join(t.TempDir(), "cache")
		writeRegion(t, cache, slots)
		return cache
	}
	foreign := func(t *testing.T) string {
		cache := filepath.Join(t.TempDir(), "cache")
		if err := os.WriteFile(cache, []byte("HAMi-core shared region, not ours"), 0o644); err != nil {
			t.Fatal(err)
		}
		return cache
	}
	for _, c := range []struct {
		name  string
		cache func(*testing.T) string
	}{{"every slot held", full}, {"a foreign file", foreign}} {
		t.Run(c.name, func(t *testing.T) {
			e := limited(30)
			e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = c.cache(t)
			e["FAKECUDA_STATE"] = filepath.Join(t.TempDir(), "device")
			out, err := command(e, "gpa", "launch", "kernel", "1", "0").CombinedOutput()
			if err == nil || !strings.Contains(string(out), "hooktest: launch failed: 800") {
				t.Errorf("a process with no slot under an SM limit launched (want CUDA_ERROR_NOT_PERMITTED, 800): %v\n%s", err, out)
			}
			if n := strings.Count(string(out), "its launches are refused"); n != 1 {
				t.Errorf("want one ERROR line saying the launches are refused, got %d:\n%s", n, out)
			}
			// No SM limit: launches are not the accounting file's business.
			e2 := env{"FAKECUDA_STATE": e["FAKECUDA_STATE"], "CUDA_DEVICE_MEMORY_SHARED_CACHE": e["CUDA_DEVICE_MEMORY_SHARED_CACHE"]}.hooked()
			if out, err := command(e2, "gpa", "launch", "kernel", "0.3", "0").CombinedOutput(); err != nil {
				t.Errorf("without an SM limit a slotless process must still launch: %v\n%s", err, out)
			}
		})
	}
}
