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
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/owners"
	"github.com/gpupack/gpupack/preemption/policy"
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
	EventEvictingWorkload = "PreemptionEvictingWorkload"
	EventPolicyCapped     = "CheckpointTimeoutCapped"
	indexPodController    = ".metadata.controllerUID"
	indexWorkloadOwnerUID = ".metadata.ownerUID"
	indexPodNode          = ".spec.nodeName"
	indexPodGroup         = ".metadata.labels.podGroup"
	indexPodUID           = ".metadata.uid"
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
	reader   client.Reader // live reads (the per-rank ConfigMap); nil: client
	recorder events.EventRecorder
	cfg      ladder.Config
	policy   policy.Policy
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
	src, ok := owners.SourceOf(&wl)
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
	if st.Phase != ladder.PhaseNone && st.Ranks == nil {
		if err := r.rankStore().load(ctx, &wl, &st); err != nil {
			if _, api := err.(apierrors.APIStatus); api {
				return reconcile.Result{}, err
			}
			r.recorder.Eventf(&wl, nil, corev1.EventTypeWarning, EventBadAnnotation, "Preempt", "per-rank record: %v; continuing without it", err)
		}
	}
	// The pods, through the owner's chain (JobSet → Job → Pod, …) or
	// Kueue's pod-group label (LWS, StatefulSet, pod groups).
	found, err := r.finder().Pods(ctx, wl.Namespace, src)
	if err != nil {
		return reconcile.Result{}, err
	}
	pods := append(found.Pods, r.strandedRanks(ctx, wl.Namespace, st, found.Pods)...)
	kind, jobName := src.Owner.Kind, src.Owner.Name
	job := &metav1.PartialObjectMetadata{}
	var jobErr error = apierrors.NewNotFound(schema.GroupResource{}, "") // a plain pod group has no job
	if src.HasOwner() {
		job.SetGroupVersionKind(src.GVK())
		// Bounded: a kind the manager may not list (RBAC) would block this
		// worker on an informer that never syncs; an error retries.
		gctx, cancel := context.WithTimeout(ctx, owners.LookupTimeout)
		jobErr = r.client.Get(gctx, types.NamespacedName{Namespace: wl.Namespace, Name: jobName}, job)
		cancel()
		if jobErr == nil && job.UID != src.Owner.UID {
			jobErr = apierrors.NewNotFound(schema.GroupResource{}, jobName) // a new object of the same name
		}
		if jobErr != nil && !apierrors.IsNotFound(jobErr) {
			return reconcile.Result{}, jobErr
		}
	}
	// Pod-level triggers count while the job lives and the preemption is
	// not over; after Done the pods are the job's replacements.
	jobLives := jobErr == nil && job.DeletionTimestamp == nil
	if !src.HasOwner() {
		jobLives = true // a plain pod group: the Workload is all there is
	}
	podTriggers := jobLives && wl.DeletionTimestamp == nil && st.Phase != ladder.PhaseDone
	trig, evicted := evictedBy(&wl, pods, podTriggers, func(node string) bool { return r.nodeReady(ctx, node) })
	if st.Phase == ladder.PhaseNone && !evicted {
		return reconcile.Result{}, nil // the common case: nothing to do
	}

	obs := ladder.Observation{Now: r.now(), Evicted: evicted, Reason: trig.Reason, PodLevel: trig.PodLevel && holdsQuota(&wl)}
	if st.Phase == ladder.PhaseNone {
		// The deadline is fixed on entering Checkpointing: work out the
		// policy's figure only then.
		requested, err := checkpointTimeout(pods, job.Annotations, &wl)
		if err != nil {
			r.recorder.Eventf(&wl, nil, corev1.EventTypeWarning, EventBadAnnotation, "Preempt", "%v; using the cluster default", err)
		}
		pd := r.policy.Effective(policy.Victim{PriorityClass: priorityClassOf(&wl), ClusterQueue: r.clusterQueueOf(ctx, &wl), Requested: requested})
		obs.CheckpointTimeout = pd.Timeout
		obs.Grace = pd.Grace // the pods' own grace may not hold the GPUs longer
		if requested > pd.Timeout {
			r.recorder.Eventf(&wl, nil, corev1.EventTypeNormal, EventPolicyCapped, "Preempt", "%s %v is longer than the cluster allows for this workload; checkpointing gets %v", v1alpha1.AnnotationCheckpointTimeout, requested, pd.Timeout)
		}
	}
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
	// 2. Record the consistent step on the job, and on the Jobs of its
	// chain (a JobSet's, a TrainJob's): the pod webhook reads it from a
	// pod's owners for GPUPACK_RESUME_STEP, and JobSet suspends and resumes
	// its Jobs rather than recreating them. Before the pods are deleted, so
	// that no pod recreated in between (an LWS group's) starts without it;
	// a failed record does not hold the deletes back (the policy's
	// deadlines stand) and is retried.
	recordErr := r.recordConsistentStep(ctx, &wl, d.State, job, jobErr, found.Chain, kind, jobName)
	// 3. Act: first the whole Workload through Kueue (so the job
	// controller stops the job rather than recreating the pods), then the
	// pods.
	now := obs.Now
	if d.EvictWorkload {
		if err := r.evictWorkload(ctx, &wl, trig, now); err != nil {
			return reconcile.Result{}, fmt.Errorf("evicting workload %s/%s through Kueue: %w", wl.Namespace, wl.Name, err)
		}
	}
	versions := make(map[string]string, len(pods))
	for i := range pods {
		versions[pods[i].Name] = pods[i].ResourceVersion
	}
	if err := r.actAll(ctx, wl.Namespace, d.Actions, versions, now, d.State.CheckpointDeadline); err != nil {
		return reconcile.Result{}, err
	}
	if recordErr != nil {
		return reconcile.Result{}, recordErr
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

// recordConsistentStep writes the state's consistent step (if any) on the
// job and on the Jobs of its chain; the Event is emitted once, when the
// job's own annotation changes.
func (r *Reconciler) recordConsistentStep(ctx context.Context, wl *kueue.Workload, st ladder.State, job *metav1.PartialObjectMetadata, jobErr error, chain []metav1.PartialObjectMetadata, kind, jobName string) error {
	s := st.LastConsistentStep
	if s == nil || jobErr != nil {
		return nil
	}
	want := strconv.FormatInt(*s, 10)
	if job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint] != want {
		if err := r.recordStep(ctx, job, want); err != nil {
			return fmt.Errorf("recording the consistent step on %s %s: %w", kind, jobName, err)
		}
		r.recorder.Eventf(wl, nil, corev1.EventTypeNormal, EventConsistentStep, "Preempt", "every rank completed step %d; recorded on %s %s", *s, kind, jobName)
	}
	for i := range chain {
		o := &chain[i]
		if o.GroupVersionKind() != owners.GVKJob || o.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint] == want {
			continue
		}
		if err := r.recordStep(ctx, o, want); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("recording the consistent step on Job %s: %w", o.Name, err)
		}
	}
	return nil
}

