// Package gpureq parses what a pod template asks of GPUs: the gpupack and HAMi
// request annotations (job level and template level), HAMi's per-container
// resources, nvidia.com/gpu, and the already-converted gpupack.io/* resources.
// It is pure: no API server, no GPU model lookups. Percentages of memory stay
// percentages here; the caller resolves them against a GPU model.
package gpureq

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// MaxMemoryMiB bounds a per-GPU memory request (16 TiB); larger values are
// typos and would overflow N×MiB sums.
const MaxMemoryMiB int64 = 16 << 20

// MaxGPUs bounds the GPU count of one container.
const MaxGPUs int64 = 1024

// Spec is the per-GPU request of one pod template (or container). Zero fields
// are unset.
type Spec struct {
	// MemoryMiB is the memory per GPU.
	MemoryMiB int64
	// MemoryPercent is HAMi's nvidia.com/gpumem-percentage: a share of the
	// GPU's allocatable memory, resolved by the caller once the model is known.
	MemoryPercent int32
	// Cores is the SM percent per GPU, 1–100.
	Cores int32
}

// HasMemory reports whether a memory request (absolute or percent) is set.
// A GPU request with memory is fractional; without it, exclusive.
func (s Spec) HasMemory() bool { return s.MemoryMiB > 0 || s.MemoryPercent > 0 }

// IsZero reports whether nothing is requested.
func (s Spec) IsZero() bool { return s == Spec{} }

// RequestKeys are every annotation key this package reads. The validating
// webhook forbids editing them on running jobs.
var RequestKeys = []string{
	v1alpha1.AnnotationGPUMemory,
	v1alpha1.AnnotationGPUCores,
	v1alpha1.AnnotationHAMiGPUMem,
	v1alpha1.AnnotationHAMiGPUMemPercentage,
	v1alpha1.AnnotationHAMiGPUCores,
}

// HasRequestAnnotation reports whether any request key is present.
func HasRequestAnnotation(ann map[string]string) bool {
	for _, k := range RequestKeys {
		if _, ok := ann[k]; ok {
			return true
		}
	}
	return false
}

// ParseMemoryMiB parses a per-GPU memory value: a plain integer is MiB (as in
// HAMi's nvidia.com/gpumem); anything else is a Kubernetes quantity of bytes,
// rounded up to whole MiB.
func ParseMemoryMiB(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty memory value")
	}
	if isDigits(t) {
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil || n > MaxMemoryMiB {
			return 0, fmt.Errorf("memory %q is too large (at most %d MiB)", s, MaxMemoryMiB)
		}
		if n <= 0 {
			return 0, fmt.Errorf("memory %q must be more than 0", s)
		}
		return n, nil
	}
	if isDecimal(t) {
		return 0, fmt.Errorf("memory %q: a plain number means MiB and must be a whole number (or write a quantity such as 1536Mi or 1.5Gi)", s)
	}
	// resource.ParseQuantity computes 10^exp with big integers: an input
	// like 1e999999999 would take minutes, so bound the text first.
	if len(t) > 40 || hugeExponent(t) {
		return 0, fmt.Errorf("memory %q is not a sensible quantity (examples: 20Gi, 512Mi, or 20480 for MiB)", s)
	}
	q, err := resource.ParseQuantity(t)
	if err != nil {
		return 0, fmt.Errorf("memory %q is not a quantity (examples: 20Gi, 512Mi, or 20480 for MiB)", s)
	}
	if q.Sign() <= 0 {
		return 0, fmt.Errorf("memory %q must be more than 0", s)
	}
	const mib = 1 << 20
	// Compare against the bound before converting so huge exponents cannot overflow.
	if q.Cmp(*resource.NewQuantity(MaxMemoryMiB*mib, resource.BinarySI)) > 0 {
		return 0, fmt.Errorf("memory %q is too large (at most %d MiB)", s, MaxMemoryMiB)
	}
	if q.Cmp(*resource.NewQuantity(mib, resource.BinarySI)) < 0 {
		return 0, fmt.Errorf("memory %q is less than 1 MiB", s)
	}
	// Ceil to bytes first (milli-quantities), then to MiB.
	return (q.Value() + mib - 1) / mib, nil
}

