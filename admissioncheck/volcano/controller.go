package volcano

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/util/admissioncheck"
	"sigs.k8s.io/kueue/pkg/workload"
	volcanoscheduling "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

const (
	// FieldOwner names this controller's writes.
	FieldOwner = "gpupack-volcano"
	// EventSource is the Event reporter name.
	EventSource = "gpupack-volcano"

	// Event reasons on Workloads.
	EventPodGroupCreated      = "PodGroupCreated"
	EventPodGroupDeleted      = "PodGroupDeleted"
	EventPodGroupConflict     = "PodGroupConflict"
	EventVolcanoUnschedulable = "VolcanoUnschedulable"

	// Retry backoff bounds when the parameters set none (the gang-fit
	// check's own defaults: admissioncheck.DefaultRetry{Min,Max}Seconds).
	defaultRetryMinSeconds int32 = 5
	defaultRetryMaxSeconds int32 = 300
	maxMessage                   = 1024
)

// Options configure the PodGroup bridge.
type Options struct {
	// Clock is for tests; defaults to the real clock.
	Clock clock.Clock
	// SkipNameValidation lets tests start the controller again in one process.
	SkipNameValidation bool
}

// Setup registers the PodGroup reconciler. Without Volcano's PodGroup CRD
// in the cluster it registers nothing (and says so in the log).
func Setup(mgr ctrl.Manager, opts Options) error {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	gk := schema.GroupKind{Group: volcanoscheduling.SchemeGroupVersion.Group, Kind: "PodGroup"}
	if _, err := mgr.GetRESTMapper().RESTMapping(gk, volcanoscheduling.SchemeGroupVersion.Version); err != nil {
		mgr.GetLogger().WithName("volcano").Info("Volcano PodGroup CRD not served; the PodGroup bridge is off", "error", err.Error())
		return nil
	}
	r := &reconciler{
		client:    mgr.GetClient(),
		apiReader: mgr.GetAPIReader(),
		recorder:  mgr.GetEventRecorderFor(EventSource), //nolint:staticcheck // core/v1 Events show in kubectl describe
		clock:     opts.Clock,
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("gpupack-volcano-podgroup").
		For(&kueue.Workload{}).
		Owns(&volcanoscheduling.PodGroup{}).
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation}).
		Complete(r)
}

type reconciler struct {
	client    client.Client
	apiReader client.Reader
	recorder  record.EventRecorder
	clock     clock.Clock
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	wl := &kueue.Workload{}
	if err := r.client.Get(ctx, req.NamespacedName, wl); err != nil {
		// A deleted Workload's PodGroup goes with it (owner reference).
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	checks, err := admissioncheck.FilterForController(ctx, r.client, wl.Status.AdmissionChecks, v1alpha1.ControllerName)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(checks) == 0 {
		return reconcile.Result{}, r.deletePodGroup(ctx, wl, "the workload has no gang-fit check")
	}
	check := checks[0]
	st := admissioncheck.FindAdmissionCheck(wl.Status.AdmissionChecks, check)
	switch {
	case workload.IsFinished(wl):
		return reconcile.Result{}, r.deletePodGroup(ctx, wl, "the workload finished")
	case workload.IsEvicted(wl) || !workload.IsActive(wl):
		return reconcile.Result{}, r.deletePodGroup(ctx, wl, "the workload was evicted")
	case !workload.HasQuotaReservation(wl) || st == nil || st.State != kueue.CheckStateReady:
		return reconcile.Result{}, r.deletePodGroup(ctx, wl, "the workload is not admitted")
	}
	params, err := r.parameters(ctx, check)
	if err != nil {
		// The gang-fit check reports bad parameters on the AdmissionCheck.
		ctrl.LoggerFrom(ctx).V(1).Info("parameters unavailable", "error", err.Error())
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	if !Wanted(wl, params) {
		return reconcile.Result{}, r.deletePodGroup(ctx, wl, "the workload does not run under Volcano")
	}
	level, err := r.planLevel(ctx, wl)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.ensureQueue(ctx, params); err != nil {
		return reconcile.Result{}, err
	}
	pg, err := r.ensurePodGroup(ctx, wl, Build(wl, params, level))
	if err != nil || pg == nil {
		return reconcile.Result{}, err
	}
	return r.watchSchedulability(ctx, wl, check, st, pg, params)
}

// parameters resolves the check's GangFitParameters (nil ref: defaults).
func (r *reconciler) parameters(ctx context.Context, check kueue.AdmissionCheckReference) (*v1alpha1.GangFitParameters, error) {
	var ac kueue.AdmissionCheck
	if err := r.client.Get(ctx, client.ObjectKey{Name: string(check)}, &ac); err != nil {
		return nil, err
	}
	ref := ac.Spec.Parameters
	if ref == nil {
		return &v1alpha1.GangFitParameters{}, nil
	}
	if ref.APIGroup != v1alpha1.GroupName || ref.Kind != "GangFitParameters" {
		return nil, fmt.Errorf("parameters must be %s GangFitParameters, not %s %s", v1alpha1.GroupName, ref.APIGroup, ref.Kind)
	}
	p := &v1alpha1.GangFitParameters{}
	return p, r.client.Get(ctx, client.ObjectKey{Name: ref.Name}, p)
}

// planLevel is the level of the workload's GPUPlan ("" without one: the
// check admitted it with no GPU pod set, or cluster-wide). Read from the
// API server: the check writes the plan just before turning Ready.
func (r *reconciler) planLevel(ctx context.Context, wl *kueue.Workload) (string, error) {
	var plan v1alpha1.GPUPlan
	if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(wl), &plan); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	if plan.Spec.WorkloadUID != "" && plan.Spec.WorkloadUID != wl.UID {
		return "", nil
	}
	return plan.Spec.Level, nil
}

// ensureQueue creates the Volcano queue when missing, without capability:
// Kueue stays the only owner of quota, and the queue is not reclaimable so
// Volcano does not preempt across queues behind Kueue's back.
func (r *reconciler) ensureQueue(ctx context.Context, params *v1alpha1.GangFitParameters) error {
	name := DefaultQueue
	if v := params.Spec.Volcano; v != nil && v.Queue != "" {
		name = v.Queue
	}
	var q volcanoscheduling.Queue
	err := r.client.Get(ctx, client.ObjectKey{Name: name}, &q)
	if err == nil {
		if len(q.Spec.Capability) > 0 {
			ctrl.LoggerFrom(ctx).V(1).Info("Volcano queue has a capability; Kueue and Volcano both limit quota", "queue", name)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	q = volcanoscheduling.Queue{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManagedBy: ManagedByValue}},
		Spec:       volcanoscheduling.QueueSpec{Weight: 1, Reclaimable: ptr.To(false)},
	}
	if err := r.client.Create(ctx, &q, client.FieldOwner(FieldOwner)); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Volcano queue %s: %w", name, err)
	}
	return nil
}

