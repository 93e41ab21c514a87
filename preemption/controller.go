// Package preemption is gpupack's preemption coordinator: when Kueue (or
// Volcano, or a node drain) evicts a gang, it asks every rank to checkpoint,
// then deletes the pods gracefully, then force-deletes what is left after
// grace + slack, and records the newest step every rank completed on the
// job (gpupack.io/last-consistent-checkpoint).
//
// The decisions are made by the pure state machine in preemption/ladder;
// this package translates the API into its inputs and its actions back into
// API calls. The state lives in the Workload annotation gpupack.io/preemption
// (JSON with timestamps and deadlines), so a restarted manager resumes
// exactly where the previous one was.
package preemption

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
)

// ControllerName names the reconciler, its field owner and its Events.
const ControllerName = "gpupack-preemption"

// Event reasons, one per phase (and the outcome).
const (
	EventCheckpointing    = "PreemptionCheckpointing"
	EventTerminating      = "PreemptionTerminating"
	EventKilling          = "PreemptionKilling"
	EventDone             = "PreemptionDone"
	EventConsistentStep   = "LastConsistentCheckpoint"
	EventBadAnnotation    = "BadPreemptionAnnotation"
	indexPodController    = ".metadata.controllerUID"
	indexWorkloadOwnerUID = ".metadata.ownerUID"
)

var phaseEvent = map[ladder.Phase]string{
	ladder.PhaseCheckpointing: EventCheckpointing,
	ladder.PhaseTerminating:   EventTerminating,
	ladder.PhaseKilling:       EventKilling,
	ladder.PhaseDone:          EventDone,
}

// Reconciler drives the ladder for one Workload at a time.
type Reconciler struct {
	client   client.Client
	recorder events.EventRecorder
	cfg      ladder.Config
	now      func() time.Time

	skipNameCheck bool
}

// Reconcile reads the workload, its pods and its state, takes one ladder
// step, stores the new state first (so a crash after that repeats only
// idempotent actions) and then acts.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	var wl kueue.Workload
	if err := r.client.Get(ctx, req.NamespacedName, &wl); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	apiVersion, kind, jobName, jobUID, ok := jobOf(&wl)
	if !ok {
		return reconcile.Result{}, nil // not a job's workload: no pods to find
	}
	st, err := loadState(wl.Annotations)
	if err != nil {
		// A hand-edited record must not wedge the workload: say so and
		// start over from what the API shows.
		r.recorder.Eventf(&wl, nil, corev1.EventTypeWarning, EventBadAnnotation, "Preempt", "%v; starting the preemption record afresh", err)
		st = ladder.State{}
	}
	var podList corev1.PodList
	if err := r.client.List(ctx, &podList, client.InNamespace(wl.Namespace), client.MatchingFields{indexPodController: string(jobUID)}); err != nil {
		return reconcile.Result{}, err
	}
	pods := podList.Items
	reason, evicted := evictedBy(&wl, pods)
	if st.Phase == ladder.PhaseNone && !evicted {
		return reconcile.Result{}, nil // the common case: nothing to do
	}

	job := &metav1.PartialObjectMetadata{}
	job.SetGroupVersionKind(schema.FromAPIVersionAndKind(apiVersion, kind))
	jobErr := r.client.Get(ctx, types.NamespacedName{Namespace: wl.Namespace, Name: jobName}, job)
	if jobErr != nil && !apierrors.IsNotFound(jobErr) {
		return reconcile.Result{}, jobErr
	}
	timeout, err := checkpointTimeout(pods, job.Annotations, &wl)
	if err != nil {
		r.recorder.Eventf(&wl, nil, corev1.EventTypeWarning, EventBadAnnotation, "Preempt", "%v; using the default %v", err, r.cfg.DefaultCheckpointTimeout)
	}
	obs := ladder.Observation{Now: r.now(), Evicted: evicted, Reason: reason, CheckpointTimeout: timeout}
	for i := range pods {
		obs.Pods = append(obs.Pods, observePod(&pods[i], r.cfg.DefaultGrace))
	}
	d := ladder.Step(r.cfg, st, obs)

	// 1. Persist.
	if d.Reset {
		if err := r.saveState(ctx, &wl, nil); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, nil
	}
	if !equalState(st, d.State) {
		if err := r.saveState(ctx, &wl, &d.State); err != nil {
			return reconcile.Result{}, err
		}
	}
	// 2. Act.
	now := obs.Now
	for _, a := range d.Actions {
		if err := r.act(ctx, wl.Namespace, a, now); err != nil {
			return reconcile.Result{}, fmt.Errorf("%s pod %s/%s: %w", a.Kind, wl.Namespace, a.Pod, err)
		}
	}
	// 3. Record the consistent step on the job.
	if s := d.State.LastConsistentStep; s != nil && jobErr == nil {
		want := strconv.FormatInt(*s, 10)
		if job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint] != want {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationLastConsistentCheckpoint: want}}})
			if err := r.client.Patch(ctx, job, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(ControllerName)); err != nil {
				return reconcile.Result{}, fmt.Errorf("recording the consistent step on %s %s: %w", kind, jobName, err)
			}
			r.recorder.Eventf(&wl, nil, corev1.EventTypeNormal, EventConsistentStep, "Preempt", "every rank completed step %d; recorded on %s %s", *s, kind, jobName)
		}
	}
	// 4. Narrate and measure.
	prev := st
	for _, p := range d.Entered {
		r.recorder.Eventf(&wl, nil, corev1.EventTypeNormal, phaseEvent[p], "Preempt", "%s", describe(p, d.State, len(pods)))
		if old := prev.Phase; old != ladder.PhaseNone {
			if since, ok := prev.Since(old); ok {
				phaseSeconds.WithLabelValues(string(old)).Observe(now.Sub(since).Seconds())
			}
		}
		prev.Phase = p
		prev.Transitions = append(prev.Transitions, ladder.Transition{Phase: p, At: now})
		if p == ladder.PhaseDone {
			if len(d.State.Transitions) > 0 {
				evictionToGone.Observe(now.Sub(d.State.Transitions[0].At).Seconds())
			}
			for _, o := range d.State.Outcomes {
				checkpointOutcomes.WithLabelValues(o).Inc()
			}
		}
	}
	logger.V(2).Info("preemption step", "workload", req.NamespacedName, "phase", d.State.Phase, "actions", len(d.Actions), "requeueAfter", d.RequeueAfter)
	return reconcile.Result{RequeueAfter: d.RequeueAfter}, nil
}

