package admissioncheck

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/util/admissioncheck"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/gpucache"
)

const testCheck = "gangfit"

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, kueue.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// gpuNode is a Ready node with n whole H100s named <name>-g<i>.
func gpuNode(name string, n int, labels map[string]string) *corev1.Node {
	var gpus []v1alpha1.GPUInfo
	for i := 0; i < n; i++ {
		gpus = append(gpus, v1alpha1.GPUInfo{UUID: fmt.Sprintf("%s-g%d", name, i), Index: i, Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559})
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{v1alpha1.AnnotationGPUs: v1alpha1.FormatGPUs(gpus)}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

type wlBuilder struct{ wl *kueue.Workload }

// admittedWorkload: quota reserved, the gang-fit check Pending, one pod set
// "main" of pods × gpus whole GPUs.
func admittedWorkload(name string, uid types.UID, pods int32, gpus int64) *wlBuilder {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	wl := &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: uid},
		Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{Name: kueue.DefaultPodSetName, Count: pods, Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: q}}}}},
		}}}},
		Status: kueue.WorkloadStatus{
			Conditions: []metav1.Condition{{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionTrue, Reason: "QuotaReserved",
				LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 1, 23, 59, 0, 0, time.UTC))}},
			Admission: &kueue.Admission{ClusterQueue: "cq", PodSetAssignments: []kueue.PodSetAssignment{{Name: kueue.DefaultPodSetName, Count: &pods}}},
			AdmissionChecks: []kueue.AdmissionCheckState{{Name: testCheck, State: kueue.CheckStatePending,
				LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 1, 23, 59, 0, 0, time.UTC))}},
		},
	}
	return &wlBuilder{wl}
}

func (b *wlBuilder) ownedBy(apiVersion, kind, name string) *wlBuilder {
	b.wl.OwnerReferences = append(b.wl.OwnerReferences, metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: "owner", Controller: ptrTo(true)})
	return b
}

func (b *wlBuilder) obj() *kueue.Workload { return b.wl }

func ptrTo[T any](v T) *T { return &v }

func gangFitCheck() *kueue.AdmissionCheck {
	return &kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: testCheck}, Spec: kueue.AdmissionCheckSpec{ControllerName: v1alpha1.ControllerName}}
}

// holderPod is a pod holding whole GPUs by its devices annotation.
func holderPod(name string, uid types.UID, node, plan string, terminating bool, uuids ...string) *corev1.Pod {
	devs := make([]v1alpha1.DeviceAssignment, len(uuids))
	for i, u := range uuids {
		devs[i] = v1alpha1.DeviceAssignment{UUID: u, MemoryMiB: 81559}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: uid,
			Annotations: map[string]string{v1alpha1.AnnotationDevices: v1alpha1.FormatDevices(devs), v1alpha1.AnnotationPlan: plan}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: *resource.NewQuantity(int64(len(uuids)), resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if terminating {
		now := metav1.Now()
		p.DeletionTimestamp = &now
		p.Finalizers = []string{"gpupack.io/checkpoint"} // the fake client keeps a deleted object only with a finalizer
	}
	return p
}

// planFor is a stored plan of workload wl: one slot per uuid.
func planFor(wl *kueue.Workload, uuids ...string) *v1alpha1.GPUPlan {
	p := &v1alpha1.GPUPlan{
		ObjectMeta: metav1.ObjectMeta{Name: wl.Name, Namespace: wl.Namespace},
		Spec:       v1alpha1.GPUPlanSpec{WorkloadName: wl.Name, WorkloadUID: wl.UID, PodCount: int32(len(uuids)), GPUCount: int32(len(uuids))},
		Status:     v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlanned},
	}
	for i, u := range uuids {
		node := u[:len(u)-3]
		p.Spec.Assignments = append(p.Spec.Assignments, v1alpha1.PodAssignment{PodSet: string(kueue.DefaultPodSetName), Index: int32(i), Node: node,
			GPUs: []v1alpha1.GPUAssignment{{UUID: u, MemoryMiB: 81559, Exclusive: true}}})
	}
	return p
}

type env struct {
	t   *testing.T
	c   client.Client
	r   *workloadReconciler
	rec *record.FakeRecorder
}

func newEnv(t *testing.T, objs ...client.Object) *env {
	t.Helper()
	s := testScheme(t)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(append([]client.Object{gangFitCheck()}, objs...)...).
		WithStatusSubresource(&kueue.Workload{}, &v1alpha1.GPUPlan{}, &kueue.AdmissionCheck{}).Build()
	rec := record.NewFakeRecorder(100)
	r := &workloadReconciler{client: c, planReader: c, recorder: rec, clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))}
	return &env{t: t, c: c, r: r, rec: rec}
}

