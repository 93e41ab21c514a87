package preemption

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/checkpoint/agent"
	"github.com/gpupack/gpupack/preemption/ladder"
)

// Reasons recorded in the state and the Events.
const (
	ReasonKueueEvicted     = "Evicted"          // Kueue's Evicted condition
	ReasonKueuePreempted   = "Preempted"        // Kueue's Preempted condition
	ReasonDisruptionTarget = "DisruptionTarget" // a pod's DisruptionTarget condition (Volcano, taint manager…)
	ReasonEviction         = "Eviction"         // a drain's eviction request held by the webhook
	ReasonPodDeleted       = "PodDeleted"       // an opted-in pod deleted while its workload stays admitted (kubectl delete pod)
	ReasonNodeNotReady     = "NodeNotReady"     // an opted-in pod's node is NotReady (or gone)
)

// KueueEvictionReason is the Evicted condition's reason the coordinator
// sets when a pod-level trigger evicts a whole Workload through Kueue.
// Kueue v0.17 re-queues an evicted workload at once (Requeued=True) only
// for Preempted and NodeFailures; any other reason set by an outside
// controller leaves it parked with Requeued=False. NodeFailures is the
// honest one of the two for a drain or a NotReady node, and the condition's
// message names the actual trigger.
const KueueEvictionReason = kueue.WorkloadEvictedDueToNodeFailures

// optedIn: the pod runs gpupack-ckpt.
func optedIn(pod *corev1.Pod) bool {
	return pod.Annotations[v1alpha1.AnnotationCheckpoint] == "true"
}

func finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

func disrupted(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// reportedSteps reads what the pod's agent said: the annotation (the step
// of the checkpoint saved for the request) and the termination messages
// (that step plus the other verified steps). reported is true once a new
// checkpoint answered the request.
func reportedSteps(pod *corev1.Pod) (steps []int64, reported bool) {
	if v, ok := pod.Annotations[v1alpha1.AnnotationCheckpointStep]; ok {
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n >= 0 {
			steps = append(steps, n)
			reported = true
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Terminated == nil || cs.State.Terminated.Message == "" {
			continue
		}
		rep, err := agent.ParseReport(cs.State.Terminated.Message)
		if err != nil {
			continue // not gpupack-ckpt's report
		}
		if rep.CheckpointStep != nil {
			steps = append(steps, *rep.CheckpointStep)
			reported = true
		}
		steps = append(steps, rep.VerifiedSteps...)
	}
	return steps, reported
}

// observePod translates one pod for the ladder.
func observePod(pod *corev1.Pod, defaultGrace time.Duration) ladder.Pod {
	steps, reported := reportedSteps(pod)
	grace := defaultGrace
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	var deletedAt time.Time
	var deletionGrace time.Duration
	if pod.DeletionTimestamp != nil && pod.DeletionGracePeriodSeconds != nil {
		deletionGrace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		deletedAt = pod.DeletionTimestamp.Add(-deletionGrace)
	}
	return ladder.Pod{
		DeletedAt:           deletedAt,
		DeletionGrace:       deletionGrace,
		Name:                pod.Name,
		UID:                 string(pod.UID),
		Created:             pod.CreationTimestamp.Time,
		OptedIn:             optedIn(pod),
		Terminating:         pod.DeletionTimestamp != nil,
		Finished:            finished(pod),
		CheckpointRequested: pod.Annotations[v1alpha1.AnnotationCheckpointRequest] != "",
		Steps:               steps,
		Reported:            reported,
		Grace:               grace,
	}
}

// trigger is why a workload is being evicted.
type trigger struct {
	Reason string
	// PodLevel: seen only on a pod (Pod names it), not on the Workload.
	PodLevel bool
	Pod      string
}

// evictedBy says whether (and why) a workload is being evicted: Kueue's
// conditions first, then any live opted-in pod being disrupted, drained,
// deleted, or on a NotReady node. podTriggers false (the workload
// finished, its job is being deleted, the preemption is Done) looks at
// Kueue's conditions only. nodeReady may be nil (no node trigger).
func evictedBy(wl *kueue.Workload, pods []corev1.Pod, podTriggers bool, nodeReady func(string) bool) (trigger, bool) {
	if apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadPreempted) {
		return trigger{Reason: ReasonKueuePreempted}, true
	}
	if apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadEvicted) {
		return trigger{Reason: ReasonKueueEvicted}, true
	}
	if !podTriggers || apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished) {
		return trigger{}, false
	}
	// Pod-level disruptions count only for opted-in pods: for the others
	// the coordinator would only widen a one-pod disruption to the gang.
	checks := []struct {
		reason string
		is     func(*corev1.Pod) bool
	}{
		{ReasonDisruptionTarget, disrupted},
		{ReasonEviction, func(p *corev1.Pod) bool { return p.Annotations[v1alpha1.AnnotationCheckpointRequest] != "" }},
		{ReasonPodDeleted, func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil }},
		{ReasonNodeNotReady, func(p *corev1.Pod) bool {
			return nodeReady != nil && p.Spec.NodeName != "" && !nodeReady(p.Spec.NodeName)
		}},
	}
	for _, c := range checks {
		for i := range pods {
			p := &pods[i]
			if !finished(p) && optedIn(p) && c.is(p) {
				return trigger{Reason: c.reason, PodLevel: true, Pod: p.Name}, true
			}
		}
	}
	return trigger{}, false
}

