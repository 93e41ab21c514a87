package placement

import (
	"context"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

func gatedPod(name, uid, plan string, index string, gates ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid),
		Labels:          map[string]string{"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": index},
		Annotations:     map[string]string{v1alpha1.AnnotationPlan: plan},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(&metav1.ObjectMeta{Name: "job", UID: testJobUID}, batchv1.SchemeGroupVersion.WithKind("Job"))}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}}}
	for _, g := range append(gates, v1alpha1.SchedulingGatePlacement) {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g})
	}
	return p
}

// testJobUID is the Job the test pods (gatedPod) and the plan's Workload
// (testWorkload) belong to.
const testJobUID = "uid-job"

// testWorkload is the Workload of testPlan, owned by the pods' Job.
func testWorkload() *kueue.Workload {
	return &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns",
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(&metav1.ObjectMeta{Name: "job", UID: testJobUID}, batchv1.SchemeGroupVersion.WithKind("Job"))}}}
}

func testPlan() *v1alpha1.GPUPlan {
	return &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns"}, Spec: v1alpha1.GPUPlanSpec{
		WorkloadName: "wl", PodCount: 2, GPUCount: 2,
		Assignments: []v1alpha1.PodAssignment{
			{PodSet: "worker", Index: 0, Node: "n1", GPUs: []v1alpha1.GPUAssignment{{UUID: "GPU-a", MemoryMiB: 20480}}},
			{PodSet: "worker", Index: 1, Node: "n2", GPUs: []v1alpha1.GPUAssignment{{UUID: "GPU-b", MemoryMiB: 20480}}},
		}}, Status: v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlanned}}
}

// setup builds the reconciler on a fake client holding objs, and
// testWorkload unless objs has a Workload named wl.
func setup(t *testing.T, objs ...client.Object) (*Reconciler, client.Client, *record.FakeRecorder) {
	hasWL := false
	for _, o := range objs {
		if _, ok := o.(*kueue.Workload); ok && o.GetName() == "wl" {
			hasWL = true
		}
	}
	if !hasWL {
		objs = append(objs, testWorkload())
	}
	s := runtime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	_ = kueue.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&v1alpha1.GPUPlan{}).
		WithIndex(&corev1.Pod{}, IndexPlan, func(o client.Object) []string {
			if p := o.GetAnnotations()[v1alpha1.AnnotationPlan]; p != "" {
				return []string{p}
			}
			return nil
		}).
		WithIndex(&corev1.Pod{}, IndexUnplannedGated, IndexUnplannedGatedFunc).
		WithIndex(&corev1.Pod{}, IndexAwaitingNode, IndexAwaitingNodeFunc).
		WithIndex(&kueue.Workload{}, IndexVictim, IndexVictimFunc).
		WithIndex(&kueue.Workload{}, IndexWorkloadOwner, IndexWorkloadOwnerFunc).Build()
	rec := record.NewFakeRecorder(20)
	return &Reconciler{Client: c, Recorder: rec}, c, rec
}

func reconcilePod(t *testing.T, r *Reconciler, name string) reconcile.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func getPod(t *testing.T, c client.Client, name string) *corev1.Pod {
	p := &corev1.Pod{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReconcilePlaces(t *testing.T) {
	placed := testutil.ToFloat64(decisions.WithLabelValues(EventPlaced))
	r, c, rec := setup(t, testPlan(), gatedPod("w1", "u1", "wl", "1"), gatedPod("w0", "u0", "wl", "0"))
	reconcilePod(t, r, "w1")
	reconcilePod(t, r, "w0")
	reconcilePod(t, r, "w0") // idempotent
	w1 := getPod(t, c, "w1")
	if len(w1.Spec.SchedulingGates) != 0 || w1.Annotations[v1alpha1.AnnotationDevices] != "GPU-b:20480" {
		t.Errorf("w1: gates %v devices %q", w1.Spec.SchedulingGates, w1.Annotations[v1alpha1.AnnotationDevices])
	}
	wantAff := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}}}}}
	if d := cmp.Diff(wantAff, w1.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution); d != "" {
		t.Errorf("w1 affinity (-want +got):\n%s", d)
	}
	plan := &v1alpha1.GPUPlan{}
	_ = c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "wl"}, plan)
	want := []v1alpha1.SlotBinding{{PodSet: "worker", Index: 1, PodName: "w1", PodUID: "u1"}, {PodSet: "worker", Index: 0, PodName: "w0", PodUID: "u0"}}
	if d := cmp.Diff(want, plan.Status.Bindings); d != "" || plan.Status.Phase != v1alpha1.PlanPlaced || plan.Status.PlacedPods != 2 {
		t.Errorf("plan status phase %s placed %d bindings (-want +got):\n%s", plan.Status.Phase, plan.Status.PlacedPods, d)
	}
	if n := len(rec.Events); n != 2 {
		t.Errorf("%d events, want 2 Placed", n)
	}
	if got := testutil.ToFloat64(decisions.WithLabelValues(EventPlaced)) - placed; got != 2 {
		t.Errorf("gpupack_placement_decisions_total{result=Placed} +%v, want +2", got)
	}
}

