package devicehook

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 14 finding 7: the hook kept limits and the shared region per CUDA
// device ordinal, and the ordinal is what the tenant's CUDA_VISIBLE_DEVICES
// makes it. With GPUPACK_DEVICE_UUID_<i> in the trusted limits file every
// process of the container charges the same index for the same GPU,
// whatever order or subset of the GPUs it sees.

// fakeUUID is the fake driver's UUID of physical device p (fakecuda.c).
func fakeUUID(p int) string { return fmt.Sprintf("GPU-fa4e0000-0000-4000-8000-0000000000%02x", p) }

// uuidLimits is a limits file giving index i the memory limit mib[i] (MiB)
// and, when withUUIDs, physical device i's UUID, with a shared cache.
func uuidLimits(t *testing.T, withUUIDs bool, mib ...int) string {
	var b strings.Builder
	b.WriteString("# gpupack-node\n")
	for i, m := range mib {
		fmt.Fprintf(&b, "CUDA_DEVICE_MEMORY_LIMIT_%d=%dm\n", i, m)
		if withUUIDs {
			fmt.Fprintf(&b, "GPUPACK_DEVICE_UUID_%d=%s\n", i, fakeUUID(i))
		}
	}
	fmt.Fprintf(&b, "CUDA_DEVICE_MEMORY_SHARED_CACHE=%s\n", filepath.Join(t.TempDir(), "cache"))
	return b.String()
}

// holdThenGrab runs, in one mount namespace with file at the limits path,
// a holder (CUDA_VISIBLE_DEVICES=holdVis, CUdevice holdDev) that fills its
// device, then, while it holds, a grabber (grabVis, grabDev). It returns
// how many chunks each got, and the log.
func holdThenGrab(t *testing.T, file string, e env, chunk int64, holdVis string, holdDev int, grabVis string,
	grabDev int) (held, got int64, logs string) {
	t.Helper()
	dir := t.TempDir()
	fifo, out := filepath.Join(dir, "f"), filepath.Join(dir, "held")
	setup := fmt.Sprintf(`mkfifo %[1]s
CUDA_VISIBLE_DEVICES=%[3]s HOOKTEST_DEVICE=%[4]d %[5]s direct hold %[6]d < %[1]s > %[2]s &
exec 3> %[1]s
i=0
until grep -q held= %[2]s; do i=$((i+1)); [ $i -lt 1000 ] || exit 96; sleep 0.02; done
cat %[2]s
export CUDA_VISIBLE_DEVICES=%[7]s HOOKTEST_DEVICE=%[8]d`, fifo, out, holdVis, holdDev, hooktest, chunk, grabVis, grabDev)
	kv, logs := inLimitsNamespaceSetup(t, &file, setup, e, "direct", "grab", fmt.Sprint(chunk))
	return num(t, kv, "held"), num(t, kv, "n"), logs
}

func TestDeviceUUIDsKeyChargesByGPU(t *testing.T) {
	const chunk = 4 * mib
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "FAKECUDA_DEVICES": "2"}.hooked()
	cases := []struct {
		name              string
		limits            []int
		holdVis           string
		holdDev           int
		grabVis           string
		grabDev           int
		wantHeld, wantGot int64
	}{
		// GPU 0 is CUdevice 0 for one process and CUdevice 1 for the
		// other: together they get GPU 0's limit once (before: twice).
		{"reordered same GPU", []int{64, 64}, "0,1", 0, "1,0", 1, 16, 0},
		{"reordered same GPU the other way", []int{64, 64}, "1,0", 1, "0,1", 0, 16, 0},
		// The other GPU is untouched, and has its own limit (32 MiB):
		// the limit follows the UUID too, not only the counter.
		{"reordered other GPU", []int{64, 32}, "0,1", 0, "1,0", 0, 16, 8},
		// A process that sees GPU 1 alone has it as CUdevice 0.
		{"filtered", []int{64, 64}, "1", 0, "0,1", 1, 16, 0},
		{"filtered other GPU", []int{64, 64}, "1", 0, "0", 0, 16, 16},
		// CUDA_VISIBLE_DEVICES by UUID, as the driver also accepts.
		{"by UUID", []int{64, 64}, fakeUUID(1) + "," + fakeUUID(0), 0, "0,1", 1, 16, 0},
	}
	for _, c := range cases {
		// No commas in names: t.TempDir() is in overlayfs mount options.
		t.Run(c.name, func(t *testing.T) {
			held, got, logs := holdThenGrab(t, uuidLimits(t, true, c.limits...), e, chunk, c.holdVis, c.holdDev,
				c.grabVis, c.grabDev)
			if held != c.wantHeld || got != c.wantGot {
				t.Errorf("holder (CUDA_VISIBLE_DEVICES=%s, device %d) got %d MiB, then grabber (%s, device %d) %d MiB; "+
					"want %d and %d MiB\nlogs: %s", c.holdVis, c.holdDev, held*chunk/mib, c.grabVis, c.grabDev,
					got*chunk/mib, c.wantHeld*chunk/mib, c.wantGot*chunk/mib, logs)
			}
		})
	}
}

