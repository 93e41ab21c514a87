package devicehook

import (
	"fmt"
	"testing"
)

// Issue 15 M7 (with the fake's stream-ordered free, L2): a block freed
// with cuMemFreeAsync stays in use until its stream reaches the free. A
// request for the same size on another stream before that would make the
// pool grow, so under a limit the block held it is refused before it
// reaches the driver; on the same stream (stream order: the driver reuses
// the block) and after a synchronisation it is served. Before, the free
// counted as done at the call: the other stream's request went to the
// driver uncharged, the pool grew to twice the limit, and the hook took it
// back only afterwards.
func TestStreamOrderedFreeIsUnchargedWhenItRuns(t *testing.T) {
	const limit = 64 * mib
	for _, mode := range []string{"direct", "gpa", "gpa-ptsz"} {
		t.Run(mode, func(t *testing.T) {
			e := env{"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKECUDA_MEM": fmt.Sprint(1 * gib),
				"FAKECUDA_QUEUE_NS": fmt.Sprint(int64(10e9))}.hooked()
			kv := run(t, e, mode, "freeasync", fmt.Sprint(limit), "1500")
			if kv["other"] != "2" || kv["reached"] != "0" {
				t.Errorf("another stream's request while the free was pending: rc %s, reached the driver %s; want 2 (out of memory), 0 (%v)",
					kv["other"], kv["reached"], kv)
			}
			if got := num(t, kv, "max_used"); got > limit {
				t.Errorf("the device held %d MiB under a %d MiB limit", got/mib, limit/mib)
			}
			if kv["same"] != "0" || kv["after"] != "0" {
				t.Errorf("the same stream's request (stream-ordered reuse) and the one after synchronising must be served: %v", kv)
			}
		})
	}
}

// Issue 15 M3: cuMemAllocAsync allocates on its stream's device, not the
// current context's: a stream of device 1 (limited to 64 MiB) used with
// device 0 (no limit) current is charged to device 1. Before, the charge
// went to device 0 and device 1 filled to its physical size.
func TestAllocAsyncIsChargedToTheStreamsDevice(t *testing.T) {
	const chunk = 4 * mib
	for _, mode := range []string{"direct", "gpa"} {
		t.Run(mode, func(t *testing.T) {
			e := env{"CUDA_DEVICE_MEMORY_LIMIT_1": "64m", "FAKECUDA_MEM": fmt.Sprint(1 * gib)}.hooked()
			kv := run(t, e, mode, "streamdev", fmt.Sprint(chunk))
			if n := num(t, kv, "n"); n*chunk != 64*mib {
				t.Errorf("got %d MiB on device 1 under its 64 MiB limit (%v)", n*chunk/mib, kv)
			}
			if u := num(t, kv, "used1"); u > 64*mib {
				t.Errorf("device 1 holds %d MiB under a 64 MiB limit", u/mib)
			}
		})
	}
}
