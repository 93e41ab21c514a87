package jobkinds

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

const (
	labelJobSetName = "jobset.sigs.k8s.io/jobset-name"
	containerAlive  = "test.gpupack.io/container-running"
	consistentStep  = 1200
)

// needController skips a test whose job controller is not built (they are
// built only when named: hack/build-tools.sh jobset lws, as `make tools`
// does) on a developer's machine, and fails it in CI (CI set, as .ci/run
// does), where a missing one is coverage silently lost.
func needController(t *testing.T, name string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(framework.ToolsDir(), name)); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the %s controller is not built in CI (make tools builds it): %v", name, err)
		}
		t.Skipf("the %s controller is not built (hack/build-tools.sh %s)", name, name)
	}
}

// fakeTrainer plays, for the pods of one job (selected by a label), the
// in-pod checkpoint agent: a finalizer stands for the running container
// (kwok deletes a terminating pod at once); asked to checkpoint, it
// reports step consistentStep on its pod once answering is on; deleted
// after reporting, its container exits (the finalizer goes).
type fakeTrainer struct {
	env      *framework.Env
	ns       string
	selector client.MatchingLabels

	mu     sync.Mutex
	answer bool
}

func (a *fakeTrainer) setAnswer(v bool) { a.mu.Lock(); a.answer = v; a.mu.Unlock() }

func (a *fakeTrainer) run(t *testing.T) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			a.tick(t)
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

func (a *fakeTrainer) tick(t *testing.T) {
	var pods corev1.PodList
	if err := a.env.Client.List(a.env.Ctx, &pods, client.InNamespace(a.ns), a.selector); err != nil {
		return
	}
	a.mu.Lock()
	answer := a.answer
	a.mu.Unlock()
	for i := range pods.Items {
		p := &pods.Items[i]
		var meta map[string]any
		if os.Getenv("GPUPACK_TEST_DEBUG") != "" && p.Annotations[v1alpha1.AnnotationCheckpointRequest] != "" {
			t.Logf("fake trainer sees %s answer=%v del=%v step=%q fin=%v", p.Name, answer, p.DeletionTimestamp != nil, p.Annotations[v1alpha1.AnnotationCheckpointStep], p.Finalizers)
		}
		// Strategic merge patches: finalizers merge as a set, so no
		// concurrent finalizer of the job controller is lost or revived.
		switch {
		case p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && !controllerutil.ContainsFinalizer(p, containerAlive):
			meta = map[string]any{"finalizers": []string{containerAlive}}
		case answer && p.Annotations[v1alpha1.AnnotationCheckpointRequest] != "" && p.Annotations[v1alpha1.AnnotationCheckpointStep] == "":
			meta = map[string]any{"annotations": map[string]string{v1alpha1.AnnotationCheckpointStep: fmt.Sprint(consistentStep)}}
		case p.DeletionTimestamp != nil && p.Annotations[v1alpha1.AnnotationCheckpointStep] != "" && controllerutil.ContainsFinalizer(p, containerAlive):
			meta = map[string]any{"$deleteFromPrimitiveList/finalizers": []string{containerAlive}}
		default:
			continue
		}
		meta["uid"] = p.UID
		raw, _ := json.Marshal(map[string]any{"metadata": meta})
		if err := a.env.Client.Patch(a.env.Ctx, p, client.RawPatch(types.StrategicMergePatchType, raw)); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("fake trainer: patching %s: %v", p.Name, err)
		}
	}
}

// controllerSuite: the real apiserver, Kueue, kube-scheduler + kwok, the
// job controllers asked for, and one gpupack manager with the webhooks
// (JobSet entries), the gang-fit check, the placement ungater and the
// preemption coordinator. One node with two H100s; a ClusterQueue with
// quota for two GPUs that preempts lower priorities.
type controllerSuite struct {
	env *framework.Env
	ns  string
	cfg webhooks.Config // the webhooks' configuration (its JobKinds: kinds)
}

