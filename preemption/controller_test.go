package preemption

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/policy"
)

var t0 = time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)

func testScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(kueue.AddToScheme(s))
	utilruntime.Must(kftraining.AddToScheme(s))
	utilruntime.Must(jobset.AddToScheme(s))
	utilruntime.Must(lws.AddToScheme(s))
	// Trainer v2's TrainJob, metadata only (its API module is not needed).
	s.AddKnownTypeWithName(gvkTrainJob, &metav1.PartialObjectMetadata{})
	s.AddKnownTypeWithName(gvkTrainJob.GroupVersion().WithKind("TrainJobList"), &metav1.PartialObjectMetadataList{})
	return s
}

const jobUID = types.UID("job-uid")

func job() *kftraining.PyTorchJob {
	return &kftraining.PyTorchJob{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ns", UID: jobUID,
		Annotations: map[string]string{v1alpha1.AnnotationCheckpointTimeout: "2m"}}}
}

func workload(conds ...metav1.Condition) *kueue.Workload {
	return &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Name: "pytorchjob-train", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: kftraining.SchemeGroupVersion.String(), Kind: kftraining.PyTorchJobKind, Name: "train", UID: jobUID, Controller: ptr.To(true),
		}}},
		Status: kueue.WorkloadStatus{Conditions: conds},
	}
}

func preempted() metav1.Condition {
	return metav1.Condition{Type: kueue.WorkloadPreempted, Status: metav1.ConditionTrue, Reason: "InClusterQueue", LastTransitionTime: metav1.NewTime(t0)}
}

func rankPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Annotations:     map[string]string{v1alpha1.AnnotationCheckpoint: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob", Name: "train", UID: jobUID, Controller: ptr.To(true)}}},
		Spec:   corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](90)},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

type harness struct {
	t      *testing.T
	c      client.Client
	rec    *events.FakeRecorder
	clock  time.Time
	policy policy.Policy
	events []string
	wlName string // default pytorchjob-train
}

func (h *harness) wlKey() types.NamespacedName {
	if h.wlName == "" {
		return types.NamespacedName{Namespace: "ns", Name: "pytorchjob-train"}
	}
	return types.NamespacedName{Namespace: "ns", Name: h.wlName}
}

func newHarness(t *testing.T, objs ...client.Object) *harness {
	c := fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(objs...).WithStatusSubresource(&kueue.Workload{}, &corev1.Pod{}).
		WithIndex(&corev1.Pod{}, indexPodController, func(o client.Object) []string {
			if ref := metav1.GetControllerOf(o); ref != nil {
				return []string{string(ref.UID)}
			}
			return nil
		}).
		WithIndex(&corev1.Pod{}, indexPodGroup, podGroupOf).
		WithIndex(&corev1.Pod{}, indexPodUID, podUIDOf).
		WithIndex(&kueue.Workload{}, indexWorkloadOwnerUID, func(o client.Object) []string {
			var uids []string
			for _, r := range o.GetOwnerReferences() {
				uids = append(uids, string(r.UID))
			}
			return uids
		}).Build()
	return &harness{t: t, c: c, rec: events.NewFakeRecorder(100), clock: t0}
}

// reconcile runs one reconcile with a fresh Reconciler, as a restarted
// manager would: nothing is carried over in memory.
func (h *harness) reconcile() reconcile.Result {
	h.t.Helper()
	r := &Reconciler{client: h.c, recorder: h.rec, now: func() time.Time { return h.clock },
		policy: h.policy,
		cfg:    ladder.Config{DefaultCheckpointTimeout: time.Minute, DefaultGrace: 30 * time.Second, Slack: 10 * time.Second, MaxStepsPerRank: 8}}
	res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: h.wlKey()})
	if err != nil {
		h.t.Fatalf("Reconcile: %v", err)
	}
	for {
		select {
		case e := <-h.rec.Events:
			f := strings.Fields(e)
			h.events = append(h.events, f[1])
			continue
		default:
		}
		break
	}
	return res
}

func (h *harness) state() ladder.State {
	h.t.Helper()
	var wl kueue.Workload
	if err := h.c.Get(context.Background(), h.wlKey(), &wl); err != nil {
		h.t.Fatal(err)
	}
	st, err := PreemptionRecord(context.Background(), h.c, &wl)
	if err != nil {
		h.t.Fatal(err)
	}
	return st
}

