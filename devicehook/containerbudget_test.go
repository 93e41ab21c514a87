package devicehook

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// relayProg is a tenant's own CUDA program (plain driver API, linked
// against libcuda as any would be): it initialises and creates its context
// (no launch yet: the hook's control thread is not started), waits for its
// turn on a lock file, launches one kernel, waits for it and SIGKILLs
// itself, which passes the lock to the next pre-warmed process. Each
// process's life after its first launch is one kernel (< the 100 ms
// control period), so no control thread of the container ever ticks.
const relayProg = `
#include "cuda_types.h"
CUresult cuInit(unsigned); CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice); CUresult cuCtxSetCurrent(CUcontext);
CUresult cuModuleLoadData(CUmodule *, const void *); CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuCtxSynchronize(void);
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>
#include <stdint.h>
#include <string.h>
int fakecuda_busy(int dev, uint64_t *pids, uint64_t *busy, int max);
int main(int argc, char **argv)
{
	CUdevice d; CUcontext c; CUmodule m; CUfunction f;
	if (argc > 1 && !strcmp(argv[1], "hold")) { /* a slot holder: the hook's init, no context */
		cuInit(0);
		printf("held\n");
		fflush(stdout);
		pause();
	}
	if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c))
		return 3;
	cuModuleLoadData(&m, "");
	cuModuleGetFunction(&f, m, argv[2]);
	int fd = open(argv[1], O_RDWR | O_CREAT, 0666);
	if (fd < 0 || flock(fd, LOCK_EX) != 0)
		return 4;
	if (cuLaunchKernel(f, 100, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL))
		return 5;
	cuCtxSynchronize();
	uint64_t pids[256], busy[256], mine = 0;
	int n = fakecuda_busy(0, pids, busy, 256);
	for (int i = 0; i < n; i++)
		if (pids[i] == (uint64_t)getpid())
			mine = busy[i];
	printf("busy_ns=%llu\n", (unsigned long long)mine);
	fflush(stdout);
	if (getenv("RELAY_HOLD_MS"))
		usleep(atoi(getenv("RELAY_HOLD_MS")) * 1000);
	if (getenv("RELAY_EXIT"))
		_exit(0); /* no destructors: the slot stays, as after a SIGKILL */
	kill(getpid(), SIGKILL);
	return 0;
}
`

func buildRelay(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "relay.c")
	if err := os.WriteFile(src, []byte(relayProg), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "relay")
	out, err := exec.Command("cc", "-O1", "-I"+filepath.Join(filepath.Dir(hookLib), "..", "src"), "-o", bin, src,
		"-L"+fakeDir, "-lcuda").CombinedOutput()
	if err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return bin
}

// relayShare runs `workers` chains of relay processes for secs in one
// container and returns its share of the device.
func relayShare(t *testing.T, bin string, workers int, kernel string, secs float64, e env) float64 {
	return relayShareWrapped(t, nil, bin, workers, kernel, secs, e)
}

