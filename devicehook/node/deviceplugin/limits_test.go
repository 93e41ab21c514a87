package deviceplugin

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

func TestRenderLimitsRoundTrip(t *testing.T) {
	b := RenderLimits([]LimitsGPU{{MemoryMiB: 20480, Cores: 30}, {MemoryMiB: 1000, Cores: 100}, {}}, "512m")
	got, err := ParseLimits(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	want := map[string]string{
		"CUDA_DEVICE_MEMORY_LIMIT_0": "20480m", "CUDA_DEVICE_SM_LIMIT_0": "30",
		"CUDA_DEVICE_MEMORY_LIMIT_1":      "1000m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/var/run/gpupack/vgpu.cache",
		"GPUPACK_CONTEXT_RESERVE":         "512m",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestParseLimitsRefusesWhatIsNotTheContract(t *testing.T) {
	for _, in := range []string{
		"CUDA_DISABLE_CONTROL=1\n",
		"LD_PRELOAD=/tmp/x.so\n",
		"CUDA_DEVICE_MEMORY_LIMIT=1g\n", // only the per-device form is written
		"CUDA_DEVICE_MEMORY_LIMIT_0=1g\nCUDA_DEVICE_MEMORY_LIMIT_0=2g\n",
		"CUDA_DEVICE_MEMORY_LIMIT_01=1g\n",
		"garbage\n",
		strings.Repeat("#", LimitsMaxBytes+1),
	} {
		if _, err := ParseLimits([]byte(in)); err == nil {
			t.Errorf("ParseLimits(%.40q) accepted", in)
		}
	}
}

func TestWriteLimits(t *testing.T) {
	root := t.TempDir()
	path, err := WriteLimits(root, "uid-1", "main", []byte("GPUPACK_CONTEXT_RESERVE=512m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("mode %v, %v", fi.Mode(), err)
	}
	// Rewritten atomically (a restarted container gets the new file).
	if _, err := WriteLimits(root, "uid-1", "main", []byte("GPUPACK_CONTEXT_RESERVE=1g\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "GPUPACK_CONTEXT_RESERVE=1g\n" {
		t.Errorf("content %q", b)
	}
	// Hostile names and a symlink planted in the tree are refused.
	for _, c := range []struct{ uid, ctr string }{{"..", "main"}, {"uid-1", "../../etc"}, {"a/b", "main"}, {"uid-1", ""}} {
		if _, err := WriteLimits(root, types.UID(c.uid), c.ctr, nil); err == nil {
			t.Errorf("WriteLimits(%q, %q) accepted", c.uid, c.ctr)
		}
	}
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(root, "uid-2")); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteLimits(root, "uid-2", "main", nil); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("symlinked pod dir: err = %v", err)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Errorf("wrote through a symlink: %v", ents)
	}
}

func TestContextReserve(t *testing.T) {
	c, err := ParseContextReserve("H100=512m, GH200=768m,*=256m")
	if err != nil {
		t.Fatal(err)
	}
	for model, want := range map[string]string{"NVIDIA H100 80GB HBM3": "512m", "NVIDIA GH200 480GB": "768m", "NVIDIA A100-SXM4-80GB": "256m"} {
		if got := c.For(model); got != want {
			t.Errorf("For(%q) = %q, want %q", model, got, want)
		}
	}
	for _, bad := range []string{"H100", "H100=lots", "=1g", "H100=1g\nCUDA_DISABLE_CONTROL=1"} {
		if _, err := ParseContextReserve(bad); err == nil {
			t.Errorf("ParseContextReserve(%q) accepted", bad)
		}
	}
	if got := DefaultContextReserve().String(); got != "*=512m,H100=512m,H200=512m" {
		t.Errorf("default table = %q", got)
	}
}

// FuzzLimitsRoundTrip: whatever the plan says, the file written parses
// back to exactly the plan's values and stays within the contract.
func FuzzLimitsRoundTrip(f *testing.F) {
	f.Add(int64(20480), int32(30), int64(1000), int32(100), "512m")
	f.Add(int64(0), int32(0), int64(-1), int32(-5), "")
	f.Fuzz(func(t *testing.T, m0 int64, c0 int32, m1 int64, c1 int32, reserve string) {
		if !sizeRe.MatchString(reserve) {
			reserve = ""
		}
		gpus := []LimitsGPU{{MemoryMiB: m0, Cores: c0}, {MemoryMiB: m1, Cores: c1}}
		b := RenderLimits(gpus, reserve)
		got, err := ParseLimits(b)
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		for i, g := range gpus {
			k := "CUDA_DEVICE_MEMORY_LIMIT_" + string(rune('0'+i))
			if v, ok := got[k]; ok != (g.MemoryMiB > 0) || (ok && v != strconv.FormatInt(g.MemoryMiB, 10)+"m") {
				t.Fatalf("%s = %q for %d MiB", k, v, g.MemoryMiB)
			}
			k = "CUDA_DEVICE_SM_LIMIT_" + string(rune('0'+i))
			if _, ok := got[k]; ok != (g.Cores > 0 && g.Cores < 100) {
				t.Fatalf("%s present=%v for %d%%", k, ok, g.Cores)
			}
		}
	})
}

// Issue 14 finding 7: every GPU of the container is named by UUID, so the
// hook keys limits and accounting by GPU, not by the CUDA ordinal the
// tenant's CUDA_VISIBLE_DEVICES picks; whole GPUs (no limit) too, since a
// CUDA device whose UUID is in no line gets no memory.
func TestRenderLimitsNamesEachGPU(t *testing.T) {
	const a, b = "GPU-a0000000-0000-0000-0000-000000000001", "GPU-A0000000-0000-0000-0000-000000000002"
	got, err := ParseLimits(RenderLimits([]LimitsGPU{{UUID: a, MemoryMiB: 1000, Cores: 30}, {UUID: b}}, ""))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"GPUPACK_DEVICE_UUID_0": a, "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", "CUDA_DEVICE_SM_LIMIT_0": "30",
		"GPUPACK_DEVICE_UUID_1":           b,
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/var/run/gpupack/vgpu.cache",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	// A UUID the hook cannot read (old MIG form, a test name), a missing
	// one, or one GPU twice: no UUID at all (index = CUDA device, as
	// before), never a partial map that would refuse a GPU of the pod.
	for _, gpus := range [][]LimitsGPU{
		{{UUID: a, MemoryMiB: 1000}, {UUID: "MIG-GPU-a0000000-0000-0000-0000-000000000002/1/0", MemoryMiB: 1000}},
		{{UUID: a, MemoryMiB: 1000}, {MemoryMiB: 1000}},
		{{UUID: "GPU-a", MemoryMiB: 1000}},
		{{UUID: a, MemoryMiB: 1000}, {UUID: strings.ToUpper(a), MemoryMiB: 1000}},
		{{UUID: a, MemoryMiB: 1000}, {UUID: "MIG-" + a[4:], MemoryMiB: 1000}},
	} {
		out := RenderLimits(gpus, "")
		if strings.Contains(string(out), LimitsKeyDeviceUUID) {
			t.Errorf("RenderLimits(%v) wrote UUIDs:\n%s", gpus, out)
		}
		if _, err := ParseLimits(out); err != nil {
			t.Errorf("RenderLimits(%v): %v", gpus, err)
		}
	}
	for _, bad := range []string{"GPUPACK_DEVICE_UUID_0=GPU-a\n", "GPUPACK_DEVICE_UUID_0=" + a + "x\n", "GPUPACK_DEVICE_UUID=" + a + "\n"} {
		if _, err := ParseLimits([]byte(bad)); err == nil {
			t.Errorf("ParseLimits(%q) accepted", bad)
		}
	}
}
