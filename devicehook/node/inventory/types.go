// Package inventory reads the node's GPUs through NVML and turns them into
// what gpupack-node publishes: the gpupack.io/gpus annotation, the
// gpupack.io/nvlink-domain label and the gpupack.io/* node capacity.
//
// Reading (nvml.go) is a thin adapter over nvml.Interface so tests run on
// go-nvml's mocks; everything else (domain naming, merging with the previous
// inventory, capacity) is pure and table-tested; publishing (publish.go)
// compares with the Node and patches only what differs.
package inventory

import (
	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// GPU is one device as the agent sees it: the published fields plus what only
// the agent needs (fabric, NVLink state, why it is unhealthy).
type GPU struct {
	v1alpha1.GPUInfo
	// Fabric is the NVLink fabric (NVSwitch tray / NVL72) membership, when the
	// GPU has one. Nil on HGX boxes whose NVLink ends at the node.
	Fabric *Fabric
	// ActiveLinks counts NVLink links in state enabled; TotalLinks those that
	// answered at all.
	ActiveLinks, TotalLinks int
	// Reason says why Health is Unhealthy (for Events and logs).
	Reason string
	// MIG is true when the GPU is in MIG mode (nvmlDeviceGetMigMode,
	// current mode). Its MIG slices bound the SMs a container gets, NVML has
	// no per-process utilisation there, and the hook does not throttle:
	// gpupack.io/gpu-cores (CUDA_DEVICE_SM_LIMIT) does not apply on it.
	MIG bool
}

// Fabric is the result of nvmlDeviceGetGpuFabricInfo(V).
type Fabric struct {
	ClusterUUID [16]byte
	CliqueID    uint32
	State       uint8  // nvml.GPU_FABRIC_STATE_*
	Status      uint32 // an nvml.Return
}

// State is everything published for one node.
type State struct {
	GPUs []v1alpha1.GPUInfo
	// Domain is the value of the gpupack.io/nvlink-domain label.
	Domain string
	// Capacity holds gpupack.io/gpu-memory (MiB), gpupack.io/vgpu (slots) and
	// gpupack.io/gpu-cores (percent), all counting healthy GPUs only.
	Capacity map[string]int64
}
