package devicehook

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupack/gpupack/test/testenv"
)

// Every way a program reaches the driver (see testprog/hooktest.c).
var modes = []string{"direct", "dlsym", "gpa", "gpa-ptsz", "gpa-v1"}

// arrayBytes mirrors the driver's layout of a CUDA array: rows padded to
// 512 bytes. Written independently of the C code it checks.
func arrayBytes(w, h, d, elem, ch int64) int64 {
	row := (max(w, 1)*elem*max(ch, 1) + 511) &^ 511
	return row * max(h, 1) * max(d, 1)
}

// unitBytes is what one allocation of family f with chunk c really takes
// (hooktest builds descriptors so that most families take exactly c).
func unitBytes(f string, c int64) int64 {
	switch f {
	case "mipmap": // 2 levels of 1024 x c/5120 floats
		h := c / 5120
		return arrayBytes(1024, h, 1, 4, 1) + arrayBytes(512, h/2, 1, 4, 1)
	case "array3d", "array3d_v1":
		return arrayBytes(512, 16, c/(16*4096), 2, 4)
	default:
		return c
	}
}

// poolGranule is the step in which the fake driver's pools reserve memory.
const poolGranule = 32 * mib

var families = []string{"mem", "mem_v1", "pitch", "pitch_v1", "managed", "async", "pool", "vmm",
	"array", "array_v1", "array3d", "array3d_v1", "mipmap"}

type familyResult struct {
	N, Err, Err2, Reached, Unit, Refree, Realloc, FreeBad, Left, Free, Total int64
}

func familyRun(t *testing.T, e env, mode, fam string, chunk int64) familyResult {
	kv := run(t, e, mode, "family", fam, fmt.Sprint(chunk))
	return familyResult{
		N: num(t, kv, "n"), Err: num(t, kv, "err"), Err2: num(t, kv, "err2"), Reached: num(t, kv, "reached"),
		Unit: num(t, kv, "unit"), Refree: num(t, kv, "refree"), Realloc: num(t, kv, "realloc"),
		FreeBad: num(t, kv, "freebad"), Left: num(t, kv, "left"), Free: num(t, kv, "free"), Total: num(t, kv, "total"),
	}
}

// For every allocation family and every resolution road: allocate up to the
// limit, be refused past it without the request reaching the driver, free
// one, allocate again, free all and see the whole limit free again.
func TestEveryFamilyIsLimited(t *testing.T) {
	const limit, chunk = 64 * mib, 4 * mib
	base := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}
	for _, mode := range modes {
		for _, fam := range families {
			t.Run(mode+"/"+fam, func(t *testing.T) {
				unit := unitBytes(fam, chunk)
				want := familyResult{
					N: limit / unit, Err: 2 /* CUDA_ERROR_OUT_OF_MEMORY */, Err2: 2, Reached: 0, Unit: unit,
					Refree: 0, Realloc: 0, FreeBad: 0, Left: 0, Free: limit, Total: limit,
				}
				got := familyRun(t, base.hooked(), mode, fam, chunk)
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("family %s via %s (-want +got):\n%s", fam, mode, d)
				}
			})
		}
	}
}

// Without the hook the same program is limited only by the fake device:
// the test above would fail if the hook were not in the path.
func TestWithoutHookNothingIsLimited(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(256 * mib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}
	got := familyRun(t, e, "gpa", "mem", 4*mib)
	if got.N != 64 || got.Reached != 1 {
		t.Errorf("unhooked: n=%d reached=%d, want 64 allocations and the refusal from the driver", got.N, got.Reached)
	}
}

// VMM and pool allocations are charged to the device they name, not the
// current context's (HAMi-core's off-device gap); CUDA_DEVICE_MEMORY_LIMIT_1
// applies to device 1 only.
func TestOffDeviceAllocationsChargeTheirDevice(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT_1": "32m",
		"HOOKTEST_VMM_DEV": "1", "HOOKTEST_POOL_DEV": "1"}.hooked()
	for _, fam := range []string{"vmm", "pool"} {
		for _, mode := range []string{"direct", "gpa"} {
			got := familyRun(t, e, mode, fam, 4*mib)
			if got.N != 8 || got.Reached != 0 || got.Left != 0 {
				t.Errorf("%s via %s on device 1: %+v, want 8 allocations of 4 MiB under a 32 MiB limit", fam, mode, got)
			}
		}
	}
	// Device 0 has no limit here: the same program fills the fake device.
	got := familyRun(t, env{"FAKECUDA_MEM": fmt.Sprint(128 * mib), "CUDA_DEVICE_MEMORY_LIMIT_1": "32m"}.hooked(), "gpa", "mem", 4*mib)
	if got.N != 32 {
		t.Errorf("device 0 without a limit: n=%d, want 32 (the whole fake device)", got.N)
	}
}

