package placement

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/allocorder"
	"github.com/gpupack/gpupack/preemption/owners"
	"github.com/gpupack/gpupack/webhooks/placement/victims"
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
	// IndexVictim indexes, under "true", the Workloads that are giving up
	// quota they still use (victims.Observe): the candidates a pod
	// admitted without a plan may have to wait for.
	IndexVictim = "gpupack.io/preemption-victim"
	// IndexWorkloadOwner indexes Workloads by the UIDs of their owners
	// (Kueue's pod integration: the pods).
	IndexWorkloadOwner = "gpupack.io/placement-workload-owner"
	// IndexUnplannedGated indexes, under "true", the pods at gpupack's
	// gate without a plan (woken when a victim lets go).
	IndexUnplannedGated = "gpupack.io/unplanned-gated"
	// IndexAwaitingNode indexes pods by the node where they await the
	// kubelet's allocation of their GPUs (allocorder.Awaiting).
	IndexAwaitingNode = "gpupack.io/awaiting-allocation-node"

	EventPlaced      = "Placed"
	EventPlanMissing = "PlanNotFound"
	// EventPlanNotForPod: the pod names a GPUPlan whose Workload it does
	// not belong to (owners.Belongs); it stays gated (issue 14, finding 6).
	EventPlanNotForPod = "PlanNotForThisPod"
	// EventGroupCreatorsDiffer: the pod is a member of a Kueue pod group
	// whose members were created by different users (their
	// gpupack.io/created-by stamps, owners.GroupSlot); none of them takes
	// a slot (review 14 F3).
	EventGroupCreatorsDiffer = "PodGroupCreatorsDiffer"
	EventNoSlot              = "NoPlanSlot"
	EventWaiting             = "WaitingForSlot"
	// EventWaitingForAllocation: the pod's slot is ready, but another pod
	// on its node asking for the same GPU count still awaits the kubelet's
	// allocation; the kubelet's request does not name the pod, so such
	// pods are released one at a time (allocorder.Blocking).
	EventWaitingForAllocation = "WaitingForAllocation"
	// EventWaitingForRelease: a pod admitted without a plan (its
	// ClusterQueue has no gang-fit check) waits while the workloads Kueue
	// preempted for it still checkpoint or terminate; the message names
	// them and their deadlines.
	EventWaitingForRelease = "WaitingForGPURelease"
	// EventReleased: such a pod's gate is lifted, GPUs are free.
	EventReleased = "Ungated"
)

// BusyRetry is how soon a pod whose slot is still held is looked at again
// (pod deletions also trigger it).
var BusyRetry = 5 * time.Second

// NotForPodRetry is how soon a pod found not to belong to its plan's
// Workload is looked at again (a Workload or chain object the cache did
// not show yet); a pod that names another job's plan only ever waits.
var NotForPodRetry = 30 * time.Second

// AllocationRetry is how soon a pod held back for another pod's allocation
// is looked at again; the other pod's admission (or end) also triggers it.
var AllocationRetry = 2 * time.Second

// UnboundGrace bounds how long a released pod that no scheduler has bound
// holds back the pods of its node and GPU count: a tenant can name a
// scheduler nobody runs (spec.schedulerName is the pod's), and such a pod
// is never bound nor marked unschedulable. Counted from when this process
// first saw it released and unbound (a restart starts it again).
var UnboundGrace = 30 * time.Second

// Reconciler lifts the gpupack.io/placement gate of pods whose GPUPlan has
// a slot for them, after pinning them to the slot's node and GPUs.
type Reconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	// mu makes "is a pod of this key awaiting its allocation on the node?"
	// and the release that follows one step.
	mu sync.Mutex
	// released are pods this process released whose ungating the cache
	// may not show yet (the Blocking check must count them all the same).
	released map[types.UID]*corev1.Pod
	// heldBack are the pods waiting for another's allocation, by node (to
	// wake them when it is admitted), under heldMu (event handlers read it
	// while a reconcile holds mu over an API write).
	heldMu   sync.Mutex
	heldBack map[string]map[types.NamespacedName]bool
	// unbound is when this process first saw each released, unbound pod
	// that holds others back (UnboundGrace), under mu.
	unbound map[types.UID]unboundSince
}

