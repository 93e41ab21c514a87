// Package usage is gpupack's one rule for "does this pod hold GPU capacity,
// and which GPUs and MiB": the gang-fit check, `gpupack fit` and the node
// agent's device plugin all count GPUs through it, so they cannot disagree.
//
// The rule, in two parts:
//
//   - Pods: every live pod counts its own devices (the gpupack.io/devices
//     annotation) once it is bound to a node (spec.nodeName) or pinned by a
//     plan (gpupack.io/plan), unless it is Succeeded or Failed. A terminating
//     pod (deletionTimestamp set) still holds until it is gone: its
//     processes may still have the memory (a checkpoint being written).
//   - Plans: a GPUPlan that is not Released reserves every slot, except a
//     slot whose binding (status.bindings[].podUID) names a live pod that is
//     already counted by the first part. The match is by pod UID, never by
//     plan or pod name: an evicted and re-admitted workload gets a new plan
//     of the same name, and its previous pods, still terminating, must keep
//     holding their GPUs on top of the new plan.
//
// Resources other than GPUs (cpu, memory, pods, ephemeral-storage,
// extended resources) follow the same two parts: every pod bound to a node
// (spec.nodeName), not Succeeded or Failed, holds its requests there
// (PodNodeUsage), terminating or not, GPU pod or not; a plan slot that
// holds its GPUs also holds its pod's requests on its node (Slot.Requests,
// from the plan's gpupack.io/pod-requests).
//
// A GPU counted twice (a pod created but not yet recorded in its plan's
// bindings) errs on the safe side: capacity looks busier than it is for a
// moment, never freer. Pure functions; no client calls.
package usage

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
)

// Pod is what PodUsage says about one pod.
type Pod struct {
	UID types.UID
	// GPUs the pod holds (one entry per device of its annotation).
	GPUs []fit.Usage
	// Terminating: deletionTimestamp is set; the GPUs are held until the
	// pod is gone.
	Terminating bool
}

// PodUsage reports whether p holds GPU capacity now and which. holds is
// false, with no error, for a pod that holds nothing (no devices
// annotation, not yet bound or pinned, Succeeded or Failed); err is set when
// the devices annotation cannot be parsed (the caller decides whether to
// warn; the pod is then not counted). A whole-GPU pod (nvidia.com/gpu with
// no memory request, read as the check reads a template) holds its GPUs
// exclusively; otherwise each GPU holds the annotation's MiB and the pod's
// SM share.
func PodUsage(p *corev1.Pod) (Pod, bool, error) {
	out := Pod{UID: p.UID, Terminating: p.DeletionTimestamp != nil}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return out, false, nil
	}
	s, ok := p.Annotations[v1alpha1.AnnotationDevices]
	if !ok {
		return out, false, nil
	}
	if p.Spec.NodeName == "" && p.Annotations[v1alpha1.AnnotationPlan] == "" {
		return out, false, nil
	}
	devs, err := v1alpha1.ParseDevices(s)
	if err != nil {
		return out, false, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	// Whole or shared, read as the check read the pod's template; if the pod
	// cannot be read that way any more, its resources decide.
	var exclusive bool
	var cores int32
	if ps, ok, err := inventory.TemplateRequest(&corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}); err == nil && ok {
		exclusive, cores = ps.Exclusive(), ps.Cores
	} else {
		total := podResources(&p.Spec)
		vgpus := quantity(total, v1alpha1.ResourceVGPU)
		exclusive = quantity(total, v1alpha1.ResourceNvidiaGPU) > 0 && vgpus == 0
		if vgpus > 0 {
			cores = int32(min(quantity(total, v1alpha1.ResourceGPUCores)/vgpus, 100))
		}
	}
	out.GPUs = make([]fit.Usage, len(devs))
	for i, d := range devs {
		out.GPUs[i] = fit.Usage{UUID: d.UUID, MemoryMiB: d.MemoryMiB, Cores: cores, Exclusive: exclusive}
		if exclusive {
			out.GPUs[i].Cores = 100
		}
	}
	return out, true, nil
}

// NodeUsage is what a pod holds on its node besides GPUs.
type NodeUsage struct {
	Node string
	// Requests in milli-units (cpu, memory, ephemeral-storage, extended
	// resources); the pod also holds one of the node's pods.
	Requests    map[corev1.ResourceName]int64
	Terminating bool
}

// PodNodeUsage reports what p holds on its node of everything but GPUs:
// holds is false for a pod not bound to a node, or Succeeded or Failed.
func PodNodeUsage(p *corev1.Pod) (NodeUsage, bool) {
	if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return NodeUsage{}, false
	}
	return NodeUsage{Node: p.Spec.NodeName, Requests: inventory.PodRequests(&p.Spec), Terminating: p.DeletionTimestamp != nil}, true
}