// The per-context reserve is charged when the primary context is retained.
func TestContextReserveCountsAgainstTheLimit(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m", "GPUPACK_CONTEXT_RESERVE": "16m"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		got := familyRun(t, e, mode, "mem", 4*mib)
		if got.N != 12 || got.Free != 48*mib || got.Total != 64*mib {
			t.Errorf("via %s: n=%d free=%d total=%d, want 12 chunks, 48 MiB free of 64 MiB", mode, got.N, got.Free, got.Total)
		}
	}
}

func TestVirtualizedQueries(t *testing.T) {
	type q struct {
		Free, Total, FreeV1, TotalV1, DevTotal, DevTotalV1              int64
		NvmlTotal, NvmlFree, NvmlUsed, Nvml2Total, Nvml2Free, Nvml2Used int64
		Nvml2Reserved                                                   int64
	}
	const reservedByFake = 64 * mib
	cases := []struct {
		name  string
		e     env
		alloc int64
		want  q
	}{{
		name: "limit below physical", alloc: 8 * mib,
		e:    env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"},
		want: q{56 * mib, 64 * mib, 56 * mib, 64 * mib, 64 * mib, 64 * mib, 64 * mib, 56 * mib, 8 * mib, 64 * mib, 56 * mib, 8 * mib, 0},
	}, {
		name: "limit above physical is capped to physical", alloc: 8 * mib,
		e: env{"FAKECUDA_MEM": fmt.Sprint(128 * mib), "CUDA_DEVICE_MEMORY_LIMIT_0": "1g"},
		// free never exceeds what is physically free (the fake's v2 reserve included).
		want: q{120 * mib, 128 * mib, 120 * mib, 128 * mib, 128 * mib, 128 * mib, 128 * mib, 120 * mib, 8 * mib,
			128 * mib, 120*mib - reservedByFake, 8 * mib, 0},
	}, {
		name: "no limit passes through", alloc: 8 * mib,
		e: env{"FAKECUDA_MEM": fmt.Sprint(128 * mib)},
		want: q{120 * mib, 128 * mib, 120 * mib, 128 * mib, 128 * mib, 128 * mib, 128 * mib, 120 * mib, 8 * mib,
			128 * mib, 120*mib - reservedByFake, 8 * mib, reservedByFake},
	}}
	for _, c := range cases {
		for _, mode := range []string{"direct", "dlsym", "gpa"} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				kv := run(t, c.e.hooked(), mode, "query", fmt.Sprint(c.alloc))
				got := q{num(t, kv, "free"), num(t, kv, "total"), num(t, kv, "free_v1"), num(t, kv, "total_v1"),
					num(t, kv, "devtotal"), num(t, kv, "devtotal_v1"), num(t, kv, "nvml_total"), num(t, kv, "nvml_free"),
					num(t, kv, "nvml_used"), num(t, kv, "nvml2_total"), num(t, kv, "nvml2_free"), num(t, kv, "nvml2_used"),
					num(t, kv, "nvml2_reserved")}
				if d := cmp.Diff(c.want, got); d != "" {
					t.Errorf("(-want +got):\n%s", d)
				}
			})
		}
	}
}

