package bypass

import (
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
)

// Proc is one GPU process as NVML reported it, with its pod when known.
type Proc struct {
	PID     uint32
	GPU     string // UUID
	UsedMiB int64
	Pod     types.UID // "" when the process is in no pod (or unreadable)
}

// Pod is what the decision needs of a pod on this node.
type Pod struct {
	Key types.NamespacedName
	UID types.UID
	// Limits is what the node trusts the pod to hold (its GPUPlan binding,
	// or whole GPUs the node recorded for it): GPU UUID → MiB. Nil for a pod
	// no plan covers.
	Limits map[string]int64
	// Containers counts the pod's containers given each GPU (the slack is
	// per container).
	Containers map[string]int
	// Chunks are the pod's GPUs per container (accounting files).
	Chunks []deviceplugin.Chunk
}

// Input of one decision.
type Input struct {
	Procs []Proc
	Pods  map[types.UID]Pod
	// Held are GPUs some live planned pod holds. A pod without a plan using
	// a held GPU is trespassing; using a GPU nobody planned is its right
	// (a whole GPU handed out by the device plugin's free-GPU policy).
	Held map[string]bool
	// SlackMiB per container covers the CUDA contexts NVML counts but the
	// hook charges only approximately. It is per container, never per
	// process: a pod that forks 64 processes gets no more room than one.
	SlackMiB int64
}

// Usage is a pod's memory on one GPU.
type Usage struct {
	Pod     types.UID
	GPU     string
	UsedMiB int64
	PIDs    []uint32
}

// Finding is one detected bypass.
type Finding struct {
	Kind     string // metrics.Kind*
	Pod      types.UID
	Key      types.NamespacedName // zero for KindUnknown and KindUnattributed
	GPU      string
	UsedMiB  int64
	LimitMiB int64 // 0 when the pod has no share of this GPU; the tolerance for KindUnattributed
	PIDs     []uint32
	Detail   string // KindMountOverride: what the first process sees
}

// Message renders a finding for an Event.
func (f Finding) Message() string {
	switch f.Kind {
	case metrics.KindOverLimit:
		return fmt.Sprintf("processes %v use %d MiB on GPU %s, over the %d MiB planned for this pod (memory the hook did not bound: static binary, direct ioctl, or LD_PRELOAD removed)", f.PIDs, f.UsedMiB, f.GPU, f.LimitMiB)
	case metrics.KindUnassigned:
		return fmt.Sprintf("processes %v use %d MiB on GPU %s, which is not assigned to this pod", f.PIDs, f.UsedMiB, f.GPU)
	case metrics.KindMountOverride:
		return fmt.Sprintf("processes %v do not see gpupack-node's own mounts: %s (a pod mount over the hook's paths, e.g. a subPath or terminationMessagePath through an image symlink)", f.PIDs, f.Detail)
	case metrics.KindUnattributed:
		return fmt.Sprintf("%d MiB in use on GPU %s is in no NVML process list (compute, graphics, MPS), over the %d MiB tolerated for the driver: not attributable to a pod, nothing killed", f.UsedMiB, f.GPU, f.LimitMiB)
	default:
		if f.Pod != "" {
			return fmt.Sprintf("processes %v of unknown pod %s use %d MiB on GPU %s", f.PIDs, f.Pod, f.UsedMiB, f.GPU)
		}
		return fmt.Sprintf("processes %v outside any pod use %d MiB on GPU %s", f.PIDs, f.UsedMiB, f.GPU)
	}
}

// Decide sums processes per pod and GPU and names every bypass. Output is
// sorted (pod, GPU) so callers and tests see a stable order.
func Decide(in Input) ([]Usage, []Finding) {
	type key struct {
		pod types.UID
		gpu string
	}
	sums := map[key]*Usage{}
	for _, p := range in.Procs {
		k := key{p.Pod, p.GPU}
		u := sums[k]
		if u == nil {
			u = &Usage{Pod: p.Pod, GPU: p.GPU}
			sums[k] = u
		}
		u.UsedMiB += p.UsedMiB
		u.PIDs = append(u.PIDs, p.PID)
	}
	var usage []Usage
	for _, u := range sums {
		sort.Slice(u.PIDs, func(i, j int) bool { return u.PIDs[i] < u.PIDs[j] })
		usage = append(usage, *u)
	}
	sort.Slice(usage, func(i, j int) bool {
		if usage[i].Pod != usage[j].Pod {
			return usage[i].Pod < usage[j].Pod
		}
		return usage[i].GPU < usage[j].GPU
	})
	var out []Finding
	for _, u := range usage {
		f := Finding{Pod: u.Pod, GPU: u.GPU, UsedMiB: u.UsedMiB, PIDs: u.PIDs}
		pod, known := in.Pods[u.Pod]
		switch {
		case u.Pod == "" || !known:
			f.Kind = metrics.KindUnknown
		case pod.Limits == nil:
			if !in.Held[u.GPU] {
				continue
			}
			f.Key, f.Kind = pod.Key, metrics.KindUnassigned
		default:
			f.Key = pod.Key
			limit, ok := pod.Limits[u.GPU]
			if !ok {
				f.Kind = metrics.KindUnassigned
				break
			}
			f.LimitMiB = limit
			if u.UsedMiB <= limit+in.SlackMiB*int64(max(1, pod.Containers[u.GPU])) {
				continue
			}
			f.Kind = metrics.KindOverLimit
		}
		out = append(out, f)
	}
	return usage, out
}
