package preemption

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/owners"
)

var gvkRayJob = schema.GroupVersionKind{Group: "ray.io", Version: "v1", Kind: "RayJob"}

// KubeRay deletes a suspended RayJob's RayCluster at once (background
// propagation): its pods, asked to checkpoint and still saving, are then
// controlled by a RayCluster that no longer exists, and the walk down
// from the RayJob finds none of them. The coordinator must still read
// their answers (found again by UID) and not end the protocol while they
// hold their GPUs; a pod of the namespace that merely shares nothing with
// the job, or whose controller still exists, is never taken.
func TestRanksStrandedByADeletedRayCluster(t *testing.T) {
	rjRef := controllerRef(gvkRayJob, "rj")
	rcRef := controllerRef(owners.GVKRayCluster, "rj-abc")
	otherRC := controllerRef(owners.GVKRayCluster, "other")
	rc := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "ray.io/v1", Kind: "RayCluster"}, ObjectMeta: om("rj-abc", &rjRef)}
	objs := []client.Object{
		&metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "ray.io/v1", Kind: "RayJob"}, ObjectMeta: om("rj", nil)},
		rc,
		&metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "ray.io/v1", Kind: "RayCluster"}, ObjectMeta: om("other", nil)},
		ckptPod("rj-head", &rcRef), ckptPod("rj-worker", &rcRef), ckptPod("other-head", &otherRC),
		&kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "rayjob-rj", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{rjRef}},
			Status: kueue.WorkloadStatus{Conditions: []metav1.Condition{preempted()}}},
	}
	h := newHarness(t, objs...)
	h.wlName = "rayjob-rj"
	h.reconcile()
	if st := h.state(); st.Phase != ladder.PhaseCheckpointing || len(st.Ranks) != 2 {
		t.Fatalf("state %+v, want Checkpointing with 2 ranks", st)
	}

	// KubeRay deletes the RayCluster; the garbage collector deletes its
	// pods, which their containers' finalizer keeps while they save.
	if err := h.c.Delete(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"rj-head", "rj-worker"} {
		p := h.pod(n)
		p.Finalizers = []string{"test/container-running"}
		if err := h.c.Update(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		if err := h.c.Delete(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		h.annotatePod(n, v1alpha1.AnnotationCheckpointStep, "70")
	}
	h.clock = t0.Add(time.Second)
	h.reconcile()
	st := h.state()
	if st.LastConsistentStep == nil || *st.LastConsistentStep != 70 {
		t.Fatalf("state %+v, want the ranks' step 70 read from the stranded pods", st)
	}
	for rank, o := range st.Outcomes {
		if o != ladder.OutcomeSaved {
			t.Errorf("rank %s: %s, want Saved", rank, o)
		}
	}
	if st.Phase == ladder.PhaseDone {
		t.Fatalf("Done while the stranded ranks still hold their GPUs")
	}
	if h.pod("other-head").Annotations[v1alpha1.AnnotationCheckpointRequest] != "" {
		t.Error("another RayCluster's pod asked to checkpoint")
	}

	// Their containers exit: the protocol ends.
	for _, n := range []string{"rj-head", "rj-worker"} {
		p := h.pod(n)
		p.Finalizers = nil
		if err := h.c.Update(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	h.clock = t0.Add(2 * time.Second)
	h.reconcile()
	if st := h.state(); st.Phase != ladder.PhaseDone {
		t.Fatalf("phase %s, want Done once the stranded ranks are gone", st.Phase)
	}
}

// A rank whose controller still exists is the walk's to find: found by
// UID only, it is not taken (a pod another controller adopted, or a
// record naming a pod of some other job).
func TestStrandedRanksNeedTheirControllerGone(t *testing.T) {
	rcRef := controllerRef(owners.GVKRayCluster, "live")
	h := newHarness(t,
		&metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "ray.io/v1", Kind: "RayCluster"}, ObjectMeta: om("live", nil)},
		ckptPod("p", &rcRef))
	r := &Reconciler{client: h.c}
	st := ladder.State{Ranks: map[string][]int64{"uid-p": nil}}
	if got := r.strandedRanks(context.Background(), "ns", st, nil); len(got) != 0 {
		t.Errorf("took %d pod(s) whose controller lives", len(got))
	}
	if err := h.c.Delete(context.Background(), &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "ray.io/v1", Kind: "RayCluster"}, ObjectMeta: metav1.ObjectMeta{Name: "live", Namespace: "ns"}}); err != nil {
		t.Fatal(err)
	}
	if got := r.strandedRanks(context.Background(), "ns", st, nil); len(got) != 1 || got[0].UID != types.UID("uid-p") {
		t.Errorf("stranded %v, want pod p once its RayCluster is gone", got)
	}
	if got := r.strandedRanks(context.Background(), "ns", st, []corev1.Pod{{ObjectMeta: metav1.ObjectMeta{UID: "uid-p"}}}); len(got) != 0 {
		t.Errorf("a rank the walk found taken again: %v", got)
	}
}

// A stranded rank's events still wake its Workload (its chain up ends at
// the deleted RayCluster), so its answer is read before its container
// exits — and only Workloads in a running preemption are woken.
func TestStrandedPodWakesWorkloadsInAPreemption(t *testing.T) {
	rjRef := controllerRef(gvkRayJob, "rj")
	rcRef := controllerRef(owners.GVKRayCluster, "rj-abc")
	active := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "rayjob-rj", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{rjRef},
		Annotations: map[string]string{v1alpha1.AnnotationPreemptionPhase: `{"phase":"Checkpointing","checkpointDeadline":"2026-11-30T05:05:00Z"}`}}}
	idle := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "idle", Namespace: "ns"}}
	pod := ckptPod("rj-head", &rcRef)
	h := newHarness(t, active, idle, pod)
	r := &Reconciler{client: h.c}
	got := r.podToWorkloads(context.Background(), pod)
	if len(got) != 1 || got[0].Name != "rayjob-rj" {
		t.Errorf("stranded pod woke %v, want rayjob-rj only", got)
	}
	// With its RayCluster there, the chain decides (none here: no
	// Workload owns the RayCluster's RayJob UID chain in this fake).
	h2 := newHarness(t, active, idle, pod, &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "ray.io/v1", Kind: "RayCluster"}, ObjectMeta: om("rj-abc", &rjRef)})
	r2 := &Reconciler{client: h2.c}
	for _, req := range r2.podToWorkloads(context.Background(), pod) {
		if req.Name == "idle" {
			t.Errorf("woke a Workload in no preemption: %v", req)
		}
	}
}
