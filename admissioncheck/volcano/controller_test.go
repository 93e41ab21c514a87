package volcano

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanoscheduling "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(kueue.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	utilruntime.Must(volcanoscheduling.AddToScheme(s))
	return s
}

type fixture struct {
	client client.Client
	r      *reconciler
	clock  *clocktesting.FakeClock
	wl     *kueue.Workload
}

var t0 = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)

// newFixture stores a gang-fit check with parameters (queue "gpu", patience
// 60 s, levels spine/leaf), the workload, its plan at leaf, and extra objects.
func newFixture(t *testing.T, wl *kueue.Workload, objs ...client.Object) *fixture {
	t.Helper()
	p := params(func(s *v1alpha1.GangFitParametersSpec) {
		s.TopologyLevels = []string{spine, leaf}
		s.Volcano = &v1alpha1.VolcanoSettings{Queue: "gpu", UnschedulablePatienceSeconds: ptr.To[int32](60)}
	})
	ac := &kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: "gang-fit"}, Spec: kueue.AdmissionCheckSpec{
		ControllerName: v1alpha1.ControllerName,
		Parameters:     &kueue.AdmissionCheckParametersReference{APIGroup: v1alpha1.GroupName, Kind: "GangFitParameters", Name: p.Name},
	}}
	plan := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Name: wl.Name, Namespace: wl.Namespace},
		Spec: v1alpha1.GPUPlanSpec{WorkloadName: wl.Name, WorkloadUID: wl.UID, Level: leaf, Domain: "l1"}}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).
		WithStatusSubresource(&kueue.Workload{}).
		WithObjects(append([]client.Object{p, ac, plan, wl}, objs...)...).Build()
	clk := clocktesting.NewFakeClock(t0)
	return &fixture{client: c, clock: clk, wl: wl,
		r: &reconciler{client: c, apiReader: c, recorder: record.NewFakeRecorder(100), clock: clk}}
}

func (f *fixture) reconcile(t *testing.T) reconcile.Result {
	t.Helper()
	res, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(f.wl)})
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return res
}

func (f *fixture) podGroup(t *testing.T) *volcanoscheduling.PodGroup {
	t.Helper()
	var pg volcanoscheduling.PodGroup
	err := f.client.Get(context.Background(), client.ObjectKey{Namespace: f.wl.Namespace, Name: f.wl.Name}, &pg)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &pg
}

func (f *fixture) check(t *testing.T) kueue.AdmissionCheckState {
	t.Helper()
	var wl kueue.Workload
	if err := f.client.Get(context.Background(), client.ObjectKeyFromObject(f.wl), &wl); err != nil {
		t.Fatal(err)
	}
	return wl.Status.AdmissionChecks[0]
}

func admittedGang(name string) *wlWrapper {
	return makeWL(name).
		podSet("master", 1, rl("cpu", "1", gpu, "2")).scheduler(SchedulerName).
		podSet("worker", 3, rl("cpu", "1", gpu, "2")).scheduler(SchedulerName).
		admitted(nil).check("gang-fit", kueue.CheckStateReady, t0.Add(-time.Minute))
}

func TestReconcileCreatesOnePodGroupAndQueue(t *testing.T) {
	f := newFixture(t, admittedGang("wl").obj())
	f.reconcile(t)
	pg := f.podGroup(t)
	if pg == nil {
		t.Fatal("no PodGroup")
	}
	if pg.Spec.MinMember != 4 || pg.Spec.Queue != "gpu" || pg.Spec.NetworkTopology == nil || *pg.Spec.NetworkTopology.HighestTierAllowed != 1 {
		t.Fatalf("PodGroup spec %+v (leaf is tier 1 of spine/leaf)", pg.Spec)
	}
	var q volcanoscheduling.Queue
	if err := f.client.Get(context.Background(), client.ObjectKey{Name: "gpu"}, &q); err != nil {
		t.Fatalf("queue not created: %v", err)
	}
	if len(q.Spec.Capability) != 0 || ptr.Deref(q.Spec.Reclaimable, true) {
		t.Fatalf("queue %+v: want no capability, not reclaimable", q.Spec)
	}
	// Level-triggered and idempotent: a second run writes nothing.
	rv := pg.ResourceVersion
	f.reconcile(t)
	if got := f.podGroup(t).ResourceVersion; got != rv {
		t.Fatalf("second reconcile rewrote the PodGroup (rv %s → %s)", rv, got)
	}
}