// listCache is what a (re)started manager's informers deliver: a model
// listed from the API.
func listCache(t *testing.T, c client.Client) *gpucache.Cache {
	t.Helper()
	ctx := context.Background()
	gc := gpucache.New(nil)
	var nodes corev1.NodeList
	var pods corev1.PodList
	var plans v1alpha1.GPUPlanList
	if err := errors.Join(c.List(ctx, &nodes), c.List(ctx, &pods), c.List(ctx, &plans)); err != nil {
		t.Fatal(err)
	}
	for i := range nodes.Items {
		gc.UpsertNode(&nodes.Items[i])
	}
	for i := range pods.Items {
		gc.UpsertPod(&pods.Items[i])
	}
	for i := range plans.Items {
		gc.UpsertPlan(&plans.Items[i])
	}
	return gc
}

func (e *env) reconcile(wl *kueue.Workload) reconcile.Result {
	e.t.Helper()
	e.r.cache = listCache(e.t, e.c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(wl)})
	if err != nil {
		e.t.Fatalf("reconcile %s: %v", wl.Name, err)
	}
	return res
}

func (e *env) check(wl *kueue.Workload) kueue.AdmissionCheckState {
	e.t.Helper()
	cur := &kueue.Workload{}
	if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(wl), cur); err != nil {
		e.t.Fatal(err)
	}
	st := admissioncheck.FindAdmissionCheck(cur.Status.AdmissionChecks, testCheck)
	if st == nil {
		e.t.Fatalf("%s has no check state", wl.Name)
	}
	return *st
}

func (e *env) plan(name string) *v1alpha1.GPUPlan {
	p := &v1alpha1.GPUPlan{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, p); err != nil {
		return nil
	}
	return p
}

// Issue 17 item 2: workload "wl" was evicted and re-admitted; its new plan
// (same name) holds n1-g1, while its previous pod, still checkpointing,
// holds n1-g0 and names plan "wl" in gpupack.io/plan. Another workload
// asking for one GPU must wait for that pod, not be planned onto n1-g0.
func TestReadmittedPlanDoesNotHideTerminatingPods(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid-2", 1, 1).obj()
	wl.Status.AdmissionChecks[0].State = kueue.CheckStateReady
	other := admittedWorkload("other", "other-uid", 1, 1).obj()
	e := newEnv(t, gpuNode("n1", 2, nil), wl, planFor(wl, "n1-g1"),
		holderPod("wl-0-old", "old-pod-uid", "n1", "wl", true, "n1-g0"), other)
	e.reconcile(other)
	st := e.check(other)
	if st.State != kueue.CheckStatePending {
		p := e.plan("other")
		t.Fatalf("other: check %s (%q), plan %+v; want Pending until the old pod of wl is gone", st.State, st.Message, p)
	}
	if e.plan("other") != nil {
		t.Errorf("a plan was written for other onto GPUs still held")
	}
}

// cacheClient models the manager's cached client: a Get of a kind whose
// informer is not running (a JobSet, an MPIJob, any kind outside RBAC)
// blocks until the informer syncs, which it never does. It records such
// Gets; the test fails on any.
type cacheClient struct {
	client.Client
	watched map[string]bool
	blocked []string
}

