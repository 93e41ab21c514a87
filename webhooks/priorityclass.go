package webhooks

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// priorityClass is the priority class Kueue gives the pod's Workload, which
// the checkpoint policy caps the pod's grace (and its agent's timeout) by:
// the top job's kueue.x-k8s.io/priority-class label, else the pod's
// priorityClassName (Kueue's class from the pod template), read live
// through the owner walk (owners.Finder.Top, each step UID-checked). The
// pod's own labels count only where the pod is the job — Kueue's pod
// integration (no controller, or a ReplicaSet/StatefulSet), where Kueue
// reads them too. Anything else — no reader, no job, a failed read — is
// unknown (false): the mutator then applies the shortest cap, since a
// tenant's pod label must never pick a longer one.
//
// top is topOf(pod), read once by the caller.
func (h *podMutator) priorityClass(ctx context.Context, pod *corev1.Pod, top *metav1.PartialObjectMetadata) (string, bool) {
	ref := metav1.GetControllerOf(pod)
	if placement.KueuePodIntegration(pod) && (ref == nil || (ref.APIVersion == "apps/v1" && (ref.Kind == "ReplicaSet" || ref.Kind == "StatefulSet"))) {
		// Only where Kueue's pod integration really takes the pod in
		// (the same rule as the unmanaged-GPU policy's).
		if !h.kv.manages(ctx, "pod", pod.Namespace, pod.Labels) {
			return "", false
		}
		return mutation.PodPriorityClass(pod), true
	}
	if ref == nil || top == nil {
		return "", false
	}
	// The top must be a job Kueue manages (an integrated kind, queued): any
	// object a tenant creates (a ConfigMap, an unqueued Job) can carry the
	// class label (second review N2).
	gvk := top.GroupVersionKind()
	if !h.kv.manages(ctx, mutation.Framework(gvk.GroupVersion().String(), gvk.Kind), pod.Namespace, top.Labels) {
		return "", false
	}
	return mutation.PriorityClassOf(top.Labels, pod.Spec.PriorityClassName), true
}
