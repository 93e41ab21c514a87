package admissioncheck

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/util/admissioncheck"
	"sigs.k8s.io/kueue/pkg/workload"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/gpucache"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/admissioncheck/volcano"
	"github.com/gpupack/gpupack/flavors"
)

// Options configure the controller.
type Options struct {
	// Clock is for tests; defaults to the real clock.
	Clock clock.Clock
	// ReconcileTimeout bounds one reconcile (default 30s), so nothing can
	// hold the decision worker for ever.
	ReconcileTimeout time.Duration
	// OwnerTimeout bounds the read of a Workload's owner for job-level
	// settings (default 2s); the read never goes through the informer cache.
	OwnerTimeout time.Duration
	// Workers is how many Workloads are decided at once (default
	// DefaultWorkers). Each decision reads the model and assumes its plan
	// under the model's lock; its API writes run outside it.
	Workers int
}

const (
	defaultReconcileTimeout = 30 * time.Second
	defaultOwnerTimeout     = 2 * time.Second
	// DefaultWorkers: decisions in flight at once.
	DefaultWorkers = 4
)

// Setup registers both reconcilers with a manager.
func Setup(mgr ctrl.Manager, opts Options) error {
	if err := setupACReconciler(mgr); err != nil {
		return err
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.ReconcileTimeout <= 0 {
		opts.ReconcileTimeout = defaultReconcileTimeout
	}
	if opts.OwnerTimeout <= 0 {
		opts.OwnerTimeout = defaultOwnerTimeout
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	w := newWaiters()
	r := &workloadReconciler{
		client:       mgr.GetClient(),
		planReader:   mgr.GetAPIReader(),
		ownerReader:  mgr.GetAPIReader(),
		ownerTimeout: opts.OwnerTimeout,
		recorder:     mgr.GetEventRecorderFor(EventSource), //nolint:staticcheck // core/v1 Events show in kubectl describe
		clock:        opts.Clock,
		cache:        gpucache.New(w.wake),
		waiters:      w,
	}
	// A node lost under a plan's unbound slot wakes that Workload at once.
	r.cache.SetOnNodeLost(w.wakeKeys)
	synced, err := feedCache(context.Background(), mgr, r.cache)
	if err != nil {
		return err
	}
	r.synced = synced
	return ctrl.NewControllerManagedBy(mgr).
		Named("gangfit-workload").
		For(&kueue.Workload{}).
		// Capacity freed (a holder pod gone, a plan released, a node Ready)
		// re-triggers the Workloads waiting for it.
		WatchesRawSource(source.Channel(w.ch, &handler.TypedEnqueueRequestForObject[*kueue.Workload]{})).
		// Decisions run side by side (one per Workload at a time, the
		// workqueue's rule); none gets capacity another took, because each
		// reads the model and assumes its plan in one gpucache.Read: a plan
		// counts before the lock is let go, written or not. The API writes
		// (plan create, check state) happen after it, and a create that
		// fails forgets the assumption (ForgetHeld when it may have been
		// stored).
		WithOptions(controller.Options{MaxConcurrentReconciles: opts.Workers, ReconciliationTimeout: opts.ReconcileTimeout}).
		Complete(r)
}

type workloadReconciler struct {
	client     client.Client
	planReader client.Reader
	// ownerReader reads a Workload's owner straight from the API server
	// (never the informer cache: a Get of a kind the manager may not watch
	// blocks there until the informer syncs, which it never does).
	ownerReader  client.Reader
	ownerTimeout time.Duration
	// cache is the long-lived GPU model; synced says it has listed
	// everything once (nil: always).
	cache        *gpucache.Cache
	synced       gpucache.Synced
	waiters      *waiters
	lastCapacity time.Time
	recorder     record.EventRecorder
	clock        clock.Clock
}

func (r *workloadReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	if r.synced != nil && !r.synced() {
		return reconcile.Result{RequeueAfter: time.Second}, nil // the GPU model is still being listed
	}
	wl := &kueue.Workload{}
	if err := r.client.Get(ctx, req.NamespacedName, wl); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone: its plan no longer reserves anything.
			return reconcile.Result{}, r.releasePlan(ctx, nil, req.NamespacedName, "")
		}
		return reconcile.Result{}, err
	}
	checks, err := admissioncheck.FilterForController(ctx, r.client, wl.Status.AdmissionChecks, v1alpha1.ControllerName)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(checks) == 0 {
		// Not (or no longer) ours: the check was removed from the
		// ClusterQueue. A plan left behind would reserve GPUs for ever.
		if plan, ok := r.cache.Plan(req.NamespacedName); !ok || plan.Spec.WorkloadUID != wl.UID {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, r.releasePlan(ctx, wl, req.NamespacedName, "the gang-fit check is no longer required by the workload's ClusterQueue")
	}
	if !reservationUsable(wl) {
		if err := r.releasePlan(ctx, wl, req.NamespacedName, "workload no longer holds quota"); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, r.resetReady(ctx, wl, checks)
	}
	var requeue time.Duration
	for _, name := range checks {
		st := admissioncheck.FindAdmissionCheck(wl.Status.AdmissionChecks, name)
		switch st.State {
		case kueue.CheckStateReady:
			after, err := r.healReady(ctx, wl, name, st)
			if err != nil {
				return reconcile.Result{}, err
			}
			if after > 0 && (requeue == 0 || after < requeue) {
				requeue = after
			}
			continue
		case kueue.CheckStatePending:
		default: // Retry / Rejected: Kueue releases quota; so do we.
			if err := r.releasePlan(ctx, wl, req.NamespacedName, "check is "+string(st.State)); err != nil {
				return reconcile.Result{}, err
			}
			continue
		}
		after, err := r.decide(ctx, wl, name, nil)
		if errors.Is(err, errReservationChanged) {
			// Evicted or re-admitted while deciding: the write was refused and
			// the plan released; the Workload's own update brings it back.
			log.V(2).Info("quota reservation changed during the decision; not written", "check", name)
			continue
		}
		if err != nil {
			log.Error(err, "gang-fit decision failed", "check", name)
			return reconcile.Result{}, err
		}
		if after > 0 && (requeue == 0 || after < requeue) {
			requeue = after
		}
	}
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// healReady: a Ready check whose podSetUpdates name a plan that is gone (or
// belongs to an earlier workload of the same name, or to an earlier
// admission of this one) would leave the pods gated for ever. A Ready left
// over from an earlier admission (Kueue admitted the new reservation at
// once on it) is planned again in place: a new plan under the name the
// pods already carry, the same podSetUpdates. Otherwise, or when that does
// not fit, Retry makes Kueue evict and requeue; the next admission is
// planned afresh.
func (r *workloadReconciler) healReady(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, st *kueue.AdmissionCheckState) (time.Duration, error) {
	name := ""
	for _, u := range st.PodSetUpdates {
		if v := u.Annotations[v1alpha1.AnnotationPlan]; v != "" {
			name = v
		}
	}
	if name == "" {
		return 0, nil // no GPU pod set: nothing to place
	}
	msg := fmt.Sprintf("GPUPlan %s of this admission is gone; re-planning", name)
	if plan, ok := r.cache.Plan(client.ObjectKey{Namespace: wl.Namespace, Name: name}); ok && planOfAdmission(plan, wl) {
		lost, wait := r.lostNode(plan)
		if lost == "" {
			return wait, nil
		}
		msg = fmt.Sprintf("node %s of GPUPlan %s is gone, cordoned or NotReady for more than %v before its pod was placed; re-planning", lost, name, gpucache.LostNodeGrace)
	} else if name == wl.Name && staleReady(wl, st) {
		after, err := r.decide(ctx, wl, check, st)
		if errors.Is(err, errReservationChanged) {
			return 0, nil
		}
		return after, err
	}
	r.recorder.Event(wl, corev1.EventTypeWarning, EventPlanLost, msg)
	err := r.setState(ctx, wl, check, kueue.CheckStateRetry, msg, nil, nil)
	if errors.Is(err, errReservationChanged) {
		return 0, nil
	}
	return 0, err
}

// decide evaluates one Pending check and writes the decision. With keep
// set (a Ready state of an earlier admission, on which Kueue already
// admitted this one), it re-plans in place: Ready again only with the same
// podSetUpdates (the pods already carry them), else Retry.
func (r *workloadReconciler) decide(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, keep *kueue.AdmissionCheckState) (time.Duration, error) {
	start := time.Now()
	defer func() { decisionSeconds.Observe(time.Since(start).Seconds()) }()

	var ac kueue.AdmissionCheck
	if err := r.client.Get(ctx, client.ObjectKey{Name: string(check)}, &ac); err != nil {
		return 0, err
	}
	params, err := loadParameters(ctx, r.client, ac.Spec.Parameters)
	if err != nil {
		// The AdmissionCheck's Active condition says why; Kueue stops using
		// the ClusterQueue. Look again later.
		return 30 * time.Second, nil
	}
	planKey := client.ObjectKey{Namespace: wl.Namespace, Name: wl.Name}

	// Under MultiKueue the pods run in a worker cluster, whose own gang-fit
	// check plans them on its GPUs. Here (the manager) a plan would reserve
	// GPUs no pod of this workload will use, and a verdict on this
	// cluster's inventory says nothing of the workers': never Ready, never
	// Rejected, and the message says where the check belongs.
	mk, err := admissioncheck.FilterForController(ctx, r.client, wl.Status.AdmissionChecks, kueue.MultiKueueControllerName)
	if err != nil {
		return 0, err
	}
	if len(mk) > 0 {
		decisions.WithLabelValues(ResultRetry).Inc()
		msg := fmt.Sprintf("the workload is dispatched to worker clusters by MultiKueue (admission check %s): gang-fit plans GPUs in the cluster that runs the pods, so configure it on the worker clusters' ClusterQueues and remove it from this one; no plan is made here", mk[0])
		if st := admissioncheck.FindAdmissionCheck(wl.Status.AdmissionChecks, check); st == nil || st.Message != msg {
			r.recorder.Event(wl, corev1.EventTypeWarning, EventMultiKueue, msg)
		}
		return 0, r.setState(ctx, wl, check, kueue.CheckStateRetry, msg, nil, params)
	}

	gang, aff, gangErr := r.gangOf(ctx, wl)
	if re := (*readError)(nil); errors.As(gangErr, &re) {
		return 0, gangErr // transient: retried, never Rejected, the stored plan kept
	}
	// A plan stored for this very workload (e.g. by a manager that died
	// before marking the check Ready) is reused: deciding again would count
	// it twice or hand its GPUs to someone else. Only while it still matches
	// the admission: pod counts and flavors can change between admissions.
	buf := flavors.NewBuffer(params.Spec.Buffer.DriverOverheadMiB, params.Spec.Buffer.BufferPercent)
	if existing, ok := r.cache.Plan(planKey); ok {
		ours := planOfAdmission(existing, wl)
		if ours && gangErr == nil {
			why := r.planMismatch(ctx, existing, gang)
			if why == "" {
				// Reused only where it still fits beside everything else:
				// a create of an earlier leader may have landed after this
				// process listed the plans and planned those GPUs again.
				r.cache.Read(buf, func(s *gpucache.Snapshot) { why = s.Overbooked(planKey) })
			}
			if why == "" {
				return 0, r.writeReady(ctx, wl, check, existing.DeepCopy(), params, "GPUs reserved by an existing plan", keep)
			}
			ctrl.LoggerFrom(ctx).V(2).Info("stored plan does not match the admission; planning again", "plan", existing.Name, "why", why)
		}
		// Replaced while the check is Pending: no pod of this admission
		// exists yet, so its slots are free at once. A plan of an earlier
		// workload, or of an earlier admission of this one (whose pods may
		// still be terminating), is released as usual.
		if err := r.deletePlan(ctx, existing, !ours || keep != nil); err != nil {
			return 0, err
		}
	}

	if gangErr != nil {
		decisions.WithLabelValues(ResultRejected).Inc()
		msg := "the GPU request cannot be read: " + gangErr.Error()
		if errors.Is(gangErr, inventory.ErrNotPlanned) {
			msg = "the gang cannot be planned: " + gangErr.Error()
		}
		r.recorder.Event(wl, corev1.EventTypeWarning, EventBadRequest, msg)
		return 0, r.setState(ctx, wl, check, kueue.CheckStateRejected, msg, nil, params)
	}
	if ps := tasAssigned(wl, gang); ps != "" {
		// Kueue TAS places these pods itself (its ungater picks the nodes);
		// a gang-fit plan beside it would name other GPUs, and the two
		// would double-book. Planning inside a TopologyAssignment is not
		// built, so the combination is refused, saying so.
		decisions.WithLabelValues(ResultRejected).Inc()
		msg := fmt.Sprintf("pod set %s has a Kueue TopologyAssignment (topology-aware scheduling); gang-fit cannot plan inside one yet: use either TAS or the gang-fit check for GPU pod sets", ps)
		r.recorder.Event(wl, corev1.EventTypeWarning, EventTASConflict, msg)
		return 0, r.setState(ctx, wl, check, kueue.CheckStateRejected, msg, nil, params)
	}
	if len(gang.PodSets) == 0 {
		decisions.WithLabelValues(ResultNoGPU).Inc()
		return 0, r.setState(ctx, wl, check, kueue.CheckStateReady, "no pod set asks for GPUs", volcano.AddPodSetUpdates(wl, params, nil), params)
	}
	level := r.levelFor(ctx, wl, params)
	opts := fit.Options{Levels: params.Spec.TopologyLevels, Level: level, Policy: params.Spec.Policy}
	if s := params.Spec.Search.MaxSteps; s != nil {
		opts.MaxSteps = *s
	}
	if d := params.Spec.Search.MaxDomains; d != nil {
		opts.MaxDomains = int(*d)
	}

	// The decision reads the long-lived model under its lock and, when the
	// gang fits, assumes the plan before the lock is let go.
	var (
		v           gpucache.Verdict
		plan        *v1alpha1.GPUPlan
		warnings    []string
		terminating int
		planErr     error
	)
	r.cache.Read(buf, func(s *gpucache.Snapshot) {
		r.recordCapacity(s, params.Spec.TopologyLevels)
		warnings, terminating = s.Warnings, s.Terminating
		v = s.Decide(gang, aff, opts)
		if v.Result.Fits {
			plan, planErr = r.newPlan(wl, gang, aff, v.Result)
			if planErr == nil {
				s.Assume(plan.DeepCopy())
			}
		}
	})
	res := v.Result
	if planErr != nil {
		return 0, planErr
	}
	if res.Fits {
		if err := r.createPlan(ctx, plan); err != nil {
			return 0, err
		}
		decisions.WithLabelValues(ResultReady).Inc()
		// The check's message says what a GangFits Event used to (no Event
		// for a fit: one API request per admitted Workload less).
		msg := fmt.Sprintf("all %d pods fit on %d GPUs%s; GPUPlan %s", gang.Pods(), plan.Spec.GPUCount, inDomain(res), plan.Name)
		if keep != nil {
			msg += " (planned again: this admission began on the Ready check of an earlier one)"
		}
		return 0, r.writeReady(ctx, wl, check, plan, params, msg, keep)
	}
	why := summarize(res)
	if len(warnings) > 0 {
		r.recorder.Event(wl, corev1.EventTypeWarning, EventInventoryWarning, truncate(warningsLine(warnings)))
	}
	if keep != nil {
		// Admitted already: Pending would stop the job all the same. While
		// the gang fits once terminating pods (or a released plan's ghosts)
		// are gone, the stale Ready is left as it is, its pods gated on the
		// plan name they carry, and looked at again (bounded as Pending is);
		// otherwise Retry says why.
		if qr := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved); v.SettledFits && qr != nil &&
			r.clock.Since(qr.LastTransitionTime.Time) <= maxPendingOnTerminating {
			decisions.WithLabelValues(ResultPending).Inc()
			r.wait(wl, true)
			return pendingRecheck, nil
		}
		r.wait(wl, false)
		decisions.WithLabelValues(ResultRetry).Inc()
		msg := "this admission began on the Ready check of an earlier one, whose GPUPlan is gone, and the gang does not fit now: " + why
		r.recorder.Event(wl, corev1.EventTypeWarning, EventPlanLost, truncate(msg))
		return 0, r.setState(ctx, wl, check, kueue.CheckStateRetry, msg, nil, params)
	}
	if st := admissioncheck.FindAdmissionCheck(wl.Status.AdmissionChecks, check); v.SettledFits && st != nil &&
		!st.LastTransitionTime.IsZero() && r.clock.Since(st.LastTransitionTime.Time) > maxPendingOnTerminating {
		// Pending holds the quota; a pod stuck terminating (a finalizer
		// nobody removes) must not hold it for ever.
		decisions.WithLabelValues(ResultRetry).Inc()
		msg := fmt.Sprintf("waited more than %v for %d terminating pod(s) to release their GPUs; releasing the quota and retrying (now: %s)", maxPendingOnTerminating, terminating, why)
		r.recorder.Event(wl, corev1.EventTypeWarning, EventNoFit, truncate(msg))
		r.wait(wl, false)
		return 0, r.setState(ctx, wl, check, kueue.CheckStateRetry, msg, nil, params)
	}
	if v.SettledFits {
		decisions.WithLabelValues(ResultPending).Inc()
		msg := fmt.Sprintf("waiting for GPUs held by %d terminating pod(s): the gang fits once they are gone (now: %s)", terminating, why)
		if st := admissioncheck.FindAdmissionCheck(wl.Status.AdmissionChecks, check); st == nil || st.Message != truncate(msg) {
			r.recorder.Event(wl, corev1.EventTypeNormal, EventWaitingTerminating, msg)
		}
		r.wait(wl, true)
		return pendingRecheck, r.setState(ctx, wl, check, kueue.CheckStatePending, msg, nil, params)
	}
	r.wait(wl, false)
	if v.Never {
		// Rejected deactivates the Workload: only when no state of the
		// declared inventory could ever hold the gang. An inventory that is
		// empty, partly published or partly unreadable is not that.
		if v.Incomplete != "" {
			decisions.WithLabelValues(ResultRetry).Inc()
			msg := fmt.Sprintf("gang does not fit the GPU nodes read so far (%s), but %s; not rejecting while the inventory is incomplete", v.NeverWhy, v.Incomplete)
			r.recorder.Event(wl, corev1.EventTypeWarning, EventNoFit, truncate(msg))
			return 0, r.setState(ctx, wl, check, kueue.CheckStateRetry, msg, nil, params)
		}
		decisions.WithLabelValues(ResultRejected).Inc()
		msg := "the gang can never fit: " + v.NeverWhy
		r.recorder.Event(wl, corev1.EventTypeWarning, EventNeverFits, msg)
		return 0, r.setState(ctx, wl, check, kueue.CheckStateRejected, msg, nil, params)
	}
	decisions.WithLabelValues(ResultRetry).Inc()
	msg := "gang does not fit now: " + why
	if len(warnings) > 0 {
		msg += "; inventory warnings: " + warningsLine(warnings)
	}
	r.recorder.Event(wl, corev1.EventTypeNormal, EventNoFit, truncate(msg))
	return 0, r.setState(ctx, wl, check, kueue.CheckStateRetry, msg, nil, params)
}

// writeReady marks the check Ready for plan; if the Workload lost the
// reservation meanwhile, the plan is released (its capacity is not the
// next admission's) and errReservationChanged returned. With keep set, the
// podSetUpdates must stay keep's (Kueue refuses to change a Ready check's,
// and the pods already carry them): if they would not, the plan is dropped
// and the check set to Retry.
func (r *workloadReconciler) writeReady(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, plan *v1alpha1.GPUPlan, params *v1alpha1.GangFitParameters, msg string, keep *kueue.AdmissionCheckState) error {
	if keep != nil && !equality.Semantic.DeepEqual(readyUpdates(wl, plan, params), keep.PodSetUpdates) {
		if err := r.deletePlan(ctx, plan, false); err != nil {
			return err
		}
		msg := fmt.Sprintf("this admission began on the Ready check of an earlier one, whose GPUPlan is gone; a new plan fits but not in the domain the pods were given (%s); retrying", inDomainOf(plan))
		r.recorder.Event(wl, corev1.EventTypeWarning, EventPlanLost, msg)
		return r.setState(ctx, wl, check, kueue.CheckStateRetry, msg, nil, params)
	}
	err := r.setReady(ctx, wl, check, plan, params, msg)
	if errors.Is(err, errReservationChanged) {
		if derr := r.deletePlan(ctx, plan, true); derr != nil {
			return derr
		}
	}
	return err
}

// planMismatch says why a stored plan no longer fits the admission ("" if
// it does): a pod set's count changed, or a planned node no longer carries
// the labels of the flavor Kueue assigned.
func (r *workloadReconciler) planMismatch(ctx context.Context, plan *v1alpha1.GPUPlan, gang fit.Gang) string {
	count := map[string]int{}
	nodes := map[string][]string{}
	for _, a := range plan.Spec.Assignments {
		count[a.PodSet]++
		nodes[a.PodSet] = append(nodes[a.PodSet], a.Node)
	}
	if len(count) != len(gang.PodSets) {
		return fmt.Sprintf("plan has %d GPU pod sets, the admission %d", len(count), len(gang.PodSets))
	}
	for _, ps := range gang.PodSets {
		if count[ps.Name] != ps.Count {
			return fmt.Sprintf("pod set %s: plan has %d pods, the admission %d", ps.Name, count[ps.Name], ps.Count)
		}
		if len(ps.NodeSelector) == 0 {
			continue
		}
		for _, n := range nodes[ps.Name] {
			var node corev1.Node
			if err := r.client.Get(ctx, client.ObjectKey{Name: n}, &node); err != nil {
				return fmt.Sprintf("planned node %s: %v", n, err)
			}
			for k, v := range ps.NodeSelector {
				if node.Labels[k] != v {
					return fmt.Sprintf("planned node %s lacks %s=%s of the assigned flavor", n, k, v)
				}
			}
		}
	}
	return ""
}

func warningsLine(ws []string) string {
	const max = 3
	more := ""
	if len(ws) > max {
		more = fmt.Sprintf(" (and %d more)", len(ws)-max)
		ws = ws[:max]
	}
	return strings.Join(ws, "; ") + more
}

func inDomain(res fit.Result) string {
	if res.Level == "" {
		return ""
	}
	return fmt.Sprintf(" in %s=%s", res.Level, res.Domain)
}

// summarize makes one line of the engine's reasons.
func summarize(res fit.Result) string {
	if len(res.Reasons) == 0 {
		return "no domain can hold every pod"
	}
	const max = 3
	rs := res.Reasons
	more := ""
	if len(rs) > max {
		more = fmt.Sprintf(" (and %d more)", len(rs)-max)
		rs = rs[:max]
	}
	return strings.Join(rs, "; ") + more
}

const maxMessage = 1024

func truncate(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage-3] + "..."
}

