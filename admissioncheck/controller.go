package admissioncheck

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/util/admissioncheck"
	"sigs.k8s.io/kueue/pkg/workload"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
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
}

const (
	defaultReconcileTimeout = 30 * time.Second
	defaultOwnerTimeout     = 2 * time.Second
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
	r := &workloadReconciler{
		client:       mgr.GetClient(),
		planReader:   mgr.GetAPIReader(),
		ownerReader:  mgr.GetAPIReader(),
		ownerTimeout: opts.OwnerTimeout,
		recorder:     mgr.GetEventRecorderFor(EventSource), //nolint:staticcheck // core/v1 Events show in kubectl describe
		clock:        opts.Clock,
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("gangfit-workload").
		For(&kueue.Workload{}).
		// Decisions are serial: each sees the plans of the previous one, so
		// two workloads never get the same GPU capacity.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, ReconciliationTimeout: opts.ReconcileTimeout}).
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
	recorder     record.EventRecorder
	clock        clock.Clock
	mu           sync.Mutex
}

func (r *workloadReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	wl := &kueue.Workload{}
	if err := r.client.Get(ctx, req.NamespacedName, wl); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone: its plan no longer reserves anything.
			return reconcile.Result{}, r.releasePlan(ctx, nil, req.NamespacedName, "")
		}
		return reconcile.Result{}, err
	}
	checks, err := admissioncheck.FilterForController(ctx, r.client, wl.Status.AdmissionChecks, v1alpha1.ControllerName)
	if err != nil || len(checks) == 0 {
		return reconcile.Result{}, err
	}
	if !workload.HasQuotaReservation(wl) || workload.IsFinished(wl) || workload.IsEvicted(wl) || !workload.IsActive(wl) {
		return reconcile.Result{}, r.releasePlan(ctx, wl, req.NamespacedName, "workload no longer holds quota")
	}
	var requeue time.Duration
	for _, name := range checks {
		st := admissioncheck.FindAdmissionCheck(wl.Status.AdmissionChecks, name)
		switch st.State {
		case kueue.CheckStateReady:
			continue
		case kueue.CheckStatePending:
		default: // Retry / Rejected: Kueue releases quota; so do we.
			if err := r.releasePlan(ctx, wl, req.NamespacedName, "check is "+string(st.State)); err != nil {
				return reconcile.Result{}, err
			}
			continue
		}
		after, err := r.decide(ctx, wl, name)
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

// decide evaluates one Pending check and writes the decision.
func (r *workloadReconciler) decide(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference) (time.Duration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
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

	// A plan stored for this very workload (e.g. by a manager that died
	// before marking the check Ready) is reused: deciding again would count
	// it twice or hand its GPUs to someone else.
	var existing v1alpha1.GPUPlan
	switch err := r.planReader.Get(ctx, planKey, &existing); {
	case err == nil && existing.Spec.WorkloadUID == wl.UID && existing.Status.Phase != v1alpha1.PlanReleased:
		return 0, r.setReady(ctx, wl, check, &existing, params, "GPUs reserved by an existing plan")
	case err == nil:
		if err := r.client.Delete(ctx, &existing); client.IgnoreNotFound(err) != nil {
			return 0, err
		}
	case !apierrors.IsNotFound(err):
		return 0, err
	}

	gang, err := r.gangOf(ctx, wl)
	if err != nil {
		decisions.WithLabelValues(ResultRejected).Inc()
		msg := "the GPU request cannot be read: " + err.Error()
		r.recorder.Event(wl, corev1.EventTypeWarning, EventBadRequest, msg)
		return 0, r.setState(ctx, wl, check, kueue.CheckStateRejected, msg, nil, params)
	}
	if len(gang.PodSets) == 0 {
		decisions.WithLabelValues(ResultNoGPU).Inc()
		return 0, r.setState(ctx, wl, check, kueue.CheckStateReady, "no pod set asks for GPUs", volcano.AddPodSetUpdates(wl, params, nil), params)
	}
	level := r.levelFor(ctx, wl, params)
	buf := flavors.NewBuffer(params.Spec.Buffer.DriverOverheadMiB, params.Spec.Buffer.BufferPercent)
	l, err := buildLedger(ctx, r.client, r.planReader, buf, planKey)
	if err != nil {
		return 0, err
	}
	recordCapacity(l)
	opts := fit.Options{Levels: params.Spec.TopologyLevels, Level: level, Policy: params.Spec.Policy}
	if s := params.Spec.Search.MaxSteps; s != nil {
		opts.MaxSteps = *s
	}
	if d := params.Spec.Search.MaxDomains; d != nil {
		opts.MaxDomains = int(*d)
	}

	res := l.all.Fit(gang, opts)
	if res.Fits {
		plan, err := r.createPlan(ctx, wl, res)
		if err != nil {
			return 0, err
		}
		decisions.WithLabelValues(ResultReady).Inc()
		msg := fmt.Sprintf("all %d pods fit on %d GPUs%s", gang.Pods(), plan.Spec.GPUCount, inDomain(res))
		r.recorder.Event(wl, corev1.EventTypeNormal, EventFits, msg+"; plan "+plan.Name)
		return 0, r.setReady(ctx, wl, check, plan, params, msg)
	}
	why := summarize(res)
	if l.terminatingPods > 0 {
		if later := l.settled.Fit(gang, opts); later.Fits {
			decisions.WithLabelValues(ResultPending).Inc()
			msg := fmt.Sprintf("waiting for GPUs held by %d terminating pod(s): the gang fits once they are gone (now: %s)", l.terminatingPods, why)
			if st := admissioncheck.FindAdmissionCheck(wl.Status.AdmissionChecks, check); st == nil || st.Message != truncate(msg) {
				r.recorder.Event(wl, corev1.EventTypeNormal, EventWaitingTerminating, msg)
			}
			return pendingRecheck, r.setState(ctx, wl, check, kueue.CheckStatePending, msg, nil, params)
		}
	}
	if never, reason := fit.Never(l.nodes, gang, opts); never {
		decisions.WithLabelValues(ResultRejected).Inc()
		msg := "the gang can never fit: " + reason
		r.recorder.Event(wl, corev1.EventTypeWarning, EventNeverFits, msg)
		return 0, r.setState(ctx, wl, check, kueue.CheckStateRejected, msg, nil, params)
	}
	decisions.WithLabelValues(ResultRetry).Inc()
	msg := "gang does not fit now: " + why
	r.recorder.Event(wl, corev1.EventTypeNormal, EventNoFit, msg)
	return 0, r.setState(ctx, wl, check, kueue.CheckStateRetry, msg, nil, params)
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
func (r *workloadReconciler) gangOf(ctx context.Context, wl *kueue.Workload) (fit.Gang, error) {
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
				if err := r.applyFlavors(ctx, &podSets[i], psa.Flavors); err != nil {
					return fit.Gang{}, err
				}
			}
		}
	}
	return inventory.GangFromPodSets(podSets)
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
			return err
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