// ensurePodGroup creates the PodGroup or brings its spec to want. It
// returns the stored PodGroup, or nil when the name is taken by one it
// does not own (then nothing is written).
func (r *reconciler) ensurePodGroup(ctx context.Context, wl *kueue.Workload, want *volcanoscheduling.PodGroup) (*volcanoscheduling.PodGroup, error) {
	var cur volcanoscheduling.PodGroup
	err := r.client.Get(ctx, client.ObjectKeyFromObject(want), &cur)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.client.Create(ctx, want, client.FieldOwner(FieldOwner)); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return nil, err // the cache is behind; retry
			}
			return nil, fmt.Errorf("creating PodGroup %s: %w", want.Name, err)
		}
		r.recorder.Eventf(wl, corev1.EventTypeNormal, EventPodGroupCreated, "Volcano PodGroup %s: %d pods, queue %s%s", want.Name, want.Spec.MinMember, want.Spec.Queue, topologyNote(want))
		return want, nil
	case err != nil:
		return nil, err
	}
	owner := metav1.GetControllerOf(&cur)
	if cur.Labels[LabelManagedBy] != ManagedByValue || owner == nil || owner.Kind != "Workload" {
		r.recorder.Eventf(wl, corev1.EventTypeWarning, EventPodGroupConflict, "PodGroup %s exists and is not gpupack's; pods join it as they are", cur.Name)
		return nil, nil
	}
	if owner.UID != wl.UID {
		// Left by an earlier workload of the same name.
		if err := r.client.Delete(ctx, &cur, client.Preconditions{UID: &cur.UID}); client.IgnoreNotFound(err) != nil {
			return nil, err
		}
		return nil, fmt.Errorf("replacing PodGroup %s of an earlier workload", cur.Name)
	}
	if equality.Semantic.DeepEqual(cur.Spec, want.Spec) {
		return &cur, nil
	}
	// PodGroup has no status subresource: patch the spec alone so
	// Volcano's status is never overwritten.
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec = want.Spec
	if err := r.client.Patch(ctx, &cur, patch, client.FieldOwner(FieldOwner)); err != nil {
		return nil, fmt.Errorf("updating PodGroup %s: %w", cur.Name, err)
	}
	return &cur, nil
}

func topologyNote(pg *volcanoscheduling.PodGroup) string {
	if nt := pg.Spec.NetworkTopology; nt != nil && nt.HighestTierAllowed != nil {
		return fmt.Sprintf(", network topology %s up to tier %d", nt.Mode, *nt.HighestTierAllowed)
	}
	return ""
}

