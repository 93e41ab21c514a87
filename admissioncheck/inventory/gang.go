package inventory

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
)

// MaxMemoryMiB bounds a per-GPU memory request (16 TiB): anything larger is a
// typo and would overflow N×MiB sums.
const MaxMemoryMiB int64 = 16 << 20

// GangFromPodSets reads a Workload's pod sets. After gpupack's mutating
// webhook a shared request is gpupack.io/vgpu: N with gpupack.io/gpu-memory:
// N×MiB and gpupack.io/gpu-cores: N×percent (memory may instead be HAMi's
// nvidia.com/gpumem-percentage annotation); a whole-GPU request is
// nvidia.com/gpu: N only. A template that still has nvidia.com/gpu with
// memory annotations (the webhook did not run) is read as the shared request
// the annotations describe. Resources are summed over containers. Pod sets
// without GPUs are left out.
func GangFromPodSets(podSets []kueue.PodSet) (fit.Gang, error) {
	var g fit.Gang
	for i := range podSets {
		ps := &podSets[i]
		req, ok, err := TemplateRequest(&ps.Template)
		if err != nil {
			return fit.Gang{}, fmt.Errorf("pod set %s: %w", ps.Name, err)
		}
		if !ok {
			continue
		}
		req.Name = string(ps.Name)
		req.Count = int(ps.Count)
		g.PodSets = append(g.PodSets, req)
	}
	return g, nil
}

// TemplateRequest reads one pod template's GPU request per pod; false when
// it asks for no GPU. Name and Count are left for the caller.
func TemplateRequest(t *corev1.PodTemplateSpec) (fit.PodSet, bool, error) {
	total := podResources(&t.Spec)
	gpus, vgpus := quantity(total, v1alpha1.ResourceNvidiaGPU), quantity(total, v1alpha1.ResourceVGPU)
	mem, cores := quantity(total, v1alpha1.ResourceGPUMemory), quantity(total, v1alpha1.ResourceGPUCores)
	out := fit.PodSet{NodeSelector: t.Spec.NodeSelector, Tolerations: t.Spec.Tolerations}
	switch {
	case gpus < 0 || vgpus < 0 || mem < 0 || cores < 0:
		return out, false, fmt.Errorf("negative GPU resources")
	case gpus > 0 && vgpus > 0:
		return out, false, fmt.Errorf("asks for both %s and %s", v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU)
	case vgpus > 1024 || gpus > 1024:
		return out, false, fmt.Errorf("asks for more than 1024 GPUs per pod")
	case vgpus > 0:
		out.GPUsPerPod = int(vgpus)
		if cores%vgpus != 0 || cores/vgpus > 100 {
			return out, false, fmt.Errorf("%s %d is not a per-GPU percentage × %s %d", v1alpha1.ResourceGPUCores, cores, v1alpha1.ResourceVGPU, vgpus)
		}
		out.Cores = int32(cores / vgpus)
		if mem > 0 {
			if mem%vgpus != 0 || mem/vgpus > MaxMemoryMiB {
				return out, false, fmt.Errorf("%s %d is not per-GPU MiB × %s %d", v1alpha1.ResourceGPUMemory, mem, v1alpha1.ResourceVGPU, vgpus)
			}
			out.MemoryMiB = mem / vgpus
			return out, true, nil
		}
		a, err := AnnotatedRequest(t.Annotations)
		if err != nil {
			return out, false, err
		}
		if a.MemoryPercent == 0 && a.MemoryMiB == 0 {
			return out, false, fmt.Errorf("asks for %s without %s: every shared GPU needs a memory limit", v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUMemory)
		}
		out.MemoryMiB, out.MemoryPercent = a.MemoryMiB, a.MemoryPercent
		return out, true, nil
	case gpus > 0:
		out.GPUsPerPod = int(gpus)
		a, err := AnnotatedRequest(t.Annotations)
		if err != nil {
			return out, false, err
		}
		if a, err = hamiResources(&t.Spec, a); err != nil {
			return out, false, err
		}
		out.MemoryMiB, out.MemoryPercent, out.Cores = a.MemoryMiB, a.MemoryPercent, a.Cores
		if !out.Exclusive() {
			return out, true, nil
		}
		if a.Cores > 0 {
			return out, false, fmt.Errorf("%s without a memory request: a GPU without memory is exclusive; add %s to share it", v1alpha1.AnnotationGPUCores, v1alpha1.AnnotationGPUMemory)
		}
		return out, true, nil
	case mem > 0 || cores > 0:
		return out, false, fmt.Errorf("asks for %s/%s without %s", v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores, v1alpha1.ResourceVGPU)
	}
	return out, false, nil
}

// Request is a per-GPU request read from annotations.
type Request struct {
	MemoryMiB     int64
	MemoryPercent int32
	Cores         int32
}