type unboundSince struct {
	node  string
	since time.Time
}

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=gpupack.io,resources=gpuplans,verbs=get;list;watch
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=workloads,verbs=get;list;watch
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
	for _, ix := range []struct {
		obj  client.Object
		name string
		fn   client.IndexerFunc
	}{
		{&corev1.Pod{}, IndexUnplannedGated, IndexUnplannedGatedFunc},
		{&corev1.Pod{}, IndexAwaitingNode, IndexAwaitingNodeFunc},
		{&kueue.Workload{}, IndexVictim, IndexVictimFunc},
		{&kueue.Workload{}, IndexWorkloadOwner, IndexWorkloadOwnerFunc},
	} {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), ix.obj, ix.name, ix.fn); err != nil {
			return err
		}
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
		// A pod admitted by its kubelet (or gone) may release the pods
		// held back behind it on its node.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.heldBehind), builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
			DeleteFunc:  func(ev event.DeleteEvent) bool { return true },
			UpdateFunc: func(ev event.UpdateEvent) bool {
				old, ok1 := ev.ObjectOld.(*corev1.Pod)
				cur, ok2 := ev.ObjectNew.(*corev1.Pod)
				if !ok1 || !ok2 {
					return false
				}
				_, was := allocorder.Awaiting(old)
				_, is := allocorder.Awaiting(cur)
				return was && !is
			},
		})).
		Watches(&v1alpha1.GPUPlan{}, handler.EnqueueRequestsFromMapFunc(r.podsOfPlan)).
		// A victim that lets go (its preemption Done, or gone) may free
		// a pod waiting without a plan.
		Watches(&kueue.Workload{}, handler.EnqueueRequestsFromMapFunc(r.unplannedWaiting), builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
			DeleteFunc:  func(ev event.DeleteEvent) bool { return victim(ev.Object) },
			UpdateFunc:  func(ev event.UpdateEvent) bool { return victim(ev.ObjectOld) && !victim(ev.ObjectNew) },
		})).
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

func victim(o client.Object) bool {
	wl, ok := o.(*kueue.Workload)
	if !ok {
		return false
	}
	_, is := victims.Observe(wl)
	return is
}

// IndexVictimFunc is IndexVictim's indexer.
func IndexVictimFunc(o client.Object) []string {
	if victim(o) {
		return []string{"true"}
	}
	return nil
}

// IndexWorkloadOwnerFunc is IndexWorkloadOwner's indexer.
func IndexWorkloadOwnerFunc(o client.Object) []string {
	var uids []string
	for _, ref := range o.GetOwnerReferences() {
		uids = append(uids, string(ref.UID))
	}
	return uids
}

// IndexUnplannedGatedFunc is IndexUnplannedGated's indexer.
func IndexUnplannedGatedFunc(o client.Object) []string {
	if p, ok := o.(*corev1.Pod); ok && hasGate(p, v1alpha1.SchedulingGatePlacement) && p.Annotations[v1alpha1.AnnotationPlan] == "" {
		return []string{"true"}
	}
	return nil
}

// IndexAwaitingNodeFunc is IndexAwaitingNode's indexer.
func IndexAwaitingNodeFunc(o client.Object) []string {
	if p, ok := o.(*corev1.Pod); ok {
		if n, awaiting := allocorder.Awaiting(p); awaiting {
			return []string{n}
		}
	}
	return nil
}

// heldBehind lists the pods held back on the node of o (the node it was
// bound or pinned to).
func (r *Reconciler) heldBehind(_ context.Context, o client.Object) []reconcile.Request {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return nil
	}
	node := p.Spec.NodeName
	if node == "" {
		node = allocorder.PinnedNode(p)
	}
	if node == "" {
		return nil
	}
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	var out []reconcile.Request
	for k := range r.heldBack[node] {
		out = append(out, reconcile.Request{NamespacedName: k})
	}
	return out
}

// blockers returns the pods that keep pod from being released to node now
// (allocorder.Blocking), from the cache and from this process's own
// releases the cache does not show yet. Call with r.mu held.
func (r *Reconciler) blockers(ctx context.Context, pod *corev1.Pod, node string) ([]*corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.MatchingFields{IndexAwaitingNode: node}); err != nil {
		return nil, err
	}
	others := make([]*corev1.Pod, 0, len(pods.Items)+len(r.released))
	seen := map[types.UID]bool{}
	for i := range pods.Items {
		others = append(others, &pods.Items[i])
		seen[pods.Items[i].UID] = true
	}
	for uid, rel := range r.released {
		cur := &corev1.Pod{}
		err := r.Client.Get(ctx, client.ObjectKeyFromObject(rel), cur)
		switch {
		case apierrors.IsNotFound(err), err == nil && (cur.UID != uid || !hasGate(cur, v1alpha1.SchedulingGatePlacement)):
			delete(r.released, uid) // gone, or the cache shows the release: the index has it
			continue
		case err != nil:
			return nil, err
		}
		if !seen[uid] {
			others = append(others, rel)
		}
	}
	// A pod no scheduler binds holds others back for UnboundGrace at most.
	if r.unbound == nil {
		r.unbound = map[types.UID]unboundSince{}
	}
	now := r.now()
	still := map[types.UID]bool{}
	for _, o := range others {
		if n, ok := allocorder.Awaiting(o); !ok || n != node || o.Spec.NodeName != "" {
			continue
		}
		still[o.UID] = true
		if _, ok := r.unbound[o.UID]; !ok {
			r.unbound[o.UID] = unboundSince{node: node, since: now}
		}
	}
	for uid, u := range r.unbound {
		if u.node == node && !still[uid] {
			delete(r.unbound, uid) // bound, admitted or gone
		}
	}
	blocked := allocorder.Blocking(pod, node, others)
	out := blocked[:0]
	for _, b := range blocked {
		if u, ok := r.unbound[b.UID]; b.Spec.NodeName == "" && ok && now.Sub(u.since) > UnboundGrace {
			continue
		}
		out = append(out, b)
	}
	return out, nil
}

