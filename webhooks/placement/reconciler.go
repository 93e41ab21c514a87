package placement

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Names used by the ungater.
const (
	ControllerName = "gpupack-placement"
	// FieldOwner of the pod and plan status writes.
	FieldOwner = "gpupack-placement"
	// TASGate is Kueue TAS's scheduling gate (kueue.x-k8s.io/topology); while
	// it is on a pod, the ungater waits for TAS to place it first.
	TASGate = "kueue.x-k8s.io/topology"
	// IndexPlan indexes pods by their gpupack.io/plan annotation.
	IndexPlan = "gpupack.io/plan-index"

	EventPlaced      = "Placed"
	EventPlanMissing = "PlanNotFound"
	EventNoSlot      = "NoPlanSlot"
	EventWaiting     = "WaitingForSlot"
)

// BusyRetry is how soon a pod whose slot is still held is looked at again
// (pod deletions also trigger it).
var BusyRetry = 5 * time.Second

// Reconciler lifts the gpupack.io/placement gate of pods whose GPUPlan has
// a slot for them, after pinning them to the slot's node and GPUs.
type Reconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
}

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=gpupack.io,resources=gpuplans,verbs=get;list;watch
// +kubebuilder:rbac:groups=gpupack.io,resources=gpuplans/status,verbs=get;update;patch

// Setup registers the ungater with mgr.
func Setup(mgr ctrl.Manager) error {
	r := &Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor(ControllerName)} //nolint:staticcheck // core/v1 Events show in kubectl describe
	return r.SetupWithManager(mgr)
}

// SetupWithManager wires the watches: gated pods, and plans (a plan that
// appears, or whose bindings change, re-examines its waiting pods).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, IndexPlan, func(o client.Object) []string {
		if p := o.GetAnnotations()[v1alpha1.AnnotationPlan]; p != "" {
			return []string{p}
		}
		return nil
	}); err != nil {
		return err
	}
	gated := predicate.NewPredicateFuncs(func(o client.Object) bool {
		p, ok := o.(*corev1.Pod)
		return ok && hasGate(p, v1alpha1.SchedulingGatePlacement)
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&corev1.Pod{}, builder.WithPredicates(gated)).
		// A deleted pod may free the slot of a waiting successor.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.waitingOfSamePlan), builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
			UpdateFunc: func(ev event.UpdateEvent) bool {
				p, ok := ev.ObjectNew.(*corev1.Pod)
				return ok && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
			},
		})).
		Watches(&v1alpha1.GPUPlan{}, handler.EnqueueRequestsFromMapFunc(r.podsOfPlan)).
		Complete(r)
}

func hasGate(p *corev1.Pod, name string) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == name {
			return true
		}
	}
	return false
}

func (r *Reconciler) podsOfPlan(ctx context.Context, o client.Object) []reconcile.Request {
	return r.waitingPods(ctx, o.GetNamespace(), o.GetName())
}

func (r *Reconciler) waitingOfSamePlan(ctx context.Context, o client.Object) []reconcile.Request {
	plan := o.GetAnnotations()[v1alpha1.AnnotationPlan]
	if plan == "" {
		return nil
	}
	return r.waitingPods(ctx, o.GetNamespace(), plan)
}

func (r *Reconciler) waitingPods(ctx context.Context, ns, plan string) []reconcile.Request {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingFields{IndexPlan: plan}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range pods.Items {
		if hasGate(&pods.Items[i], v1alpha1.SchedulingGatePlacement) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
		}
	}
	return out
}