func describe(p ladder.Phase, st ladder.State, pods int) string {
	switch p {
	case ladder.PhaseCheckpointing:
		return fmt.Sprintf("%s: asked %d rank(s) to checkpoint, deadline %s", st.Reason, len(st.Ranks), st.CheckpointDeadline.Format(time.RFC3339))
	case ladder.PhaseTerminating:
		saved := 0
		for _, o := range st.Outcomes {
			if o == ladder.OutcomeSaved {
				saved++
			}
		}
		msg := fmt.Sprintf("%d/%d rank(s) checkpointed; deleting %d pod(s) gracefully", saved, len(st.Ranks), pods)
		if st.KillDeadline != nil {
			msg += ", force delete after " + st.KillDeadline.Format(time.RFC3339)
		}
		return msg
	case ladder.PhaseKilling:
		return "grace period and slack passed with pods left; force-deleting them"
	case ladder.PhaseDone:
		if st.LastConsistentStep != nil {
			return fmt.Sprintf("all pods gone; last consistent checkpoint step %d", *st.LastConsistentStep)
		}
		return "all pods gone; no checkpoint step completed by every rank"
	}
	return string(p)
}

func (r *Reconciler) act(ctx context.Context, ns string, a ladder.Action, now time.Time) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: a.Pod}}
	var err error
	switch a.Kind {
	case ladder.RequestCheckpoint:
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			v1alpha1.AnnotationCheckpointRequest: now.UTC().Format(time.RFC3339),
		}}})
		err = r.client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(ControllerName))
	case ladder.Delete:
		err = r.client.Delete(ctx, pod)
	case ladder.ForceDelete:
		err = r.client.Delete(ctx, pod, client.GracePeriodSeconds(0))
	}
	return client.IgnoreNotFound(err)
}

// saveState writes (or, with nil, removes) the durable record with an
// optimistic lock: two managers never interleave their steps.
func (r *Reconciler) saveState(ctx context.Context, wl *kueue.Workload, st *ladder.State) error {
	base := wl.DeepCopy()
	if st == nil {
		delete(wl.Annotations, v1alpha1.AnnotationPreemptionPhase)
	} else {
		raw, err := json.Marshal(st)
		if err != nil {
			return err
		}
		if wl.Annotations == nil {
			wl.Annotations = map[string]string{}
		}
		wl.Annotations[v1alpha1.AnnotationPreemptionPhase] = string(raw)
	}
	return r.client.Patch(ctx, wl, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), client.FieldOwner(ControllerName))
}

func equalState(a, b ladder.State) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// podToWorkloads maps a pod to the workload of its job.
func (r *Reconciler) podToWorkloads(ctx context.Context, obj client.Object) []reconcile.Request {
	ref := metav1.GetControllerOf(obj)
	if ref == nil {
		return nil
	}
	var wls kueue.WorkloadList
	if err := r.client.List(ctx, &wls, client.InNamespace(obj.GetNamespace()), client.MatchingFields{indexWorkloadOwnerUID: string(ref.UID)}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(wls.Items))
	for i := range wls.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&wls.Items[i])})
	}
	return out
}

func setupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &corev1.Pod{}, indexPodController, func(o client.Object) []string {
		if ref := metav1.GetControllerOf(o); ref != nil {
			return []string{string(ref.UID)}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("pod index: %w", err)
	}
	return idx.IndexField(ctx, &kueue.Workload{}, indexWorkloadOwnerUID, func(o client.Object) []string {
		var uids []string
		for _, ref := range o.GetOwnerReferences() {
			uids = append(uids, string(ref.UID))
		}
		return uids
	})
}

func (r *Reconciler) setup(mgr ctrl.Manager) error {
	var skip *bool // nil: the manager's own setting
	if r.skipNameCheck {
		skip = ptr.To(true)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&kueue.Workload{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.podToWorkloads)).
		WithOptions(controller.Options{SkipNameValidation: skip}).
		Complete(r)
}