func (r *Reconciler) holdBack(k types.NamespacedName, node string) (first bool) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	if r.heldBack == nil {
		r.heldBack = map[string]map[types.NamespacedName]bool{}
	}
	if r.heldBack[node] == nil {
		r.heldBack[node] = map[types.NamespacedName]bool{}
	}
	first = !r.heldBack[node][k]
	r.heldBack[node][k] = true
	return first
}

// letGo forgets that k is held back.
func (r *Reconciler) letGo(k types.NamespacedName) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	for n, m := range r.heldBack {
		delete(m, k)
		if len(m) == 0 {
			delete(r.heldBack, n)
		}
	}
}

func (r *Reconciler) unplannedWaiting(ctx context.Context, _ client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.MatchingFields{IndexUnplannedGated: "true"}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(pods.Items))
	for i := range pods.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
	}
	return out
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
		if apierrors.IsNotFound(err) {
			r.letGo(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !hasGate(pod, v1alpha1.SchedulingGatePlacement) || pod.DeletionTimestamp != nil {
		r.letGo(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	if hasGate(pod, TASGate) {
		return reconcile.Result{}, nil // TAS first; its ungating is a pod update we see
	}
	if hasGate(pod, KueueAdmissionGate) {
		return reconcile.Result{}, nil // Kueue's pod integration: its admission brings the plan, by an update we see
	}
	planName := pod.Annotations[v1alpha1.AnnotationPlan]
	if planName == "" && KueuePodIntegration(pod) {
		return r.unplanned(ctx, pod)
	}
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
	if reason, why, err := r.notForPod(ctx, pod, plan); err != nil {
		return reconcile.Result{}, err
	} else if why != "" {
		r.record(pod, corev1.EventTypeWarning, reason, "GPUPlan %s: %s; pod stays gated", plan.Name, why)
		return reconcile.Result{RequeueAfter: NotForPodRetry}, nil
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

	// The kubelet's Allocate does not name the pod: another pod awaiting
	// its allocation on this node with the same GPU count could be handed
	// this pod's slot, and this pod its. Release one at a time.
	r.mu.Lock()
	defer r.mu.Unlock()
	blocked, err := r.blockers(ctx, pod, slot.Node)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(blocked) > 0 {
		if r.holdBack(req.NamespacedName, slot.Node) {
			r.record(pod, corev1.EventTypeNormal, EventWaitingForAllocation, "GPUPlan %s slot %s[%d] on node %s is ready; waiting for %s, which ask(s) for the same GPU count there, to be admitted by the kubelet (its device request does not say which pod it is for, so such pods start one at a time)",
				plan.Name, slot.PodSet, slot.Index, slot.Node, allocorder.Describe(pod, blocked))
		}
		return reconcile.Result{RequeueAfter: AllocationRetry}, nil
	}
	r.letGo(req.NamespacedName)

	devices := Devices(slot)
	var pinned *corev1.Pod
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Pod{}
		if err := r.Client.Get(ctx, req.NamespacedName, cur); err != nil {
			return err
		}
		if cur.UID != pod.UID || !hasGate(cur, v1alpha1.SchedulingGatePlacement) {
			return nil
		}
		Pin(cur, slot.Node, devices)
		if err := r.Client.Update(ctx, cur, client.FieldOwner(FieldOwner)); err != nil {
			return err
		}
		pinned = cur
		return nil
	})
	if err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if pinned != nil {
		if r.released == nil {
			r.released = map[types.UID]*corev1.Pod{}
		}
		r.released[pinned.UID] = pinned
	}
	log.V(2).Info("placed pod", "plan", plan.Name, "node", slot.Node, "devices", devices)
	r.record(pod, corev1.EventTypeNormal, EventPlaced, "GPUPlan %s slot %s[%d]: node %s, GPUs %s", plan.Name, slot.PodSet, slot.Index, slot.Node, devices)
	return reconcile.Result{}, nil
}

// notForPod says why pod may not take a slot of plan ("" when it may),
// with the Event's reason: a slot is for a pod of the plan's Workload only
// (owners.Belongs, through the coordinator's walk up the controller chain),
// so a pod that names another job's plan — gpupack.io/plan is a pod
// annotation, and a trusted controller copies it from whatever template it
// is given — never takes that job's slot (issue 14, finding 6); and a
// member of a Kueue pod group takes one only if the group's members were
// all created by one user (owners.GroupSlot on their gpupack.io/created-by
// stamps): Kueue makes any pod labelled with the group's name an owner of
// its Workload (review 14 F3). A pod that asks for no GPU takes no slot:
// the check writes a plan only into GPU pod sets, and a tenant's CPU Job
// forged under the victim's JobSet (which no gpupack webhook sees) is
// given the victim's plan by the JobSet controller (review 9, F1b). A
// pod-group member it cannot read yet is an error (retried), never a
// guess.
func (r *Reconciler) notForPod(ctx context.Context, pod *corev1.Pod, plan *v1alpha1.GPUPlan) (reason, why string, err error) {
	if !asksGPU(pod) {
		return EventPlanNotForPod, "the pod asks for no GPU, and a GPUPlan slot is for a GPU pod of its Workload (the check writes the plan only into GPU pod sets)", nil
	}
	wl := &kueue.Workload{}
	f := owners.Finder{Reader: r.Client}
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: plan.Spec.WorkloadName}, wl)
	var lineage []metav1.OwnerReference
	switch {
	case err != nil:
		return EventPlanNotForPod, fmt.Sprintf("its Workload %s cannot be read (%v)", plan.Spec.WorkloadName, err), nil
	case plan.Spec.WorkloadUID != "" && wl.UID != plan.Spec.WorkloadUID:
		return EventPlanNotForPod, fmt.Sprintf("its Workload %s is not the one planned (UID %s, not %s)", wl.Name, wl.UID, plan.Spec.WorkloadUID), nil
	}
	if lineage = f.Lineage(ctx, pod); !owners.Belongs(wl, lineage) {
		return EventPlanNotForPod, fmt.Sprintf("the pod does not belong to its Workload %s (neither the pod nor its controller chain owns it, nor does its %s label name it), so it may not take that job's slot", wl.Name, owners.LabelPodGroup), nil
	}
	members, err := r.groupMembers(ctx, pod.Namespace, wl)
	if err != nil {
		return "", "", err
	}
	if owners.HasLWSOwner(wl) {
		// An LWS group's pods reach their LWS through StatefulSets, which
		// Lineage does not walk (only LWS Workloads need the reads, and
		// only with the LWS RBAC component are StatefulSets listed).
		lineage = append(lineage, f.GroupLinks(ctx, pod)...)
	}
	if why := owners.GroupSlot(wl, lineage, memberOf(pod), members); why != "" {
		return EventGroupCreatorsDiffer, why, nil
	}
	return "", "", nil
}