// Slot is one pod slot of a plan.
type Slot struct {
	PodSet string
	Index  int32
	Node   string
	// PodName and PodUID: the pod bound to the slot (status.bindings), or "".
	PodName string
	PodUID  types.UID
	GPUs    []fit.Usage
	// Requests: what the slot's pod asks besides GPUs (nil if the plan
	// does not say), held on Node with the GPUs.
	Requests map[corev1.ResourceName]int64
}

// PlanSlots lists every slot of a plan that is not Released (none when it
// is), with its binding.
func PlanSlots(plan *v1alpha1.GPUPlan) []Slot {
	if plan.Status.Phase == v1alpha1.PlanReleased {
		return nil
	}
	type key struct {
		podSet string
		index  int32
	}
	// An unreadable annotation reserves nothing besides the GPUs (the
	// plan's pods still count their own requests once they are bound).
	reqs, _ := inventory.ParsePodRequests(plan.Annotations[v1alpha1.AnnotationPodRequests])
	bound := make(map[key]v1alpha1.SlotBinding, len(plan.Status.Bindings))
	for _, b := range plan.Status.Bindings {
		bound[key{b.PodSet, b.Index}] = b
	}
	out := make([]Slot, 0, len(plan.Spec.Assignments))
	for _, a := range plan.Spec.Assignments {
		b := bound[key{a.PodSet, a.Index}]
		s := Slot{PodSet: a.PodSet, Index: a.Index, Node: a.Node, PodName: b.PodName, PodUID: b.PodUID, Requests: reqs[a.PodSet]}
		for _, g := range a.GPUs {
			u := fit.Usage{UUID: g.UUID, MemoryMiB: g.MemoryMiB, Cores: g.Cores, Exclusive: g.Exclusive}
			if g.Exclusive && u.Cores == 0 {
				u.Cores = 100
			}
			s.GPUs = append(s.GPUs, u)
		}
		out = append(out, s)
	}
	return out
}

// SlotHolds is the second half of the rule: a slot reserves its GPUs unless
// the pod bound to it by UID is counted (counted reports whether a pod UID
// is a live pod that PodUsage said holds).
func SlotHolds(s Slot, counted func(types.UID) bool) bool {
	return s.PodUID == "" || !counted(s.PodUID)
}

// Holder is one source of usage in a Ledger: a pod, or a plan's slot.
type Holder struct {
	// Pod is namespace/name of the pod, or "" for a plan slot.
	Pod string
	// Plan is namespace/name of the plan, or "" for a pod.
	Plan        string
	Slot        Slot
	GPUs        []fit.Usage
	Terminating bool
}

// Ledger applies the whole rule to a set of pods and plans (a snapshot of
// the cluster, or the files `gpupack fit` read): every holder, in input
// order (pods first), and a warning for each pod whose devices cannot be read.
func Ledger(pods []corev1.Pod, plans []v1alpha1.GPUPlan) (holders []Holder, warnings []string) {
	counted := make(map[types.UID]bool, len(pods))
	for i := range pods {
		p := &pods[i]
		u, holds, err := PodUsage(p)
		if err != nil {
			warnings = append(warnings, err.Error()+"; not counted")
			continue
		}
		if !holds {
			continue
		}
		if p.UID != "" {
			counted[p.UID] = true
		}
		holders = append(holders, Holder{Pod: p.Namespace + "/" + p.Name, GPUs: u.GPUs, Terminating: u.Terminating})
	}
	isCounted := func(uid types.UID) bool { return counted[uid] }
	for i := range plans {
		pl := &plans[i]
		for _, s := range PlanSlots(pl) {
			if SlotHolds(s, isCounted) {
				holders = append(holders, Holder{Plan: pl.Namespace + "/" + pl.Name, Slot: s, GPUs: s.GPUs})
			}
		}
	}
	return holders, warnings
}

// podResources sums the GPU resources of a pod's containers (limits, else
// requests) and its sidecar init containers; a plain init container runs
// alone, so only its excess over that sum counts.
func podResources(p *corev1.PodSpec) corev1.ResourceList {
	sum := corev1.ResourceList{}
	get := func(c *corev1.Container, n corev1.ResourceName) (resource.Quantity, bool) {
		v, ok := c.Resources.Limits[n]
		if !ok {
			v, ok = c.Resources.Requests[n]
		}
		return v, ok
	}
	add := func(c *corev1.Container) {
		for _, n := range gpuResources {
			if q, ok := get(c, n); ok {
				cur := sum[n]
				cur.Add(q)
				sum[n] = cur
			}
		}
	}
	sidecar := func(c *corev1.Container) bool {
		return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
	}
	for i := range p.Containers {
		add(&p.Containers[i])
	}
	for i := range p.InitContainers {
		if sidecar(&p.InitContainers[i]) {
			add(&p.InitContainers[i])
		}
	}
	for i := range p.InitContainers {
		c := &p.InitContainers[i]
		if sidecar(c) {
			continue
		}
		for _, n := range gpuResources {
			if q, ok := get(c, n); ok {
				if cur := sum[n]; q.Cmp(cur) > 0 {
					sum[n] = q
				}
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