// gangOf reads the workload's GPU pod sets, with the admitted counts and the
// node labels and tolerations of the flavors Kueue assigned.
func (r *workloadReconciler) gangOf(ctx context.Context, wl *kueue.Workload) (fit.Gang, []inventory.PodAffinity, error) {
	podSets := make([]kueue.PodSet, len(wl.Spec.PodSets))
	for i := range wl.Spec.PodSets {
		podSets[i] = *wl.Spec.PodSets[i].DeepCopy()
	}
	if adm := wl.Status.Admission; adm != nil {
		for _, psa := range adm.PodSetAssignments {
			for i := range podSets {
				if podSets[i].Name != psa.Name {
					continue
				}
				if psa.Count != nil {
					podSets[i].Count = *psa.Count
				}
				// Pods Kueue counts as reclaimable (finished for good) need no GPUs.
				for _, rp := range wl.Status.ReclaimablePods {
					if rp.Name == psa.Name {
						podSets[i].Count = max(0, podSets[i].Count-rp.Count)
					}
				}
				if err := r.applyFlavors(ctx, &podSets[i], psa.Flavors); err != nil {
					return fit.Gang{}, nil, err
				}
			}
		}
	}
	return inventory.GangFromPodSets(wl.Namespace, podSets)
}

func (r *workloadReconciler) applyFlavors(ctx context.Context, ps *kueue.PodSet, fl map[corev1.ResourceName]kueue.ResourceFlavorReference) error {
	seen := map[kueue.ResourceFlavorReference]bool{}
	for _, name := range fl {
		if seen[name] {
			continue
		}
		seen[name] = true
		var rf kueue.ResourceFlavor
		if err := r.client.Get(ctx, client.ObjectKey{Name: string(name)}, &rf); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return &readError{fmt.Errorf("reading ResourceFlavor %s: %w", name, err)}
		}
		if len(rf.Spec.NodeLabels) > 0 {
			if ps.Template.Spec.NodeSelector == nil {
				ps.Template.Spec.NodeSelector = map[string]string{}
			}
			for k, v := range rf.Spec.NodeLabels {
				ps.Template.Spec.NodeSelector[k] = v
			}
		}
		ps.Template.Spec.Tolerations = append(ps.Template.Spec.Tolerations, rf.Spec.Tolerations...)
	}
	return nil
}

