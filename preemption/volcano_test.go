package preemption

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
)

// volcanoEvict does to pod what Volcano's scheduler cache does when its
// preempt or reclaim action evicts a task (pkg/scheduler/cache/cache.go,
// defaultEvictor.Evict): one status update — PodReady False with reason
// "Evict" and, since Volcano v1.13, DisruptionTarget True with reason
// PreemptionByScheduler — then a plain delete (no grace period, no
// preconditions: the pod's own terminationGracePeriodSeconds). No Eviction
// API, so no eviction webhook sees it.
func volcanoEvict(t *testing.T, c client.Client, name string, disruptionTarget bool) {
	t.Helper()
	var p corev1.Pod
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	msg := "Pod is evicted, because of preempt"
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "Evict", Message: msg})
	if disruptionTarget {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: corev1.PodReasonPreemptionByScheduler, Message: "volcano: preempting to accommodate a higher priority pod"})
	}
	if err := c.Status().Update(context.Background(), &p); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(context.Background(), &p); err != nil {
		t.Fatal(err)
	}
}

// Volcano's evictor deleting one opted-in rank of a gang Kueue still has
// admitted is a pod-level trigger like `kubectl delete pod`: the coordinator
// evicts the whole Workload through Kueue, asks every rank to checkpoint,
// and records the consistent step — for both shapes Volcano writes
// (v1.12 and earlier: delete only; v1.13 on: a DisruptionTarget first).
func TestVolcanoEvictorIsAPodLevelTrigger(t *testing.T) {
	for _, tc := range []struct {
		name             string
		disruptionTarget bool
		reason           string
	}{
		{"Volcano v1.12: status update and delete", false, ReasonPodDeleted},
		{"Volcano v1.13+: with DisruptionTarget", true, ReasonDisruptionTarget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w0, w1 := rankPod("w0"), rankPod("w1")
			// The kubelet still runs the containers: the objects stay until it confirms.
			w0.Finalizers, w1.Finalizers = []string{"test.gpupack.io/kubelet"}, []string{"test.gpupack.io/kubelet"}
			h := newHarness(t, job(), workload(quotaReserved()), w0, w1)
			if h.reconcile(); h.state().Phase != ladder.PhaseNone {
				t.Fatalf("running gang: state %+v", h.state())
			}
			volcanoEvict(t, h.c, "w0", tc.disruptionTarget)
			h.clock = t0.Add(time.Second)
			h.reconcile()
			wl := h.workload()
			c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted)
			if c == nil || c.Status != metav1.ConditionTrue || c.Reason != KueueEvictionReason || !strings.Contains(c.Message, tc.reason+" of pod w0") {
				t.Fatalf("Evicted condition %+v, want True/%s naming %s of w0", c, KueueEvictionReason, tc.reason)
			}
			st := h.state()
			if st.Phase != ladder.PhaseCheckpointing || st.Reason != tc.reason || len(st.Ranks) != 2 {
				t.Fatalf("state %+v, want Checkpointing for %s with both ranks", st, tc.reason)
			}
			for _, n := range []string{"w0", "w1"} {
				if h.pod(n).Annotations[v1alpha1.AnnotationCheckpointRequest] == "" {
					t.Errorf("rank %s not asked to checkpoint", n)
				}
			}
			// Both ranks save step 300; the evicted one's container exits.
			h.annotatePod("w0", v1alpha1.AnnotationCheckpointStep, "300")
			h.annotatePod("w1", v1alpha1.AnnotationCheckpointStep, "300")
			h.clock = t0.Add(2 * time.Second)
			h.reconcile() // Terminating: w1 deleted gracefully
			if p := h.pod("w1"); p == nil || p.DeletionTimestamp == nil {
				t.Fatalf("w1 not deleted in Terminating: %+v", p)
			}
			for _, n := range []string{"w0", "w1"} {
				p := h.pod(n)
				p.Finalizers = nil
				if err := h.c.Update(context.Background(), p); err != nil {
					t.Fatal(err)
				}
			}
			h.clock = t0.Add(3 * time.Second)
			h.reconcile()
			if st := h.state(); st.Phase != ladder.PhaseDone || st.LastConsistentStep == nil || *st.LastConsistentStep != 300 {
				t.Fatalf("state %+v, want Done at step 300", st)
			}
			if diff := cmp.Diff([]string{EventEvictingWorkload, EventCheckpointing, EventConsistentStep, EventTerminating, EventDone}, h.events); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}