func (h *harness) pod(name string) *corev1.Pod {
	var p corev1.Pod
	if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, &p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		h.t.Fatal(err)
	}
	return &p
}

func (h *harness) annotatePod(name, k, v string) {
	h.t.Helper()
	p := h.pod(name)
	p.Annotations[k] = v
	if err := h.c.Update(context.Background(), p); err != nil {
		h.t.Fatal(err)
	}
}

func TestReconcileWalksTheLadder(t *testing.T) {
	h := newHarness(t, job(), workload(preempted()), rankPod("w0"), rankPod("w1"))
	savedBefore, goneBefore := gathered(t)

	// Eviction seen: both ranks asked, deadline from the job's 2m.
	res := h.reconcile()
	st := h.state()
	if st.Phase != ladder.PhaseCheckpointing || !st.CheckpointDeadline.Equal(t0.Add(2*time.Minute)) || st.Reason != ReasonKueuePreempted {
		t.Fatalf("state after eviction = %+v", st)
	}
	if res.RequeueAfter != 2*time.Minute {
		t.Errorf("requeue after %v, want the checkpoint deadline 2m", res.RequeueAfter)
	}
	req0 := h.pod("w0").Annotations[v1alpha1.AnnotationCheckpointRequest]
	if req0 != t0.Format(time.RFC3339) || h.pod("w1").Annotations[v1alpha1.AnnotationCheckpointRequest] == "" {
		t.Fatalf("checkpoint not requested on both ranks: %q", req0)
	}

	// A restarted manager, later: same phase, no new request.
	h.clock = t0.Add(30 * time.Second)
	h.reconcile()
	if got := h.state(); got.Phase != ladder.PhaseCheckpointing || len(got.Transitions) != 1 {
		t.Fatalf("restart changed the phase: %+v", got)
	}
	if got := h.pod("w0").Annotations[v1alpha1.AnnotationCheckpointRequest]; got != req0 {
		t.Errorf("restart re-requested: %q → %q", req0, got)
	}

	// Both agents report; rank 1 also lists an older verified step in its
	// termination message.
	h.annotatePod("w0", v1alpha1.AnnotationCheckpointStep, "120")
	p := h.pod("w1")
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "pytorch", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		Message: `{"checkpointStep":120,"verifiedSteps":[120,100],"outcome":"Saved","exitCode":0}`}}}}
	if err := h.c.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	h.clock = t0.Add(40 * time.Second)
	h.reconcile()
	st = h.state()
	if st.Phase != ladder.PhaseTerminating || st.LastConsistentStep == nil || *st.LastConsistentStep != 120 {
		t.Fatalf("state after reports = %+v", st)
	}
	if h.pod("w0") != nil || h.pod("w1") != nil {
		t.Errorf("pods not deleted in Terminating")
	}
	var j kftraining.PyTorchJob
	h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "train"}, &j)
	if got := j.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != "120" {
		t.Errorf("job %s = %q, want 120", v1alpha1.AnnotationLastConsistentCheckpoint, got)
	}

	// Pods gone: Done.
	h.clock = t0.Add(45 * time.Second)
	h.reconcile()
	st = h.state()
	if st.Phase != ladder.PhaseDone {
		t.Fatalf("phase %s, want Done", st.Phase)
	}
	var phases []ladder.Phase
	for _, tr := range st.Transitions {
		phases = append(phases, tr.Phase)
	}
	if diff := cmp.Diff([]ladder.Phase{ladder.PhaseCheckpointing, ladder.PhaseTerminating, ladder.PhaseDone}, phases); diff != "" {
		t.Errorf("transitions (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{EventCheckpointing, EventConsistentStep, EventTerminating, EventDone}, h.events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	savedAfter, goneAfter := gathered(t)
	if got := savedAfter - savedBefore; got != 2 {
		t.Errorf("saved outcomes counted %v, want 2", got)
	}
	if got := goneAfter - goneBefore; got != 1 {
		t.Errorf("eviction-to-gone observations %d, want 1", got)
	}

	// Re-admitted: the record goes.
	var wl kueue.Workload
	h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "pytorchjob-train"}, &wl)
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadPreempted, Status: metav1.ConditionFalse, Reason: "QuotaReserved"})
	if err := h.c.Status().Update(context.Background(), &wl); err != nil {
		t.Fatal(err)
	}
	h.reconcile()
	h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "pytorchjob-train"}, &wl)
	if _, ok := wl.Annotations[v1alpha1.AnnotationPreemptionPhase]; ok {
		t.Errorf("preemption record kept after re-admission")
	}
}