func startControllerSuite(t *testing.T, opts framework.Options, kinds ...string) *controllerSuite {
	t.Helper()
	opts.Scheduler, opts.JobPodsKeepRunning = true, true
	env := framework.Start(t, opts)
	env.MustCreate(t, framework.MakeNode("n1").GPUs(2, framework.H100).Obj())
	env.WaitForNodeReady(t, "n1")
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"},
		Spec: v1alpha1.GangFitParametersSpec{RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)}}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))
	env.MustCreate(t, &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "low"}, Value: 10})
	env.MustCreate(t, &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000})
	// JobKinds as the manager sets them (--job-kinds): the owner walk
	// passes a RayCluster or JobSet only where its kind is checked at
	// creation.
	cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: opts.KueueFrameworks()}, JobKinds: kinds}
	wopts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		if err := webhooks.Setup(mgr, cfg); err != nil {
			return err
		}
		if err := admissioncheck.Setup(mgr, admissioncheck.Options{}); err != nil {
			return err
		}
		if err := placement.Setup(mgr); err != nil {
			return err
		}
		return preemption.SetupWithManager(mgr, preemption.Options{Slack: 5 * time.Second, SkipNameValidation: true})
	}, wopts)
	serve, err := webhooks.DefaultServeOptions().WithFastPath(cfg)
	if err != nil {
		t.Fatal(err)
	}
	serve.JobKinds = kinds
	mwc, vwc := webhooks.WebhookConfigurations(serve)
	env.InstallWebhooks(t, wopts, mwc, vwc)
	env.WaitForAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 2, framework.H100).AdmissionChecks("gang-fit").
		Preemption(kueue.ClusterQueuePreemption{WithinClusterQueue: kueue.PreemptionPolicyLowerPriority}).Obj())
	s := &controllerSuite{env: env, ns: env.Namespace(t, "team"), cfg: cfg}
	env.MustCreate(t, framework.MakeLocalQueue("lq", s.ns, "cq"))
	return s
}

// runnableJobSet is fractionalJobSet with workers only (at a priority),
// and the fields JobSet's defaulting webhook would set spelled out.
func runnableJobSet(name, ns, priority string, workers int32, mem string, checkpoint bool) *jobset.JobSet {
	js := fractionalJobSet(name, ns, workers, mem)
	js.Spec.ReplicatedJobs = js.Spec.ReplicatedJobs[1:]
	js.Labels["kueue.x-k8s.io/priority-class"] = priority
	js.Spec.Network = &jobset.Network{EnableDNSHostnames: ptr.To(false)}
	w := &js.Spec.ReplicatedJobs[0].Template
	w.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	if checkpoint {
		w.Spec.Template.Spec.Containers[0].Command = []string{"python", "train.py"}
		w.Spec.Template.Annotations = map[string]string{
			v1alpha1.AnnotationCheckpoint:        "true",
			v1alpha1.AnnotationCheckpointTimeout: "60s",
		}
	}
	return js
}

// checkpointingHoldsPreemptor waits until the victim "low" (of kind) is
// Checkpointing with both of its pods asked to save, then checks that the
// preemptor "high" is not admitted while they save (its GPUs are the
// victim's until the pods are gone).
func (s *controllerSuite) checkpointingHoldsPreemptor(t *testing.T, kind string, victimSel client.MatchingLabels) {
	t.Helper()
	s.env.Eventually(t, 60*time.Second, "victim in Checkpointing with both pods asked", func() (bool, string) {
		st, wl := s.record(t, "low", kind)
		asked := 0
		for _, p := range s.pods(t, victimSel) {
			if p.Annotations[v1alpha1.AnnotationCheckpointRequest] != "" {
				asked++
			}
		}
		return st.Phase == ladder.PhaseCheckpointing && len(st.Ranks) == 2 && asked == 2,
			fmt.Sprintf("phase %q, %d ranks, %d asked; %s", st.Phase, len(st.Ranks), asked, framework.DescribeWorkload(wl))
	})
	time.Sleep(3 * time.Second)
	if hw, _ := s.env.WorkloadOf(s.ns, "high", kind); hw != nil && admitted(hw) {
		t.Fatalf("preemptor admitted while the victim checkpoints: %s", framework.DescribeWorkload(hw))
	}
}

