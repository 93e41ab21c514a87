package inventory

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
)

func TestReadDGXH100(t *testing.T) {
	n := nvmlfake.DGXH100()
	got, err := Read(n, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want []GPU
	for i, g := range n.GPUs {
		want = append(want, GPU{
			GPUInfo: v1alpha1.GPUInfo{
				UUID: g.UUID(), Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920,
				SMCount: 132, NUMA: i / 4, Health: v1alpha1.GPUHealthy,
			},
			ActiveLinks: 18, TotalLinks: 18,
		})
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Read (-want +got):\n%s", d)
	}
}

func TestReadNVLTrayFabric(t *testing.T) {
	n := nvmlfake.NVLTray(4, nvmlfake.ClusterUUID(0xab), 7)
	got, err := Read(n, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("got %d GPUs, want 4", len(got))
	}
	for _, g := range got {
		d, ok := FabricDomain(g.Fabric)
		if !ok || d != "abababab-abab-abab-abab-abababababab-7" {
			t.Errorf("GPU %d domain = %q, %v", g.Index, d, ok)
		}
		if g.SMCount != 148 || g.MemoryMiB != 184320 || g.Health != v1alpha1.GPUHealthy {
			t.Errorf("GPU %d = %+v", g.Index, g.GPUInfo)
		}
	}
}

// TestReadHealth drives every unhealthy signal the reader knows through the
// mock and checks the GPU is marked, never dropped.
func TestReadHealth(t *testing.T) {
	cases := []struct {
		name       string
		set        func(g *nvmlfake.GPU)
		wantHealth string
		wantReason string
		wantLinks  int
	}{
		{"healthy", func(*nvmlfake.GPU) {}, v1alpha1.GPUHealthy, "", 18},
		{"lost", func(g *nvmlfake.GPU) { g.Lost = true }, v1alpha1.GPUUnhealthy, "GPU is lost (fell off the bus)", 18},
		{"remap failed", func(g *nvmlfake.GPU) { g.RemapFail = true }, v1alpha1.GPUUnhealthy, "row remapping failed", 18},
		{"uncorrectable ECC", func(g *nvmlfake.GPU) { g.UncorrectableECC = 2 }, v1alpha1.GPUUnhealthy, "2 uncorrectable ECC errors since the last GPU reset", 18},
		{"two reasons", func(g *nvmlfake.GPU) { g.UncorrectableECC = 1; g.RemapFail = true }, v1alpha1.GPUUnhealthy, "row remapping failed; 1 uncorrectable ECC errors since the last GPU reset", 18},
		{"fabric failed", func(g *nvmlfake.GPU) {
			g.Fabric = &nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.ERROR_UNKNOWN)}
		}, v1alpha1.GPUUnhealthy, "NVLink fabric registration failed: ERROR_UNKNOWN", 18},
		{"fabric still training is healthy", func(g *nvmlfake.GPU) {
			g.Fabric = &nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}
		}, v1alpha1.GPUHealthy, "", 18},
		{"links down are counted", func(g *nvmlfake.GPU) { g.DownLinks = 4 }, v1alpha1.GPUHealthy, "", 14},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := nvmlfake.DGXH100()
			n.GPUs[3].Set(tc.set)
			got, err := Read(n, ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 8 {
				t.Fatalf("got %d GPUs, want 8", len(got))
			}
			g := got[3]
			if g.Health != tc.wantHealth || g.Reason != tc.wantReason || g.ActiveLinks != tc.wantLinks {
				t.Errorf("GPU 3: health %q reason %q links %d; want %q %q %d", g.Health, g.Reason, g.ActiveLinks, tc.wantHealth, tc.wantReason, tc.wantLinks)
			}
			if g.MemoryMiB <= 0 {
				t.Errorf("memoryMiB %d must stay > 0 for the annotation", g.MemoryMiB)
			}
		})
	}
}

func TestReadSkipsVanishedHandle(t *testing.T) {
	n := nvmlfake.DGXH100()
	n.Hide(5, true)
	got, err := Read(n, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var idx []int
	for _, g := range got {
		idx = append(idx, g.Index)
	}
	if d := cmp.Diff([]int{0, 1, 2, 3, 4, 6, 7}, idx); d != "" {
		t.Errorf("indices (-want +got):\n%s", d)
	}
}

// TestReadFallbacks: old drivers without v2 memory info, attributes or NUMA.
func TestReadFallbacks(t *testing.T) {
	n := nvmlfake.DGXH100()
	for _, g := range n.GPUs {
		d := g.Device()
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_FUNCTION_NOT_FOUND }
		d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) { return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED }
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_FUNCTION_NOT_FOUND }
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED }
		d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
	}
	got, err := Read(n, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := got[0]
	want := v1alpha1.GPUInfo{UUID: n.GPUs[0].UUID(), Index: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, SMCount: 132, NUMA: -1, Health: v1alpha1.GPUHealthy}
	if d := cmp.Diff(want, g.GPUInfo); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestInit(t *testing.T) {
	cases := []struct {
		ret  nvml.Return
		want error
	}{
		{nvml.SUCCESS, nil},
		{nvml.ERROR_LIBRARY_NOT_FOUND, ErrNoNVML},
	}
	for _, tc := range cases {
		lib := &mock.Interface{InitFunc: func() nvml.Return { return tc.ret }}
		if err := Init(lib); !errors.Is(err, tc.want) {
			t.Errorf("Init(%v) = %v, want %v", tc.ret, err, tc.want)
		}
	}
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}
	if err := Init(lib); err == nil || errors.Is(err, ErrNoNVML) {
		t.Errorf("Init(driver not loaded) = %v, want a distinct error", err)
	}
}

// TestInitRealLibrary runs the real go-nvml loader: on a machine without the
// NVIDIA driver it must say so with ErrNoNVML (what the agent reports), and
// on one with a driver it must read at least one GPU.
func TestInitRealLibrary(t *testing.T) {
	lib := nvml.New()
	err := Init(lib)
	if errors.Is(err, ErrNoNVML) {
		return
	}
	if err != nil {
		t.Fatalf("Init: %v", err)
	}
	defer lib.Shutdown()
	gpus, err := Read(lib, ReadOptions{Fabric: FabricVersioned})
	if err != nil || len(gpus) == 0 {
		t.Fatalf("Read on a driver node: %d GPUs, %v", len(gpus), err)
	}
	t.Logf("real GPUs: %+v", gpus)
}

// A GPU in MIG mode is reported as such (its SM limits do not apply: the
// node agent's gpupack_node_gpu_mig_enabled metric); a pending change is
// not the current mode.
func TestReadMIGMode(t *testing.T) {
	n := nvmlfake.DGXH100()
	n.GPUs[2].Device().SetMigMode(nvml.DEVICE_MIG_ENABLE)
	got, err := Read(n, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		if want := i == 2; g.MIG != want {
			t.Errorf("GPU %d: MIG = %v, want %v", i, g.MIG, want)
		}
	}
}