// recordStep sets gpupack.io/last-consistent-checkpoint on obj (metadata
// only), if it is still the object read (UID precondition).
func (r *Reconciler) recordStep(ctx context.Context, obj *metav1.PartialObjectMetadata, step string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         obj.UID,
		"annotations": map[string]string{v1alpha1.AnnotationLastConsistentCheckpoint: step},
	}})
	err := r.client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(ControllerName))
	if apierrors.IsConflict(err) {
		return nil // another object by that name by now
	}
	return err
}

// strandedRanks are the ranks of st that the walk down no longer reaches
// because the object between the job and them is gone: KubeRay deletes a
// suspended RayJob's RayCluster at once (background propagation), and its
// pods — asked to checkpoint, still saving — are left to the garbage
// collector, controlled by a RayCluster that no longer exists. Without
// them the ranks' answers were never read (every rank TimedOut) and the
// protocol ended while they still held the GPUs. A rank is found again by
// its UID (a rank key is the UID of a pod the walk once found), and taken
// only while its controller is gone or replaced, so a pod that its job
// still reaches some other way, or that a controller adopted, is never
// counted twice nor acted on for this Workload.
func (r *Reconciler) strandedRanks(ctx context.Context, ns string, st ladder.State, found []corev1.Pod) []corev1.Pod {
	if len(st.Ranks) == 0 {
		return nil
	}
	have := make(map[string]bool, len(found))
	for i := range found {
		have[string(found[i].UID)] = true
	}
	var out []corev1.Pod
	for _, key := range slices.Sorted(maps.Keys(st.Ranks)) {
		if have[key] {
			continue
		}
		var pl corev1.PodList
		if err := r.client.List(ctx, &pl, client.InNamespace(ns), client.MatchingFields{indexPodUID: key}); err != nil {
			continue
		}
		for _, p := range pl.Items {
			if r.controllerGone(ctx, &p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// intermediateController: pod's controller is of a kind some chain passes
// through (owners.Intermediates: a Job, JobSet, RayCluster), which the
// cache already reads for the walk up; other kinds are never looked up.
func intermediateController(pod *corev1.Pod) bool {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return false
	}
	gvk := schema.FromAPIVersionAndKind(ref.APIVersion, ref.Kind)
	for _, ks := range owners.Intermediates {
		if slices.Contains(ks, gvk) {
			return true
		}
	}
	return false
}

// controllerGone: pod has a controller reference whose object does not
// exist (or is another object by that name). Read errors say no.
func (r *Reconciler) controllerGone(ctx context.Context, pod *corev1.Pod) bool {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return false
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(schema.FromAPIVersionAndKind(ref.APIVersion, ref.Kind))
	gctx, cancel := context.WithTimeout(ctx, owners.LookupTimeout)
	defer cancel()
	err := r.client.Get(gctx, types.NamespacedName{Namespace: pod.Namespace, Name: ref.Name}, meta)
	if err != nil {
		return apierrors.IsNotFound(err)
	}
	return meta.UID != ref.UID
}

func (r *Reconciler) finder() owners.Finder {
	return owners.Finder{Reader: r.client, PodControllerIndex: indexPodController, PodGroupIndex: indexPodGroup}
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

// actParallelism bounds the pod writes of one step in flight: a
// 4,096-rank gang is asked in a fraction of the time one-by-one takes
// (every rank gets the same absolute deadline, so asking late shortens a
// rank's time).
const actParallelism = 32

// actAll runs the actions (idempotent, independent) with bounded
// parallelism and returns the first error.
// versions holds the resourceVersion of each pod the decision was made on.
func (r *Reconciler) actAll(ctx context.Context, ns string, actions []ladder.Action, versions map[string]string, now time.Time, deadline *time.Time) error {
	if len(actions) == 0 {
		return nil
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, actParallelism)
	for _, a := range actions {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := r.act(ctx, ns, a, versions[a.Pod], now, deadline); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("%s pod %s/%s: %w", a.Kind, ns, a.Pod, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

func (r *Reconciler) act(ctx context.Context, ns string, a ladder.Action, version string, now time.Time, deadline *time.Time) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: a.Pod}}
	var uid *types.UID
	if a.UID != "" {
		uid = ptr.To(types.UID(a.UID))
	}
	var err error
	switch a.Kind {
	case ladder.RequestCheckpoint:
		ann := map[string]string{v1alpha1.AnnotationCheckpointRequest: now.UTC().Format(time.RFC3339)}
		if deadline != nil {
			ann[policy.AnnotationCheckpointDeadline] = policy.FormatDeadline(*deadline)
		}
		meta := map[string]any{"annotations": ann}
		if uid != nil {
			meta["uid"] = *uid // a precondition: never the recreated pod of the same name
		}
		if version != "" {
			// A precondition too: the decision "not yet asked" was made on
			// this version of the pod. The cache lags our own writes, so a
			// reconcile right after the request (woken by the Workload's
			// new phase) would otherwise ask every rank again.
			meta["resourceVersion"] = version
		}
		patch, _ := json.Marshal(map[string]any{"metadata": meta})
		err = r.client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(ControllerName))
		if apierrors.IsConflict(err) || apierrors.IsInvalid(err) {
			// Another pod by now (the rank is gone), or the pod changed
			// since the cache's copy: its update wakes this Workload again
			// and the next step decides on the new version.
			err = nil
		}
	case ladder.Delete:
		opts := []client.DeleteOption{client.Preconditions{UID: uid}}
		if a.Grace > 0 {
			opts = append(opts, client.GracePeriodSeconds(int64(a.Grace/time.Second)))
		}
		err = r.client.Delete(ctx, pod, opts...)
	case ladder.ForceDelete:
		err = r.client.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: uid})
	}
	if apierrors.IsConflict(err) {
		err = nil // the UID precondition failed: the rank is gone
	}
	return client.IgnoreNotFound(err)
}

// evictWorkload sets Kueue's Evicted condition on a workload Kueue still
// has admitted, as Kueue's own eviction does: its job reconciler then
// stops (suspends) the job, clears the admission and re-queues the
// workload. The optimistic lock keeps Kueue's concurrent status writes.
func (r *Reconciler) evictWorkload(ctx context.Context, wl *kueue.Workload, trig trigger, now time.Time) error {
	if apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadEvicted) {
		return nil
	}
	// The cache may lag our own status write of a moment ago: look live
	// before writing (and narrating) again.
	if r.reader != nil {
		var cur kueue.Workload
		if err := r.reader.Get(ctx, client.ObjectKeyFromObject(wl), &cur); err != nil {
			return err
		}
		if apimeta.IsStatusConditionTrue(cur.Status.Conditions, kueue.WorkloadEvicted) || !holdsQuota(&cur) {
			return nil
		}
		wl = &cur
	}
	base := wl.DeepCopy()
	msg := fmt.Sprintf("gpupack: %s of pod %s; evicting the whole workload so it checkpoints and restarts together", trig.Reason, trig.Pod)
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{
		Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue, Reason: KueueEvictionReason, Message: msg,
		LastTransitionTime: metav1.NewTime(now), ObservedGeneration: wl.Generation,
	})
	if err := r.client.Status().Patch(ctx, wl, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), client.FieldOwner(ControllerName)); err != nil {
		return err
	}
	r.recorder.Eventf(wl, nil, corev1.EventTypeNormal, EventEvictingWorkload, "Preempt", "%s", msg)
	return nil
}