// groupMembers are wl's Pod owners as owners.GroupSlot sees them: each read
// from the cache (gone, or another pod of the name: skipped; so is one that
// asks for no GPUs).
func (r *Reconciler) groupMembers(ctx context.Context, ns string, wl *kueue.Workload) ([]owners.Member, error) {
	var out []owners.Member
	for _, o := range wl.OwnerReferences {
		if o.APIVersion != "v1" || o.Kind != "Pod" {
			continue
		}
		p := &corev1.Pod{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: o.Name}, p)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && p.UID != o.UID):
			out = append(out, owners.Member{Name: o.Name, UID: o.UID, Skip: true})
		case err != nil:
			return nil, err
		default:
			m := memberOf(p)
			m.Skip = !asksGPU(p)
			out = append(out, m)
		}
	}
	return out, nil
}

func memberOf(p *corev1.Pod) owners.Member {
	stamp, ok := p.Annotations[v1alpha1.AnnotationCreatedBy]
	return owners.Member{Name: p.Name, UID: p.UID, Stamp: stamp, Stamped: ok}
}

// asksGPU: a container (init containers too) of p asks for a GPU resource.
func asksGPU(p *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			for _, r := range []corev1.ResourceName{v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores} {
				if _, ok := c.Resources.Limits[r]; ok {
					return true
				}
				if _, ok := c.Resources.Requests[r]; ok {
					return true
				}
			}
		}
	}
	return false
}