// ParsePercent parses an integer percentage in 1–100 (gpu-cores, gpucores,
// gpumem-percentage).
func ParsePercent(what, s string) (int32, error) {
	t := strings.TrimSpace(s)
	if !isDigits(t) {
		return 0, fmt.Errorf("%s %q must be a whole number from 1 to 100", what, s)
	}
	n, err := strconv.ParseInt(t, 10, 32)
	if err != nil || n < 1 || n > 100 {
		return 0, fmt.Errorf("%s %q is outside 1–100", what, s)
	}
	return int32(n), nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// hugeExponent reports a decimal exponent (e/E followed by a signed number)
// with more than two digits.
func hugeExponent(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != 'e' && s[i] != 'E' {
			continue
		}
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := j
		for k < len(s) && s[k] >= '0' && s[k] <= '9' {
			k++
		}
		if k-j > 2 {
			return true
		}
	}
	return false
}

func isDecimal(s string) bool {
	dot := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.' && !dot:
			dot = true
		case c < '0' || c > '9':
			return false
		}
	}
	return dot
}

// levelSpec is what one annotation map sets, with presence bits so a template
// overrides a job field by field.
type levelSpec struct {
	Spec
	memSet, coresSet bool
}

// parseLevel reads one annotation map and rejects conflicting gpupack/HAMi
// values within it.
func parseLevel(where string, ann map[string]string) (levelSpec, error) {
	var l levelSpec
	var gp, hm int64
	if v, ok := ann[v1alpha1.AnnotationGPUMemory]; ok {
		n, err := ParseMemoryMiB(v)
		if err != nil {
			return l, fmt.Errorf("%s annotation %s: %w", where, v1alpha1.AnnotationGPUMemory, err)
		}
		gp = n
	}
	if v, ok := ann[v1alpha1.AnnotationHAMiGPUMem]; ok {
		n, err := ParseMemoryMiB(v)
		if err != nil {
			return l, fmt.Errorf("%s annotation %s: %w", where, v1alpha1.AnnotationHAMiGPUMem, err)
		}
		hm = n
	}
	if gp > 0 && hm > 0 && gp != hm {
		return l, fmt.Errorf("%s annotations conflict: %s is %d MiB but %s is %d MiB; set one of them", where, v1alpha1.AnnotationGPUMemory, gp, v1alpha1.AnnotationHAMiGPUMem, hm)
	}
	l.MemoryMiB = max(gp, hm)
	if v, ok := ann[v1alpha1.AnnotationHAMiGPUMemPercentage]; ok {
		p, err := ParsePercent(where+" annotation "+v1alpha1.AnnotationHAMiGPUMemPercentage, v)
		if err != nil {
			return l, err
		}
		if l.MemoryMiB > 0 {
			return l, fmt.Errorf("%s annotations conflict: %s and an absolute memory (%s/%s) are both set; set one of them", where, v1alpha1.AnnotationHAMiGPUMemPercentage, v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationHAMiGPUMem)
		}
		l.MemoryPercent = p
	}
	l.memSet = l.HasMemory()
	var gc, hc int32
	if v, ok := ann[v1alpha1.AnnotationGPUCores]; ok {
		p, err := ParsePercent(where+" annotation "+v1alpha1.AnnotationGPUCores, v)
		if err != nil {
			return l, err
		}
		gc = p
	}
	if v, ok := ann[v1alpha1.AnnotationHAMiGPUCores]; ok {
		p, err := ParsePercent(where+" annotation "+v1alpha1.AnnotationHAMiGPUCores, v)
		if err != nil {
			return l, err
		}
		hc = p
	}
	if gc > 0 && hc > 0 && gc != hc {
		return l, fmt.Errorf("%s annotations conflict: %s is %d but %s is %d; set one of them", where, v1alpha1.AnnotationGPUCores, gc, v1alpha1.AnnotationHAMiGPUCores, hc)
	}
	l.Cores = max(gc, hc)
	l.coresSet = l.Cores > 0
	return l, nil
}

// ParseAnnotations reads the request of one annotation map.
func ParseAnnotations(ann map[string]string) (Spec, error) {
	l, err := parseLevel("pod", ann)
	return l.Spec, err
}

// Effective is the request of a replica template: the job's annotations are
// defaults, the template's own override them (memory and cores separately).
func Effective(job, tmpl map[string]string) (Spec, error) {
	j, err := parseLevel("job", job)
	if err != nil {
		return Spec{}, err
	}
	t, err := parseLevel("template", tmpl)
	if err != nil {
		return Spec{}, err
	}
	out := j.Spec
	if t.memSet {
		out.MemoryMiB, out.MemoryPercent = t.MemoryMiB, t.MemoryPercent
	}
	if t.coresSet {
		out.Cores = t.Cores
	}
	return out, nil
}

