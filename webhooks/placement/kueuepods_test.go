package placement

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
)

func TestKueuePodIntegration(t *testing.T) {
	owner := func(apiVersion, kind string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "o", UID: "u", Controller: ptr.To(true)}}
	}
	queued := map[string]string{KueueQueueLabel: "lq"}
	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want bool
	}{
		{"plain pod with a queue name", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: queued}}, true},
		{"plain pod without", corev1.Pod{}, false},
		{"Deployment's pod", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: queued, OwnerReferences: owner("apps/v1", "ReplicaSet")}}, true},
		{"LWS / StatefulSet pod, parent annotation only", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{KueueSuspendingParent: "leaderworkerset"}, OwnerReferences: owner("apps/v1", "StatefulSet")}}, true},
		{"Job's pod with a queue label: the Job integration's", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: queued, OwnerReferences: owner("batch/v1", "Job")}}, false},
		{"PyTorchJob's pod", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: queued, OwnerReferences: owner("kubeflow.org/v1", "PyTorchJob")}}, false},
		{"already gated by Kueue", corev1.Pod{Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: KueueAdmissionGate}}}}, true},
	} {
		if got := KueuePodIntegration(&tc.pod); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func gpuPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
}

// workloadOf is the Workload Kueue's pod integration makes for pod p
// (owned by it), with quota reserved at t.
func workloadOf(p *corev1.Pod, t time.Time) *kueue.Workload {
	return &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "pod-" + p.Name, Namespace: p.Namespace, UID: types.UID("uid-wl-" + p.Name),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID}}},
		Status: kueue.WorkloadStatus{Conditions: []metav1.Condition{{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionTrue, Reason: "QuotaReserved", LastTransitionTime: metav1.NewTime(t)}}}}
}

// preemptedVictim is a Workload Kueue preempted for preemptor, in the
// coordinator's phase ph.
func preemptedVictim(name string, preemptor *kueue.Workload, ph ladder.Phase, at time.Time, deadline time.Time) *kueue.Workload {
	msg := fmt.Sprintf("Preempted to accommodate a workload (UID: %s, JobUID: %s) due to prioritization in the ClusterQueue; preemptor path: /plain; preemptee path: /plain", preemptor.UID, preemptor.OwnerReferences[0].UID)
	st := ladder.State{Phase: ph, Reason: "Preempted", Transitions: []ladder.Transition{{Phase: ladder.PhaseCheckpointing, At: at}}, CheckpointDeadline: &deadline}
	raw, _ := json.Marshal(st)
	return &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "other", UID: types.UID("uid-" + name),
		Annotations: map[string]string{v1alpha1.AnnotationPreemptionPhase: string(raw)}},
		Status: kueue.WorkloadStatus{Conditions: []metav1.Condition{
			{Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue, Reason: kueue.WorkloadEvictedByPreemption, Message: msg, LastTransitionTime: metav1.NewTime(at)},
			{Type: kueue.WorkloadPreempted, Status: metav1.ConditionTrue, Reason: kueue.InClusterQueueReason, Message: msg, LastTransitionTime: metav1.NewTime(at)},
		}}}
}

