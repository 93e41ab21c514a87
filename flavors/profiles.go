package flavors

import (
	"sort"
	"strings"
)

// Profile describes a GPU model for nodes that publish no inventory but whose
// ResourceFlavor nodeLabels name the model (nvidia.com/gpu.product).
type Profile struct {
	// Model as NVML / GPU feature discovery reports it.
	Model     string
	MemoryMiB int64 // physical, as NVML reports total memory
	SMCount   int
}

// Label keys that name a GPU model on nodes (GPU feature discovery) and the
// GPU count.
const (
	LabelGPUProduct = "nvidia.com/gpu.product"
	LabelGPUCount   = "nvidia.com/gpu.count"
)

// profiles are keyed by a normalised model name. Memory figures are the
// totals NVML reports (slightly under the marketing size).
var profiles = []Profile{
	{Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, SMCount: 132},
	{Model: "NVIDIA H100 PCIe", MemoryMiB: 81559, SMCount: 114},
	{Model: "NVIDIA H100 NVL", MemoryMiB: 95830, SMCount: 132},
	{Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132},
	{Model: "NVIDIA H20", MemoryMiB: 97871, SMCount: 78},
	{Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, SMCount: 108},
	{Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, SMCount: 108},
	{Model: "NVIDIA A100-PCIE-40GB", MemoryMiB: 40960, SMCount: 108},
	{Model: "NVIDIA A100 80GB PCIe", MemoryMiB: 81920, SMCount: 108},
	{Model: "NVIDIA L40S", MemoryMiB: 46068, SMCount: 142},
	{Model: "NVIDIA L4", MemoryMiB: 23034, SMCount: 58},
	{Model: "NVIDIA A10", MemoryMiB: 23028, SMCount: 72},
	{Model: "Tesla T4", MemoryMiB: 15360, SMCount: 40},
	{Model: "NVIDIA B200", MemoryMiB: 183359, SMCount: 148},
	{Model: "NVIDIA GB200", MemoryMiB: 189471, SMCount: 152},
}

func normalise(s string) string {
	s = strings.ToLower(s)
	s = strings.NewReplacer("nvidia", "", "tesla", "", "-", "", "_", "", " ", "").Replace(s)
	return s
}

var byName = func() map[string]Profile {
	m := make(map[string]Profile, len(profiles)*2)
	for _, p := range profiles {
		m[normalise(p.Model)] = p
	}
	return m
}()

// Lookup finds a profile by model name, tolerating case, spaces, dashes and
// the NVIDIA/Tesla prefix (GPU feature discovery writes "NVIDIA-H100-80GB-HBM3").
func Lookup(model string) (Profile, bool) {
	p, ok := byName[normalise(model)]
	return p, ok
}

// Profiles lists the known profiles, sorted by model.
func Profiles() []Profile {
	out := append([]Profile(nil), profiles...)
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// MaxRequestMiB is the largest per-GPU memory request a pod may make on a GPU
// of this physical size: its allocatable under the buffer.
func (b Buffer) MaxRequestMiB(physicalMiB int64) int64 { return b.Allocatable(physicalMiB) }

// GPUMemoryQuotaMiB is the ClusterQueue nominal quota of gpupack.io/gpu-memory
// that keeps a flavor of gpus GPUs of this physical size within the 90 % line.
func (b Buffer) GPUMemoryQuotaMiB(physicalMiB int64, gpus int64) int64 {
	return b.Allocatable(physicalMiB) * gpus
}