// levelFor: the job's gpupack.io/gang-topology annotation (on a pod template
// or the owning job) overrides the parameters' required level. The owner is
// read through ownerReader with a short timeout; any failure (no such kind,
// no RBAC, gone, slow) reads as "not set", so a Workload of a job kind the
// manager knows nothing about is decided like any other.
func (r *workloadReconciler) levelFor(ctx context.Context, wl *kueue.Workload, p *v1alpha1.GangFitParameters) string {
	for _, ps := range wl.Spec.PodSets {
		if v := ps.Template.Annotations[v1alpha1.AnnotationGangTopology]; v != "" {
			return v
		}
	}
	owner := metav1.GetControllerOf(wl)
	if owner == nil || r.ownerReader == nil {
		return p.Spec.RequiredLevel
	}
	gv, err := schema.ParseGroupVersion(owner.APIVersion)
	if err != nil {
		return p.Spec.RequiredLevel
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(gv.WithKind(owner.Kind))
	octx, cancel := context.WithTimeout(ctx, r.ownerTimeout)
	defer cancel()
	if err := r.ownerReader.Get(octx, client.ObjectKey{Namespace: wl.Namespace, Name: owner.Name}, meta); err != nil {
		if !apierrors.IsNotFound(err) {
			ctrl.LoggerFrom(ctx).V(2).Info("owner not readable; its gang-topology annotation reads as not set",
				"owner", owner.Kind+"/"+owner.Name, "error", err.Error())
		}
		return p.Spec.RequiredLevel
	}
	if v := meta.Annotations[v1alpha1.AnnotationGangTopology]; v != "" {
		return v
	}
	return p.Spec.RequiredLevel
}

// newPlan renders a fit result as the workload's plan object.
func (r *workloadReconciler) newPlan(wl *kueue.Workload, gang fit.Gang, aff []inventory.PodAffinity, res fit.Result) (*v1alpha1.GPUPlan, error) {
	plan := &v1alpha1.GPUPlan{
		ObjectMeta: metav1.ObjectMeta{Name: wl.Name, Namespace: wl.Namespace,
			Labels: map[string]string{"gpupack.io/workload": truncateLabel(wl.Name)}},
		Spec: inventory.PlanFromResult(res),
	}
	plan.Spec.WorkloadName, plan.Spec.WorkloadUID = wl.Name, wl.UID
	plan.Annotations = map[string]string{}
	if a := admissionOf(wl); a != "" {
		plan.Annotations[v1alpha1.AnnotationAdmission] = a
	}
	// A slot no pod is on yet reserves its pod's cpu, memory, … on its node.
	reqs := map[string]map[corev1.ResourceName]int64{}
	for _, ps := range gang.PodSets {
		reqs[ps.Name] = ps.Requests
		if reqs[ps.Name] == nil {
			reqs[ps.Name] = map[corev1.ResourceName]int64{}
		}
	}
	if s := inventory.FormatPodRequests(reqs); s != "" {
		plan.Annotations[v1alpha1.AnnotationPodRequests] = s
	}
	// A slot no pod is bound to yet stands for its pod in pod anti-affinity.
	if s := inventory.FormatPodAffinity(aff); s != "" {
		plan.Annotations[v1alpha1.AnnotationPodAffinity] = s
	}
	// No status: a plan's phase is empty until the placement ungater binds
	// its first pod (Planned, then Placed); empty reserves like Planned.
	if err := controllerutil.SetOwnerReference(wl, plan, r.client.Scheme()); err != nil {
		return nil, err
	}
	return plan, nil
}

// createPlan writes an assumed plan, in one request (the spec is the whole
// reservation; the status subresource is the placement ungater's); if the
// write fails the assumption is forgotten (the GPUs are free again).
func (r *workloadReconciler) createPlan(ctx context.Context, plan *v1alpha1.GPUPlan) error {
	key := client.ObjectKeyFromObject(plan)
	if err := r.client.Create(ctx, plan); err != nil {
		if definitelyNotWritten(err) {
			r.cache.Forget(key, plan.Spec.WorkloadUID)
		} else {
			// The apiserver may have stored it (the client saw a timeout):
			// freeing its GPUs now would let the next decision plan them.
			r.cache.ForgetHeld(key, plan.Spec.WorkloadUID)
		}
		return err
	}
	r.cache.Created(key, plan.Spec.WorkloadUID, plan.UID)
	return nil
}

// definitelyNotWritten reports errors after which the apiserver cannot have
// stored the object (it refused the request itself).
func definitelyNotWritten(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) || apierrors.IsUnauthorized(err) ||
		apierrors.IsNotFound(err) || apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsMethodNotSupported(err)
}