func TestReconcileRecreatedPodGetsSlotBack(t *testing.T) {
	plan := testPlan()
	plan.Status.Bindings = []v1alpha1.SlotBinding{{PodSet: "worker", Index: 0, PodName: "w0-old", PodUID: "old"}}
	r, c, _ := setup(t, plan, gatedPod("w0-new", "new", "wl", "0"))
	reconcilePod(t, r, "w0-new")
	if got := getPod(t, c, "w0-new").Annotations[v1alpha1.AnnotationDevices]; got != "GPU-a:20480" {
		t.Errorf("devices = %q, want the old pod's GPU-a", got)
	}
}

func TestReconcileWaitsForPredecessor(t *testing.T) {
	plan := testPlan()
	plan.Status.Bindings = []v1alpha1.SlotBinding{{PodSet: "worker", Index: 0, PodName: "w0-old", PodUID: "old"}}
	old := gatedPod("w0-old", "old", "wl", "0")
	old.Spec.SchedulingGates = nil
	r, c, _ := setup(t, plan, old, gatedPod("w0-new", "new", "wl", "0"))
	waiting := testutil.ToFloat64(decisions.WithLabelValues(EventWaiting))
	if res := reconcilePod(t, r, "w0-new"); res.RequeueAfter == 0 {
		t.Error("no requeue while the predecessor holds the slot")
	}
	if got := testutil.ToFloat64(decisions.WithLabelValues(EventWaiting)) - waiting; got != 1 {
		t.Errorf("gpupack_placement_decisions_total{result=WaitingForSlot} +%v, want +1", got)
	}
	if !hasGate(getPod(t, c, "w0-new"), v1alpha1.SchedulingGatePlacement) {
		t.Error("ungated while the slot is busy")
	}
}

func TestReconcileLeavesGated(t *testing.T) {
	r, c, rec := setup(t, gatedPod("gone", "u", "missing", "0"), gatedPod("tas", "u2", "wl", "0", TASGate), testPlan())
	reconcilePod(t, r, "gone")
	reconcilePod(t, r, "tas")
	if !hasGate(getPod(t, c, "gone"), v1alpha1.SchedulingGatePlacement) || !hasGate(getPod(t, c, "tas"), v1alpha1.SchedulingGatePlacement) {
		t.Error("gate lifted")
	}
	ev := <-rec.Events
	if !strings.Contains(ev, EventPlanMissing) || !strings.Contains(ev, "missing") {
		t.Errorf("event = %q", ev)
	}
	if len(rec.Events) != 0 {
		t.Errorf("TAS-gated pod produced an event")
	}
}

func TestPinNarrowsExistingAffinity(t *testing.T) {
	p := gatedPod("p", "u", "wl", "0")
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}},
	}}}
	Pin(p, "n1", "GPU-a:1")
	Pin(p, "n1", "GPU-a:1")
	terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Values[0] != "n1" {
		t.Errorf("terms = %+v", terms)
	}
}

