package preemption

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/owners"
	"github.com/gpupack/gpupack/preemption/policy"
)

// EvictionWebhookPath is where the pods/eviction validating webhook is
// served. Its configuration: rules CREATE on pods/eviction (group "",
// version v1), sideEffects NoneOnDryRun (it annotates the pod), and
// failurePolicy Ignore (a coordinator that is down must not block drains).
const EvictionWebhookPath = "/validate-gpupack-io-pods-eviction"

// EvictionHandler holds back a drain's eviction of an opted-in pod until
// the pod has checkpointed or its budget is spent: the first attempt
// requests the checkpoint (gpupack.io/checkpoint-request = now), later
// ones get 429 with a Retry-After until the agent reports or the budget
// (the checkpoint policy's figure for the pod, see preemption/policy)
// runs out.
type EvictionHandler struct {
	// Reader is read live (not from a cache): a drain retries every few
	// seconds and must see the agent's report at once.
	Reader client.Reader
	// Client writes the request; it also finds the pod's Workload (through
	// the coordinator's owner index, when the manager has it) for its
	// priority class and ClusterQueue.
	Client client.Client
	Policy policy.Policy
	Now    func() time.Time
}

var _ admission.Handler = &EvictionHandler{}

// Handle answers one eviction.
func (h *EvictionHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.SubResource != "eviction" {
		return admission.Allowed("not an eviction")
	}
	var pod corev1.Pod
	if err := h.Reader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: req.Name}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Allowed("pod not found")
		}
		// Do not block a drain on our own trouble.
		log.FromContext(ctx).Error(err, "eviction webhook: reading pod; allowing", "pod", req.Namespace+"/"+req.Name)
		return admission.Allowed("gpupack could not read the pod")
	}
	// An eviction that names another incarnation of the pod (UID
	// precondition) fails in the API server anyway: never hold it, nor
	// request a checkpoint of the pod that now carries the name.
	if len(req.Object.Raw) > 0 {
		var ev policyv1.Eviction
		if err := json.Unmarshal(req.Object.Raw, &ev); err == nil && ev.DeleteOptions != nil && ev.DeleteOptions.Preconditions != nil &&
			ev.DeleteOptions.Preconditions.UID != nil && *ev.DeleteOptions.Preconditions.UID != pod.UID {
			return admission.Allowed("the eviction names another pod of this name (UID precondition)")
		}
	}
	now := h.Now()
	ep := h.evictionPod(ctx, &pod)
	v := ladder.Evict(ep, now)
	if v.Allow {
		if optedIn(&pod) {
			evictionsHeld.WithLabelValues("allowed").Inc()
		}
		return admission.Allowed(v.Reason)
	}
	if v.Request && (req.DryRun == nil || !*req.DryRun) {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID, "annotations": map[string]string{
			v1alpha1.AnnotationCheckpointRequest: now.UTC().Format(time.RFC3339),
			policy.AnnotationCheckpointDeadline:  policy.FormatDeadline(now.Add(ep.Budget)),
		}}})
		if err := h.Client.Patch(ctx, &pod, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(ControllerName)); err != nil {
			log.FromContext(ctx).Error(err, "eviction webhook: requesting a checkpoint; allowing", "pod", req.Namespace+"/"+req.Name)
			return admission.Allowed("gpupack could not request a checkpoint")
		}
	}
	evictionsHeld.WithLabelValues("held").Inc()
	secs := int32(math.Ceil(v.RetryAfter.Seconds()))
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result: &metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    http.StatusTooManyRequests,
			Reason:  metav1.StatusReasonTooManyRequests,
			Message: fmt.Sprintf("gpupack: pod %s/%s is checkpointing (%s); retry in %ds", pod.Namespace, pod.Name, v.Reason, secs),
			Details: &metav1.StatusDetails{Name: pod.Name, Kind: "pods", RetryAfterSeconds: secs},
		},
	}}
}