// readError is a failure to read what a decision depends on (not a bad
// request): the reconcile is retried; it never Rejects nor drops a plan.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

func truncateLabel(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}

// releasePlan deletes the workload's plan: its pods that still exist keep
// their GPUs counted through their own gpupack.io/devices annotation.
func (r *workloadReconciler) releasePlan(ctx context.Context, wl *kueue.Workload, key client.ObjectKey, why string) error {
	r.forgetWaiting(key)
	plan, ok := r.cache.Plan(key)
	if !ok {
		return nil
	}
	if wl != nil && plan.Spec.WorkloadUID != "" && plan.Spec.WorkloadUID != wl.UID {
		wl = nil // a plan of an earlier workload of the same name
	}
	if err := r.deletePlan(ctx, plan, true); err != nil {
		return err
	}
	if wl != nil {
		r.recorder.Eventf(wl, corev1.EventTypeNormal, EventPlanReleased, "GPUPlan %s released: %s", plan.Name, why)
	}
	return nil
}

// deletePlan deletes one plan object (never a newer one of the same name)
// and tells the model at once; hold keeps its slots held for
// gpucache.GhostTTL (pods may hold them unseen).
func (r *workloadReconciler) deletePlan(ctx context.Context, plan *v1alpha1.GPUPlan, hold bool) error {
	var pre client.DeleteOption = client.Preconditions{}
	if plan.UID != "" {
		pre = client.Preconditions{UID: &plan.UID}
	}
	err := r.client.Delete(ctx, plan, pre)
	if err := client.IgnoreNotFound(err); err != nil && !apierrors.IsConflict(err) {
		return err
	}
	if hold {
		r.cache.DeletePlan(client.ObjectKeyFromObject(plan), plan.UID, plan.Spec.WorkloadUID)
	} else {
		r.cache.ReplacePlan(client.ObjectKeyFromObject(plan), plan.UID, plan.Spec.WorkloadUID)
	}
	return nil
}