// A pod Kueue admitted without a plan waits at the gate while the workload
// Kueue preempted for it still checkpoints, says whom and until when, and
// is ungated (not pinned) once that preemption is Done; a pod nobody
// preempted for is ungated at once, whatever else checkpoints.
func TestUnplannedWaitsForItsVictims(t *testing.T) {
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	deadline := at.Add(5 * time.Minute)
	infer := gpuPod("infer")
	infer.Labels = map[string]string{KueueQueueLabel: "lq"}
	infer.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: KueueAdmissionGate}, {Name: v1alpha1.SchedulingGatePlacement}}
	web := gpuPod("web")
	web.Labels = map[string]string{KueueQueueLabel: "lq"}
	web.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
	inferWL, webWL := workloadOf(infer, at.Add(2*time.Second)), workloadOf(web, at.Add(2*time.Second))
	train := preemptedVictim("train", inferWL, ladder.PhaseCheckpointing, at, deadline)
	r, c, rec := setup(t, infer, web, inferWL, webWL, train)

	// Not yet admitted: Kueue's gate first, nothing said.
	if res := reconcilePod(t, r, "infer"); res.RequeueAfter != 0 || len(rec.Events) != 0 {
		t.Fatalf("while Kueue's gate is on: %+v, %d events", res, len(rec.Events))
	}
	// Kueue admits (no plan: no gang-fit check on its ClusterQueue).
	cur := &corev1.Pod{}
	_ = c.Get(t.Context(), client.ObjectKeyFromObject(infer), cur)
	cur.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
	if err := c.Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	if res := reconcilePod(t, r, "infer"); res.RequeueAfter != BusyRetry {
		t.Fatalf("its victim still checkpointing: got %+v, want a retry", res)
	}
	want := "workload other/train (Checkpointing, deadline " + deadline.UTC().Format(time.RFC3339) + ")"
	if ev := <-rec.Events; !strings.Contains(ev, EventWaitingForRelease) || !strings.Contains(ev, want) {
		t.Fatalf("event %q does not say whom it waits for and until when (%s)", ev, want)
	}
	_ = c.Get(t.Context(), client.ObjectKeyFromObject(infer), cur)
	if !hasGate(cur, v1alpha1.SchedulingGatePlacement) {
		t.Fatal("gate lifted while its victim holds its GPUs")
	}

	// The bystander: nobody was preempted for it.
	reconcilePod(t, r, "web")
	if g := getPod(t, c, "web").Spec.SchedulingGates; len(g) != 0 {
		t.Fatalf("a pod nobody preempted for is held by someone else's checkpoint: gates %v", g)
	}
	if ev := <-rec.Events; !strings.Contains(ev, EventReleased) {
		t.Fatalf("bystander: event %q", ev)
	}

	// The victim's preemption is Done: its pods are gone.
	done := preemptedVictim("train", inferWL, ladder.PhaseDone, at, deadline)
	_ = c.Get(t.Context(), client.ObjectKeyFromObject(train), train)
	train.Annotations = done.Annotations
	if err := c.Update(t.Context(), train); err != nil {
		t.Fatal(err)
	}
	reconcilePod(t, r, "infer")
	_ = c.Get(t.Context(), client.ObjectKeyFromObject(infer), cur)
	if len(cur.Spec.SchedulingGates) != 0 || cur.Annotations[v1alpha1.AnnotationDevices] != "" || cur.Spec.Affinity != nil {
		t.Fatalf("after its victim went: gates %v, devices %q, affinity %v; want ungated, unpinned", cur.Spec.SchedulingGates, cur.Annotations[v1alpha1.AnnotationDevices], cur.Spec.Affinity)
	}
	if d := cmp.Diff(true, strings.Contains(<-rec.Events, EventReleased)); d != "" {
		t.Fatal("no Ungated event")
	}
}

// The fallback: a victim that names nobody (a drain the coordinator
// evicted through Kueue) holds a pod admitted since its eviction, not one
// admitted before it; a pod whose Workload is not known waits.
func TestUnplannedUnattributedVictim(t *testing.T) {
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	deadline := at.Add(5 * time.Minute)
	mk := func(name string) *corev1.Pod {
		p := gpuPod(name)
		p.Labels = map[string]string{KueueQueueLabel: "lq"}
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
		return p
	}
	after, before, unknown := mk("after"), mk("before"), mk("unknown")
	drained := preemptedVictim("drained", workloadOf(before, at), ladder.PhaseCheckpointing, at, deadline)
	drained.Status.Conditions = []metav1.Condition{{Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue, Reason: kueue.WorkloadEvictedDueToNodeFailures,
		Message: "gpupack: Eviction of pod drained-0; evicting the whole workload so it checkpoints and restarts together", LastTransitionTime: metav1.NewTime(at)}}
	r, c, rec := setup(t, after, before, unknown, workloadOf(after, at.Add(time.Second)), workloadOf(before, at.Add(-time.Second)), drained)
	for _, tc := range []struct {
		pod  string
		held bool
	}{{"after", true}, {"before", false}, {"unknown", true}} {
		reconcilePod(t, r, tc.pod)
		ev := <-rec.Events
		if held := len(getPod(t, c, tc.pod).Spec.SchedulingGates) != 0; held != tc.held {
			t.Errorf("%s: held %v, want %v (%s)", tc.pod, held, tc.held, ev)
		}
		if tc.held && !strings.Contains(ev, "other/drained") {
			t.Errorf("%s: event %q does not name the victim", tc.pod, ev)
		}
	}
}

func resourceQty(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

// A fractional pod admitted without a plan is never ungated: only a plan's
// slots share GPUs (docs/security.md finding 1).
func TestUnplannedFractionalStaysGated(t *testing.T) {
	infer := gpuPod("infer")
	infer.Labels = map[string]string{KueueQueueLabel: "lq"}
	infer.Spec.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceVGPU: *resourceQty("1")}
	infer.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
	r, c, rec := setup(t, infer)
	if res := reconcilePod(t, r, "infer"); res.RequeueAfter != 0 {
		t.Fatalf("got %+v", res)
	}
	cur := &corev1.Pod{}
	_ = c.Get(t.Context(), client.ObjectKeyFromObject(infer), cur)
	if !hasGate(cur, v1alpha1.SchedulingGatePlacement) {
		t.Fatal("fractional pod without a plan ungated")
	}
	if ev := <-rec.Events; !strings.Contains(ev, EventPlanMissing) || !strings.Contains(ev, "gang-fit") {
		t.Fatalf("event %q does not say why", ev)
	}
}