func (c *cacheClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	gvk, err := c.Client.GroupVersionKindFor(obj)
	if err == nil && obj.GetObjectKind().GroupVersionKind().Kind != "" {
		gvk = obj.GetObjectKind().GroupVersionKind()
	}
	if err != nil || !c.watched[gvk.Kind] {
		c.blocked = append(c.blocked, gvk.String()+" "+key.String())
		<-ctx.Done() // the informer never syncs
		return ctx.Err()
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// ownerReader answers owner reads the way the API server does for kinds
// the manager cannot read.
type ownerReader struct {
	err   error
	block bool
	reads int
}

func (o *ownerReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	o.reads++
	if o.block {
		<-ctx.Done()
		return ctx.Err()
	}
	return o.err
}

func (o *ownerReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return fmt.Errorf("not used")
}

// Issue 17 item 1: a Workload owned by a kind the manager does not watch
// (JobSet, MPIJob, RayJob, TrainJob, LWS, AppWrapper) must be decided, and
// must not make the only worker wait on an informer that never syncs.
func TestOwnerOfUnwatchedKindNeverWedges(t *testing.T) {
	noKind := &metaNoKindMatch{}
	cases := []struct {
		name  string
		owner *ownerReader
	}{
		{"kind not installed", &ownerReader{err: noKind}},
		{"kind outside RBAC", &ownerReader{err: forbidden()}},
		{"API server slow", &ownerReader{block: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wl := admittedWorkload("js", "js-uid", 2, 1).ownedBy("jobset.x-k8s.io/v1alpha2", "JobSet", "js").obj()
			e := newEnv(t, gpuNode("n1", 2, nil), wl)
			cc := &cacheClient{Client: e.c, watched: map[string]bool{"Workload": true, "AdmissionCheck": true, "GangFitParameters": true,
				"ResourceFlavor": true, "GPUPlan": true, "Node": true, "Pod": true}}
			e.r.client, e.r.ownerReader, e.r.ownerTimeout = cc, tc.owner, 50*time.Millisecond
			e.r.cache = listCache(t, e.c)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := e.r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(wl)}); err != nil {
				t.Fatalf("reconcile: %v (cached Gets that would block for ever: %v)", err, cc.blocked)
			}
			if len(cc.blocked) > 0 {
				t.Errorf("cached Gets of unwatched kinds (block the worker for ever): %v", cc.blocked)
			}
			if st := e.check(wl); st.State != kueue.CheckStateReady {
				t.Errorf("check %s (%q), want Ready", st.State, st.Message)
			}
			if tc.owner.reads != 1 {
				t.Errorf("owner read %d times through the API reader, want 1", tc.owner.reads)
			}
		})
	}
}

type metaNoKindMatch = apimeta.NoKindMatchError

func forbidden() error {
	return apierrors.NewForbidden(schema.GroupResource{Group: "jobset.x-k8s.io", Resource: "jobsets"}, "js", fmt.Errorf("RBAC"))
}

// Issue 17 item 3: Kueue evicts the Workload while the decision runs. The
// Ready must not land on the evicted Workload, and the plan made for the
// lost reservation must not keep its GPUs.
func TestEvictedDuringDecisionIsNotMarkedReady(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
	var base client.Client
	evicted := false
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(gangFitCheck(), gpuNode("n1", 1, nil), wl).
		WithStatusSubresource(&kueue.Workload{}, &v1alpha1.GPUPlan{}).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if w, ok := obj.(*kueue.Workload); ok && !evicted {
				// Kueue's eviction lands just before our write.
				evicted = true
				cur := &kueue.Workload{}
				if err := base.Get(ctx, client.ObjectKeyFromObject(w), cur); err != nil {
					return err
				}
				apimeta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue, Reason: "Preempted"})
				apimeta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionFalse, Reason: "Pending"})
				cur.Status.Admission = nil
				cur.Status.AdmissionChecks[0].State = kueue.CheckStatePending
				if err := base.Status().Update(ctx, cur); err != nil {
					return err
				}
			}
			return cl.SubResource(sub).Update(ctx, obj, opts...)
		}}).Build()
	base = c
	e := &env{t: t, c: c, rec: record.NewFakeRecorder(100)}
	e.r = &workloadReconciler{client: c, planReader: c, recorder: e.rec, clock: clocktesting.NewFakeClock(time.Now())}
	e.reconcile(wl)
	if !evicted {
		t.Fatal("the eviction was never injected")
	}
	if st := e.check(wl); st.State == kueue.CheckStateReady {
		t.Errorf("Ready written onto an evicted Workload (%q)", st.Message)
	}
	if p := e.plan("wl"); p != nil {
		t.Errorf("plan of the lost reservation still stored: %+v", p.Spec.Assignments)
	}
}