func (r *workloadReconciler) setReady(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, plan *v1alpha1.GPUPlan, params *v1alpha1.GangFitParameters, msg string) error {
	return r.setState(ctx, wl, check, kueue.CheckStateReady, msg, readyUpdates(wl, plan, params), nil)
}

func inDomainOf(plan *v1alpha1.GPUPlan) string {
	if plan.Spec.Level == "" {
		return "the whole cluster"
	}
	return plan.Spec.Level + "=" + plan.Spec.Domain
}

// readyUpdates are the podSetUpdates of a Ready check for plan.
func readyUpdates(wl *kueue.Workload, plan *v1alpha1.GPUPlan, params *v1alpha1.GangFitParameters) []kueue.PodSetUpdate {
	var updates []kueue.PodSetUpdate
	gpuSets := map[string]bool{}
	for _, a := range plan.Spec.Assignments {
		gpuSets[a.PodSet] = true
	}
	names := make([]string, 0, len(gpuSets))
	for n := range gpuSets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		u := kueue.PodSetUpdate{Name: kueue.PodSetReference(n), Annotations: map[string]string{v1alpha1.AnnotationPlan: plan.Name}}
		if plan.Spec.Level != "" {
			u.NodeSelector = map[string]string{plan.Spec.Level: plan.Spec.Domain}
		}
		updates = append(updates, u)
	}
	// Pods run under Volcano join the workload's one PodGroup.
	return volcano.AddPodSetUpdates(wl, params, updates)
}