// gathered reads, from the manager's registry, the Saved outcome counter
// and the eviction-to-gone histogram's sample count.
func gathered(t *testing.T) (saved float64, gone uint64) {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "gpupack_preemption_checkpoint_outcomes_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" && l.GetValue() == ladder.OutcomeSaved {
						saved = m.GetCounter().GetValue()
					}
				}
			case "gpupack_preemption_eviction_to_gone_seconds":
				gone = m.GetHistogram().GetSampleCount()
			}
		}
	}
	return saved, gone
}

func TestReconcileEscalatesToForceDelete(t *testing.T) {
	stuck := rankPod("w0")
	stuck.Finalizers = []string{"test/hold"} // a node that never confirms
	h := newHarness(t, job(), workload(preempted()), stuck)
	h.reconcile() // Checkpointing
	h.clock = t0.Add(2 * time.Minute)
	h.reconcile() // timeout → Terminating, graceful delete
	st := h.state()
	if st.Phase != ladder.PhaseTerminating || st.Outcomes["uid-w0"] != ladder.OutcomeTimedOut {
		t.Fatalf("state = %+v", st)
	}
	if p := h.pod("w0"); p == nil || p.DeletionTimestamp == nil {
		t.Fatalf("pod not gracefully deleted: %+v", p)
	}
	h.clock = t0.Add(2*time.Minute + 90*time.Second + 10*time.Second)
	h.reconcile()
	if st := h.state(); st.Phase != ladder.PhaseKilling || st.Outcomes["uid-w0"] != ladder.OutcomeKilled {
		t.Fatalf("state after grace + slack = %+v", st)
	}
	// The finalizer goes (the node answered, or an admin), the pod is gone.
	p := h.pod("w0")
	p.Finalizers = nil
	h.c.Update(context.Background(), p)
	h.reconcile()
	if st := h.state(); st.Phase != ladder.PhaseDone || st.LastConsistentStep != nil {
		t.Fatalf("state = %+v, want Done with no consistent step", st)
	}
}

func TestReconcileIgnoresHealthyWorkloads(t *testing.T) {
	h := newHarness(t, job(), workload(), rankPod("w0"))
	h.reconcile()
	var wl kueue.Workload
	h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: "pytorchjob-train"}, &wl)
	if len(wl.Annotations) != 0 || h.pod("w0").Annotations[v1alpha1.AnnotationCheckpointRequest] != "" {
		t.Errorf("a workload nobody evicted was touched: %v", wl.Annotations)
	}
}