func (r *Reconciler) nodeReady(ctx context.Context, name string) bool {
	var n corev1.Node
	if err := r.client.Get(ctx, types.NamespacedName{Name: name}, &n); err != nil {
		// Gone is not ready; a read error must not evict a gang.
		return !apierrors.IsNotFound(err)
	}
	return nodeIsReady(&n)
}

// clusterQueueOf: the admitting ClusterQueue, else the LocalQueue's.
func (r *Reconciler) clusterQueueOf(ctx context.Context, wl *kueue.Workload) string {
	if a := wl.Status.Admission; a != nil && a.ClusterQueue != "" {
		return string(a.ClusterQueue)
	}
	if wl.Spec.QueueName == "" {
		return ""
	}
	var lq kueue.LocalQueue
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: wl.Namespace, Name: string(wl.Spec.QueueName)}, &lq); err != nil {
		return ""
	}
	return string(lq.Spec.ClusterQueue)
}

func priorityClassOf(wl *kueue.Workload) string {
	if wl.Spec.PriorityClassRef != nil {
		return wl.Spec.PriorityClassRef.Name
	}
	return ""
}

// saveState writes (or, with nil, removes) the durable record: the
// per-rank part first (its ConfigMap), then the Workload annotation with
// an optimistic lock, so two managers never interleave their steps and the
// annotation never names a step whose ranks are not stored.
func (r *Reconciler) saveState(ctx context.Context, wl *kueue.Workload, st *ladder.State) error {
	base := wl.DeepCopy()
	if st == nil {
		delete(wl.Annotations, v1alpha1.AnnotationPreemptionPhase)
	} else {
		if err := r.rankStore().save(ctx, wl, st); err != nil {
			return fmt.Errorf("per-rank record: %w", err)
		}
		small := *st
		small.Ranks, small.Outcomes = nil, nil
		raw, err := json.Marshal(small)
		if err != nil {
			return err
		}
		if wl.Annotations == nil {
			wl.Annotations = map[string]string{}
		}
		wl.Annotations[v1alpha1.AnnotationPreemptionPhase] = string(raw)
	}
	if err := r.client.Patch(ctx, wl, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), client.FieldOwner(ControllerName)); err != nil {
		return err
	}
	if st == nil {
		return r.rankStore().save(ctx, wl, nil)
	}
	return nil
}

