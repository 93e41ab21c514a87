package mutation

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// FuzzPodMutation: for any request annotations and tenant env, mutation
// never panics, a mutated pod is a fixed point (a second pass changes
// nothing and warns nothing), it passes validation, and no GPU container
// keeps a tenant value of an owned key.
func FuzzPodMutation(f *testing.F) {
	f.Add("20Gi", "30", "", "1", "/evil.so", "80g", "true", "NVIDIA-H100-80GB-HBM3")
	f.Add("", "", "50", "2", "", "", "", "NVIDIA L4")
	f.Add("3000", "", "", "0", "", "1m", "", "")
	f.Fuzz(func(t *testing.T, mem, cores, pct, gpus, preload, limit, ckpt, model string) {
		p := makePod("p")
		set := func(k, v string) {
			if v != "" {
				p.ann(k, v)
			}
		}
		set(v1alpha1.AnnotationGPUMemory, mem)
		set(v1alpha1.AnnotationGPUCores, cores)
		set(v1alpha1.AnnotationHAMiGPUMemPercentage, pct)
		set(v1alpha1.AnnotationCheckpoint, ckpt)
		if model != "" {
			p.nodeSelector(flavors.LabelGPUProduct, model)
		}
		c := makeCtr("c")
		if gpus != "" {
			if len(gpus) > 3 {
				return
			}
			for _, ch := range gpus {
				if ch < '0' || ch > '9' {
					return
				}
			}
			c.gpus(gpus)
		}
		if preload != "" {
			c.env(v1alpha1.EnvLDPreload, preload)
		}
		if limit != "" {
			c.env(v1alpha1.EnvMemoryLimit, limit)
		}
		p.ctr(c.obj())
		m := mustNew(t, Config{})
		pod := p.obj()
		if _, err := m.Pod(pod, PodContext{}); err != nil {
			return
		}
		assertFixedPoint(t, m, pod)
		hasGPU := false
		for _, r := range []corev1.ResourceName{v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU} {
			if q, ok := pod.Spec.Containers[0].Resources.Limits[r]; ok && !q.IsZero() {
				hasGPU = true
			}
		}
		for _, e := range pod.Spec.Containers[0].Env {
			if hasGPU && ((e.Name == v1alpha1.EnvLDPreload && e.Value == preload) || (e.Name == v1alpha1.EnvMemoryLimit && e.Value == limit && limit != m.memLimitFor(pod))) {
				t.Fatalf("tenant %s=%s survived", e.Name, e.Value)
			}
		}
	})
}

// memLimitFor is the CUDA_DEVICE_MEMORY_LIMIT gpupack derives for the pod's
// first container.
func (m *Mutator) memLimitFor(p *corev1.Pod) string {
	q := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMemory]
	n := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceVGPU]
	if n.Value() == 0 {
		return ""
	}
	return itoa(q.Value()/n.Value()) + "m"
}

// assertFixedPoint checks that mutating a mutated pod again changes nothing,
// warns nothing, and that the validating webhook accepts it.
func assertFixedPoint(t *testing.T, m *Mutator, pod *corev1.Pod) {
	t.Helper()
	again := pod.DeepCopy()
	w, err := m.Pod(again, PodContext{})
	if err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(pod, again) {
		t.Fatalf("second pass: warn %q err %v diff %s", w, err, cmp.Diff(pod, again))
	}
	if err := m.ValidatePod(pod); err != nil {
		t.Fatalf("mutated pod fails validation: %v", err)
	}
}