func (s *controllerSuite) pods(t *testing.T, sel client.MatchingLabels) []corev1.Pod {
	t.Helper()
	var pl corev1.PodList
	if err := s.env.Client.List(s.env.Ctx, &pl, client.InNamespace(s.ns), sel); err != nil {
		t.Fatal(err)
	}
	sort.Slice(pl.Items, func(i, j int) bool { return pl.Items[i].Name < pl.Items[j].Name })
	return pl.Items
}

// waitPinned waits until n pods of sel run, each pinned by the ungater to
// its plan slot, and checks the pins (pinnedToOwnSlots). It returns the pods.
func (s *controllerSuite) waitPinned(t *testing.T, what string, sel client.MatchingLabels, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	s.env.Eventually(t, 120*time.Second, what+" running, pinned to the plan", func() (bool, string) {
		pods = nil
		var notes []string
		for _, p := range s.pods(t, sel) {
			if p.DeletionTimestamp == nil {
				pods = append(pods, p)
				notes = append(notes, fmt.Sprintf("%s phase=%s node=%q devices=%q gates=%v", p.Name, p.Status.Phase, p.Spec.NodeName, p.Annotations[v1alpha1.AnnotationDevices], p.Spec.SchedulingGates))
			}
		}
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationDevices] != "" {
				running++
			}
		}
		return running == n && len(pods) == n, strings.Join(notes, "; ")
	})
	s.pinnedToOwnSlots(t, pods)
	return pods
}

// pinnedToOwnSlots checks each pod against the plan it names: the plan's
// status binds it (by UID) to a slot no other pod has, it runs on that
// slot's node with exactly that slot's GPUs, the slot gives it the memory
// per GPU it asked for (a leader never on a worker's slot), and no GPU is
// given more than one GPU's allocatable memory across the pods.
func (s *controllerSuite) pinnedToOwnSlots(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	h100, _ := flavors.Lookup(framework.H100)
	allocatable := flavors.Allocatable(h100.MemoryMiB)
	slotOf := map[string]string{}
	perGPU := map[string]int64{}
	for _, p := range pods {
		plan := p.Annotations[v1alpha1.AnnotationPlan]
		var gp v1alpha1.GPUPlan
		if err := s.env.Client.Get(s.env.Ctx, client.ObjectKey{Namespace: s.ns, Name: plan}, &gp); err != nil {
			t.Fatalf("pod %s's plan %q: %v", p.Name, plan, err)
		}
		devs, err := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices])
		if err != nil {
			t.Fatalf("pod %s devices: %v", p.Name, err)
		}
		var bound *v1alpha1.SlotBinding
		for i, b := range gp.Status.Bindings {
			if b.PodUID == p.UID {
				bound = &gp.Status.Bindings[i]
			}
		}
		if bound == nil {
			t.Errorf("pod %s has no binding in plan %s: %+v", p.Name, plan, gp.Status.Bindings)
			continue
		}
		key := fmt.Sprintf("%s/%s[%d]", plan, bound.PodSet, bound.Index)
		for other, k := range slotOf {
			if k == key {
				t.Errorf("pods %s and %s are both bound to %s", other, p.Name, key)
			}
		}
		slotOf[p.Name] = key
		var slot *v1alpha1.PodAssignment
		for i, a := range gp.Spec.Assignments {
			if a.PodSet == bound.PodSet && a.Index == bound.Index {
				slot = &gp.Spec.Assignments[i]
			}
		}
		if slot == nil {
			t.Errorf("pod %s bound to %s, which plan %s does not have", p.Name, key, plan)
			continue
		}
		match := slot.Node == p.Spec.NodeName && len(slot.GPUs) == len(devs)
		for i := 0; match && i < len(devs); i++ {
			match = slot.GPUs[i].UUID == devs[i].UUID && slot.GPUs[i].MemoryMiB == devs[i].MemoryMiB
		}
		if !match {
			t.Errorf("pod %s on %s with devices %v, but its slot %s is %+v", p.Name, p.Spec.NodeName, devs, key, *slot)
		}
		var want int64
		for _, c := range p.Spec.Containers {
			q := c.Resources.Limits[v1alpha1.ResourceGPUMemory]
			want += q.Value()
		}
		var got int64
		for _, d := range devs {
			got += d.MemoryMiB
			perGPU[d.UUID] += d.MemoryMiB
		}
		if want > 0 && got != want { // (a whole-GPU pod gets the GPU's allocatable)
			t.Errorf("pod %s asks for %d MiB of GPU memory, its slot %s gives %d (%v)", p.Name, want, key, got, devs)
		}
	}
	for uuid, mib := range perGPU {
		if mib > allocatable {
			t.Errorf("GPU %s given %d MiB across the pods, more than its %d allocatable", uuid, mib, allocatable)
		}
	}
}