func relayShareWrapped(t *testing.T, wrap []string, bin string, workers int, kernel string, secs float64, e env) float64 {
	t.Helper()
	dir := t.TempDir()
	e2 := env{"FAKECUDA_STATE": filepath.Join(dir, "device"), "CUDA_DEVICE_MEMORY_SHARED_CACHE": filepath.Join(dir, "cache")}
	for k, v := range e {
		e2[k] = v
	}
	lock := filepath.Join(dir, "turn")
	t0 := time.Now()
	var mu sync.Mutex
	var busy int64
	n := 0
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(t0).Seconds() < secs {
				args := append(append([]string{}, wrap...), bin, lock, kernel)
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Env = e2.list()
				out, _ := cmd.Output()
				v, err := strconv.ParseInt(parseKV(string(out))["busy_ns"], 10, 64)
				if err != nil {
					continue
				}
				mu.Lock()
				busy += v
				n++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	share := 100 * float64(busy) / float64(time.Since(t0).Nanoseconds())
	t.Logf("%d relay processes (%d pre-warmed at a time), one %s each: %.1f%%", n, workers, kernel, share)
	return share
}

// Hook15 review H1: a relay of pre-warmed processes (each creates its
// context, waits for its turn on a lock file, launches one 80 ms kernel,
// waits for it and SIGKILLs itself or _exit()s) was never charged: no
// process lived long enough for its control thread to tick, so none polled
// NVML, and each dead slot's unreported span ended at its last tick, before
// its first launch: 63.8-73.0 % under 30 %. Now a process's first launch
// reclaims the container's dead slots first, and a reclaimed span runs at
// least to the reclaim (capped at one cadence and one period).
func TestSMBudgetChargesARelayOfPrewarmedProcesses(t *testing.T) {
	bin := buildRelay(t)
	for _, c := range []struct {
		name    string
		cadence int
		exit    bool
	}{{"SIGKILL, NVML every 167 ms", 167, false}, {"SIGKILL, NVML every 1 s", 1000, false},
		{"_exit, NVML every 167 ms", 167, true}} {
		t.Run(c.name, func(t *testing.T) {
			e := limitedAt(30, c.cadence, 100000)
			e["GPUPACK_SM_PERIOD_MS"] = "100" // the limits file's (fixed) period
			if c.exit {
				e["RELAY_EXIT"] = "1"
			}
			// The charge is conservative: each process is charged from
			// its launch to its reclaim (at most one cadence plus one
			// period), which on a loaded box comes well after its
			// kernel ended (15-27 % at load 4-9 on the 2-core VM). So
			// the bound is one-sided, as for long kernels, with a floor
			// that says the relay is not starved; the defect is 86-91 %.
			got := relayShare(t, bin, 4, "k800000", 8, e)
			if got > 30+smBand {
				t.Logf("%.1f%% above 30 + %d; measuring once more", got, smBand)
				got = relayShare(t, bin, 4, "k800000", 8, e)
			}
			if got > 30+smBand || got < 5 {
				t.Errorf("a relay of pre-warmed processes at 30%%: got %.1f%% of the device, want 5..%d%%", got, 30+smBand)
			}
		})
	}
}

// Hook15 review M2: a tenant that replaced her accounting file by one of the
// older layout (the slots alone, the magic) had every later process take the
// SM budget per process again (the file's size versions it), and a fresh
// process per 300 ms kernel never paid: 77-80 % under 30 %. Under an SM
// limit the file is grown to the current layout in place where there is
// room, so the budget is the container's again.
func TestSMBudgetSurvivesADowngradeToTheOlderLayout(t *testing.T) {
	e := limitedAt(30, 167, 100000)
	e["GPUPACK_SM_PERIOD_MS"] = "100"
	dir := t.TempDir()
	cache := filepath.Join(dir, "v1cache")
	b := make([]byte, regionV1Size)
	binary.LittleEndian.PutUint64(b, 0x6770706b68303031) // "gppkh001"
	if err := os.WriteFile(cache, b, 0o666); err != nil {
		t.Fatal(err)
	}
	e["FAKECUDA_STATE"] = filepath.Join(dir, "device")
	e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache
	got := sharesWithin(t, smBand, func() []float64 {
		t0 := time.Now()
		var busy int64
		n := 0
		for time.Since(t0).Seconds() < 8 {
			busy += num(t, run(t, e, "gpa", "onekernel", "k3000000"), "busy_ns")
			n++
		}
		share := 100 * float64(busy) / float64(time.Since(t0).Nanoseconds())
		t.Logf("%d processes on a cache downgraded to the older layout: %.1f%%", n, share)
		return []float64{share}
	}, 30)
	within(t, "fresh process per 300 ms kernel, cache downgraded to the older layout, at 30%", got[0], 30, smBand)
	if st, err := os.Stat(cache); err != nil || st.Size() == regionV1Size {
		t.Errorf("the older-layout file was not grown under an SM limit: %v %v", st, err)
	}
}