// nodeIsReady: the node exists and its Ready condition is True.
func nodeIsReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// holdsQuota: Kueue has the workload admitted (or reserving quota).
func holdsQuota(wl *kueue.Workload) bool {
	return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
}

// checkpointTimeout is the job's gpupack.io/checkpoint-timeout, read from
// the first pod, the job, or the workload's pod templates that has one.
func checkpointTimeout(pods []corev1.Pod, jobAnnotations map[string]string, wl *kueue.Workload) (time.Duration, error) {
	sources := []map[string]string{}
	for i := range pods {
		sources = append(sources, pods[i].Annotations)
	}
	sources = append(sources, jobAnnotations)
	for i := range wl.Spec.PodSets {
		sources = append(sources, wl.Spec.PodSets[i].Template.Annotations)
	}
	for _, a := range sources {
		if v, ok := a[v1alpha1.AnnotationCheckpointTimeout]; ok {
			return parseTimeout(v)
		}
	}
	return 0, nil
}

func parseTimeout(v string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q is not a positive duration (e.g. 5m)", v1alpha1.AnnotationCheckpointTimeout, v)
	}
	return d, nil
}

// loadState reads the durable state; a missing annotation is no preemption.
func loadState(annotations map[string]string) (ladder.State, error) {
	raw, ok := annotations[v1alpha1.AnnotationPreemptionPhase]
	if !ok || raw == "" {
		return ladder.State{}, nil
	}
	var st ladder.State
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return ladder.State{}, fmt.Errorf("%s: %w", v1alpha1.AnnotationPreemptionPhase, err)
	}
	switch st.Phase {
	case ladder.PhaseNone, ladder.PhaseCheckpointing, ladder.PhaseTerminating, ladder.PhaseKilling, ladder.PhaseDone:
	default:
		return ladder.State{}, fmt.Errorf("%s: unknown phase %q", v1alpha1.AnnotationPreemptionPhase, st.Phase)
	}
	if st.Phase == ladder.PhaseCheckpointing && st.CheckpointDeadline == nil {
		return ladder.State{}, fmt.Errorf("%s: phase Checkpointing without a deadline", v1alpha1.AnnotationPreemptionPhase)
	}
	return st, nil
}

// PreemptionState returns the coordinator's durable record of a workload's
// preemption (for tests, the CLI, and other gpupack parts) as the Workload
// annotation holds it: phase, reason, transitions, deadlines and the
// consistent step, without the per-rank part (see PreemptionRecord).
func PreemptionState(wl *kueue.Workload) (ladder.State, error) {
	return loadState(wl.Annotations)
}

// PreemptionRecord is PreemptionState with the per-rank part (Ranks,
// Outcomes) read through r from the ConfigMap RankRecordName(wl.Name).
func PreemptionRecord(ctx context.Context, r client.Reader, wl *kueue.Workload) (ladder.State, error) {
	st, err := loadState(wl.Annotations)
	if err != nil || st.Phase == ladder.PhaseNone || st.Ranks != nil {
		return st, err
	}
	err = rankStore{reader: r}.load(ctx, wl, &st)
	return st, err
}