// TestReconcileRefusesPodOfAnotherJob: a gated pod naming a plan whose
// Workload it does not belong to — a hand-made pod, a pod of another Job,
// a pod labelled with a pod group that is a Job's Workload — is not bound
// and stays gated with PlanNotForThisPod (issue 14, finding 6); the plan's
// own pod then takes the slot.
func TestReconcileRefusesPodOfAnotherJob(t *testing.T) {
	handMade := gatedPod("hand-made", "u-hand", "wl", "0")
	handMade.OwnerReferences = nil
	otherJob := gatedPod("other-job", "u-other", "wl", "0")
	otherJob.OwnerReferences[0].UID = "uid-other-job"
	grouped := gatedPod("grouped", "u-grouped", "wl", "0")
	grouped.OwnerReferences = nil
	grouped.Labels[KueuePodGroupLabel] = "wl"
	recreatedWL := testPlan()
	recreatedWL.Name, recreatedWL.Spec.WorkloadUID = "stale", "uid-old-wl"
	stale := gatedPod("stale-wl", "u-stale", "stale", "0")
	// A pod of the plan's own Job that asks for no GPU: a tenant's CPU Job
	// forged under the victim's JobSet gets the victim's plan copied in
	// by the JobSet controller, and a gate of her own (review 9, F1b).
	cpu := gatedPod("cpu", "u-cpu", "wl", "0")
	cpu.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	r, c, rec := setup(t, testPlan(), recreatedWL, handMade, otherJob, grouped, stale, cpu, gatedPod("own", "u-own", "wl", "0"))
	refused := testutil.ToFloat64(decisions.WithLabelValues(EventPlanNotForPod))
	for _, name := range []string{"hand-made", "other-job", "grouped", "stale-wl", "cpu"} {
		if res := reconcilePod(t, r, name); res.RequeueAfter == 0 {
			t.Errorf("%s: no requeue", name)
		}
		if !gated(t, c, name) || getPod(t, c, name).Annotations[v1alpha1.AnnotationDevices] != "" {
			t.Errorf("%s: bound or ungated", name)
		}
		if ev := <-rec.Events; !strings.Contains(ev, EventPlanNotForPod) {
			t.Errorf("%s: event %q, want %s", name, ev, EventPlanNotForPod)
		}
	}
	if got := testutil.ToFloat64(decisions.WithLabelValues(EventPlanNotForPod)) - refused; got != 5 {
		t.Errorf("gpupack_placement_decisions_total{result=PlanNotForThisPod} +%v, want +5", got)
	}
	plan := &v1alpha1.GPUPlan{}
	_ = c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "wl"}, plan)
	if len(plan.Status.Bindings) != 0 {
		t.Errorf("bindings %+v, want none", plan.Status.Bindings)
	}
	reconcilePod(t, r, "own")
	if got := getPod(t, c, "own").Annotations[v1alpha1.AnnotationDevices]; got != "GPU-a:20480" {
		t.Errorf("the plan's own pod: devices %q, want slot worker[0]'s GPU-a", got)
	}
}

// A plain pod group's members are placed only when their creator stamps
// agree (owners.GroupSlot, review 14 F3): alice's pod in bob's group, and
// bob's own member, stay gated with PodGroupCreatorsDiffer naming both
// users; once alice's pod is gone, bob's is placed.
func TestReconcilePodGroupOfTwoCreators(t *testing.T) {
	member := func(name, uid, user string) *corev1.Pod {
		p := gatedPod(name, uid, "wl", "0")
		p.OwnerReferences = nil
		p.Labels = map[string]string{KueuePodGroupLabel: "wl"}
		p.Annotations[kueueRoleHash] = "worker"
		p.Annotations[v1alpha1.AnnotationCreatedBy] = user
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}
		return p
	}
	bob0, thief := member("bob-0", "u-bob-0", "bob"), member("thief", "u-thief", "alice")
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "v1", Kind: "Pod", Name: "bob-0", UID: "u-bob-0"}, {APIVersion: "v1", Kind: "Pod", Name: "thief", UID: "u-thief"}}}}
	r, c, rec := setup(t, testPlan(), wl, bob0, thief)
	for _, name := range []string{"thief", "bob-0"} {
		if res := reconcilePod(t, r, name); res.RequeueAfter == 0 {
			t.Errorf("%s: no requeue", name)
		}
		if !gated(t, c, name) || getPod(t, c, name).Annotations[v1alpha1.AnnotationDevices] != "" {
			t.Errorf("%s: bound or ungated", name)
		}
		ev := <-rec.Events
		for _, want := range []string{EventGroupCreatorsDiffer, `thief (created by "alice")`, `bob-0 (created by "bob")`} {
			if !strings.Contains(ev, want) {
				t.Errorf("%s: event %q lacks %q", name, ev, want)
			}
		}
	}
	if err := c.Delete(context.Background(), getPod(t, c, "thief")); err != nil {
		t.Fatal(err)
	}
	reconcilePod(t, r, "bob-0")
	if got := getPod(t, c, "bob-0").Annotations[v1alpha1.AnnotationDevices]; got != "GPU-a:20480" {
		t.Errorf("bob's pod once alice's is gone: devices %q, want GPU-a:20480", got)
	}
}