// Reconcile moves one gated pod one step: wait, or bind + pin + ungate.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	pod := &corev1.Pod{}
	if err := r.Client.Get(ctx, req.NamespacedName, pod); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !hasGate(pod, v1alpha1.SchedulingGatePlacement) || pod.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	if hasGate(pod, TASGate) {
		return reconcile.Result{}, nil // TAS first; its ungating is a pod update we see
	}
	planName := pod.Annotations[v1alpha1.AnnotationPlan]
	if planName == "" {
		r.record(pod, corev1.EventTypeWarning, EventPlanMissing, "pod carries gate %s but no %s annotation; it stays gated", v1alpha1.SchedulingGatePlacement, v1alpha1.AnnotationPlan)
		return reconcile.Result{}, nil
	}
	plan := &v1alpha1.GPUPlan{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: planName}, plan)
	if apierrors.IsNotFound(err) || (err == nil && plan.Status.Phase == v1alpha1.PlanReleased) {
		r.record(pod, corev1.EventTypeWarning, EventPlanMissing, "GPUPlan %s is gone (workload evicted or finished?); pod stays gated", planName)
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}

	var slot v1alpha1.PodAssignment
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(plan), plan); err != nil {
			return err
		}
		live, err := r.livePods(ctx, pod.Namespace, plan.Name)
		if err != nil {
			return err
		}
		pi := PodInfoFromLabels(pod.Name, pod.UID, pod.Labels, pod.Annotations)
		s, bindings, err := Assign(plan.Spec.Assignments, plan.Status.Bindings, pi, func(b v1alpha1.SlotBinding) bool {
			p, ok := live[b.PodName]
			return ok && (b.PodUID == "" || b.PodUID == p)
		})
		if err != nil {
			return err
		}
		slot = s
		if equalBindings(bindings, plan.Status.Bindings) {
			return nil
		}
		// The binding is written before the pod is pinned, so a crash in
		// between leaves a reservation the next reconcile finds by UID.
		plan.Status.Bindings = bindings
		plan.Status.PlacedPods = int32(len(bindings))
		plan.Status.Phase = v1alpha1.PlanPlanned
		if len(bindings) >= len(plan.Spec.Assignments) {
			plan.Status.Phase = v1alpha1.PlanPlaced
		}
		return r.Client.Status().Update(ctx, plan, client.FieldOwner(FieldOwner))
	})
	switch {
	case errors.Is(err, ErrSlotBusy):
		r.record(pod, corev1.EventTypeNormal, EventWaiting, "GPUPlan %s: %v; waiting for it to go", plan.Name, err)
		return reconcile.Result{RequeueAfter: BusyRetry}, nil
	case errors.Is(err, ErrNoSlot):
		r.record(pod, corev1.EventTypeWarning, EventNoSlot, "GPUPlan %s: %v; pod stays gated", plan.Name, err)
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, err
	}

	devices := Devices(slot)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Pod{}
		if err := r.Client.Get(ctx, req.NamespacedName, cur); err != nil {
			return err
		}
		if cur.UID != pod.UID || !hasGate(cur, v1alpha1.SchedulingGatePlacement) {
			return nil
		}
		Pin(cur, slot.Node, devices)
		return r.Client.Update(ctx, cur, client.FieldOwner(FieldOwner))
	})
	if err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	log.V(2).Info("placed pod", "plan", plan.Name, "node", slot.Node, "devices", devices)
	r.record(pod, corev1.EventTypeNormal, EventPlaced, "GPUPlan %s slot %s[%d]: node %s, GPUs %s", plan.Name, slot.PodSet, slot.Index, slot.Node, devices)
	return reconcile.Result{}, nil
}

// livePods maps the plan's pods that still hold GPUs (they exist and have not
// finished; terminating pods count) to their UIDs.
func (r *Reconciler) livePods(ctx context.Context, ns, plan string) (map[string]types.UID, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingFields{IndexPlan: plan}); err != nil {
		return nil, err
	}
	out := make(map[string]types.UID, len(pods.Items))
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out[p.Name] = p.UID
	}
	return out, nil
}

func equalBindings(a, b []v1alpha1.SlotBinding) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Pin adds required node affinity to node (matchFields metadata.name, ANDed
// into every existing term: the API allows only narrowing a gated pod's
// affinity), sets gpupack.io/devices and removes the placement gate.
func Pin(p *corev1.Pod, node, devices string) {
	req := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	if p.Spec.Affinity.NodeAffinity == nil {
		p.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := p.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{req}}}}
	} else {
		terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		for i := range terms {
			if !hasFieldReq(terms[i], req) {
				terms[i].MatchFields = append(terms[i].MatchFields, req)
			}
		}
	}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1alpha1.AnnotationDevices] = devices
	gates := p.Spec.SchedulingGates[:0]
	for _, g := range p.Spec.SchedulingGates {
		if g.Name != v1alpha1.SchedulingGatePlacement {
			gates = append(gates, g)
		}
	}
	p.Spec.SchedulingGates = gates
	if len(gates) == 0 {
		p.Spec.SchedulingGates = nil
	}
}

func hasFieldReq(t corev1.NodeSelectorTerm, r corev1.NodeSelectorRequirement) bool {
	for _, f := range t.MatchFields {
		if f.Key == r.Key && f.Operator == r.Operator && len(f.Values) == 1 && f.Values[0] == r.Values[0] {
			return true
		}
	}
	return false
}

// record emits the Event of a placement step and counts it by reason, so a
// dashboard shows pods waiting on busy slots or stuck without a plan.
func (r *Reconciler) record(pod *corev1.Pod, eventType, reason, msg string, args ...any) {
	decisions.WithLabelValues(reason).Inc()
	r.Recorder.Eventf(pod, eventType, reason, msg, args...)
}