func TestReconcileDeletes(t *testing.T) {
	for _, tc := range []struct {
		name string
		wl   *kueue.Workload
	}{
		{"finished", admittedGang("wl").cond(kueue.WorkloadFinished, true).obj()},
		{"evicted", admittedGang("wl").cond(kueue.WorkloadEvicted, true).obj()},
		{"deactivated", func() *kueue.Workload { w := admittedGang("wl").obj(); w.Spec.Active = ptr.To(false); return w }()},
		{"quota released", admittedGang("wl").cond(kueue.WorkloadQuotaReserved, false).obj()},
		{"check no longer Ready", func() *kueue.Workload {
			w := admittedGang("wl").obj()
			w.Status.AdmissionChecks[0].State = kueue.CheckStatePending
			return w
		}()},
		{"not under Volcano", makeWL("wl").podSet("main", 2, rl(gpu, "1")).admitted(nil).check("gang-fit", kueue.CheckStateReady, t0).obj()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			existing := Build(tc.wl, nil, "")
			f := newFixture(t, tc.wl, existing)
			f.reconcile(t)
			if pg := f.podGroup(t); pg != nil {
				t.Fatalf("PodGroup kept: %+v", pg.Spec)
			}
		})
	}
}

func TestReconcileLeavesForeignPodGroups(t *testing.T) {
	wl := admittedGang("wl").obj()
	foreign := &volcanoscheduling.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: wl.Name, Namespace: wl.Namespace},
		Spec: volcanoscheduling.PodGroupSpec{MinMember: 1, Queue: "other"}}
	f := newFixture(t, wl, foreign)
	f.reconcile(t)
	if pg := f.podGroup(t); pg == nil || pg.Spec.Queue != "other" || pg.Spec.MinMember != 1 {
		t.Fatalf("foreign PodGroup changed: %+v", pg)
	}
	// Finishing never deletes a PodGroup gpupack did not make.
	done := admittedGang("wl").cond(kueue.WorkloadFinished, true).obj()
	f = newFixture(t, done, foreign.DeepCopy())
	f.reconcile(t)
	if f.podGroup(t) == nil {
		t.Fatal("foreign PodGroup deleted")
	}
}

func TestReconcileReplacesPodGroupOfEarlierWorkload(t *testing.T) {
	old := admittedGang("wl").obj()
	old.UID = "uid-of-an-earlier-wl"
	wl := admittedGang("wl").obj()
	f := newFixture(t, wl, Build(old, nil, ""))
	if _, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(wl)}); err == nil {
		t.Fatal("want an error to retry after deleting the stale PodGroup")
	}
	f.reconcile(t)
	pg := f.podGroup(t)
	if pg == nil || metav1.GetControllerOf(pg).UID != wl.UID {
		t.Fatalf("PodGroup not replaced: %+v", pg)
	}
}

func TestReconcileUnschedulableTurnsCheckToRetry(t *testing.T) {
	f := newFixture(t, admittedGang("wl").obj())
	f.reconcile(t)
	pg := f.podGroup(t)
	// Volcano says Unschedulable, refreshing the time every cycle.
	pg.Status.Phase = volcanoscheduling.PodGroupPending
	pg.Status.Conditions = []volcanoscheduling.PodGroupCondition{{Type: volcanoscheduling.PodGroupUnschedulableType,
		Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0), Reason: "NotEnoughResources", Message: "4/4 tasks in gang unschedulable"}}
	if err := f.client.Update(context.Background(), pg); err != nil {
		t.Fatal(err)
	}
	res := f.reconcile(t)
	if res.RequeueAfter != time.Minute {
		t.Fatalf("requeue after %v, want the full patience", res.RequeueAfter)
	}
	if got := f.podGroup(t).Annotations[AnnotationUnschedulableSince]; got != t0.Format(time.RFC3339) {
		t.Fatalf("unschedulable-since %q", got)
	}
	if st := f.check(t); st.State != kueue.CheckStateReady {
		t.Fatalf("check %s before the patience ran out", st.State)
	}

	f.clock.Step(61 * time.Second)
	pg = f.podGroup(t)
	pg.Status.Conditions[0].LastTransitionTime = metav1.NewTime(f.clock.Now()) // a later cycle
	if err := f.client.Update(context.Background(), pg); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	st := f.check(t)
	if st.State != kueue.CheckStateRetry || !strings.Contains(st.Message, "NotEnoughResources: 4/4 tasks in gang unschedulable") || st.RequeueAfterSeconds == nil {
		t.Fatalf("check %+v, want Retry with Volcano's message and a requeue delay", st)
	}
	if st.PodSetUpdates != nil {
		t.Fatalf("Retry keeps podSetUpdates %+v", st.PodSetUpdates)
	}

	// Schedulable again (before the patience): the record is cleared.
	f2 := newFixture(t, admittedGang("wl").obj())
	f2.reconcile(t)
	pg = f2.podGroup(t)
	pg.Annotations = map[string]string{AnnotationUnschedulableSince: t0.Format(time.RFC3339)}
	pg.Status.Phase = volcanoscheduling.PodGroupRunning
	if err := f2.client.Update(context.Background(), pg); err != nil {
		t.Fatal(err)
	}
	f2.reconcile(t)
	if _, ok := f2.podGroup(t).Annotations[AnnotationUnschedulableSince]; ok {
		t.Fatal("unschedulable-since kept on a running gang")
	}
	if st := f2.check(t); st.State != kueue.CheckStateReady {
		t.Fatalf("running gang's check turned %s", st.State)
	}
}
