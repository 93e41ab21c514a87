package inventory

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// CoresPerGPU is the gpupack.io/gpu-cores capacity of one GPU (percent).
const CoresPerGPU = 100

// FabricDomain returns the NVLink domain of a fabric-attached GPU
// ("<clusterUUID>-<cliqueID>") and true, or false when the fabric is absent,
// still training, or failed: then the GPU's NVLink ends at its node.
func FabricDomain(f *Fabric) (string, bool) {
	if f == nil || f.State != nvml.GPU_FABRIC_STATE_COMPLETED || nvml.Return(f.Status) != nvml.SUCCESS || f.ClusterUUID == ([16]byte{}) {
		return "", false
	}
	u := f.ClusterUUID
	return fmt.Sprintf("%x-%x-%x-%x-%x-%d", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16], f.CliqueID), true
}

// LabelValue turns any name into a valid label value that is also a DNS label
// (lower case alphanumerics and '-', at most 63 characters, alphanumeric at
// both ends). Long names keep a prefix and a hash so distinct nodes stay
// distinct.
func LabelValue(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	v := strings.Trim(b.String(), "-")
	if len(v) > 63 {
		h := fnv.New32a()
		h.Write([]byte(s))
		v = strings.TrimRight(v[:54], "-") + fmt.Sprintf("-%08x", h.Sum32())
	}
	if v == "" {
		v = "node"
	}
	return v
}

// Merge combines what NVML sees now with the inventory published before.
// A GPU published before but not seen now stays, marked Unhealthy, so a plan
// never lands on it and nobody mistakes a lost GPU for a smaller node. The
// result is sorted by index, then UUID.
func Merge(now []GPU, previous []v1alpha1.GPUInfo, nodeName string) []v1alpha1.GPUInfo {
	nodeDomain := LabelValue(nodeName)
	out := make([]v1alpha1.GPUInfo, 0, len(now)+len(previous))
	seen := make(map[string]bool, len(now))
	for _, g := range now {
		info := g.GPUInfo
		if d, ok := FabricDomain(g.Fabric); ok {
			info.NVLinkDomain = d
		} else {
			info.NVLinkDomain = nodeDomain
		}
		if info.Health == "" {
			info.Health = v1alpha1.GPUHealthy
		}
		seen[info.UUID] = true
		out = append(out, info)
	}
	for _, p := range previous {
		if seen[p.UUID] {
			continue
		}
		seen[p.UUID] = true
		p.Health = v1alpha1.GPUUnhealthy
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Index != out[j].Index {
			return out[i].Index < out[j].Index
		}
		return out[i].UUID < out[j].UUID
	})
	return out
}

// NodeDomain picks the node's gpupack.io/nvlink-domain label: the fabric
// domain when every GPU NVML sees now agrees on one, otherwise the node
// itself (a node whose GPUs disagree cannot promise a cross-node NVLink
// domain to a gang).
func NodeDomain(now []GPU, nodeName string) string {
	domain := ""
	for _, g := range now {
		d, ok := FabricDomain(g.Fabric)
		if !ok || (domain != "" && d != domain) {
			return LabelValue(nodeName)
		}
		domain = d
	}
	if domain == "" {
		return LabelValue(nodeName)
	}
	return domain
}

// Desired computes the published state. Capacity counts healthy GPUs only:
// the scheduler must not place new work on a GPU that is gone or failing.
func Desired(now []GPU, previous []v1alpha1.GPUInfo, nodeName string, buf flavors.Buffer, slotsPerGPU int) State {
	gpus := Merge(now, previous, nodeName)
	var memMiB, healthy int64
	for _, g := range gpus {
		if g.Healthy() {
			healthy++
			memMiB += buf.Allocatable(g.MemoryMiB)
		}
	}
	return State{
		GPUs:   gpus,
		Domain: NodeDomain(now, nodeName),
		Capacity: map[string]int64{
			v1alpha1.ResourceGPUMemory: memMiB,
			v1alpha1.ResourceVGPU:      healthy * int64(slotsPerGPU),
			v1alpha1.ResourceGPUCores:  healthy * CoresPerGPU,
		},
	}
}