func (s *controllerSuite) record(t *testing.T, owner, kind string) (ladder.State, *kueue.Workload) {
	t.Helper()
	wl, err := s.env.WorkloadOf(s.ns, owner, kind)
	if err != nil || wl == nil {
		t.Fatalf("workload of %s %s: %v", kind, owner, err)
	}
	st, err := preemption.PreemptionRecord(s.env.Ctx, s.env.Client, wl)
	if err != nil {
		t.Fatal(err)
	}
	return st, wl
}

func phaseTime(st ladder.State, p ladder.Phase) time.Time {
	for _, tr := range st.Transitions {
		if tr.Phase == p {
			return tr.At
		}
	}
	return time.Time{}
}

// The whole path for JobSet with the real JobSet controller: a fractional
// JobSet is converted, counted by Kueue in gpupack.io/*, admitted by the
// check, its pods (JobSet → Job → Pod, made by the real controllers)
// pinned to the planned GPUs; a higher-priority JobSet makes Kueue preempt
// it; the coordinator finds the victim's pods through the chain and runs
// the checkpoint protocol; the check holds the preemptor while the
// victim's pods hold the GPUs and admits it once they are gone; the
// consistent step is recorded on the JobSet and its Jobs, and when the
// victim is re-admitted its new pods get GPUPACK_RESUME_STEP.
func TestJobSetControllerPreemptedThroughTheCheckpointProtocol(t *testing.T) {
	needController(t, "jobset")
	s := startControllerSuite(t, framework.Options{JobSet: true, JobSetController: true}, webhooks.KindJobSet)
	env := s.env
	lowSel := client.MatchingLabels{labelJobSetName: "low"}
	highSel := client.MatchingLabels{labelJobSetName: "high"}
	trainer := &fakeTrainer{env: env, ns: s.ns, selector: lowSel}
	trainer.run(t)

	// The victim: 2 × 50 GiB, one per GPU, opted in to checkpointing.
	env.MustCreate(t, runnableJobSet("low", s.ns, "low", 2, "50Gi", true))
	wl := env.WaitForWorkloadOf(t, s.ns, "low", "JobSet", admitted)
	req := wl.Spec.PodSets[0].Template.Spec.Containers[0].Resources.Requests
	if q := req[v1alpha1.ResourceGPUMemory]; q.Value() != 51200 {
		t.Errorf("Workload requests %v, want gpupack.io/gpu-memory 51200", req)
	}
	low := s.waitPinned(t, "low's 2 pods", lowSel, 2)
	for _, p := range low {
		if ref := metav1.GetControllerOf(&p); ref == nil || ref.Kind != "Job" {
			t.Errorf("pod %s not made by a Job: %v", p.Name, p.OwnerReferences)
		}
	}
	env.Eventually(t, 30*time.Second, "low's containers running (finalizer)", func() (bool, string) {
		n := 0
		for _, p := range s.pods(t, lowSel) {
			if controllerutil.ContainsFinalizer(&p, containerAlive) {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d of 2", n)
	})

	// The preemptor: needs both GPUs' memory, and Kueue's quota only fits
	// it without the victim.
	env.MustCreate(t, runnableJobSet("high", s.ns, "high", 2, "50Gi", false))
	s.checkpointingHoldsPreemptor(t, "JobSet", lowSel)
	if n := len(s.pods(t, highSel)); n != 0 {
		t.Errorf("%d preemptor pods exist while the victim checkpoints", n)
	}

	trainer.setAnswer(true)
	done := s.waitVictimDone(t, "JobSet", lowSel, true)
	var js jobset.JobSet
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &js); err != nil {
		t.Fatal(err)
	}
	if got := js.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
		t.Errorf("JobSet %s = %q, want %d", v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
	}
	var jobs batchv1.JobList
	if err := env.Client.List(env.Ctx, &jobs, client.InNamespace(s.ns), lowSel); err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) == 0 {
		t.Error("the victim's Jobs are gone (JobSet should suspend, not delete them)")
	}
	for _, j := range jobs.Items {
		if got := j.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
			t.Errorf("Job %s %s = %q, want %d (the pod webhook reads it for GPUPACK_RESUME_STEP)", j.Name, v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
		}
	}

	// The preemptor is admitted once the victim's pods are gone, and lands
	// on the freed GPUs.
	s.preemptorAdmittedAfter(t, "JobSet", done)
	s.waitPinned(t, "high's 2 pods", highSel, 2)

	// The preemptor leaves: the victim is re-admitted and its new pods
	// carry the consistent step.
	if err := env.Client.Delete(env.Ctx, &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "high"}}, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 120*time.Second, "the victim's new pods with GPUPACK_RESUME_STEP", func() (bool, string) {
		var notes []string
		n := 0
		for _, p := range s.pods(t, lowSel) {
			if p.CreationTimestamp.Time.Before(phaseTime(done, ladder.PhaseDone).Truncate(time.Second)) {
				continue
			}
			step := ""
			for _, e := range p.Spec.Containers[0].Env {
				if e.Name == v1alpha1.EnvResumeStep {
					step = e.Value
				}
			}
			notes = append(notes, p.Name+"="+step)
			if step == fmt.Sprint(consistentStep) {
				n++
			}
		}
		w, _ := env.WorkloadOf(s.ns, "low", "JobSet")
		return n == 2, strings.Join(notes, ", ") + "; " + framework.DescribeWorkload(w)
	})
}

