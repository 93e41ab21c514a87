package devicehook

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A context costs device memory (the fake: FAKECUDA_CTX_MEM, a real H100
// 300-600 MiB). It is charged per context, measured from NVML's
// per-process memory around the creation, without any reserve configured:
// before, a container could exceed its limit by one context per process.
func TestContextMemoryIsCharged(t *testing.T) {
	const ctxMem, chunk = 24 * mib, 4 * mib
	base := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"FAKECUDA_CTX_MEM": fmt.Sprint(ctxMem), "FAKECUDA_PID_OFFSET": "70000"}
	for _, mode := range []string{"direct", "gpa"} {
		t.Run(mode, func(t *testing.T) {
			kv := run(t, base.hooked(), mode, "grab", fmt.Sprint(chunk))
			if got, want := num(t, kv, "n"), (64*mib-ctxMem)/chunk; got != want {
				t.Errorf("got %d chunks of 4 MiB next to a 24 MiB context under 64 MiB, want %d", got, want)
			}
		})
	}
	// The configured reserve (the device plugin's per-model default) is the
	// floor: a context grows after creation, which no delta sees.
	for _, c := range []struct {
		name         string
		ctxMem, want int64
		reserve      string
	}{{"measured above the reserve", 24 * mib, 10, "8m"}, {"reserve above the measured", 8 * mib, 8, "32m"}} {
		t.Run(c.name, func(t *testing.T) {
			e := base.hooked()
			e["GPUPACK_CONTEXT_RESERVE"] = c.reserve
			e["FAKECUDA_CTX_MEM"] = fmt.Sprint(c.ctxMem)
			if got := num(t, run(t, e, "direct", "grab", fmt.Sprint(chunk)), "n"); got != c.want {
				t.Errorf("got %d chunks, want %d", got, c.want)
			}
		})
	}
}

// With no reserve configured (the environment's and HAMi's default) the
// measured context cost is settled against the limit: a context that does
// not fit once measured is destroyed and refused. Before, the measured
// cost was charged past the limit, one context at a time without bound
// (the review's 200 contexts x 300 MiB under a 64 MiB limit).
func TestContextOverLimitIsDestroyed(t *testing.T) {
	const chunk = 4 * mib
	for _, c := range []struct {
		name   string
		ctxMem int64
		want   map[string]string
	}{
		// 24 MiB each under 64: the primary and one more fit, 16 MiB left.
		{"two fit", 24 * mib, map[string]string{"primary_rc": "0", "created": "1", "create_rc": "2", "n": "4"}},
		// 300 MiB: not even the primary context fits.
		{"none fits", 300 * mib, map[string]string{"primary_rc": "2", "created": "0", "create_rc": "2", "n": "0"}},
	} {
		for _, mode := range []string{"direct", "gpa"} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				e := env{"FAKECUDA_MEM": fmt.Sprint(80 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
					"FAKECUDA_CTX_MEM": fmt.Sprint(c.ctxMem), "FAKECUDA_PID_OFFSET": "70000"}.hooked()
				kv := run(t, e, mode, "ctxloop", "200", fmt.Sprint(chunk))
				if d := cmp.Diff(c.want, kv); d != "" {
					t.Errorf("(-want +got):\n%s", d)
				}
			})
		}
	}
}

// cuCtxSetLimit reserves device memory: the malloc heap, and the stack of
// every resident thread (a 2 KiB stack costs 264 MiB on the fake's H100
// shape, 64 KiB ~17 GiB on a real one). Growth is charged, refused past
// the limit before the driver is asked, and given back on shrinking.
// The device runtime's limits (issue 15 M5) reserve memory at a cost the
// hook cannot know: under a limit their growth is refused (2 =
// CUDA_ERROR_OUT_OF_MEMORY) and the device holds nothing more; the same
// value and shrinking pass. Before, a 64K pending-launch buffer and 8
// sync levels took 223 MiB of the fake's device under a 64 MiB limit.
func TestCtxSetLimitGrowthIsCharged(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		kv := run(t, e, mode, "ctxlimit", fmt.Sprint(4*mib))
		want := map[string]string{"heap_rc": "0", "with_heap": "10", "stack_rc": "2", "after_shrink": "16",
			"pending_rc": "2", "sync_rc": "2", "same_rc": "0", "shrink_rc": "0", "devrt_grew_mib": "0"}
		if d := cmp.Diff(want, kv); d != "" {
			t.Errorf("via %s (-want +got):\n%s", mode, d)
		}
	}
}