// Issue 17 item 3: a Ready check whose plan is gone (deleted while the
// Workload was re-admitted) leaves pods gated for ever; the check heals it.
func TestReadyCheckWithLostPlanRetries(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
	wl.Status.AdmissionChecks[0].State = kueue.CheckStateReady
	wl.Status.AdmissionChecks[0].PodSetUpdates = []kueue.PodSetUpdate{{Name: kueue.DefaultPodSetName, Annotations: map[string]string{v1alpha1.AnnotationPlan: "wl"}}}
	old := admittedWorkload("wl", "earlier-uid", 1, 1).obj() // a plan of an earlier workload of the same name
	for _, tc := range []struct {
		name  string
		plans []client.Object
		want  kueue.CheckState
	}{
		{"plan deleted", nil, kueue.CheckStateRetry},
		{"plan of an earlier workload", []client.Object{planFor(old, "n1-g0")}, kueue.CheckStateRetry},
		{"plan present", []client.Object{planFor(wl, "n1-g0")}, kueue.CheckStateReady},
		{"planned node gone before its pod bound", []client.Object{planFor(wl, "n2-g0")}, kueue.CheckStateRetry},
		{"planned node gone after its pod bound", []client.Object{func() client.Object {
			p := planFor(wl, "n2-g0")
			p.Status.Bindings = []v1alpha1.SlotBinding{{PodSet: "main", Index: 0, PodName: "wl-0", PodUID: "u"}}
			return p
		}()}, kueue.CheckStateReady},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, append(tc.plans, gpuNode("n1", 1, nil), wl.DeepCopy())...)
			e.reconcile(wl)
			if st := e.check(wl); st.State != tc.want {
				t.Errorf("check %s (%q), want %s", st.State, st.Message, tc.want)
			}
		})
	}
}

// Issue 17 item 8: the check's lastTransitionTime is when it got its
// current state, not when it became Pending.
func TestLastTransitionTimeIsTheStateChange(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
	e := newEnv(t, gpuNode("n1", 1, nil), wl)
	e.reconcile(wl)
	st := e.check(wl)
	want := e.r.clock.Now()
	if st.State != kueue.CheckStateReady || !st.LastTransitionTime.Time.Equal(want) {
		t.Errorf("check %s at %v, want Ready at %v (the Pending time was %v)", st.State, st.LastTransitionTime, want, wl.Status.AdmissionChecks[0].LastTransitionTime)
	}
}

// Issue 17 item 4: Rejected deactivates the Workload, so only an inventory
// that is complete may prove a gang never fits.
func TestRejectedOnlyOnCompleteInventory(t *testing.T) {
	unpublished := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "fresh"}, Status: corev1.NodeStatus{
		Capacity:   corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("8")},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	skewed := gpuNode("skewed", 8, nil)
	skewed.Annotations[v1alpha1.AnnotationGPUs] = `[{"uuid":"s-0","index":0,"model":"H100","memoryMiB":81559,"health":"Healthy","mig":{"mode":"x"}}]`
	unknownModel := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b300", Labels: map[string]string{"nvidia.com/gpu.product": "NVIDIA-B300-SXM6", "nvidia.com/gpu.count": "8"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	cases := []struct {
		name    string
		nodes   []client.Object
		want    kueue.CheckState
		wantMsg string
	}{
		{"no GPU node at all (fresh install, scale from zero)", nil, kueue.CheckStateRetry, "no node has published a GPU inventory yet"},
		{"a node advertises GPUs but has no inventory yet", []client.Object{gpuNode("n1", 2, nil), unpublished}, kueue.CheckStateRetry, "node fresh has 8 nvidia.com/gpu but no inventory yet"},
		{"a node's inventory fails strict parsing (version skew)", []client.Object{gpuNode("n1", 2, nil), skewed}, kueue.CheckStateRetry, "node skewed ignored"},
		{"a GPU model without a profile", []client.Object{gpuNode("n1", 2, nil), unknownModel}, kueue.CheckStateRetry, "NVIDIA-B300-SXM6"},
		{"complete inventory that can never hold 4 GPUs per pod", []client.Object{gpuNode("n1", 2, nil), gpuNode("n2", 2, nil)}, kueue.CheckStateRejected, "never fit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wl := admittedWorkload("wl", "wl-uid", 1, 4).obj()
			e := newEnv(t, append(tc.nodes, wl)...)
			e.reconcile(wl)
			st := e.check(wl)
			if st.State != tc.want || !strings.Contains(st.Message, tc.wantMsg) {
				t.Errorf("check %s (%q), want %s with %q", st.State, st.Message, tc.want, tc.wantMsg)
			}
		})
	}
}

// Issue 17 item 7: the check removed from the ClusterQueue (Kueue drops it
// from the Workload) must not leave the plan reserving GPUs.
func TestPlanReleasedWhenCheckLeavesClusterQueue(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
	wl.Status.AdmissionChecks = nil
	e := newEnv(t, gpuNode("n1", 1, nil), wl, planFor(wl, "n1-g0"))
	e.reconcile(wl)
	if p := e.plan("wl"); p != nil {
		t.Errorf("plan still stored after the check left the ClusterQueue")
	}
}