// waitVictimDone waits until the victim's ("low") preemption record of kind
// is Done and checks that it names the consistent step; with allSaved, that
// every rank's outcome is Saved too. It returns the record.
func (s *controllerSuite) waitVictimDone(t *testing.T, kind string, sel client.MatchingLabels, allSaved bool) ladder.State {
	t.Helper()
	s.env.Eventually(t, 90*time.Second, "victim's preemption Done", func() (bool, string) {
		st, _ := s.record(t, "low", kind)
		return st.Phase == ladder.PhaseDone, fmt.Sprintf("phase %q, %d pods left", st.Phase, len(s.pods(t, sel)))
	})
	done, _ := s.record(t, "low", kind)
	if done.LastConsistentStep == nil || *done.LastConsistentStep != consistentStep {
		t.Errorf("consistent step %v, want %d", done.LastConsistentStep, consistentStep)
	}
	if allSaved {
		for rank, o := range done.Outcomes {
			if o != ladder.OutcomeSaved {
				t.Errorf("rank %s: %s, want %s", rank, o, ladder.OutcomeSaved)
			}
		}
	}
	return done
}

// preemptorAdmittedAfter waits until the preemptor's ("high") Workload of
// kind is admitted and checks it was not admitted before the victim's
// preemption was Done (its pods gone).
func (s *controllerSuite) preemptorAdmittedAfter(t *testing.T, kind string, done ladder.State) *kueue.Workload {
	t.Helper()
	hw := s.env.WaitForWorkloadOf(t, s.ns, "high", kind, admitted)
	if c := apimeta.FindStatusCondition(hw.Status.Conditions, kueue.WorkloadAdmitted); c != nil && c.LastTransitionTime.Time.Before(phaseTime(done, ladder.PhaseDone).Truncate(time.Second)) {
		t.Errorf("preemptor admitted at %s, before the victim's pods were gone (%s)", c.LastTransitionTime, phaseTime(done, ladder.PhaseDone))
	}
	return hw
}