func (r *Reconciler) rankStore() rankStore {
	reader := r.reader
	if reader == nil {
		reader = r.client
	}
	return rankStore{reader: reader, client: r.client}
}

func equalState(a, b ladder.State) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// podToWorkloads maps a pod to the workload of its job: through its pod
// group (Kueue's label names the Workload), the pod itself (a single pod's
// Workload), or its controller chain up to the Workload's owner (a JobSet
// pod's Job, then the JobSet, then a TrainJob).
func (r *Reconciler) podToWorkloads(ctx context.Context, obj client.Object) []reconcile.Request {
	var out []reconcile.Request
	seen := map[reconcile.Request]bool{}
	add := func(req reconcile.Request) {
		if !seen[req] {
			seen[req] = true
			out = append(out, req)
		}
	}
	for _, k := range workloadsOf(ctx, r.client, r.finder(), obj) {
		add(reconcile.Request{NamespacedName: k})
	}
	// A pod whose controller is gone (a RayCluster KubeRay deleted while
	// its pods save, strandedRanks) reaches no Workload up its chain: it
	// wakes every Workload of its namespace in a running preemption, which
	// finds it again by UID if it is one of their ranks (an extra
	// reconcile of another is harmless).
	if pod, ok := obj.(*corev1.Pod); ok && optedIn(pod) && intermediateController(pod) && r.controllerGone(ctx, pod) {
		var wls kueue.WorkloadList
		if err := r.client.List(ctx, &wls, client.InNamespace(obj.GetNamespace())); err == nil {
			for i := range wls.Items {
				st, err := loadState(wls.Items[i].Annotations)
				if err == nil && st.Phase != ladder.PhaseNone && st.Phase != ladder.PhaseDone {
					add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&wls.Items[i])})
				}
			}
		}
	}
	return out
}