// AnnotatedRequest reads gpupack.io/gpu-memory and gpupack.io/gpu-cores, or
// HAMi's nvidia.com/gpumem, nvidia.com/gpumem-percentage and
// nvidia.com/gpucores. gpupack's and HAMi's names may both be set only if
// they agree.
func AnnotatedRequest(ann map[string]string) (Request, error) {
	var r Request
	gm, err := annMemory(ann, v1alpha1.AnnotationGPUMemory)
	if err != nil {
		return r, err
	}
	hm, err := annMemory(ann, v1alpha1.AnnotationHAMiGPUMem)
	if err != nil {
		return r, err
	}
	if gm > 0 && hm > 0 && gm != hm {
		return r, fmt.Errorf("%s (%d MiB) and %s (%d MiB) disagree; set one", v1alpha1.AnnotationGPUMemory, gm, v1alpha1.AnnotationHAMiGPUMem, hm)
	}
	r.MemoryMiB = max(gm, hm)
	pct, err := annPercent(ann, v1alpha1.AnnotationHAMiGPUMemPercentage, 1)
	if err != nil {
		return r, err
	}
	if pct > 0 && r.MemoryMiB > 0 {
		return r, fmt.Errorf("%s and a memory size are both set; set one", v1alpha1.AnnotationHAMiGPUMemPercentage)
	}
	r.MemoryPercent = pct
	gc, err := annPercent(ann, v1alpha1.AnnotationGPUCores, 1)
	if err != nil {
		return r, err
	}
	hc, err := annPercent(ann, v1alpha1.AnnotationHAMiGPUCores, 0)
	if err != nil {
		return r, err
	}
	if gc > 0 && hc > 0 && gc != hc {
		return r, fmt.Errorf("%s (%d) and %s (%d) disagree; set one", v1alpha1.AnnotationGPUCores, gc, v1alpha1.AnnotationHAMiGPUCores, hc)
	}
	r.Cores = max(gc, hc)
	return r, nil
}

// ParseMemoryMiB parses a per-GPU memory value: a plain integer is MiB (as in
// HAMi); anything else is a Kubernetes quantity of bytes, rounded up to MiB.
func ParseMemoryMiB(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s != "" && strings.Trim(s, "0123456789") == "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 1 || v > MaxMemoryMiB {
			return 0, fmt.Errorf("%q MiB is not in 1–%d", s, MaxMemoryMiB)
		}
		return v, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%q is neither MiB nor a quantity such as 20Gi", s)
	}
	if q.Sign() <= 0 || q.Cmp(*resource.NewQuantity(MaxMemoryMiB<<20, resource.BinarySI)) > 0 {
		return 0, fmt.Errorf("%q is not in 1 MiB–16 TiB", s)
	}
	b := q.Value() // rounds fractions of a byte up
	return (b + 1<<20 - 1) >> 20, nil
}

func annMemory(ann map[string]string, key string) (int64, error) {
	s, ok := ann[key]
	if !ok {
		return 0, nil
	}
	v, err := ParseMemoryMiB(s)
	if err != nil {
		return 0, fmt.Errorf("annotation %s: %w", key, err)
	}
	return v, nil
}

func annPercent(ann map[string]string, key string, lo int) (int32, error) {
	s, ok := ann[key]
	if !ok {
		return 0, nil
	}
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < lo || v > 100 {
		return 0, fmt.Errorf("annotation %s=%q: want a whole percentage %d–100", key, s, lo)
	}
	return int32(v), nil
}

// hamiResources applies HAMi's per-GPU container resources (nvidia.com/gpumem,
// nvidia.com/gpumem-percentage, nvidia.com/gpucores in limits), which
// override annotations as they do in HAMi. The first GPU container that sets
// them decides.
func hamiResources(spec *corev1.PodSpec, r Request) (Request, error) {
	for i := range spec.Containers {
		c := &spec.Containers[i]
		get := func(n string, lo, hi int64) (int64, bool, error) {
			q, ok := c.Resources.Limits[corev1.ResourceName(n)]
			if !ok {
				return 0, false, nil
			}
			v, exact := q.AsInt64()
			if !exact || v < lo || v > hi {
				return 0, true, fmt.Errorf("container %s: %s %s is not in %d–%d", c.Name, n, q.String(), lo, hi)
			}
			return v, true, nil
		}
		mem, hasMem, err := get(v1alpha1.AnnotationHAMiGPUMem, 1, MaxMemoryMiB)
		if err != nil {
			return r, err
		}
		pct, hasPct, err := get(v1alpha1.AnnotationHAMiGPUMemPercentage, 1, 100)
		if err != nil {
			return r, err
		}
		cores, hasCores, err := get(v1alpha1.AnnotationHAMiGPUCores, 0, 100)
		if err != nil {
			return r, err
		}
		if hasMem && hasPct {
			return r, fmt.Errorf("container %s: %s and %s both set; set one", c.Name, v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage)
		}
		if !hasMem && !hasPct && !hasCores {
			continue
		}
		if hasMem {
			r.MemoryMiB, r.MemoryPercent = mem, 0
		}
		if hasPct {
			r.MemoryMiB, r.MemoryPercent = 0, int32(pct)
		}
		if hasCores {
			r.Cores = int32(cores)
		}
		return r, nil
	}
	return r, nil
}