// Kind classifies a container's GPU request.
type Kind int

const (
	// NoGPU: the container asks for no GPU.
	NoGPU Kind = iota
	// Whole: nvidia.com/gpu without memory — exclusive GPUs.
	Whole
	// Fractional: a share of each GPU — nvidia.com/gpu with a memory request
	// from annotations or HAMi's per-container resources. The webhook's
	// gpupack mode converts it to gpupack.io/* (then Converted); its hami
	// mode writes it as HAMi's resources (nvidia.com/gpu + gpumem
	// [+ gpucores]), which read back as Fractional again, with the same
	// Spec: HAMi form is a fixed point of hami mode, and the input that
	// gpupack mode converts.
	Fractional
	// Converted: already expressed as gpupack.io/vgpu + gpu-memory (a pod
	// created from a mutated job template, or a second webhook pass). The
	// hami mode rewrites it as HAMi's resources.
	Converted
)

func (k Kind) String() string {
	return [...]string{"NoGPU", "Whole", "Fractional", "Converted"}[k]
}

// Request is one container's GPU request.
type Request struct {
	Kind Kind
	GPUs int64
	// Spec is per GPU. For Converted it is read back from the resources.
	Spec Spec
}

// resourceValue reads name from limits, else requests. Extended resources
// must be equal in both, so either is the request.
func resourceValue(c *corev1.Container, name corev1.ResourceName) (resource.Quantity, bool) {
	if q, ok := c.Resources.Limits[name]; ok {
		return q, true
	}
	q, ok := c.Resources.Requests[name]
	return q, ok
}

func intResource(c *corev1.Container, name corev1.ResourceName, lo, hi int64) (int64, bool, error) {
	q, ok := resourceValue(c, name)
	if !ok {
		return 0, false, nil
	}
	v, exact := q.AsInt64()
	if !exact || v < lo || v > hi {
		return 0, true, fmt.Errorf("container %q: %s %s must be a whole number from %d to %d", c.Name, name, q.String(), lo, hi)
	}
	return v, true, nil
}