func (r *workloadReconciler) createPlan(ctx context.Context, wl *kueue.Workload, res fit.Result) (*v1alpha1.GPUPlan, error) {
	plan := &v1alpha1.GPUPlan{
		ObjectMeta: metav1.ObjectMeta{Name: wl.Name, Namespace: wl.Namespace,
			Labels: map[string]string{"gpupack.io/workload": truncateLabel(wl.Name)}},
		Spec: inventory.PlanFromResult(res),
	}
	plan.Spec.WorkloadName, plan.Spec.WorkloadUID = wl.Name, wl.UID
	if err := controllerutil.SetOwnerReference(wl, plan, r.client.Scheme()); err != nil {
		return nil, err
	}
	if err := r.client.Create(ctx, plan); err != nil {
		return nil, err
	}
	plan.Status.Phase = v1alpha1.PlanPlanned
	if err := r.client.Status().Update(ctx, plan); err != nil {
		return nil, err
	}
	return plan, nil
}

func truncateLabel(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}

// releasePlan deletes the workload's plan: its pods that still exist keep
// their GPUs counted through their own gpupack.io/devices annotation.
func (r *workloadReconciler) releasePlan(ctx context.Context, wl *kueue.Workload, key client.ObjectKey, why string) error {
	var plan v1alpha1.GPUPlan
	if err := r.planReader.Get(ctx, key, &plan); err != nil {
		return client.IgnoreNotFound(err)
	}
	if wl != nil && plan.Spec.WorkloadUID != "" && plan.Spec.WorkloadUID != wl.UID {
		wl = nil // a plan of an earlier workload of the same name
	}
	if err := r.client.Delete(ctx, &plan); client.IgnoreNotFound(err) != nil {
		return err
	}
	if wl != nil {
		r.recorder.Eventf(wl, corev1.EventTypeNormal, EventPlanReleased, "GPUPlan %s released: %s", plan.Name, why)
	}
	return nil
}

func (r *workloadReconciler) setReady(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, plan *v1alpha1.GPUPlan, params *v1alpha1.GangFitParameters, msg string) error {
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
	updates = volcano.AddPodSetUpdates(wl, params, updates)
	return r.setState(ctx, wl, check, kueue.CheckStateReady, msg, updates, nil)
}

// setState writes one check's state (status update, retried on conflict).
func (r *workloadReconciler) setState(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, state kueue.CheckState, msg string, updates []kueue.PodSetUpdate, params *v1alpha1.GangFitParameters) error {
	msg = truncate(msg)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &kueue.Workload{}
		if err := r.client.Get(ctx, client.ObjectKeyFromObject(wl), cur); err != nil {
			return err
		}
		old := admissioncheck.FindAdmissionCheck(cur.Status.AdmissionChecks, check)
		if old == nil {
			return nil
		}
		if old.State == state && old.Message == msg && state != kueue.CheckStateReady {
			return nil
		}
		ns := *old.DeepCopy()
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