// watchSchedulability records when Volcano first called the gang
// Unschedulable and turns the check to Retry once that lasts the patience.
func (r *reconciler) watchSchedulability(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, st *kueue.AdmissionCheckState, pg *volcanoscheduling.PodGroup, params *v1alpha1.GangFitParameters) (reconcile.Result, error) {
	patience := time.Duration(DefaultUnschedulablePatienceSeconds) * time.Second
	if v := params.Spec.Volcano; v != nil && v.UnschedulablePatienceSeconds != nil {
		patience = time.Duration(*v.UnschedulablePatienceSeconds) * time.Second
	}
	var recorded time.Time
	if v := pg.Annotations[AnnotationUnschedulableSince]; v != "" {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			recorded = t
		}
	}
	now := r.clock.Now()
	o := Observe(pg, recorded, st.LastTransitionTime.Time, now, patience)
	if err := r.recordSince(ctx, pg, o.Since); err != nil {
		return reconcile.Result{}, err
	}
	if o.Since.IsZero() {
		return reconcile.Result{}, nil
	}
	if !o.Stuck {
		return reconcile.Result{RequeueAfter: o.Wait}, nil
	}
	msg := RetryMessage(o, now)
	if len(msg) > maxMessage {
		msg = msg[:maxMessage-3] + "..."
	}
	done, err := r.setRetry(ctx, wl, check, msg, params)
	if err != nil || !done {
		return reconcile.Result{}, err
	}
	r.recorder.Event(wl, corev1.EventTypeWarning, EventVolcanoUnschedulable, msg)
	return reconcile.Result{}, nil
}

// recordSince keeps AnnotationUnschedulableSince equal to since (removed
// when zero); it writes only on a change.
func (r *reconciler) recordSince(ctx context.Context, pg *volcanoscheduling.PodGroup, since time.Time) error {
	want := ""
	if !since.IsZero() {
		want = since.UTC().Format(time.RFC3339)
	}
	if pg.Annotations[AnnotationUnschedulableSince] == want {
		return nil
	}
	patch := client.MergeFrom(pg.DeepCopy())
	if want == "" {
		delete(pg.Annotations, AnnotationUnschedulableSince)
	} else {
		if pg.Annotations == nil {
			pg.Annotations = map[string]string{}
		}
		pg.Annotations[AnnotationUnschedulableSince] = want
	}
	return client.IgnoreNotFound(r.client.Patch(ctx, pg, patch, client.FieldOwner(FieldOwner)))
}

// setRetry turns the check from Ready to Retry (only from Ready: the check
// itself owns every other transition), with the parameters' backoff. done
// is false when the check was no longer Ready.
func (r *reconciler) setRetry(ctx context.Context, wl *kueue.Workload, check kueue.AdmissionCheckReference, msg string, params *v1alpha1.GangFitParameters) (done bool, err error) {
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		done = false
		cur := &kueue.Workload{}
		if err := r.client.Get(ctx, client.ObjectKeyFromObject(wl), cur); err != nil {
			return err
		}
		if cur.UID != wl.UID {
			return nil
		}
		old := admissioncheck.FindAdmissionCheck(cur.Status.AdmissionChecks, check)
		if old == nil || old.State != kueue.CheckStateReady {
			return nil
		}
		ns := *old.DeepCopy()
		ns.State, ns.Message, ns.PodSetUpdates = kueue.CheckStateRetry, msg, nil
		workload.UpdateAdmissionCheckRequeueState(&ns,
			ptr.Deref(params.Spec.RetryBackoff.MinSeconds, defaultRetryMinSeconds),
			ptr.Deref(params.Spec.RetryBackoff.MaxSeconds, defaultRetryMaxSeconds), r.clock)
		workload.SetAdmissionCheckState(&cur.Status.AdmissionChecks, ns, r.clock)
		if err := r.client.Status().Update(ctx, cur, client.FieldOwner(FieldOwner)); err != nil {
			return err
		}
		done = true
		return nil
	})
	return done, client.IgnoreNotFound(err)
}

// deletePodGroup removes the workload's PodGroup if gpupack made it for
// this workload.
func (r *reconciler) deletePodGroup(ctx context.Context, wl *kueue.Workload, why string) error {
	var pg volcanoscheduling.PodGroup
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: wl.Namespace, Name: GroupName(wl)}, &pg); err != nil {
		return client.IgnoreNotFound(err)
	}
	owner := metav1.GetControllerOf(&pg)
	if pg.Labels[LabelManagedBy] != ManagedByValue || owner == nil || owner.UID != wl.UID || pg.DeletionTimestamp != nil {
		return nil
	}
	if err := r.client.Delete(ctx, &pg, client.Preconditions{UID: &pg.UID}); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.recorder.Eventf(wl, corev1.EventTypeNormal, EventPodGroupDeleted, "Volcano PodGroup %s deleted: %s", pg.Name, why)
	return nil
}
