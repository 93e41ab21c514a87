package inventory

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
)

// PodUsage is what a pod holds: the GPUs of its gpupack.io/devices
// annotation, once it is bound (spec.nodeName) or pinned by a plan
// (gpupack.io/plan). Succeeded and Failed pods hold nothing; a terminating
// pod (deletionTimestamp set) still holds until it is gone, because its
// processes may still have the memory. A whole-GPU pod (nvidia.com/gpu with
// no memory request, read as TemplateRequest reads it) holds its GPUs
// exclusively; otherwise each GPU holds the annotation's MiB and the pod's
// SM share.
func PodUsage(p *corev1.Pod) ([]fit.Usage, bool, error) {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil, false, nil
	}
	s, ok := p.Annotations[v1alpha1.AnnotationDevices]
	if !ok {
		return nil, false, nil
	}
	if p.Spec.NodeName == "" && p.Annotations[v1alpha1.AnnotationPlan] == "" {
		return nil, false, nil
	}
	devs, err := v1alpha1.ParseDevices(s)
	if err != nil {
		return nil, false, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	// Whole or shared, read as the check read the pod's template; if the pod
	// cannot be read that way any more, its resources decide.
	var exclusive bool
	var cores int32
	if ps, ok, err := TemplateRequest(&corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}); err == nil && ok {
		exclusive, cores = ps.Exclusive(), ps.Cores
	} else {
		total := podResources(&p.Spec)
		vgpus := quantity(total, v1alpha1.ResourceVGPU)
		exclusive = quantity(total, v1alpha1.ResourceNvidiaGPU) > 0 && vgpus == 0
		if vgpus > 0 {
			cores = int32(min(quantity(total, v1alpha1.ResourceGPUCores)/vgpus, 100))
		}
	}
	out := make([]fit.Usage, len(devs))
	for i, d := range devs {
		out[i] = fit.Usage{UUID: d.UUID, MemoryMiB: d.MemoryMiB, Cores: cores, Exclusive: exclusive}
		if exclusive {
			out[i].Cores = 100
		}
	}
	return out, true, nil
}

// podResources sums the GPU resources of a pod's containers (limits, else
// requests) and its sidecar init containers; a plain init container runs
// alone, so only its excess over that sum counts.
func podResources(p *corev1.PodSpec) corev1.ResourceList {
	sum := corev1.ResourceList{}
	add := func(c *corev1.Container) {
		for _, n := range gpuResources {
			q, ok := c.Resources.Limits[n]
			if !ok {
				q, ok = c.Resources.Requests[n]
			}
			if ok {
				cur := sum[n]
				cur.Add(q)
				sum[n] = cur
			}
		}
	}
	for i := range p.Containers {
		add(&p.Containers[i])
	}
	for i := range p.InitContainers {
		c := &p.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range p.InitContainers {
		c := &p.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			continue
		}
		for _, n := range gpuResources {
			q, ok := c.Resources.Limits[n]
			if !ok {
				q, ok = c.Resources.Requests[n]
			}
			if cur := sum[n]; ok && q.Cmp(cur) > 0 {
				sum[n] = q
			}
		}
	}
	return sum
}

var gpuResources = []corev1.ResourceName{v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores}

func quantity(rl corev1.ResourceList, name corev1.ResourceName) int64 {
	q, ok := rl[name]
	if !ok {
		return 0
	}
	return q.Value()
}

// PlanUsage is the capacity a stored plan reserves: every GPU of every slot,
// unless the plan is Released. A slot whose pod already holds its GPUs
// (gpupack.io/devices) must not be counted twice: use PlanSlots and skip
// slots bound to a pod counted through PodUsage.
func PlanUsage(plan *v1alpha1.GPUPlan) []fit.Usage {
	var out []fit.Usage
	for _, s := range PlanSlots(plan) {
		out = append(out, s.Usage...)
	}
	return out
}

// Slot is one pod slot of a plan.
type Slot struct {
	PodSet string
	Index  int32
	Node   string
	// PodName is the pod bound to the slot (status.bindings), or "".
	PodName string
	Usage   []fit.Usage
}

// PlanSlots lists the slots of a plan that still reserve capacity (none when
// the plan is Released).
func PlanSlots(plan *v1alpha1.GPUPlan) []Slot {
	if plan.Status.Phase == v1alpha1.PlanReleased {
		return nil
	}
	bound := map[[2]string]string{}
	for _, b := range plan.Status.Bindings {
		bound[[2]string{b.PodSet, fmt.Sprint(b.Index)}] = b.PodName
	}
	out := make([]Slot, 0, len(plan.Spec.Assignments))
	for _, a := range plan.Spec.Assignments {
		s := Slot{PodSet: a.PodSet, Index: a.Index, Node: a.Node, PodName: bound[[2]string{a.PodSet, fmt.Sprint(a.Index)}]}
		for _, g := range a.GPUs {
			u := fit.Usage{UUID: g.UUID, MemoryMiB: g.MemoryMiB, Cores: g.Cores, Exclusive: g.Exclusive}
			if g.Exclusive && u.Cores == 0 {
				u.Cores = 100
			}
			s.Usage = append(s.Usage, u)
		}
		out = append(out, s)
	}
	return out
}

// PlanFromResult renders a fit result as a plan spec (the controller fills
// in the workload's name and UID).
func PlanFromResult(r fit.Result) v1alpha1.GPUPlanSpec {
	spec := v1alpha1.GPUPlanSpec{Level: r.Level, Domain: r.Domain, PodCount: int32(len(r.Assignments)), Assignments: []v1alpha1.PodAssignment{}}
	for _, a := range r.Assignments {
		pa := v1alpha1.PodAssignment{PodSet: a.PodSet, Index: int32(a.Index), Node: a.Node}
		for _, u := range a.GPUs {
			pa.GPUs = append(pa.GPUs, v1alpha1.GPUAssignment{UUID: u.UUID, MemoryMiB: u.MemoryMiB, Cores: u.Cores, Exclusive: u.Exclusive})
		}
		spec.GPUCount += int32(len(a.GPUs))
		spec.Assignments = append(spec.Assignments, pa)
	}
	return spec
}