// tasAssigned names a GPU pod set to which Kueue TAS assigned a topology.
func tasAssigned(wl *kueue.Workload, gang fit.Gang) string {
	if wl.Status.Admission == nil {
		return ""
	}
	gpu := map[string]bool{}
	for _, ps := range gang.PodSets {
		gpu[ps.Name] = true
	}
	for _, psa := range wl.Status.Admission.PodSetAssignments {
		if psa.TopologyAssignment != nil && gpu[string(psa.Name)] {
			return string(psa.Name)
		}
	}
	return ""
}

// lostNode names a node of a slot no pod is bound to yet that is deleted,
// cordoned, or NotReady for gpucache.LostNodeGrace: the pod planned there
// cannot start ("" if none; wait > 0: a node is NotReady within the grace,
// look again then).
func (r *workloadReconciler) lostNode(plan *v1alpha1.GPUPlan) (string, time.Duration) {
	bound := map[string]bool{}
	for _, b := range plan.Status.Bindings {
		bound[fmt.Sprintf("%s/%d", b.PodSet, b.Index)] = true
	}
	var wait time.Duration
	for _, a := range plan.Spec.Assignments {
		if bound[fmt.Sprintf("%s/%d", a.PodSet, a.Index)] {
			continue
		}
		lost, w := r.cache.NodeLost(a.Node)
		if lost {
			return a.Node, 0
		}
		if w > 0 && (wait == 0 || w < wait) {
			wait = w
		}
	}
	return "", wait
}

