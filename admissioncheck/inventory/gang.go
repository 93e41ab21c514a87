package inventory

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/webhooks/gpureq"
)

// GangFromPodSets reads a Workload's pod sets. After gpupack's mutating
// webhook a shared request is gpupack.io/vgpu: N with gpupack.io/gpu-memory:
// N×MiB and gpupack.io/gpu-cores: N×percent; in the webhook's hami mode it
// is nvidia.com/gpu: N with nvidia.com/gpumem (or gpumem-percentage) and
// nvidia.com/gpucores *per GPU* — N shared GPUs, not N whole ones. A
// whole-GPU request is nvidia.com/gpu: N only. A template that still has
// nvidia.com/gpu with memory annotations or HAMi resources (the webhook did
// not run, or a memory percentage it cannot convert) is read as the shared
// request they describe. Pod sets without GPUs are left out.
//
// ns is the Workload's namespace (its pods'): the GPU pod sets' required
// pod anti-affinity is read into Apart (pod sets whose pods may not share a
// node), and returned per pod set for the running pods' side
// (gpucache.Snapshot.Decide). A pod affinity rule the plan cannot honour
// is an error wrapping ErrNotPlanned.
func GangFromPodSets(ns string, podSets []kueue.PodSet) (fit.Gang, []PodAffinity, error) {
	var g fit.Gang
	for i := range podSets {
		ps := &podSets[i]
		req, ok, err := TemplateRequest(&ps.Template)
		if err != nil {
			return fit.Gang{}, nil, fmt.Errorf("pod set %s: %w", ps.Name, err)
		}
		if !ok {
			continue
		}
		req.Name = string(ps.Name)
		req.Count = int(ps.Count)
		g.PodSets = append(g.PodSets, req)
	}
	aff, err := podAffinities(ns, podSets, &g)
	if err != nil {
		return fit.Gang{}, nil, err
	}
	return g, aff, nil
}

// TemplateRequest reads one pod template's GPU request per pod; false when
// it asks for no GPU. Name and Count are left for the caller. Each
// container is read by webhooks/gpureq, the same reading the webhooks use
// (gpupack and HAMi annotations and resources, raw or converted); the GPU
// containers of a pod must agree on the per-GPU share, and their GPU counts
// add up (sidecar init containers too; a plain init container runs alone,
// so it only raises the peak).
func TemplateRequest(t *corev1.PodTemplateSpec) (fit.PodSet, bool, error) {
	out := fit.PodSet{NodeSelector: t.Spec.NodeSelector, NodeAffinity: requiredNodeAffinity(t), Tolerations: t.Spec.Tolerations,
		Requests: PodRequests(&t.Spec)}
	ann, err := gpureq.ParseAnnotations(t.Annotations)
	if err != nil {
		return out, false, err
	}
	var (
		sum, peak int64
		first     *gpureq.Request
		firstName string
	)
	read := func(c *corev1.Container) (gpureq.Request, error) {
		r, err := gpureq.ContainerRequest(ann, c)
		if err != nil || r.Kind == gpureq.NoGPU {
			return r, err
		}
		if first == nil {
			first, firstName = &r, c.Name
			return r, nil
		}
		if (first.Kind == gpureq.Whole) != (r.Kind == gpureq.Whole) || first.Spec != r.Spec {
			return r, fmt.Errorf("containers %s and %s ask for different kinds of GPU share (%v %+v vs %v %+v); one pod gets one kind", firstName, c.Name, first.Kind, first.Spec, r.Kind, r.Spec)
		}
		return r, nil
	}
	for i := range t.Spec.Containers {
		r, err := read(&t.Spec.Containers[i])
		if err != nil {
			return out, false, err
		}
		sum += r.GPUs
	}
	for i := range t.Spec.InitContainers {
		c := &t.Spec.InitContainers[i]
		r, err := read(c)
		if err != nil {
			return out, false, err
		}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sum += r.GPUs
		} else {
			peak = max(peak, r.GPUs)
		}
	}
	gpus := max(sum, peak)
	if first == nil || gpus == 0 {
		return out, false, nil
	}
	if gpus > gpureq.MaxGPUs {
		return out, false, fmt.Errorf("asks for %d GPUs per pod, at most %d", gpus, gpureq.MaxGPUs)
	}
	out.GPUsPerPod = int(gpus)
	if first.Kind != gpureq.Whole {
		out.MemoryMiB, out.MemoryPercent, out.Cores = first.Spec.MemoryMiB, first.Spec.MemoryPercent, first.Spec.Cores
	}
	return out, true, nil
}

// requiredNodeAffinity is the template's required node affinity. Preferred
// terms never keep a pod off a node, and pod (anti-)affinity depends on
// other pods, so neither is read.
func requiredNodeAffinity(t *corev1.PodTemplateSpec) *corev1.NodeSelector {
	if a := t.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	return nil
}
