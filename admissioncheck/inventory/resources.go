package inventory

import (
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// gpuResource: resources the model counts as GPUs, not as node resources.
func gpuResource(n corev1.ResourceName) bool {
	switch n {
	case v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores,
		v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUCores, v1alpha1.AnnotationHAMiGPUMemPercentage:
		return true
	}
	return false
}

// NodeResources is a node's allocatable of everything but GPUs, in
// milli-units (nil when the node publishes no allocatable: then it is not
// planned against).
func NodeResources(n *corev1.Node) map[corev1.ResourceName]int64 {
	if len(n.Status.Allocatable) == 0 {
		return nil
	}
	out := make(map[corev1.ResourceName]int64, len(n.Status.Allocatable))
	for name, q := range n.Status.Allocatable {
		if !gpuResource(name) {
			out[name] = q.MilliValue()
		}
	}
	return out
}

// PodRequests is what one pod of spec requests of everything but GPUs, in
// milli-units, read as kube-scheduler reads it (containers and sidecars
// summed, a plain init container's peak, pod-level resources and overhead).
// Zero requests are left out.
func PodRequests(spec *corev1.PodSpec) map[corev1.ResourceName]int64 {
	rl := resourcehelper.PodRequests(&corev1.Pod{Spec: *spec}, resourcehelper.PodResourcesOptions{})
	var out map[corev1.ResourceName]int64
	for name, q := range rl {
		if gpuResource(name) || q.IsZero() {
			continue
		}
		if out == nil {
			out = make(map[corev1.ResourceName]int64, len(rl))
		}
		out[name] = q.MilliValue()
	}
	return out
}

// FormatPodRequests renders per pod set requests for a GPUPlan's
// gpupack.io/pod-requests annotation ("" when there is no pod set).
func FormatPodRequests(byPodSet map[string]map[corev1.ResourceName]int64) string {
	out := map[string]corev1.ResourceList{}
	for ps, req := range byPodSet {
		rl := corev1.ResourceList{} // empty still holds one of the node's pods
		for n, v := range req {
			rl[n] = *resource.NewMilliQuantity(v, resource.DecimalSI)
		}
		out[ps] = rl
	}
	if len(out) == 0 {
		return ""
	}
	b, _ := json.Marshal(out) // map keys are sorted
	return string(b)
}

// ParsePodRequests reads the gpupack.io/pod-requests annotation.
func ParsePodRequests(s string) (map[string]map[corev1.ResourceName]int64, error) {
	if s == "" {
		return nil, nil
	}
	var in map[string]corev1.ResourceList
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil, fmt.Errorf("%s: %w", v1alpha1.AnnotationPodRequests, err)
	}
	out := make(map[string]map[corev1.ResourceName]int64, len(in))
	names := make([]string, 0, len(in))
	for ps := range in {
		names = append(names, ps)
	}
	sort.Strings(names)
	for _, ps := range names {
		m := map[corev1.ResourceName]int64{}
		for n, q := range in[ps] {
			if q.Sign() < 0 {
				return nil, fmt.Errorf("%s: pod set %s: %s is negative", v1alpha1.AnnotationPodRequests, ps, n)
			}
			m[n] = q.MilliValue()
		}
		out[ps] = m
	}
	return out, nil
}