// errReservationChanged: the Workload no longer holds the quota reservation
// the decision was made for (evicted, re-admitted, finished, deactivated).
var errReservationChanged = errors.New("the workload's quota reservation changed during the decision")

// sameReservation reports whether cur still holds the reservation that
// was read as orig: same object, quota still reserved, not evicted or
// finished, same admission, and the QuotaReserved condition not
// re-established since.
func sameReservation(orig, cur *kueue.Workload) bool {
	if cur.UID != orig.UID || !workload.HasQuotaReservation(cur) || workload.IsEvicted(cur) || workload.IsFinished(cur) || !workload.IsActive(cur) {
		return false
	}
	if !equality.Semantic.DeepEqual(orig.Status.Admission, cur.Status.Admission) {
		return false
	}
	oc := apimeta.FindStatusCondition(orig.Status.Conditions, kueue.WorkloadQuotaReserved)
	cc := apimeta.FindStatusCondition(cur.Status.Conditions, kueue.WorkloadQuotaReserved)
	return oc != nil && cc != nil && oc.LastTransitionTime.Equal(&cc.LastTransitionTime)
}

// setState writes one check's state. The first write carries the
// resourceVersion the decision read, so it fails if anything changed; on a
// conflict the Workload is read again and the write retried only while it
// still holds the same quota reservation (else errReservationChanged).
func (r *workloadReconciler) setState(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, state kueue.CheckState, msg string, updates []kueue.PodSetUpdate, params *v1alpha1.GangFitParameters) error {
	msg = truncate(msg)
	cur := wl.DeepCopy()
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			cur = &kueue.Workload{}
			if err := r.apiReader().Get(ctx, client.ObjectKeyFromObject(wl), cur); err != nil {
				return err
			}
			if !sameReservation(wl, cur) {
				return errReservationChanged
			}
		}
		first = false
		old := admissioncheck.FindAdmissionCheck(cur.Status.AdmissionChecks, check)
		if old == nil {
			return nil
		}
		if old.State == state && old.Message == msg && (state != kueue.CheckStateReady || equality.Semantic.DeepEqual(old.PodSetUpdates, updates)) {
			return nil // nothing would change: no write
		}
		ns := *old.DeepCopy()
		if ns.State != state {
			// A new state starts now: Kueue keeps a non-zero time as given.
			ns.LastTransitionTime = metav1.Time{}
		}
		ns.State, ns.Message, ns.PodSetUpdates = state, msg, updates
		if state == kueue.CheckStateRetry && params != nil {
			workload.UpdateAdmissionCheckRequeueState(&ns,
				ptr.Deref(params.Spec.RetryBackoff.MinSeconds, DefaultRetryMinSeconds),
				ptr.Deref(params.Spec.RetryBackoff.MaxSeconds, DefaultRetryMaxSeconds), r.clock)
		}
		workload.SetAdmissionCheckState(&cur.Status.AdmissionChecks, ns, r.clock)
		return r.client.Status().Update(ctx, cur, client.FieldOwner(FieldOwner))
	})
}

// apiReader reads around the informer cache, so a retry after a conflict
// sees the write that caused it.
func (r *workloadReconciler) apiReader() client.Reader {
	if r.planReader != nil {
		return r.planReader
	}
	return r.client
}