// A process whose limit is lower than what its container already uses
// (limits changed between processes) sees free = 0 and used <= total, never
// a negative or wrapped-around figure.
func TestQueriesNeverUnderflow(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	holder := command(env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}.hooked(), "direct", "hold", fmt.Sprint(16*mib))
	stdin, _ := holder.StdinPipe()
	out, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); holder.Wait() }()
	line := make([]byte, 64)
	if n, _ := out.Read(line); !strings.HasPrefix(string(line[:n]), "held=4") {
		t.Fatalf("holder: %q, want held=4", line[:n])
	}
	kv := run(t, env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "32m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}.hooked(), "gpa", "query", "0")
	got := map[string]string{"free": kv["free"], "total": kv["total"], "nvml_free": kv["nvml_free"],
		"nvml_used": kv["nvml_used"], "nvml_total": kv["nvml_total"]}
	want := map[string]string{"free": "0", "total": fmt.Sprint(32 * mib), "nvml_free": "0",
		"nvml_used": fmt.Sprint(32 * mib), "nvml_total": fmt.Sprint(32 * mib)}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// dlsym(RTLD_NEXT, ...) from the program must still be relative to the
// program although the hook exports dlsym.
func TestDlsymRTLDNextStaysCallerRelative(t *testing.T) {
	kv := run(t, env{}.hooked(), "direct", "rtld-next")
	if d := cmp.Diff(map[string]string{"next_is_default": "1", "default_is_direct": "1"}, kv); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// /etc/ld.so.preload loading, in a private mount namespace with an overlay
// on /etc so the host's /etc is never touched.
func TestEtcLdSoPreload(t *testing.T) {
	testenv.Command(t, "unshare", "loads the hook through /etc/ld.so.preload in a private mount namespace")
	probe := exec.Command("unshare", "-m", "-r", "true")
	if err := probe.Run(); err != nil {
		t.Skipf("no unprivileged mount namespaces here (%v); /etc/ld.so.preload loading untested", err)
	}
	dir := t.TempDir()
	for _, d := range []string{"u", "w"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := fmt.Sprintf(`set -e
mount -t overlay overlay -o lowerdir=/etc,upperdir=%[1]s/u,workdir=%[1]s/w /etc
echo %[2]s > /etc/ld.so.preload
exec %[3]s "$@"`, dir, hookLib, hooktest)
	for _, mode := range []string{"direct", "gpa"} {
		cmd := exec.Command("unshare", "-m", "-r", "sh", "-c", script, "sh", mode, "family", "mem", fmt.Sprint(4*mib))
		cmd.Env = env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.list()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Skipf("overlay on /etc not permitted here (%v: %s); /etc/ld.so.preload loading untested", err, out)
		}
		kv := parseKV(string(out))
		if kv["n"] != "16" || kv["reached"] != "0" {
			t.Errorf("via /etc/ld.so.preload (%s): %s, want n=16 reached=0", mode, out)
		}
	}
	if _, err := os.Stat("/etc/ld.so.preload"); err == nil {
		b, _ := os.ReadFile("/etc/ld.so.preload")
		if strings.Contains(string(b), hookLib) {
			t.Fatalf("the host's /etc/ld.so.preload was modified")
		}
	}
}

// Memory a pool keeps reserved after its blocks are freed is still device
// memory the container holds: it counts until the pool is trimmed.
func TestPoolReservedMemoryCounts(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		kv := run(t, e, mode, "poolhold", fmt.Sprint(4*mib), "3")
		got := map[string]int64{"reserved": num(t, kv, "reserved"), "before_trim": num(t, kv, "before_trim"),
			"after_trim": num(t, kv, "after_trim")}
		want := map[string]int64{"reserved": poolGranule, "before_trim": (64*mib - poolGranule) / (4 * mib),
			"after_trim": 16}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("via %s (-want +got):\n%s", mode, d)
		}
	}
}

// A request that fits but makes the pool grow past the limit is refused,
// and the growth is given back.
func TestPoolGrowthPastTheLimitIsRefused(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "48m"}.hooked()
	for _, fam := range []string{"async", "pool"} {
		got := familyRun(t, e, "gpa", fam, 4*mib)
		// 8 blocks fill the first 32 MiB granule; the 9th would need a second.
		if got.N != 8 || got.Err != 2 || got.Left != 0 || got.Free != 48*mib {
			t.Errorf("%s under 48 MiB: %+v, want 8 blocks, then OUT_OF_MEMORY, nothing left after trim", fam, got)
		}
	}
}

// A VMM handle released while still mapped (NCCL does this) keeps its
// memory alive: it stays charged until the last unmap.
func TestVMMReleasedWhileMappedStaysCharged(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		kv := run(t, e, mode, "vmmmap", fmt.Sprint(4*mib))
		if d := cmp.Diff(map[string]string{"mapped": "8", "unmapped": "16"}, kv); d != "" {
			t.Errorf("via %s (-want +got):\n%s", mode, d)
		}
	}
}

// Blocks still allocated when their context is destroyed (or the primary
// context reset) are freed by the driver; they must stop counting.
func TestContextTeardownReleasesItsBlocks(t *testing.T) {
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		kv := run(t, e, mode, "ctxgone", fmt.Sprint(4*mib))
		if d := cmp.Diff(map[string]string{"after_destroy": "16", "after_reset": "16"}, kv); d != "" {
			t.Errorf("via %s (-want +got):\n%s", mode, d)
		}
	}
}