func TestEvictedBy(t *testing.T) {
	disrupted := rankPod("d")
	disrupted.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}
	drained := rankPod("e")
	drained.Annotations[v1alpha1.AnnotationCheckpointRequest] = "2026-11-30T05:00:00Z"
	notOpted := disrupted.DeepCopy()
	delete(notOpted.Annotations, v1alpha1.AnnotationCheckpoint)
	doneDisrupted := disrupted.DeepCopy()
	doneDisrupted.Status.Phase = corev1.PodSucceeded
	cases := map[string]struct {
		wl     *kueue.Workload
		pods   []corev1.Pod
		want   string
		wantOK bool
	}{
		"healthy":          {wl: workload(), pods: []corev1.Pod{*rankPod("a")}},
		"kueue preempted":  {wl: workload(preempted()), want: ReasonKueuePreempted, wantOK: true},
		"kueue evicted":    {wl: workload(metav1.Condition{Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue}), want: ReasonKueueEvicted, wantOK: true},
		"evicted false":    {wl: workload(metav1.Condition{Type: kueue.WorkloadEvicted, Status: metav1.ConditionFalse})},
		"disrupted pod":    {wl: workload(), pods: []corev1.Pod{*rankPod("a"), *disrupted}, want: ReasonDisruptionTarget, wantOK: true},
		"finished pod":     {wl: workload(), pods: []corev1.Pod{*doneDisrupted}},
		"not opted in":     {wl: workload(), pods: []corev1.Pod{*notOpted}},
		"drain held a pod": {wl: workload(), pods: []corev1.Pod{*drained}, want: ReasonEviction, wantOK: true},
	}
	deleted := rankPod("k")
	deleted.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
	deleted.Finalizers = []string{"x"}
	onLost := rankPod("l")
	onLost.Spec.NodeName = "lost"
	onGood := rankPod("g")
	onGood.Spec.NodeName = "good"
	finishedWl := workload(metav1.Condition{Type: kueue.WorkloadFinished, Status: metav1.ConditionTrue})
	cases["kubectl delete pod"] = struct {
		wl     *kueue.Workload
		pods   []corev1.Pod
		want   string
		wantOK bool
	}{wl: workload(), pods: []corev1.Pod{*deleted}, want: ReasonPodDeleted, wantOK: true}
	cases["node NotReady"] = struct {
		wl     *kueue.Workload
		pods   []corev1.Pod
		want   string
		wantOK bool
	}{wl: workload(), pods: []corev1.Pod{*onGood, *onLost}, want: ReasonNodeNotReady, wantOK: true}
	cases["node Ready"] = struct {
		wl     *kueue.Workload
		pods   []corev1.Pod
		want   string
		wantOK bool
	}{wl: workload(), pods: []corev1.Pod{*onGood}}
	cases["finished workload: its pods' deletions are no eviction"] = struct {
		wl     *kueue.Workload
		pods   []corev1.Pod
		want   string
		wantOK bool
	}{wl: finishedWl, pods: []corev1.Pod{*deleted}}
	ready := func(n string) bool { return n == "good" }
	for name, tc := range cases {
		got, ok := evictedBy(tc.wl, tc.pods, true, ready)
		if got.Reason != tc.want || ok != tc.wantOK {
			t.Errorf("%s: evictedBy = %q %v, want %q %v", name, got.Reason, ok, tc.want, tc.wantOK)
		}
		kueueLevel := tc.want == ReasonKueuePreempted || tc.want == ReasonKueueEvicted
		if ok && got.PodLevel == kueueLevel {
			t.Errorf("%s: PodLevel %v", name, got.PodLevel)
		}
		// Without pod triggers (Done, job going away) only Kueue counts.
		if got, ok := evictedBy(tc.wl, tc.pods, false, ready); ok != (tc.wantOK && kueueLevel) {
			t.Errorf("%s: without pod triggers evictedBy = %+v %v", name, got, ok)
		}
	}
}

func TestReportedSteps(t *testing.T) {
	term := func(msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: msg}}}
	}
	cases := map[string]struct {
		ann          map[string]string
		statuses     []corev1.ContainerStatus
		wantSteps    []int64
		wantReported bool
	}{
		"nothing":              {},
		"annotation":           {ann: map[string]string{v1alpha1.AnnotationCheckpointStep: "42"}, wantSteps: []int64{42}, wantReported: true},
		"bad annotation":       {ann: map[string]string{v1alpha1.AnnotationCheckpointStep: "-3"}},
		"report saved":         {statuses: []corev1.ContainerStatus{term(`{"checkpointStep":9,"verifiedSteps":[9,8],"outcome":"Saved","exitCode":0}`)}, wantSteps: []int64{9, 9, 8}, wantReported: true},
		"report timed out":     {statuses: []corev1.ContainerStatus{term(`{"verifiedSteps":[8],"outcome":"TimedOut","exitCode":143}`)}, wantSteps: []int64{8}},
		"someone else's words": {statuses: []corev1.ContainerStatus{term(`segfault`)}},
	}
	for name, tc := range cases {
		p := rankPod("p")
		for k, v := range tc.ann {
			p.Annotations[k] = v
		}
		p.Status.ContainerStatuses = tc.statuses
		steps, reported := reportedSteps(p)
		if diff := cmp.Diff(tc.wantSteps, steps); diff != "" || reported != tc.wantReported {
			t.Errorf("%s: steps (-want +got):\n%s reported %v, want %v", name, diff, reported, tc.wantReported)
		}
	}
}

func TestLoadStateRejectsGarbage(t *testing.T) {
	for _, raw := range []string{`{`, `{"phase":"Sleeping"}`, `{"phase":"Checkpointing"}`} {
		if _, err := loadState(map[string]string{v1alpha1.AnnotationPreemptionPhase: raw}); err == nil {
			t.Errorf("loadState(%s) accepted", raw)
		}
	}
}

func quotaReserved() metav1.Condition {
	return metav1.Condition{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionTrue, Reason: "QuotaReserved", LastTransitionTime: metav1.NewTime(t0)}
}