// unplanned handles a pod Kueue admitted without a GPUPlan (its
// ClusterQueue has no gang-fit check, or nothing of it asks for GPUs):
// Kueue may have admitted it by preempting workloads whose pods still hold
// GPUs (they checkpoint, then terminate), which the scheduler and the
// device plugin would count as free only once they are gone. It waits at
// the gate while a victim it must wait for (victims.WaitsFor: the ones
// Kueue preempted for its Workload, and those that name nobody) is in the
// coordinator's Checkpointing, Terminating or Killing phase; then the gate
// goes, with no pin: the scheduler places it and the device plugin hands
// it free GPUs. A ClusterQueue with the check never gets here: the check
// itself keeps such a preemptor Pending until the victims' GPUs are free.
//
// A fractional pod (gpupack.io/vgpu) never goes without a plan: GPUs are
// shared only by a GPUPlan's slots, so it stays gated and says why.
func (r *Reconciler) unplanned(ctx context.Context, pod *corev1.Pod) (reconcile.Result, error) {
	if fractional(pod) {
		r.record(pod, corev1.EventTypeWarning, EventPlanMissing, "fractional GPU pod admitted without a %s annotation: shared GPUs are handed out only by a GPUPlan, so its ClusterQueue needs the gpupack.io/gang-fit AdmissionCheck; pod stays gated", v1alpha1.AnnotationPlan)
		return reconcile.Result{}, nil
	}
	var wls kueue.WorkloadList
	if err := r.Client.List(ctx, &wls, client.MatchingFields{IndexVictim: "true"}); err != nil {
		return reconcile.Result{}, err
	}
	var candidates []victims.Victim
	for i := range wls.Items {
		if v, ok := victims.Observe(&wls.Items[i]); ok {
			candidates = append(candidates, v)
		}
	}
	var held []victims.Victim
	if len(candidates) > 0 {
		self, err := r.podWorkloads(ctx, pod)
		if err != nil {
			return reconcile.Result{}, err
		}
		held = victims.WaitsFor(self, candidates, r.now())
	}
	if len(held) > 0 {
		r.record(pod, corev1.EventTypeNormal, EventWaitingForRelease, "admitted without a GPUPlan while workloads it must wait for still hold GPUs: %s; waiting for them to go", victims.Describe(held))
		return reconcile.Result{RequeueAfter: BusyRetry}, nil
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Pod{}
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(pod), cur); err != nil {
			return err
		}
		if cur.UID != pod.UID || !hasGate(cur, v1alpha1.SchedulingGatePlacement) || cur.Annotations[v1alpha1.AnnotationPlan] != "" {
			return nil
		}
		removeGate(cur)
		return r.Client.Update(ctx, cur, client.FieldOwner(FieldOwner))
	})
	if err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.record(pod, corev1.EventTypeNormal, EventReleased, "admitted without a GPUPlan; no workload preempted for it holds GPUs any more, gate %s lifted", v1alpha1.SchedulingGatePlacement)
	return reconcile.Result{}, nil
}

// podWorkloads finds the pod's own Kueue Workloads: those it owns (Kueue
// makes a single pod, a Deployment's pod and each member of a pod group an
// owner of its Workload), and its pod group's by name.
func (r *Reconciler) podWorkloads(ctx context.Context, pod *corev1.Pod) (victims.Pod, error) {
	out := victims.Pod{UID: string(pod.UID)}
	var owned kueue.WorkloadList
	if err := r.Client.List(ctx, &owned, client.InNamespace(pod.Namespace), client.MatchingFields{IndexWorkloadOwner: string(pod.UID)}); err != nil {
		return out, err
	}
	seen := map[types.UID]bool{}
	for i := range owned.Items {
		seen[owned.Items[i].UID] = true
		out.Workloads = append(out.Workloads, victims.OfWorkload(&owned.Items[i]))
	}
	if g := pod.Labels[KueuePodGroupLabel]; g != "" {
		var wl kueue.Workload
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: g}, &wl)
		switch {
		case err == nil && !seen[wl.UID]:
			out.Workloads = append(out.Workloads, victims.OfWorkload(&wl))
		case err != nil && !apierrors.IsNotFound(err):
			return out, err
		}
	}
	return out, nil
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func fractional(p *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			if _, ok := c.Resources.Limits[v1alpha1.ResourceVGPU]; ok {
				return true
			}
			if _, ok := c.Resources.Requests[v1alpha1.ResourceVGPU]; ok {
				return true
			}
		}
	}
	return false
}

func removeGate(p *corev1.Pod) {
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
	removeGate(p)
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