// A device whose UUID is not in the file gets no memory, and says so once.
func TestDeviceNotInLimitsFileIsRefused(t *testing.T) {
	const chunk = 4 * mib
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "FAKECUDA_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "2,0"}.hooked()
	file := uuidLimits(t, true, 64, 64)
	for _, dev := range []string{"0", "1"} {
		e["HOOKTEST_DEVICE"] = dev
		kv, logs := inLimitsNamespace(t, &file, e, "direct", "grab", fmt.Sprint(chunk))
		want := map[string]int64{"0": 0, "1": 16}[dev] // CUdevice 0 is GPU 2, not in the file
		if n := num(t, kv, "n"); n != want {
			t.Errorf("CUdevice %s: got %d MiB, want %d\nlogs: %s", dev, n*chunk/mib, want*chunk/mib, logs)
		}
		if c := strings.Count(logs, "is none of the GPUs in the limits file"); (dev == "0") != (c == 1) || c > 1 {
			t.Errorf("CUdevice %s: %d log lines about a device not in the file\nlogs: %s", dev, c, logs)
		}
	}
}

// Without UUIDs in the file (an older gpupack-node) index i stays CUDA
// device i: the reordering is not caught, as before (documented).
func TestLimitsFileWithoutUUIDsKeepsOrdinals(t *testing.T) {
	const chunk = 4 * mib
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "FAKECUDA_DEVICES": "2"}.hooked()
	held, got, logs := holdThenGrab(t, uuidLimits(t, false, 64, 32), e, chunk, "0,1", 0, "1,0", 1)
	if held != 16 || got != 8 {
		t.Errorf("without UUIDs: holder %d MiB, grabber on CUdevice 1 %d MiB; want 64 and 32 (index = ordinal)\nlogs: %s",
			held*chunk/mib, got*chunk/mib, logs)
	}
}

// What the process is shown (cuMemGetInfo, cuDeviceTotalMem, NVML memory
// info) is the limit of the GPU it looks at, by UUID: NVML devices too are
// matched by nvmlDeviceGetUUID, not taken by their NVML index. The fake's
// NVML numbers GPUs physically (PCI order), as the real one does, and the
// file names them in another order, so neither the CUDA ordinal nor the
// NVML index is the limits index here.
func TestDeviceUUIDsKeyTheMemoryViews(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "FAKECUDA_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "1,0",
		"HOOKTEST_DEVICE": "0", "HOOKTEST_NVML_DEVICE": "1"}.hooked()
	// Index 0: GPU 1 (CUdevice 0, NVML device 1 here), 32 MiB; index 1:
	// GPU 0, 64 MiB.
	file := "# gpupack-node\nCUDA_DEVICE_MEMORY_LIMIT_0=32m\nGPUPACK_DEVICE_UUID_0=" + fakeUUID(1) +
		"\nCUDA_DEVICE_MEMORY_LIMIT_1=64m\nGPUPACK_DEVICE_UUID_1=" + fakeUUID(0) +
		"\nCUDA_DEVICE_MEMORY_SHARED_CACHE=" + filepath.Join(t.TempDir(), "cache") + "\n"
	kv, logs := inLimitsNamespace(t, &file, e, "direct", "query", fmt.Sprint(8*mib))
	for k, want := range map[string]int64{"total": 32 * mib, "free": 24 * mib, "devtotal": 32 * mib,
		"nvml_total": 32 * mib, "nvml_used": 8 * mib, "nvml2_total": 32 * mib, "nvml2_free": 24 * mib} {
		if got := num(t, kv, k); got != want {
			t.Errorf("%s = %d MiB, want %d (GPU 1's limit, 8 MiB used)\nlogs: %s", k, got/mib, want/mib, logs)
		}
	}
}

// The SM limit follows the GPU too: 30 % on GPU 0 only, and the process
// sees GPU 0 as CUdevice 1 (CUDA_VISIBLE_DEVICES=1,0). Before, CUdevice 1
// took index 1's limit (none) and ran unthrottled. The hook starts before
// cuInit, when no device can be mapped yet, so every device gets the
// tightest SM limit the file names (docs/devicehook.md).
func TestDeviceUUIDsKeyTheSMLimit(t *testing.T) {
	file := "CUDA_DEVICE_SM_LIMIT_0=30\n" +
		"GPUPACK_DEVICE_UUID_0=" + fakeUUID(0) + "\nGPUPACK_DEVICE_UUID_1=" + fakeUUID(1) + "\n"
	e := env{"FAKECUDA_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "1,0", "HOOKTEST_DEVICE": "1",
		"FAKENVML_SAMPLE_MS": "167", "FAKECUDA_PID_OFFSET": "100000",
		"FAKECUDA_STATE": filepath.Join(t.TempDir(), "device")}.hooked()
	// The driver's folder read-only, as the toolkit mounts it: its NVML
	// is trusted and the limiter runs at the production period.
	ro := fmt.Sprintf("mount --bind %[1]s %[1]s && mount -o remount,bind,ro %[1]s", fakeDir)
	kv, logs := inLimitsNamespaceSetup(t, &file, ro, e, "gpa", "launch", "kernel", "5", "2.5")
	got := float(t, kv, "util")
	t.Logf("30%% on GPU 0, seen as CUdevice 1: %.1f%%", got)
	if got > 30+smBand {
		t.Errorf("GPU 0 limited to 30%% ran at %.1f%% as CUdevice 1\nlogs: %s", got, logs)
	}
}