func (h *harness) workload() *kueue.Workload {
	h.t.Helper()
	var wl kueue.Workload
	if err := h.c.Get(context.Background(), h.wlKey(), &wl); err != nil {
		h.t.Fatal(err)
	}
	return &wl
}

// The cluster's cap wins over the tenant's longer annotation, and the
// request carries the resulting deadline for the agent.
func TestReconcilePolicyCapWinsOverTenant(t *testing.T) {
	j := job()
	j.Annotations[v1alpha1.AnnotationCheckpointTimeout] = "2h"
	wl := workload(preempted())
	wl.Spec.PriorityClassRef = kueue.NewWorkloadPriorityClassRef("low")
	h := newHarness(t, j, wl, rankPod("w0"))
	h.policy = policy.Policy{Max: time.Hour, MaxByPriorityClass: map[string]time.Duration{"low": 3 * time.Minute}}
	h.reconcile()
	st := h.state()
	if st.Phase != ladder.PhaseCheckpointing || !st.CheckpointDeadline.Equal(t0.Add(3*time.Minute)) {
		t.Fatalf("state %+v, want Checkpointing until t0+3m (the class cap, not the tenant's 2h)", st)
	}
	if got := h.pod("w0").Annotations[policy.AnnotationCheckpointDeadline]; got != t0.Add(3*time.Minute).Format(time.RFC3339) {
		t.Errorf("request's deadline %q, want t0+3m", got)
	}
	if diff := cmp.Diff([]string{EventPolicyCapped, EventCheckpointing}, h.events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// A pod-level trigger (here a DisruptionTarget) on a workload Kueue still
// admits evicts the whole Workload through Kueue's Evicted condition
// (once), and the protocol runs to Done with its results recorded.
func TestPodLevelTriggerEvictsTheWorkloadThroughKueue(t *testing.T) {
	d := rankPod("w0")
	d.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI"}}
	h := newHarness(t, job(), workload(quotaReserved()), d, rankPod("w1"))
	h.reconcile()
	wl := h.workload()
	c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != KueueEvictionReason || !strings.Contains(c.Message, "w0") {
		t.Fatalf("Evicted condition %+v, want True/%s naming the pod", c, KueueEvictionReason)
	}
	st := h.state()
	if st.Phase != ladder.PhaseCheckpointing || st.Reason != ReasonDisruptionTarget || len(st.Ranks) != 2 {
		t.Fatalf("state %+v", st)
	}
	if h.pod("w0").DeletionTimestamp != nil || h.pod("w1").DeletionTimestamp != nil {
		t.Error("pods deleted while checkpointing")
	}
	rv := wl.ResourceVersion
	h.clock = t0.Add(time.Second)
	h.reconcile()
	if got := h.workload(); got.ResourceVersion != rv {
		t.Errorf("workload written again once Kueue's condition is set")
	}
	h.annotatePod("w0", v1alpha1.AnnotationCheckpointStep, "50")
	h.annotatePod("w1", v1alpha1.AnnotationCheckpointStep, "50")
	h.clock = t0.Add(2 * time.Second)
	h.reconcile() // Terminating
	h.clock = t0.Add(3 * time.Second)
	h.reconcile() // pods gone: Done
	if st := h.state(); st.Phase != ladder.PhaseDone || st.LastConsistentStep == nil || *st.LastConsistentStep != 50 {
		t.Fatalf("state %+v, want Done at step 50", st)
	}
	if diff := cmp.Diff([]string{EventEvictingWorkload, EventCheckpointing, EventConsistentStep, EventTerminating, EventDone}, h.events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// A pod-level trigger that ends with its pods (no Kueue eviction to keep
// the workload evicted): Done, the consistent step, the Event and the
// metrics are all written before the record is reset.
func TestPodLevelTriggerResultsAreRecorded(t *testing.T) {
	drained := rankPod("w0")
	drained.Annotations[v1alpha1.AnnotationCheckpointRequest] = t0.Format(time.RFC3339)
	h := newHarness(t, job(), workload(), drained)
	_, goneBefore := gathered(t)
	h.reconcile()
	h.annotatePod("w0", v1alpha1.AnnotationCheckpointStep, "9")
	h.clock = t0.Add(time.Second)
	h.reconcile() // Terminating: the pod is deleted, the trigger goes with it
	h.clock = t0.Add(2 * time.Second)
	h.reconcile()
	if st := h.state(); st.Phase != ladder.PhaseDone {
		t.Fatalf("phase %s, want Done recorded", st.Phase)
	}
	if diff := cmp.Diff([]string{EventCheckpointing, EventConsistentStep, EventTerminating, EventDone}, h.events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if _, gone := gathered(t); gone-goneBefore != 1 {
		t.Errorf("eviction-to-gone observed %d times, want 1", gone-goneBefore)
	}
	h.reconcile()
	if _, ok := h.workload().Annotations[v1alpha1.AnnotationPreemptionPhase]; ok {
		t.Error("record kept after the preemption was reported")
	}
}

// laggingPods serves pods as an informer that has not yet seen the
// coordinator's own writes: each pod as it was in before (same set, older
// versions).
type laggingPods struct {
	client.Client
	before map[string]corev1.Pod
}

func (l laggingPods) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := l.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	if pl, ok := list.(*corev1.PodList); ok {
		for i, p := range pl.Items {
			if old, ok := l.before[p.Name]; ok {
				pl.Items[i] = old
			}
		}
	}
	return nil
}

// The reconcile woken by the Workload's new phase sees pods from a cache
// that lags the requests it just wrote: it must not ask every rank again
// (the resourceVersion precondition refuses the write; the pod's update
// wakes the Workload once the cache has it).
func TestReconcileDoesNotReRequestFromAStaleCache(t *testing.T) {
	h := newHarness(t, job(), workload(preempted()), rankPod("w0"), rankPod("w1"))
	before := map[string]corev1.Pod{}
	for _, n := range []string{"w0", "w1"} {
		before[n] = *h.pod(n)
	}
	h.reconcile()
	asked := map[string]string{}
	for _, n := range []string{"w0", "w1"} {
		asked[n] = h.pod(n).Annotations[v1alpha1.AnnotationCheckpointRequest]
		if asked[n] == "" {
			t.Fatalf("rank %s not asked", n)
		}
	}
	fresh := h.c
	h.c = laggingPods{Client: fresh, before: before}
	h.clock = t0.Add(2 * time.Second)
	h.reconcile()
	h.c = fresh
	for n, was := range asked {
		if got := h.pod(n).Annotations[v1alpha1.AnnotationCheckpointRequest]; got != was {
			t.Errorf("rank %s asked again from a stale cache: %q → %q", n, was, got)
		}
	}
	if st := h.state(); st.Phase != ladder.PhaseCheckpointing || len(st.Transitions) != 1 {
		t.Errorf("state changed: %+v", st)
	}
}

// The consistent step is on the job before any rank is deleted: a pod the
// job controller (or an LWS group) recreates in between reads its resume
// step from there. A failed record does not hold the deletes back.
func TestConsistentStepRecordedBeforeTheDeletes(t *testing.T) {
	for _, failRecord := range []bool{false, true} {
		h := newHarness(t, job(), workload(preempted()), rankPod("w0"), rankPod("w1"))
		h.reconcile() // Checkpointing
		h.annotatePod("w0", v1alpha1.AnnotationCheckpointStep, "120")
		h.annotatePod("w1", v1alpha1.AnnotationCheckpointStep, "120")
		var order []string
		inner := h.c.(client.WithWatch)
		h.c = interceptor.NewClient(inner, interceptor.Funcs{
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				if obj.GetName() == "train" {
					order = append(order, "record")
					if failRecord {
						return apierrors.NewServiceUnavailable("injected")
					}
				}
				return c.Patch(ctx, obj, patch, opts...)
			},
			Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				order = append(order, "delete "+obj.GetName())
				return c.Delete(ctx, obj, opts...)
			},
		})
		r := &Reconciler{client: h.c, recorder: h.rec, now: func() time.Time { return t0.Add(10 * time.Second) },
			cfg: ladder.Config{DefaultCheckpointTimeout: time.Minute, DefaultGrace: 30 * time.Second, Slack: 10 * time.Second, MaxStepsPerRank: 8}}
		_, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: h.wlKey()})
		if failRecord != (err != nil) {
			t.Errorf("record failing=%v: Reconcile error %v", failRecord, err)
		}
		if len(order) != 3 || order[0] != "record" {
			t.Errorf("record failing=%v: calls %v, want the record first, then both deletes", failRecord, order)
		}
	}
}