// Issue 17 item 7: pods Kueue counts as reclaimable need no GPUs.
func TestReclaimablePodsNeedNoGPUs(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 3, 1).obj()
	wl.Status.ReclaimablePods = []kueue.ReclaimablePod{{Name: kueue.DefaultPodSetName, Count: 1}}
	e := newEnv(t, gpuNode("n1", 2, nil), wl)
	e.reconcile(wl)
	if st := e.check(wl); st.State != kueue.CheckStateReady {
		t.Fatalf("check %s (%q), want Ready: 2 of 3 pods still need GPUs and 2 are free", st.State, st.Message)
	}
	if p := e.plan("wl"); p == nil || len(p.Spec.Assignments) != 2 {
		t.Errorf("plan %+v, want 2 slots", p)
	}
}

// Issue 17 item 7: a stored plan is reused only while it matches the
// admission (a re-admission with another count, or onto another flavor,
// is planned afresh).
func TestStoredPlanCheckedAgainstAdmission(t *testing.T) {
	cases := []struct {
		name      string
		pods      int32
		selector  map[string]string
		wantSlots int
		wantNode  string
	}{
		{"same admission reuses the plan", 1, nil, 1, "n1"},
		{"count changed", 2, nil, 2, ""},
		{"flavor moved to other nodes", 1, map[string]string{"pool": "b"}, 1, "n2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wl := admittedWorkload("wl", "wl-uid", tc.pods, 1).obj()
			wl.Spec.PodSets[0].Template.Spec.NodeSelector = tc.selector
			e := newEnv(t, gpuNode("n1", 1, map[string]string{"pool": "a"}), gpuNode("n2", 1, map[string]string{"pool": "b"}), wl,
				planFor(admittedWorkload("wl", "wl-uid", 1, 1).obj(), "n1-g0"))
			e.reconcile(wl)
			if st := e.check(wl); st.State != kueue.CheckStateReady {
				t.Fatalf("check %s (%q)", st.State, st.Message)
			}
			p := e.plan("wl")
			if p == nil || len(p.Spec.Assignments) != tc.wantSlots || (tc.wantNode != "" && p.Spec.Assignments[0].Node != tc.wantNode) {
				t.Errorf("plan %+v, want %d slot(s) on %q", p, tc.wantSlots, tc.wantNode)
			}
		})
	}
}

// Issue 17 item 6: a TopologyAssignment from Kueue TAS is refused, saying
// why, instead of planning other GPUs beside it.
func TestTopologyAssignmentIsRefusedClearly(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
	wl.Status.Admission.PodSetAssignments[0].TopologyAssignment = &kueue.TopologyAssignment{Levels: []string{"kubernetes.io/hostname"}}
	e := newEnv(t, gpuNode("n1", 1, nil), wl)
	e.reconcile(wl)
	if st := e.check(wl); st.State != kueue.CheckStateRejected || !strings.Contains(st.Message, "TopologyAssignment") {
		t.Errorf("check %s (%q), want Rejected naming the TopologyAssignment", st.State, st.Message)
	}
	if e.plan("wl") != nil {
		t.Error("a plan was written beside Kueue's topology assignment")
	}
}

// Issue 17 item 7: Pending (which holds the quota) has a limit: a pod stuck
// terminating does not hold the quota for ever.
func TestPendingOnTerminatingPodsIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waited  time.Duration
		want    kueue.CheckState
		wantMsg string
	}{
		{"within the limit", time.Minute, kueue.CheckStatePending, "waiting for GPUs held by 1 terminating pod"},
		{"past the limit", maxPendingOnTerminating + time.Minute, kueue.CheckStateRetry, "waited more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
			e := newEnv(t, gpuNode("n1", 1, nil), wl, holderPod("old", "old-uid", "n1", "", true, "n1-g0"))
			wl.Status.AdmissionChecks[0].LastTransitionTime = metav1.NewTime(e.r.clock.Now().Add(-tc.waited))
			if err := e.c.Status().Update(context.Background(), wl); err != nil {
				t.Fatal(err)
			}
			e.reconcile(wl)
			if st := e.check(wl); st.State != tc.want || !strings.Contains(st.Message, tc.wantMsg) {
				t.Errorf("check %s (%q), want %s with %q", st.State, st.Message, tc.want, tc.wantMsg)
			}
		})
	}
}