// workloadsOf are the Workloads of obj's job, nearest first: through its
// pod group (Kueue's label names the Workload), the object itself (a
// single pod's Workload), or its controller chain up to the Workload's
// owner (f.Ancestors, UID-checked). c must have the owner-UID index.
func workloadsOf(ctx context.Context, c client.Reader, f owners.Finder, obj client.Object) []types.NamespacedName {
	var out []types.NamespacedName
	seen := map[types.NamespacedName]bool{}
	add := func(k types.NamespacedName) {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	if g := obj.GetLabels()[owners.LabelPodGroup]; g != "" {
		add(types.NamespacedName{Namespace: obj.GetNamespace(), Name: g})
	}
	for _, uid := range f.Ancestors(ctx, obj) {
		var wls kueue.WorkloadList
		if err := c.List(ctx, &wls, client.InNamespace(obj.GetNamespace()), client.MatchingFields{indexWorkloadOwnerUID: string(uid)}); err != nil {
			continue
		}
		for i := range wls.Items {
			add(client.ObjectKeyFromObject(&wls.Items[i]))
		}
	}
	return out
}

// nodeToWorkloads maps a node to the workloads of the opted-in pods on it.
func (r *Reconciler) nodeToWorkloads(ctx context.Context, obj client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.MatchingFields{indexPodNode: obj.GetName()}); err != nil {
		return nil
	}
	seen := map[reconcile.Request]bool{}
	var out []reconcile.Request
	for i := range pods.Items {
		if !optedIn(&pods.Items[i]) {
			continue
		}
		for _, req := range r.podToWorkloads(ctx, &pods.Items[i]) {
			if !seen[req] {
				seen[req] = true
				out = append(out, req)
			}
		}
	}
	return out
}

// readinessChanged passes node events whose Ready condition changed (and
// deletions): not every heartbeat.
func readinessChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Node)
			n, ok2 := e.ObjectNew.(*corev1.Node)
			return ok1 && ok2 && nodeIsReady(o) != nodeIsReady(n)
		},
	}
}

func podUIDOf(o client.Object) []string { return []string{string(o.GetUID())} }

func podGroupOf(o client.Object) []string {
	if g := o.GetLabels()[owners.LabelPodGroup]; g != "" {
		return []string{g}
	}
	return nil
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
	if err := idx.IndexField(ctx, &corev1.Pod{}, indexPodGroup, podGroupOf); err != nil {
		return fmt.Errorf("pod group index: %w", err)
	}
	if err := idx.IndexField(ctx, &corev1.Pod{}, indexPodUID, podUIDOf); err != nil {
		return fmt.Errorf("pod uid index: %w", err)
	}
	if err := idx.IndexField(ctx, &corev1.Pod{}, indexPodNode, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("pod node index: %w", err)
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
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.nodeToWorkloads), builder.WithPredicates(readinessChanged())).
		WithOptions(controller.Options{SkipNameValidation: skip}).
		Complete(r)
}
