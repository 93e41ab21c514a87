package placement

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kueue's pod integration (plain pods, and Deployments / StatefulSets /
// LeaderWorkerSets through it) gates a pod at creation with its own gate
// and, once the pod's Workload is admitted, writes the admission's
// podSetUpdates — gpupack.io/plan among them — into the pod by an update
// that also lifts that gate. gpupack's placement gate must then already be
// on the pod, so the ungater pins it to its slot before the scheduler sees
// it (policy gpupack-placement lets Kueue add the plan only to a pod that
// still carries both gates).
const (
	// KueueAdmissionGate is the scheduling gate of Kueue's pod integration.
	KueueAdmissionGate = "kueue.x-k8s.io/admission"
	// KueueQueueLabel names a pod's (or its parent's) LocalQueue.
	KueueQueueLabel = "kueue.x-k8s.io/queue-name"
	// KueueSuspendingParent is set by Kueue's Deployment / StatefulSet /
	// LWS webhooks on the pod template of a workload it manages.
	KueueSuspendingParent = "kueue.x-k8s.io/pod-suspending-parent"
	// KueueManagedLabel marks the pods Kueue's pod webhook took on.
	KueueManagedLabel = "kueue.x-k8s.io/managed"
	// KueuePodGroupLabel names a pod group's Workload.
	KueuePodGroupLabel = "kueue.x-k8s.io/pod-group-name"
)

// KueuePodIntegration reports whether Kueue's pod integration will gate p
// (or already has): it carries Kueue's admission gate, or a queue name /
// Kueue's suspending-parent annotation and no controller other than a
// ReplicaSet or StatefulSet (pods of a Job, PyTorchJob, JobSet… belong to
// Kueue's job integrations, whose podSetUpdates go into the job's template
// instead).
func KueuePodIntegration(p *corev1.Pod) bool {
	if hasGate(p, KueueAdmissionGate) {
		return true
	}
	_, queued := p.Labels[KueueQueueLabel]
	_, parent := p.Annotations[KueueSuspendingParent]
	if !queued && !parent {
		return false
	}
	owner := metav1.GetControllerOf(p)
	return owner == nil || (owner.APIVersion == "apps/v1" && (owner.Kind == "ReplicaSet" || owner.Kind == "StatefulSet"))
}
