package inventory

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// ErrNoNVML means libnvidia-ml.so.1 could not be loaded: the node has no
// NVIDIA driver (or the container does not see it). The agent publishes
// nothing in that case.
var ErrNoNVML = errors.New("libnvidia-ml.so.1 not found: no NVIDIA driver visible to gpupack-node; nothing is published for this node")

// Init initialises NVML and translates "library not found" into ErrNoNVML.
func Init(lib nvml.Interface) error {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return ErrNoNVML
	default:
		return fmt.Errorf("nvml init: %v", ret)
	}
}

// FabricReader reads a device's fabric membership. FabricV1 works on go-nvml
// mocks; FabricVersioned is for the real library (the versioned handler
// cannot be mocked because it wraps the library's own device type).
type FabricReader func(nvml.Device) (Fabric, nvml.Return)

// FabricV1 uses nvmlDeviceGetGpuFabricInfo.
func FabricV1(d nvml.Device) (Fabric, nvml.Return) {
	fi, ret := d.GetGpuFabricInfo()
	return Fabric{ClusterUUID: fi.ClusterUuid, CliqueID: fi.CliqueId, State: fi.State, Status: fi.Status}, ret
}

// FabricVersioned uses nvmlDeviceGetGpuFabricInfoV (v3) and falls back to the
// unversioned call on drivers that lack it.
func FabricVersioned(d nvml.Device) (Fabric, nvml.Return) {
	fi, ret := d.GetGpuFabricInfoV().V3()
	switch ret {
	case nvml.SUCCESS:
		return Fabric{ClusterUUID: fi.ClusterUuid, CliqueID: fi.CliqueId, State: fi.State, Status: fi.Status}, ret
	case nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_ARGUMENT_VERSION_MISMATCH:
		return FabricV1(d)
	default:
		return Fabric{}, ret
	}
}

// ReadOptions tune Read.
type ReadOptions struct {
	// Fabric reads fabric info; nil means FabricV1.
	Fabric FabricReader
}

const mib = 1 << 20

// Read lists the GPUs NVML sees. A GPU whose handle cannot even be obtained
// is not returned (its UUID is unknown); Merge marks it Unhealthy from the
// previous inventory instead of dropping it.
func Read(lib nvml.Interface, opts ReadOptions) ([]GPU, error) {
	fabric := opts.Fabric
	if fabric == nil {
		fabric = FabricV1
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml DeviceGetCount: %v", ret)
	}
	out := make([]GPU, 0, n)
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue // counted as vanished by Merge if it was known before
		}
		g, err := readDevice(d, i, fabric)
		if err != nil {
			continue
		}
		out = append(out, g)
	}
	return out, nil
}

func readDevice(d nvml.Device, fallbackIndex int, fabric FabricReader) (GPU, error) {
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS || uuid == "" {
		return GPU{}, fmt.Errorf("GetUUID: %v", ret)
	}
	g := GPU{GPUInfo: v1alpha1.GPUInfo{UUID: uuid, Index: fallbackIndex, NUMA: -1, Health: v1alpha1.GPUHealthy}}
	var reasons []string
	unhealthy := func(why string) { reasons = append(reasons, why) }

	if idx, ret := d.GetIndex(); ret == nvml.SUCCESS {
		g.Index = idx
	}
	if name, ret := d.GetName(); ret == nvml.SUCCESS {
		g.Model = name
	}
	// Memory: v2 first (it separates the driver's reservation), v1 fallback.
	if m, ret := d.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
		g.MemoryMiB = int64(m.Total / mib)
	} else if m, ret1 := d.GetMemoryInfo(); ret1 == nvml.SUCCESS {
		g.MemoryMiB = int64(m.Total / mib)
	} else {
		unhealthy(fmt.Sprintf("memory info: %v", ret1))
		if ret == nvml.ERROR_GPU_IS_LOST || ret1 == nvml.ERROR_GPU_IS_LOST {
			reasons = append(reasons[:0], "GPU is lost (fell off the bus)")
		}
	}
	if g.MemoryMiB <= 0 { // the annotation forbids 0; fall back to the model's profile
		if p, ok := flavors.Lookup(g.Model); ok {
			g.MemoryMiB = p.MemoryMiB
		} else {
			g.MemoryMiB = 1
		}
	}
	if a, ret := d.GetAttributes(); ret == nvml.SUCCESS && a.MultiprocessorCount > 0 {
		g.SMCount = int(a.MultiprocessorCount)
	} else if p, ok := flavors.Lookup(g.Model); ok {
		g.SMCount = p.SMCount
	}
	if numa, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS {
		g.NUMA = numa
	}
	// MIG: the current mode (a pending change applies at the next reset).
	if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
		g.MIG = true
	}
	// Rows that could not be remapped, or a remap waiting for a GPU reset,
	// mean memory that may corrupt data: plan nothing new there.
	if _, _, pending, failed, ret := d.GetRemappedRows(); ret == nvml.SUCCESS {
		if failed {
			unhealthy("row remapping failed")
		} else if pending {
			unhealthy("row remapping pending a GPU reset")
		}
	}
	// Uncorrectable ECC errors since the last reset (level-triggered, unlike
	// XID events: it survives an agent restart until the GPU is reset).
	if n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS && n > 0 {
		unhealthy(fmt.Sprintf("%d uncorrectable ECC errors since the last GPU reset", n))
	}
	if f, ret := fabric(d); ret == nvml.SUCCESS && f.State != nvml.GPU_FABRIC_STATE_NOT_SUPPORTED {
		ff := f
		g.Fabric = &ff
		if f.State == nvml.GPU_FABRIC_STATE_COMPLETED && nvml.Return(f.Status) != nvml.SUCCESS {
			unhealthy(fmt.Sprintf("NVLink fabric registration failed: %v", nvml.Return(f.Status)))
		}
	}
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, ret := d.GetNvLinkState(l)
		if ret != nvml.SUCCESS {
			// Links are numbered densely; the first invalid one ends the list.
			break
		}
		g.TotalLinks++
		if st == nvml.FEATURE_ENABLED {
			g.ActiveLinks++
		}
	}
	if len(reasons) > 0 {
		g.Health = v1alpha1.GPUUnhealthy
		g.Reason = joinReasons(reasons)
	}
	return g, nil
}

func joinReasons(rs []string) string {
	s := rs[0]
	for _, r := range rs[1:] {
		s += "; " + r
	}
	return s
}