// ContainerRequest classifies container c of a template whose annotations
// ask for tmpl. HAMi's per-container resources (nvidia.com/gpumem,
// gpumem-percentage, gpucores) override the template's annotations for that
// container, as they do in HAMi.
func ContainerRequest(tmpl Spec, c *corev1.Container) (Request, error) {
	gpus, hasGPU, err := intResource(c, v1alpha1.ResourceNvidiaGPU, 0, MaxGPUs)
	if err != nil {
		return Request{}, err
	}
	vgpus, hasVGPU, err := intResource(c, v1alpha1.ResourceVGPU, 0, MaxGPUs)
	if err != nil {
		return Request{}, err
	}
	memTotal, hasMem, err := intResource(c, v1alpha1.ResourceGPUMemory, 1, MaxGPUs*MaxMemoryMiB)
	if err != nil {
		return Request{}, err
	}
	coresTotal, hasCores, err := intResource(c, v1alpha1.ResourceGPUCores, 1, MaxGPUs*100)
	if err != nil {
		return Request{}, err
	}

	spec := tmpl
	if v, ok, err := intResource(c, v1alpha1.AnnotationHAMiGPUMem, 1, MaxMemoryMiB); err != nil {
		return Request{}, err
	} else if ok {
		spec.MemoryMiB, spec.MemoryPercent = v, 0
	}
	if v, ok, err := intResource(c, v1alpha1.AnnotationHAMiGPUMemPercentage, 1, 100); err != nil {
		return Request{}, err
	} else if ok {
		if _, abs := resourceValue(c, v1alpha1.AnnotationHAMiGPUMem); abs {
			return Request{}, fmt.Errorf("container %q: resources %s and %s conflict; set one of them", c.Name, v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage)
		}
		spec.MemoryMiB, spec.MemoryPercent = 0, int32(v)
	}
	if v, ok, err := intResource(c, v1alpha1.AnnotationHAMiGPUCores, 1, 100); err != nil {
		return Request{}, err
	} else if ok {
		spec.Cores = int32(v)
	}

	switch {
	case hasVGPU && hasGPU && gpus > 0 && vgpus > 0:
		return Request{}, fmt.Errorf("container %q asks for both %s and %s; ask for %s only (with %s for a share of each GPU)", c.Name, v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU, v1alpha1.ResourceNvidiaGPU, v1alpha1.AnnotationGPUMemory)
	case hasVGPU && vgpus > 0:
		if !hasMem {
			return Request{}, fmt.Errorf("container %q asks for %s without %s; every shared GPU needs a memory limit", c.Name, v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUMemory)
		}
		if memTotal%vgpus != 0 || (hasCores && coresTotal%vgpus != 0) {
			return Request{}, fmt.Errorf("container %q: %s and %s must be multiples of %s (%d)", c.Name, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores, v1alpha1.ResourceVGPU, vgpus)
		}
		got := Spec{MemoryMiB: memTotal / vgpus}
		if hasCores {
			got.Cores = int32(coresTotal / vgpus)
			if got.Cores > 100 {
				return Request{}, fmt.Errorf("container %q: %s is %d per GPU, more than 100", c.Name, v1alpha1.ResourceGPUCores, got.Cores)
			}
		}
		// The annotations are the source of the conversion; if they still
		// say something else, someone edited one side by hand.
		if spec.MemoryMiB > 0 && spec.MemoryMiB != got.MemoryMiB {
			return Request{}, fmt.Errorf("container %q requests %d MiB of %s per GPU but the annotations ask for %d MiB; remove the %s resources and let the webhook set them", c.Name, got.MemoryMiB, v1alpha1.ResourceGPUMemory, spec.MemoryMiB, v1alpha1.ResourceVGPU)
		}
		if spec.Cores > 0 && spec.Cores != got.Cores {
			return Request{}, fmt.Errorf("container %q requests %d %s per GPU but the annotations ask for %d; remove the %s resources and let the webhook set them", c.Name, got.Cores, v1alpha1.ResourceGPUCores, spec.Cores, v1alpha1.ResourceVGPU)
		}
		return Request{Kind: Converted, GPUs: vgpus, Spec: got}, nil
	case hasMem || hasCores:
		return Request{}, fmt.Errorf("container %q asks for %s/%s without %s", c.Name, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores, v1alpha1.ResourceVGPU)
	case !hasGPU || gpus == 0:
		if spec.MemoryMiB > 0 || spec.MemoryPercent > 0 || spec.Cores > 0 {
			// Only an error when the container itself carries HAMi resources;
			// template annotations apply to GPU containers only and the caller
			// checks that at least one exists.
			if _, ok := resourceValue(c, v1alpha1.AnnotationHAMiGPUMem); ok {
				return Request{}, errNoGPU(c.Name)
			}
			if _, ok := resourceValue(c, v1alpha1.AnnotationHAMiGPUMemPercentage); ok {
				return Request{}, errNoGPU(c.Name)
			}
			if _, ok := resourceValue(c, v1alpha1.AnnotationHAMiGPUCores); ok {
				return Request{}, errNoGPU(c.Name)
			}
		}
		return Request{Kind: NoGPU}, nil
	}
	if !spec.HasMemory() {
		if spec.Cores > 0 {
			return Request{}, fmt.Errorf("container %q sets %s without %s: a GPU without a memory request is exclusive; add %s to share it", c.Name, v1alpha1.AnnotationGPUCores, v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationGPUMemory)
		}
		return Request{Kind: Whole, GPUs: gpus}, nil
	}
	return Request{Kind: Fractional, GPUs: gpus, Spec: spec}, nil
}

func errNoGPU(name string) error {
	return fmt.Errorf("container %q sets HAMi GPU resources without %s in limits", name, v1alpha1.ResourceNvidiaGPU)
}

// Demand is what a pod set's per-pod resources ask of GPUs, read back from
// the converted resources (what Kueue counts): gpupack.io/* (gpupack mode)
// or HAMi's (hami mode). The gang-fit check can use it on Workload pod sets.
type Demand struct {
	// GPUs per pod.
	GPUs int64
	// MemoryMiB per GPU; 0 when Exclusive (or given as MemoryPercent).
	MemoryMiB int64
	// MemoryPercent is HAMi's nvidia.com/gpumem-percentage (a share of each
	// GPU's allocatable memory), left when no GPU model resolved it.
	MemoryPercent int32
	// Cores per GPU; 0 when unset (no SM reservation) or Exclusive.
	Cores int32
	// Exclusive: whole GPUs (nvidia.com/gpu).
	Exclusive bool
}