// requestClockSkew is how far in the future a checkpoint request's time may
// be (the coordinator's clock against this replica's) and still count.
const requestClockSkew = time.Minute

func (h *EvictionHandler) evictionPod(ctx context.Context, pod *corev1.Pod) ladder.EvictionPod {
	_, reported := reportedSteps(pod)
	var requested time.Duration
	if v, ok := pod.Annotations[v1alpha1.AnnotationCheckpointTimeout]; ok {
		if d, err := parseTimeout(v); err == nil {
			requested = d
		}
	}
	pc, cq, known := h.classOf(ctx, pod)
	budget := h.Policy.Effective(policy.Victim{PriorityClass: pc, ClusterQueue: cq, Requested: requested}).Timeout
	if !known {
		// No Workload says the class: the shortest cap, never one the
		// pod's own (tenant-writable) labels pick.
		budget = min(budget, h.Policy.Shortest())
	}
	var reqAt time.Time
	if v := pod.Annotations[v1alpha1.AnnotationCheckpointRequest]; v != "" {
		if t, err := time.Parse(time.RFC3339, v); err == nil && !t.After(h.Now().Add(requestClockSkew)) {
			reqAt = t
		} else {
			// (A request "in the future" is not one gpupack wrote — a
			// policy keeps tenants from writing it — and would hold the
			// drain until then: count it from the pod's creation too.)
			// Set by someone else in another format: count the budget
			// from the pod's creation so the drain is never held forever.
			reqAt = pod.CreationTimestamp.Time
		}
		// A deadline already written (by the coordinator, or by the
		// first attempt) is the one the agent works to: never hold past it.
		if v, ok := pod.Annotations[policy.AnnotationCheckpointDeadline]; ok {
			if dl, err := policy.ParseDeadline(v); err == nil {
				budget = max(0, min(budget, dl.Sub(reqAt)))
			}
		}
	}
	return ladder.EvictionPod{
		OptedIn:     optedIn(pod),
		Terminating: pod.DeletionTimestamp != nil,
		Finished:    finished(pod),
		RequestedAt: reqAt,
		Reported:    reported,
		Budget:      budget,
	}
}

// classOf finds the priority class and ClusterQueue the policy keys on,
// from the pod's Workload (owned by the pod's controller, or by the pod
// itself under Kueue's pod integration) as the coordinator's index finds
// it; known is false when there is none. The pod's own labels and
// priorityClassName are the tenant's to change (kubectl label) and never
// pick the class (outside review 2026-12-02, finding 5; the pod webhook's
// rule, webhooks' podMutator.priorityClass, is the same): without a
// Workload the caller applies the shortest cap.
func (h *EvictionHandler) classOf(ctx context.Context, pod *corev1.Pod) (priorityClass, clusterQueue string, known bool) {
	if h.Client == nil {
		return "", "", false
	}
	f := owners.Finder{Reader: h.Client, PodControllerIndex: indexPodController, PodGroupIndex: indexPodGroup}
	lineage := f.Lineage(ctx, pod)
	for _, k := range workloadsOf(ctx, h.Client, f, pod) {
		var wl kueue.Workload
		if err := h.Client.Get(ctx, k, &wl); err != nil || !owners.Belongs(&wl, lineage) {
			// (A pod-group label is the tenant's: the Workload it names
			// counts only if it owns the pod.)
			continue
		}
		priorityClass = priorityClassOf(&wl)
		if a := wl.Status.Admission; a != nil && a.ClusterQueue != "" {
			return priorityClass, string(a.ClusterQueue), true
		}
		if q := wl.Spec.QueueName; q != "" && h.Reader != nil {
			var lq kueue.LocalQueue
			if err := h.Reader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: string(q)}, &lq); err == nil {
				clusterQueue = string(lq.Spec.ClusterQueue)
			}
		}
		return priorityClass, clusterQueue, true
	}
	return "", "", false
}
