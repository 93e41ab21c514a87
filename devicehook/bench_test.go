package devicehook

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// The benchmarks run the same C driver with and without LD_PRELOAD in one
// run and report both, the difference and the ratio. The driver times its
// own loop, so process start-up is not in the figures. Run them with
//
//	go test ./devicehook -run '^$' -bench . -benchtime 1000000x
//
// (-benchtime Nx sets the driver's loop count; BenchmarkInit and
// BenchmarkSMShare3070 are best run with -benchtime 3x / 1x.)

func nsPerOp(b *testing.B, e env, args ...string) float64 {
	b.Helper()
	return float(b, run(b, e, args...), "ns_per_op")
}

// pairMin runs the driver plain and hooked, alternately, five times each and
// keeps each side's fastest run: on a shared machine the minimum is the
// figure least disturbed by other load.
func pairMin(b *testing.B, e env, args ...string) (plain, hooked float64) {
	plain, hooked = math.Inf(1), math.Inf(1)
	for range 5 {
		plain = min(plain, nsPerOp(b, e, args...))
		hooked = min(hooked, nsPerOp(b, e.hooked(), args...))
	}
	return plain, hooked
}

func reportPair(b *testing.B, plain, hooked float64) {
	b.ReportMetric(hooked, "ns/op")
	b.ReportMetric(plain, "plain-ns/op")
	b.ReportMetric(hooked-plain, "overhead-ns/op")
	b.ReportMetric(hooked/plain, "ratio")
}

// One cuMemAlloc_v2 + cuMemFree_v2 pair (4 KiB) with a memory limit set and
// a shared cache file, reached through cuGetProcAddress like the runtime.
func BenchmarkAllocFree(b *testing.B) {
	e := env{"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_MEMORY_SHARED_CACHE": filepath.Join(b.TempDir(), "cache")}
	n := fmt.Sprint(max(b.N, 1000))
	plain, hooked := pairMin(b, e, "gpa", "bench-alloc", n, "4096")
	reportPair(b, plain, hooked)
}

// One cuLaunchKernel with no SM limit: the hook's fast path.
func BenchmarkLaunchUnthrottled(b *testing.B) {
	e := env{"CUDA_DEVICE_MEMORY_LIMIT": "1g", "FAKECUDA_STATE": filepath.Join(b.TempDir(), "device")}
	n := fmt.Sprint(max(b.N, 1000))
	plain, hooked := pairMin(b, e, "gpa", "bench-launch", n)
	reportPair(b, plain, hooked)
}

// initTimes starts procs processes at once and returns each one's time for
// its first driver calls (cuInit, primary context, first alloc/free), hook
// initialisation and shared-cache attach included.
func initTimes(b *testing.B, e env, procs int) (wall, cpu []float64) {
	out := make([]float64, procs)
	cpu = make([]float64, procs)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := command(e, "direct", "init-time").Output()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = err
				return
			}
			kv := parseKV(string(o))
			if _, err := fmt.Sscan(kv["init_ns"], &out[i]); err != nil {
				firstErr = fmt.Errorf("init-time said %q: %v", o, err)
			}
			fmt.Sscan(kv["init_cpu_ns"], &cpu[i])
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return out, cpu
}

func quantile(xs []float64, q int) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)*q+99)/100-1]
}

func p99(xs []float64) float64 { return quantile(xs, 99) }

func BenchmarkInit(b *testing.B) {
	for _, procs := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			cache := filepath.Join(b.TempDir(), "cache")
			e := env{"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}
			var plain, hooked, plainCPU, hookedCPU []float64
			for b.Loop() {
				w, c := initTimes(b, e, procs)
				plain, plainCPU = append(plain, w...), append(plainCPU, c...)
				w, c = initTimes(b, e.hooked(), procs)
				hooked, hookedCPU = append(hooked, w...), append(hookedCPU, c...)
			}
			// Wall time includes waiting for a CPU when procs processes start
			// at once on a small machine; CPU time is the hook's own cost.
			b.ReportMetric(p99(hooked), "p99-hooked-ns")
			b.ReportMetric(p99(plain), "p99-plain-ns")
			b.ReportMetric(quantile(hooked, 50), "p50-hooked-ns")
			b.ReportMetric(p99(hookedCPU), "p99-hooked-cpu-ns")
			b.ReportMetric(p99(plainCPU), "p99-plain-cpu-ns")
		})
	}
}

// SM share of two processes limited to 30 % and 70 % on the fake clock,
// and of the same two processes without the hook.
func BenchmarkSMShare3070(b *testing.B) {
	for b.Loop() {
		hooked := launchUtil(b, "kernel", 3, 1, limited(30), limited(70))
		plain := launchUtil(b, "kernel", 3, 1, env{}, env{})
		b.ReportMetric(hooked[0], "share30-%")
		b.ReportMetric(hooked[1], "share70-%")
		b.ReportMetric(plain[0], "plain-a-%")
		b.ReportMetric(plain[1], "plain-b-%")
	}
}