// DemandFromResources reads a pod's total resource requests (or limits).
// HAMi form — nvidia.com/gpu: N with nvidia.com/gpumem (or
// gpumem-percentage) and optionally nvidia.com/gpucores — is N shared GPUs
// with that memory and cores *per GPU*: HAMi's resources are per GPU, not
// × N, so a pod total reads right for a pod with one GPU container (what the
// webhook's hami mode writes per container; for several, read each
// container with ContainerRequest).
func DemandFromResources(rl corev1.ResourceList) (Demand, error) {
	get := func(n string) (int64, bool, error) {
		q, ok := rl[corev1.ResourceName(n)]
		if !ok {
			return 0, false, nil
		}
		v, exact := q.AsInt64()
		if !exact || v < 0 || v > math.MaxInt32*int64(1024) {
			return 0, true, fmt.Errorf("%s %s is not a whole number", n, q.String())
		}
		return v, true, nil
	}
	gpus, _, err := get(v1alpha1.ResourceNvidiaGPU)
	if err != nil {
		return Demand{}, err
	}
	vgpus, _, err := get(v1alpha1.ResourceVGPU)
	if err != nil {
		return Demand{}, err
	}
	mem, _, err := get(v1alpha1.ResourceGPUMemory)
	if err != nil {
		return Demand{}, err
	}
	cores, _, err := get(v1alpha1.ResourceGPUCores)
	if err != nil {
		return Demand{}, err
	}
	hamiMem, hasHAMiMem, err := get(v1alpha1.AnnotationHAMiGPUMem)
	if err != nil {
		return Demand{}, err
	}
	hamiPct, hasHAMiPct, err := get(v1alpha1.AnnotationHAMiGPUMemPercentage)
	if err != nil {
		return Demand{}, err
	}
	hamiCores, hasHAMiCores, err := get(v1alpha1.AnnotationHAMiGPUCores)
	if err != nil {
		return Demand{}, err
	}
	hami := hasHAMiMem || hasHAMiPct || hasHAMiCores
	switch {
	case gpus > 0 && vgpus > 0:
		return Demand{}, fmt.Errorf("both %s and %s requested", v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU)
	case vgpus > 0 && hami:
		return Demand{}, fmt.Errorf("both %s and HAMi's %s/%s/%s requested", v1alpha1.ResourceVGPU, v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage, v1alpha1.AnnotationHAMiGPUCores)
	case gpus > 0 && hami:
		switch {
		case hasHAMiMem && hasHAMiPct:
			return Demand{}, fmt.Errorf("both %s and %s requested", v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage)
		case hamiMem > MaxMemoryMiB:
			return Demand{}, fmt.Errorf("%s %d is more than %d MiB per GPU", v1alpha1.AnnotationHAMiGPUMem, hamiMem, MaxMemoryMiB)
		case hamiPct > 100 || hamiCores > 100:
			return Demand{}, fmt.Errorf("%s %d / %s %d: percentages go up to 100", v1alpha1.AnnotationHAMiGPUMemPercentage, hamiPct, v1alpha1.AnnotationHAMiGPUCores, hamiCores)
		case hamiMem <= 0 && hamiPct <= 0:
			return Demand{}, fmt.Errorf("%s with no memory (%s or %s above 0): a GPU without a memory request is exclusive", v1alpha1.ResourceNvidiaGPU, v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage)
		}
		return Demand{GPUs: gpus, MemoryMiB: hamiMem, MemoryPercent: int32(hamiPct), Cores: int32(hamiCores)}, nil
	case gpus > 0:
		return Demand{GPUs: gpus, Exclusive: true}, nil
	case vgpus > 0:
		if mem <= 0 || mem%vgpus != 0 || cores%vgpus != 0 {
			return Demand{}, fmt.Errorf("%s %d and %s %d / %s %d do not divide evenly", v1alpha1.ResourceGPUMemory, mem, v1alpha1.ResourceGPUCores, cores, v1alpha1.ResourceVGPU, vgpus)
		}
		return Demand{GPUs: vgpus, MemoryMiB: mem / vgpus, Cores: int32(cores / vgpus)}, nil
	}
	return Demand{}, nil
}
