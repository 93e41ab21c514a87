// Package preemption tests gpupack's preemption coordinator against a real
// kube-apiserver, the real Kueue manager, kube-scheduler, kwok and the
// Kubeflow training operator, with the gang-fit check keeping the victim's
// GPUs counted until its pods are gone.
//
// kwok runs no containers, so two in-pod parts are played by the test:
//   - gpupack-ckpt (process-tested in checkpoint/agent): on the checkpoint
//     request it annotates its pod with gpupack.io/checkpoint-step, and its
//     container exits only then (a finalizer stands for the running
//     container, since kwok deletes a terminating pod at once);
//   - the placement ungater (webhooks/): it writes gpupack.io/devices on a
//     running pod, which is what keeps a terminating pod's GPUs counted.
//
// The drain test also runs the real gpupack-ckpt (in this process) around
// the Python test trainer, reporting through the real API server, with the
// test in the kubelet's place for the downward-API annotations file.
package preemption

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	ckagent "github.com/gpupack/gpupack/checkpoint/agent"
	"github.com/gpupack/gpupack/checkpoint/manifest"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks/placement"
)

const (
	jobNameLabel   = "training.kubeflow.org/job-name"
	containerAlive = "test.gpupack.io/container-running"
	consistentStep = 1200
)

// fakeNodeAgent plays gpupack-ckpt and the ungater for the pods of one job.
type fakeNodeAgent struct {
	env  *framework.Env
	ns   string
	job  string
	node string

	// noContainers: pods carry no finalizer standing for a running
	// container (the node's kubelet is gone, nothing confirms a deletion).
	noContainers bool

	mu     sync.Mutex
	answer bool // answer checkpoint requests (false: the trainer is still saving)
	stop   chan struct{}
	done   chan struct{}
}

// bind records pod p in its GPUPlan's bindings, as the ungater does.
func (a *fakeNodeAgent) bind(p *corev1.Pod) {
	name := p.Annotations[v1alpha1.AnnotationPlan]
	if name == "" {
		return
	}
	_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var gp v1alpha1.GPUPlan
		if err := a.env.Client.Get(a.env.Ctx, client.ObjectKey{Namespace: p.Namespace, Name: name}, &gp); err != nil {
			return err
		}
		_, b, err := placement.Assign(gp.Spec.Assignments, gp.Status.Bindings, placement.PodInfoFromLabels(p.Name, p.UID, p.Labels, p.Annotations),
			func(v1alpha1.SlotBinding) bool { return true })
		if err != nil {
			return nil
		}
		gp.Status.Bindings = b
		return a.env.Client.Status().Update(a.env.Ctx, &gp)
	})
}

func (a *fakeNodeAgent) setAnswer(v bool) {
	a.mu.Lock()
	a.answer = v
	a.mu.Unlock()
}

func (a *fakeNodeAgent) run(t *testing.T) {
	a.stop, a.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(a.done)
		for {
			select {
			case <-a.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			a.tick(t)
		}
	}()
	t.Cleanup(func() { close(a.stop); <-a.done })
}

func (a *fakeNodeAgent) tick(t *testing.T) {
	var pods corev1.PodList
	if err := a.env.Client.List(a.env.Ctx, &pods, client.InNamespace(a.ns), client.MatchingLabels{jobNameLabel: a.job}); err != nil {
		return
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	a.mu.Lock()
	answer := a.answer
	a.mu.Unlock()
	alloc := flavors.Allocatable(mustProfile(framework.H100).MemoryMiB)
	for i := range pods.Items {
		p := &pods.Items[i]
		patch := map[string]any{}
		ann := map[string]string{}
		switch {
		case p.DeletionTimestamp == nil && p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationDevices] == "":
			// The ungater: two whole GPUs of the node per pod, by pod
			// order (master-0 → GPUs 0-1, worker-0 → GPUs 2-3).
			var devs []v1alpha1.DeviceAssignment
			for g := 2 * i; g < 2*i+2; g++ {
				node := a.node
				if node == "" {
					node = p.Spec.NodeName
				}
				devs = append(devs, v1alpha1.DeviceAssignment{UUID: fmt.Sprintf("GPU-%s-%d", node, g), MemoryMiB: alloc})
			}
			ann[v1alpha1.AnnotationDevices] = v1alpha1.FormatDevices(devs)
			patch["metadata"] = map[string]any{"annotations": ann, "finalizers": append(p.Finalizers, containerAlive)}
			if a.noContainers {
				patch["metadata"] = map[string]any{"annotations": ann}
			}
			// Like the real ungater, bind the pod to its plan slot (the
			// check reads a slot without a binding as not yet placed).
			a.bind(p)
		case answer && p.Annotations[v1alpha1.AnnotationCheckpointRequest] != "" && p.Annotations[v1alpha1.AnnotationCheckpointStep] == "":
			// gpupack-ckpt: a verified checkpoint, reported on the pod.
			ann[v1alpha1.AnnotationCheckpointStep] = fmt.Sprint(consistentStep)
			patch["metadata"] = map[string]any{"annotations": ann}
		case p.DeletionTimestamp != nil && p.Annotations[v1alpha1.AnnotationCheckpointStep] != "" && controllerutil.ContainsFinalizer(p, containerAlive):
			// The trainer saved and exited: the container is gone.
			var keep []string
			for _, f := range p.Finalizers {
				if f != containerAlive {
					keep = append(keep, f)
				}
			}
			patch["metadata"] = map[string]any{"finalizers": keep}
		default:
			continue
		}
		raw, _ := json.Marshal(patch)
		if err := a.env.Client.Patch(a.env.Ctx, p, client.RawPatch(types.MergePatchType, raw)); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("fake node agent: patching %s: %v", p.Name, err)
		}
	}
}

func mustProfile(model string) flavors.Profile {
	p, ok := flavors.Lookup(model)
	if !ok {
		panic(model)
	}
	return p
}

func admitted(wl *kueue.Workload) bool {
	return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted)
}

type suite struct {
	env *framework.Env
	ns  string
}

func (s *suite) pods(t *testing.T, job string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := s.env.Client.List(s.env.Ctx, &pods, client.InNamespace(s.ns), client.MatchingLabels{jobNameLabel: job}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func (s *suite) state(t *testing.T, job string) (ladder.State, *kueue.Workload) {
	t.Helper()
	wl, err := s.env.WorkloadOf(s.ns, job, "PyTorchJob")
	if err != nil || wl == nil {
		t.Fatalf("workload of %s: %v", job, err)
	}
	st, err := preemption.PreemptionRecord(s.env.Ctx, s.env.Client, wl)
	if err != nil {
		t.Fatal(err)
	}
	return st, wl
}

// eventCount counts Events with a reason on an object.
func (s *suite) eventCount(t *testing.T, name, reason string) int {
	t.Helper()
	var evs corev1.EventList
	if err := s.env.Client.List(s.env.Ctx, &evs, client.InNamespace(s.ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			n++
		}
	}
	return n
}

func phasesOf(st ladder.State) []ladder.Phase {
	var out []ladder.Phase
	for _, tr := range st.Transitions {
		out = append(out, tr.Phase)
	}
	return out
}

// startPreemptionSuite brings up one 4-GPU kwok node, the gang-fit check,
// and a ClusterQueue that preempts lower priorities; the returned function
// starts a coordinator (and returns its stop).
func startPreemptionSuite(t *testing.T) (*suite, func() func()) {
	env := framework.Start(t, framework.Options{Scheduler: true, TrainingOperator: true})
	env.MustCreate(t, framework.MakeNode("n1").GPUs(4, framework.H100).Obj())
	env.WaitForNodeReady(t, "n1")
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"}, Spec: v1alpha1.GangFitParametersSpec{
		RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)}}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))
	env.MustCreate(t, &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "low"}, Value: 10})
	env.MustCreate(t, &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000})
	// The gang-fit check runs in its own manager; only the coordinator's is
	// restarted below.
	env.StartManager(t, func(mgr ctrl.Manager) error { return admissioncheck.Setup(mgr, admissioncheck.Options{}) })
	startCoordinator := func() func() {
		return env.StartManager(t, func(mgr ctrl.Manager) error {
			return preemption.SetupWithManager(mgr, preemption.Options{Slack: 5 * time.Second, SkipNameValidation: true})
		})
	}
	env.WaitForAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 4, framework.H100).AdmissionChecks("gang-fit").
		Preemption(kueue.ClusterQueuePreemption{WithinClusterQueue: kueue.PreemptionPolicyLowerPriority}).Obj())
	s := &suite{env: env, ns: env.Namespace(t, "team")}
	env.MustCreate(t, framework.MakeLocalQueue("lq", s.ns, "cq"))
	return s, startCoordinator
}

// A low-priority PyTorchJob is preempted by a high-priority one in the same
// ClusterQueue. The coordinator asks every rank to checkpoint; the manager
// is restarted in the middle of Checkpointing and resumes it without asking
// again; once every rank has saved, the phases run to Done with an Event
// each, the job records the consistent step, and the preemptor gets a pod
// placed only after the victim's GPUs are free.
func TestPreemptedJobCheckpointsThenYields(t *testing.T) {
	s, startCoordinator := startPreemptionSuite(t)
	env := s.env
	stopCoordinator := startCoordinator()
	// The victim: master + 1 worker, 2 GPUs each, opted in.
	low := framework.MakePyTorchJob("low", s.ns, "lq", 1, 2).PriorityClass("low").
		TemplateAnnotation(v1alpha1.AnnotationCheckpoint, "true").
		Annotation(v1alpha1.AnnotationCheckpointTimeout, "90s").Obj()
	env.MustCreate(t, low)
	agent := &fakeNodeAgent{env: env, ns: s.ns, job: "low", node: "n1"}
	agent.run(t)
	env.Eventually(t, 90*time.Second, "low running on all 4 GPUs", func() (bool, string) {
		n := 0
		for _, p := range s.pods(t, "low") {
			if p.Status.Phase == corev1.PodRunning && p.Annotations[v1alpha1.AnnotationDevices] != "" && controllerutil.ContainsFinalizer(&p, containerAlive) {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d of 2 pods running with devices", n)
	})

	// Watch the invariant for the rest of the test.
	w := s.watchHandover(t)

	// The preemptor.
	env.MustCreate(t, framework.MakePyTorchJob("high", s.ns, "lq", 1, 2).PriorityClass("high").Obj())

	// Checkpointing: every rank asked; the trainers are still saving.
	var requests map[string]string
	env.Eventually(t, 60*time.Second, "victim in Checkpointing with every rank asked", func() (bool, string) {
		st, wl := s.state(t, "low")
		requests = map[string]string{}
		for _, p := range s.pods(t, "low") {
			if v := p.Annotations[v1alpha1.AnnotationCheckpointRequest]; v != "" {
				requests[p.Name] = coordinatorWrites(&p)
			}
		}
		// Events are written asynchronously: wait for the first
		// coordinator's, so that the count after the restart means
		// something.
		events := 0
		if wl != nil {
			events = s.eventCount(t, wl.Name, preemption.EventCheckpointing)
		}
		return st.Phase == ladder.PhaseCheckpointing && len(requests) == 2 && events > 0,
			fmt.Sprintf("phase %q, %d requests, %d %s events; %s", st.Phase, len(requests), events, preemption.EventCheckpointing, framework.DescribeWorkload(wl))
	})
	t.Logf("coordinator's writes per rank before the restart: %v", requests)
	before, wl := s.state(t, "low")
	if before.Reason != preemption.ReasonKueuePreempted && before.Reason != preemption.ReasonKueueEvicted {
		t.Errorf("reason %q, want Kueue's preemption", before.Reason)
	}

	// Restart the coordinator in the middle of Checkpointing.
	stopCoordinator()
	stopCoordinator = startCoordinator()
	time.Sleep(3 * time.Second) // several reconciles' worth
	after, _ := s.state(t, "low")
	if after.Phase != ladder.PhaseCheckpointing || len(after.Transitions) != len(before.Transitions) || !after.CheckpointDeadline.Equal(*before.CheckpointDeadline) {
		t.Fatalf("restart changed the preemption: before %+v, after %+v", before, after)
	}
	for _, p := range s.pods(t, "low") {
		if was, ok := requests[p.Name]; ok && was != coordinatorWrites(&p) {
			t.Errorf("pod %s was written again by the coordinator after the restart (%s → %s): re-requested", p.Name, was, coordinatorWrites(&p))
		}
	}
	if n := s.eventCount(t, wl.Name, preemption.EventCheckpointing); n != 1 {
		t.Errorf("%d %s Events, want 1 (no re-entry after restart)", n, preemption.EventCheckpointing)
	}
	if lowGoneAt, violation := w.result(); lowGoneAt.IsZero() && violation == "" {
		// Still checkpointing: the preemptor must not be admitted yet.
		if hw, _ := env.WorkloadOf(s.ns, "high", "PyTorchJob"); hw != nil && admitted(hw) {
			t.Errorf("preemptor admitted while the victim checkpoints: %s", framework.DescribeWorkload(hw))
		}
	}

	// The trainers finish saving.
	agent.setAnswer(true)
	env.Eventually(t, 90*time.Second, "victim preemption Done", func() (bool, string) {
		st, _ := s.state(t, "low")
		return st.Phase == ladder.PhaseDone, fmt.Sprintf("phases %v, %d pods left", phasesOf(st), len(s.pods(t, "low")))
	})
	done, wl := s.state(t, "low")
	raw, _ := json.Marshal(done)
	t.Logf("victim's %s: %s", v1alpha1.AnnotationPreemptionPhase, raw)
	want := []ladder.Phase{ladder.PhaseCheckpointing, ladder.PhaseTerminating, ladder.PhaseDone}
	if got := phasesOf(done); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("phases %v, want %v", got, want)
	}
	for i := 1; i < len(done.Transitions); i++ {
		if done.Transitions[i].At.Before(done.Transitions[i-1].At) {
			t.Errorf("transitions out of order: %v", done.Transitions)
		}
	}
	// The Done event may be written a moment after the phase it narrates.
	env.Eventually(t, 20*time.Second, "the preemption's events written", func() (bool, string) {
		var got []string
		for _, reason := range []string{preemption.EventCheckpointing, preemption.EventTerminating, preemption.EventDone} {
			got = append(got, fmt.Sprintf("%s=%d", reason, s.eventCount(t, wl.Name, reason)))
		}
		return s.eventCount(t, wl.Name, preemption.EventDone) > 0, strings.Join(got, " ")
	})
	for _, reason := range []string{preemption.EventCheckpointing, preemption.EventTerminating, preemption.EventDone} {
		if n := s.eventCount(t, wl.Name, reason); n != 1 {
			t.Errorf("%d %s Events on the workload, want 1", n, reason)
		}
	}
	for rank, o := range done.Outcomes {
		if o != ladder.OutcomeSaved {
			t.Errorf("rank %s outcome %s, want %s", rank, o, ladder.OutcomeSaved)
		}
	}
	var job kftraining.PyTorchJob
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &job); err != nil {
		t.Fatal(err)
	}
	if got := job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
		t.Errorf("job %s = %q, want %d", v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
	}

	// The preemptor runs, and was placed only after the victim was gone.
	s.waitRunning(t, "high", 2)
	lowGoneAt, violation := w.result()
	if violation != "" {
		t.Error(violation)
	}
	if lowGoneAt.IsZero() {
		t.Error("never saw the victim's pods gone")
	}
	var first time.Time
	for _, p := range s.pods(t, "high") {
		if first.IsZero() || p.CreationTimestamp.Time.Before(first) {
			first = p.CreationTimestamp.Time
		}
	}
	t.Logf("victim's last pod gone at %s; preemptor's first pod created at %s", lowGoneAt.Format(time.RFC3339Nano), first.Format(time.RFC3339))
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func podNames(ps []corev1.Pod) string {
	var n []string
	for _, p := range ps {
		n = append(n, p.Name)
	}
	return strings.Join(n, ",")
}

// A drain's eviction of an opted-in pod is held (429) until the pod has
// checkpointed, and never past its budget.
func TestDrainEvictionWaitsForCheckpointWithinBudget(t *testing.T) {
	env := framework.Start(t, framework.Options{NoKueue: true})
	whOpts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		return preemption.SetupWithManager(mgr, preemption.Options{EvictionWebhook: true, SkipNameValidation: true})
	}, whOpts)
	whc := preemption.EvictionWebhookConfiguration("gpupack-system", "gpupack-webhook")
	// Fail rather than Ignore here: a webhook the API server cannot reach
	// must fail the test, not let every eviction through.
	fail := admissionregistrationv1.Fail
	whc.Webhooks[0].FailurePolicy = &fail
	env.InstallWebhooks(t, whOpts, whc)
	ns := env.Namespace(t, "drain")
	const budget = 6 * time.Second
	mkPod := func(name string, opted bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{
			v1alpha1.AnnotationCheckpointTimeout: budget.String()}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}}
		if opted {
			p.Annotations[v1alpha1.AnnotationCheckpoint] = "true"
		}
		env.MustCreate(t, p)
		return p
	}
	// One eviction attempt: client-go would otherwise honour the 429's
	// Retry-After itself and retry (as kubectl drain does), hiding the hold.
	evict := func(name string) error {
		return env.Clientset.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(name).SubResource("eviction").
			MaxRetries(0).Body(&policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}).Do(env.Ctx).Error()
	}
	held := func(err error) bool { return apierrors.IsTooManyRequests(err) }
	gone := func(name string) bool {
		var p corev1.Pod
		err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
	}

	// The API server picks a new webhook configuration up after a moment:
	// wait until an opted-in probe pod is held.
	mkPod("probe", true)
	env.Eventually(t, 30*time.Second, "eviction webhook in force", func() (bool, string) {
		err := evict("probe")
		return held(err), fmt.Sprint(err)
	})
	// A pod that did not opt in is evicted at once.
	mkPod("plain", false)
	if err := evict("plain"); err != nil {
		t.Fatalf("eviction of a pod that did not opt in: %v, want allowed", err)
	}

	// An opted-in pod that checkpoints: held until it reports.
	mkPod("saver", true)
	if err := evict("saver"); !held(err) {
		t.Fatalf("first eviction of an opted-in pod: %v, want 429", err)
	}
	var p corev1.Pod
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: "saver"}, &p); err != nil {
		t.Fatal(err)
	}
	if p.Annotations[v1alpha1.AnnotationCheckpointRequest] == "" {
		t.Fatal("held eviction did not request a checkpoint")
	}
	if err := evict("saver"); !held(err) || gone("saver") {
		t.Fatalf("second eviction before the checkpoint: %v, want 429", err)
	}
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"77"}}}`, v1alpha1.AnnotationCheckpointStep))
	if err := env.Client.Patch(env.Ctx, &p, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	if err := evict("saver"); err != nil {
		t.Fatalf("eviction after the checkpoint: %v, want allowed", err)
	}

	// The real gpupack-ckpt wrapping the Python test trainer: the test
	// plays the kubelet (downward-API annotations file), the agent reports
	// through the real API server.
	if py, err := exec.LookPath("python3"); err == nil {
		mkPod("real-agent", true)
		dir := t.TempDir()
		annFile, ckdir, evFile := filepath.Join(dir, "annotations"), filepath.Join(dir, "ckpt"), filepath.Join(dir, "events")
		kubeletStop := make(chan struct{})
		kubeletDone := make(chan struct{})
		go func() { // the kubelet's downward-API refresh
			defer close(kubeletDone)
			for {
				var p corev1.Pod
				if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: "real-agent"}, &p); err == nil {
					keys := make([]string, 0, len(p.Annotations))
					for k := range p.Annotations {
						keys = append(keys, k)
					}
					sort.Strings(keys)
					var b strings.Builder
					for _, k := range keys {
						fmt.Fprintf(&b, "%v=%q\n", k, p.Annotations[k])
					}
					os.WriteFile(annFile+".tmp", []byte(b.String()), 0o644)
					os.Rename(annFile+".tmp", annFile)
				}
				select {
				case <-kubeletStop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		httpClient, err := rest.HTTPClientFor(env.Config)
		if err != nil {
			t.Fatal(err)
		}
		exit := make(chan int, 1)
		go func() {
			exit <- ckagent.Run(ckagent.Config{
				Command:          []string{py, filepath.Join(framework.RepoRoot(), "checkpoint", "python", "testdata", "trainer.py"), "--mode", "cooperative", "--dir", ckdir, "--save-every", "5", "--events", evFile},
				CheckpointSignal: syscall.SIGUSR1, CheckpointTimeout: budget, Grace: 2 * budget, KillMargin: time.Second,
				ExitWait: 2 * time.Second, CheckpointDir: ckdir, AnnotationsFile: annFile, Poll: 100 * time.Millisecond,
				Reporter: &ckagent.PodAnnotator{BaseURL: env.Config.Host, Namespace: ns, Name: "real-agent", Client: httpClient},
				Log:      testLog{t},
			})
		}()
		env.Eventually(t, 30*time.Second, "trainer ready (signal handler installed)", func() (bool, string) {
			b, _ := os.ReadFile(evFile)
			return strings.Contains(string(b), " ready"), string(b)
		})
		if err := evict("real-agent"); !held(err) {
			t.Fatalf("first eviction of the real agent's pod: %v, want 429", err)
		}
		var code int
		select {
		case code = <-exit:
		case <-time.After(2 * budget):
			t.Fatal("gpupack-ckpt did not finish")
		}
		close(kubeletStop)
		<-kubeletDone
		if code != ckagent.ExitPreempted {
			t.Fatalf("gpupack-ckpt exited %d, want %d (preempted)", code, ckagent.ExitPreempted)
		}
		cp, ok, err := manifest.Latest(ckdir)
		if err != nil || !ok {
			t.Fatalf("no verified checkpoint: %v", err)
		}
		var rp corev1.Pod
		env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: "real-agent"}, &rp)
		if got := rp.Annotations[v1alpha1.AnnotationCheckpointStep]; got != fmt.Sprint(cp.Manifest.Step) {
			t.Fatalf("pod %s = %q, want the verified step %d", v1alpha1.AnnotationCheckpointStep, got, cp.Manifest.Step)
		}
		if err := evict("real-agent"); err != nil {
			t.Fatalf("eviction after the agent reported: %v, want allowed", err)
		}
	}

	// An opted-in pod that never checkpoints: held, but not past its
	// budget (counted from the first attempt; the request time has second
	// resolution, hence the extra second).
	mkPod("silent", true)
	first := time.Now()
	if err := evict("silent"); !held(err) {
		t.Fatalf("first eviction: %v, want 429", err)
	}
	for {
		err := evict("silent")
		since := time.Since(first)
		if err == nil {
			if since < budget-time.Second {
				t.Errorf("eviction allowed after %v, before the budget %v", since, budget)
			}
			break
		}
		if !held(err) {
			t.Fatalf("eviction: %v", err)
		}
		if since > budget+2*time.Second { // one retry interval and an API round trip of slack

			t.Fatalf("eviction still held %v after the first attempt, past the budget %v", since, budget)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// A victim whose node is lost while it is preempted: its trainers never
// answer the checkpoint request and nothing confirms a graceful deletion
// (kwok stops managing the node, as a kubelet that went away). The
// coordinator must still free the GPUs within its bounds: Checkpointing
// times out, Terminating's grace + slack runs out, and Killing force-deletes
// the pods; every rank is recorded as Killed, no checkpoint step is claimed,
// and the preemptor is placed only after the victim's pods are gone.
func TestPreemptedJobOnLostNodeIsKilled(t *testing.T) {
	s, startCoordinator := startPreemptionSuite(t)
	env := s.env
	startCoordinator()
	low := framework.MakePyTorchJob("low", s.ns, "lq", 1, 2).PriorityClass("low").
		TemplateAnnotation(v1alpha1.AnnotationCheckpoint, "true").
		Annotation(v1alpha1.AnnotationCheckpointTimeout, "3s").Obj()
	for _, rs := range low.Spec.PyTorchReplicaSpecs {
		rs.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	}
	env.MustCreate(t, low)
	agent := &fakeNodeAgent{env: env, ns: s.ns, job: "low", node: "n1", noContainers: true}
	agent.run(t)
	env.Eventually(t, 90*time.Second, "low running on all 4 GPUs", func() (bool, string) {
		n := 0
		for _, p := range s.pods(t, "low") {
			if p.Status.Phase == corev1.PodRunning && p.Annotations[v1alpha1.AnnotationDevices] != "" {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d of 2 pods running with devices", n)
	})

	// The node's kubelet goes away: kwok no longer acts for it.
	env.SetKubelet(t, "n1", false)

	w := s.watchHandover(t)

	env.MustCreate(t, framework.MakePyTorchJob("high", s.ns, "lq", 1, 2).PriorityClass("high").Obj())
	env.Eventually(t, 90*time.Second, "victim Terminating with its pods stuck", func() (bool, string) {
		st, _ := s.state(t, "low")
		stuck := 0
		for _, p := range s.pods(t, "low") {
			if p.DeletionTimestamp != nil {
				stuck++
			}
		}
		return st.Phase == ladder.PhaseTerminating && stuck == 2, fmt.Sprintf("phases %v, %d pods terminating", phasesOf(st), stuck)
	})
	env.Eventually(t, 60*time.Second, "victim preemption Done", func() (bool, string) {
		st, _ := s.state(t, "low")
		return st.Phase == ladder.PhaseDone, fmt.Sprintf("phases %v, %d pods left", phasesOf(st), len(s.pods(t, "low")))
	})
	done, wl := s.state(t, "low")
	raw, _ := json.Marshal(done)
	t.Logf("victim's %s: %s", v1alpha1.AnnotationPreemptionPhase, raw)
	want := []ladder.Phase{ladder.PhaseCheckpointing, ladder.PhaseTerminating, ladder.PhaseKilling, ladder.PhaseDone}
	if got := phasesOf(done); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("phases %v, want %v", got, want)
	}
	// Killing starts only once the checkpoint timeout (3 s) and the grace
	// (2 s, counted from the request, as each agent counts it) + slack (5 s)
	// have passed: the kubelet's own SIGKILL gets its chance first. And no
	// later: the GPUs of a lost node are held for about the policy's bound,
	// not the timeout and then a whole grace again.
	asked := phaseAt(done, ladder.PhaseCheckpointing)
	if at := phaseAt(done, ladder.PhaseKilling).Sub(asked); at < 8*time.Second {
		t.Errorf("Killing %s after the request, before max(timeout, grace) + slack (8s)", at)
	}
	if done.KillDeadline == nil || done.KillDeadline.Sub(asked) > 8*time.Second {
		t.Errorf("kill deadline %v after the request, want max(timeout 3s, grace 2s) + slack 5s = 8s (not timeout + grace + slack)", done.KillDeadline)
	}
	if len(done.Outcomes) != 2 {
		t.Errorf("outcomes %v, want both ranks", done.Outcomes)
	}
	for rank, o := range done.Outcomes {
		if o != ladder.OutcomeKilled {
			t.Errorf("rank %s outcome %s, want %s", rank, o, ladder.OutcomeKilled)
		}
	}
	for _, reason := range []string{preemption.EventCheckpointing, preemption.EventTerminating, preemption.EventKilling, preemption.EventDone} {
		if n := s.eventCount(t, wl.Name, reason); n != 1 {
			t.Errorf("%d %s Events on the workload, want 1", n, reason)
		}
	}
	var job kftraining.PyTorchJob
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &job); err != nil {
		t.Fatal(err)
	}
	if got, ok := job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; ok {
		t.Errorf("job claims checkpoint step %q though no rank saved", got)
	}

	// The node comes back; the preemptor runs there.
	env.SetKubelet(t, "n1", true)
	s.waitRunning(t, "high", 2)
	if lowGoneAt, violation := w.result(); violation != "" {
		t.Error(violation)
	} else if lowGoneAt.IsZero() {
		t.Error("never saw the victim's pods gone")
	}
}

func phaseAt(st ladder.State, p ladder.Phase) time.Time {
	for _, tr := range st.Transitions {
		if tr.Phase == p {
			return tr.At
		}
	}
	return time.Time{}
}

// handover records, while a test runs, whether a pod of the preemptor
// ("high") was ever bound to a node while a pod of the victim ("low")
// existed, and when the victim's pods were first all gone.
type handover struct {
	mu        sync.Mutex
	violation string
	lowGoneAt time.Time
}

func (h *handover) result() (time.Time, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lowGoneAt, h.violation
}

func (s *suite) watchHandover(t *testing.T) *handover {
	h := &handover{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			var lows, highs corev1.PodList
			if s.env.Client.List(s.env.Ctx, &lows, client.InNamespace(s.ns), client.MatchingLabels{jobNameLabel: "low"}) != nil ||
				s.env.Client.List(s.env.Ctx, &highs, client.InNamespace(s.ns), client.MatchingLabels{jobNameLabel: "high"}) != nil {
				continue
			}
			h.mu.Lock()
			if len(lows.Items) == 0 && h.lowGoneAt.IsZero() {
				h.lowGoneAt = time.Now()
			}
			for _, p := range highs.Items {
				if p.Spec.NodeName != "" && len(lows.Items) > 0 && h.violation == "" {
					h.violation = fmt.Sprintf("preemptor pod %s bound to %s while victim pods %s still exist", p.Name, p.Spec.NodeName, podNames(lows.Items))
				}
			}
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return h
}

// waitRunning waits until n pods of a job run.
func (s *suite) waitRunning(t *testing.T, job string, n int) {
	t.Helper()
	s.env.Eventually(t, 90*time.Second, job+" running", func() (bool, string) {
		running := 0
		for _, p := range s.pods(t, job) {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == n, fmt.Sprintf("%d of %d running", running, n)
	})
}

// coordinatorWrites sums up what the coordinator last wrote to a pod: its
// checkpoint request and its managed-fields entries. Other writers (kwok's
// status updates, the training operator) change the resourceVersion but not
// this.
func coordinatorWrites(p *corev1.Pod) string {
	out := p.Annotations[v1alpha1.AnnotationCheckpointRequest]
	for _, mf := range p.ManagedFields {
		if mf.Manager == preemption.ControllerName {
			out += fmt.Sprintf(" %s@%s", mf.Operation, mf.Time)
		}
	}
	return out
}

// podTracker records, while a test runs, every pod of a job it sees by
// UID: which were there at the start, which were deleted (and whether with
// grace 0), and which appeared later.
type podTracker struct {
	mu      sync.Mutex
	initial map[types.UID]string
	later   map[types.UID]string
	deleted map[types.UID]int // distinct deletionTimestamp values seen (a later, shorter graceful delete moves it)
	lastDel map[types.UID]string
}

func (s *suite) trackPods(t *testing.T, job string) *podTracker {
	tr := &podTracker{initial: map[types.UID]string{}, later: map[types.UID]string{}, deleted: map[types.UID]int{},
		lastDel: map[types.UID]string{}}
	for _, p := range s.pods(t, job) {
		tr.initial[p.UID] = p.Name
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			var pods corev1.PodList
			if s.env.Client.List(s.env.Ctx, &pods, client.InNamespace(s.ns), client.MatchingLabels{jobNameLabel: job}) != nil {
				continue
			}
			tr.mu.Lock()
			for _, p := range pods.Items {
				if _, ok := tr.initial[p.UID]; !ok {
					tr.later[p.UID] = p.Name
				}
				if p.DeletionTimestamp != nil {
					if v := p.DeletionTimestamp.String(); tr.lastDel[p.UID] != v {
						tr.lastDel[p.UID] = v
						tr.deleted[p.UID]++
					}
				}
			}
			tr.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return tr
}

// recordTracker keeps the last preemption record (with its per-rank part)
// seen on a job's Workload: phases like Done can be short-lived.
type recordTracker struct {
	mu    sync.Mutex
	st    ladder.State
	wl    *kueue.Workload
	ranks map[string]string
}

// last is the last record seen, with the last per-rank data seen.
func (r *recordTracker) last() (ladder.State, *kueue.Workload) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	if r.ranks != nil {
		if err := preemption.DecodeRankRecord(r.ranks, &st); err != nil {
			panic(err)
		}
	}
	return st, r.wl
}

func (s *suite) trackRecord(t *testing.T, job string) *recordTracker {
	// Watches, not polls: a pod-level preemption can pass Done and be
	// reset within a few milliseconds once Kueue re-admits the workload.
	r := &recordTracker{}
	wc, err := client.NewWithWatch(s.env.Config, client.Options{Scheme: s.env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	wlw, err := wc.Watch(s.env.Ctx, &kueue.WorkloadList{}, client.InNamespace(s.ns))
	if err != nil {
		t.Fatal(err)
	}
	cmw, err := wc.Watch(s.env.Ctx, &corev1.ConfigMapList{}, client.InNamespace(s.ns))
	if err != nil {
		t.Fatal(err)
	}
	var ranks map[string]string // the last per-rank data seen
	go func() {
		for {
			select {
			case ev, ok := <-wlw.ResultChan():
				if !ok {
					return
				}
				wl, isWl := ev.Object.(*kueue.Workload)
				if !isWl || !ownedByJob(wl, job) {
					continue
				}
				st, err := preemption.PreemptionState(wl)
				if err != nil || st.Phase == ladder.PhaseNone {
					continue
				}
				r.mu.Lock()
				r.st, r.wl = st, wl
				r.mu.Unlock()
			case ev, ok := <-cmw.ResultChan():
				if !ok {
					return
				}
				if cm, isCM := ev.Object.(*corev1.ConfigMap); isCM && cm.Labels[preemption.LabelRankRecordOf] != "" && len(cm.Data) > 0 {
					r.mu.Lock()
					ranks = cm.Data
					r.ranks = ranks
					r.mu.Unlock()
				}
			}
		}
	}()
	t.Cleanup(func() { wlw.Stop(); cmw.Stop() })
	return r
}

func ownedByJob(wl *kueue.Workload, job string) bool {
	for _, o := range wl.OwnerReferences {
		if o.Name == job {
			return true
		}
	}
	return false
}

// A drain of one node of a running 2-pod gang: the eviction webhook holds
// the drain and asks for a checkpoint, the coordinator evicts the whole
// Workload through Kueue (instead of deleting pods under an admitted
// Workload), every rank saves, the job records the consistent step, and
// Kueue re-queues and re-admits the workload: the job is not Succeeded, no
// pod is deleted twice or force-deleted, and the job controller's new pods
// are left alone.
func TestDrainEvictsTheWholeWorkloadThroughKueue(t *testing.T) {
	env := framework.Start(t, framework.Options{Scheduler: true, TrainingOperator: true})
	for _, n := range []string{"n1", "n2"} {
		env.MustCreate(t, framework.MakeNode(n).GPUs(4, framework.H100).Obj())
		env.WaitForNodeReady(t, n)
	}
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"}, Spec: v1alpha1.GangFitParametersSpec{
		RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)}}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))
	env.StartManager(t, func(mgr ctrl.Manager) error { return admissioncheck.Setup(mgr, admissioncheck.Options{}) })
	whOpts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		return preemption.SetupWithManager(mgr, preemption.Options{Slack: 5 * time.Second, EvictionWebhook: true, SkipNameValidation: true})
	}, whOpts)
	whc := preemption.EvictionWebhookConfiguration("gpupack-system", "gpupack-webhook")
	fail := admissionregistrationv1.Fail
	whc.Webhooks[0].FailurePolicy = &fail
	env.InstallWebhooks(t, whOpts, whc)
	env.WaitForAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 4, framework.H100).AdmissionChecks("gang-fit").Obj())
	s := &suite{env: env, ns: env.Namespace(t, "team")}
	env.MustCreate(t, framework.MakeLocalQueue("lq", s.ns, "cq"))

	low := framework.MakePyTorchJob("low", s.ns, "lq", 1, 2).
		TemplateAnnotation(v1alpha1.AnnotationCheckpoint, "true").
		Annotation(v1alpha1.AnnotationCheckpointTimeout, "60s").Obj()
	env.MustCreate(t, low)
	agent := &fakeNodeAgent{env: env, ns: s.ns, job: "low", answer: true}
	agent.run(t)
	env.Eventually(t, 90*time.Second, "low running on 4 GPUs", func() (bool, string) {
		n := 0
		for _, p := range s.pods(t, "low") {
			if p.Status.Phase == corev1.PodRunning && p.Annotations[v1alpha1.AnnotationDevices] != "" && controllerutil.ContainsFinalizer(&p, containerAlive) {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d of 2 pods running with devices", n)
	})
	tr := s.trackPods(t, "low")
	rec := s.trackRecord(t, "low")
	var node string
	for _, p := range s.pods(t, "low") {
		if strings.Contains(p.Name, "master") {
			node = p.Spec.NodeName
		}
	}
	if node == "" {
		t.Fatal("master pod has no node")
	}

	// kubectl drain's eviction loop (without the cordon: the gang-fit
	// check does not read spec.unschedulable), retrying 429s.
	var drained []corev1.Pod
	for _, p := range s.pods(t, "low") {
		if p.Spec.NodeName == node {
			drained = append(drained, p)
		}
	}
	drainDone := make(chan error, 1)
	go func() {
		for _, dp := range drained {
			name := dp.Name
			for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
				// As kubectl drain: done once that pod (by UID) is going or
				// gone; a replacement of the same name is not the target.
				var cur corev1.Pod
				if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: name}, &cur); apierrors.IsNotFound(err) || (err == nil && (cur.UID != dp.UID || cur.DeletionTimestamp != nil)) {
					break
				}
				err := env.Clientset.CoreV1().RESTClient().Post().Namespace(s.ns).Resource("pods").Name(name).SubResource("eviction").
					MaxRetries(0).Body(&policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
					DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &dp.UID}}}).Do(env.Ctx).Error()
				if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
					break
				}
				if !apierrors.IsTooManyRequests(err) || time.Now().After(deadline) {
					drainDone <- fmt.Errorf("evicting %s: %w", name, err)
					return
				}
			}
		}
		drainDone <- nil
	}()

	env.Eventually(t, 60*time.Second, "workload evicted through Kueue", func() (bool, string) {
		_, wl := s.state(t, "low")
		c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == preemption.KueueEvictionReason, framework.DescribeWorkload(wl)
	})
	// Done lasts only until Kueue re-admits the workload (then the record
	// is reset): catch it as it passes.
	env.Eventually(t, 90*time.Second, "victim preemption Done", func() (bool, string) {
		st, _ := rec.last()
		return st.Phase == ladder.PhaseDone, fmt.Sprintf("phases %v, %d pods left", phasesOf(st), len(s.pods(t, "low")))
	})
	done, wl := rec.last()
	raw, _ := json.Marshal(done)
	t.Logf("victim's %s at Done: %s", v1alpha1.AnnotationPreemptionPhase, raw)
	if err := <-drainDone; err != nil {
		t.Fatal(err)
	}
	if done.Reason != preemption.ReasonEviction && done.Reason != preemption.ReasonDisruptionTarget {
		t.Errorf("reason %q, want the drain's", done.Reason)
	}
	if got, want := phasesOf(done), []ladder.Phase{ladder.PhaseCheckpointing, ladder.PhaseTerminating, ladder.PhaseDone}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("phases %v, want %v", got, want)
	}
	tr.mu.Lock()
	for uid := range done.Ranks {
		if _, ok := tr.initial[types.UID(uid)]; !ok {
			t.Errorf("rank %s is not one of the pods running at the drain %v", uid, tr.initial)
		}
	}
	tr.mu.Unlock()
	for rank, o := range done.Outcomes {
		if o != ladder.OutcomeSaved {
			t.Errorf("rank %s outcome %s, want Saved", rank, o)
		}
	}
	for _, reason := range []string{preemption.EventEvictingWorkload, preemption.EventCheckpointing, preemption.EventDone, preemption.EventConsistentStep} {
		if n := s.eventCount(t, wl.Name, reason); n != 1 {
			t.Errorf("%d %s Events on the workload, want 1", n, reason)
		}
	}

	// Kueue re-queues and re-admits it; the job controller's new pods run
	// and are left alone.
	s.waitRunning(t, "low", 2)
	env.Eventually(t, 60*time.Second, "record reset after re-admission", func() (bool, string) {
		_, wl := s.state(t, "low")
		_, ok := wl.Annotations[v1alpha1.AnnotationPreemptionPhase]
		return !ok && admitted(wl), framework.DescribeWorkload(wl)
	})
	time.Sleep(3 * time.Second) // several reconciles' worth for a wrong delete to show
	var job kftraining.PyTorchJob
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &job); err != nil {
		t.Fatal(err)
	}
	if got := job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
		t.Errorf("job %s = %q, want %d", v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
	}
	for _, c := range job.Status.Conditions {
		if c.Type == kftraining.JobSucceeded && c.Status == corev1.ConditionTrue {
			t.Errorf("preempted job is Succeeded: %+v", c)
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.later) == 0 {
		t.Error("never saw the job controller's new pods")
	}
	for uid, name := range tr.later {
		if tr.deleted[uid] > 0 {
			t.Errorf("new pod %s (%s) deleted after the re-admission", name, uid)
		}
	}
	// (kwok, like a kubelet, confirms a graceful deletion with a grace-0
	// delete: grace 0 on the object is no sign of the coordinator's
	// force delete. The record says whether it escalated.)
	for _, o := range done.Outcomes {
		if o == ladder.OutcomeKilled {
			t.Errorf("a rank was force-deleted in a drain where every rank saved: %v", done.Outcomes)
		}
	}
	for uid, name := range tr.initial {
		if tr.deleted[uid] == 0 {
			// Gone between two looks is fine; still there is not.
			for _, p := range s.pods(t, "low") {
				if p.UID == uid {
					t.Errorf("original pod %s still there", name)
				}
			}
		}
	}
}

// A node of a running opted-in gang is lost (its kubelet stops; the node
// lifecycle controller marks it NotReady): the coordinator evicts the whole
// Workload through Kueue without waiting for the taint manager, bounds the
// wait by the policy (the ranks there never answer), force-deletes what
// the lost kubelet cannot confirm, and Kueue re-queues the workload.
func TestNodeNotReadyEvictsTheWholeWorkload(t *testing.T) {
	s, startCoordinator := startPreemptionSuite(t)
	env := s.env
	startCoordinator()
	low := framework.MakePyTorchJob("low", s.ns, "lq", 1, 2).
		TemplateAnnotation(v1alpha1.AnnotationCheckpoint, "true").
		Annotation(v1alpha1.AnnotationCheckpointTimeout, "3s").Obj()
	for _, rs := range low.Spec.PyTorchReplicaSpecs {
		rs.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	}
	env.MustCreate(t, low)
	agent := &fakeNodeAgent{env: env, ns: s.ns, job: "low", node: "n1", noContainers: true}
	agent.run(t)
	s.waitRunning(t, "low", 2)
	rec := s.trackRecord(t, "low")
	env.SetKubelet(t, "n1", false)
	env.Eventually(t, 3*time.Minute, "workload evicted through Kueue for the NotReady node", func() (bool, string) {
		_, wl := s.state(t, "low")
		c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == preemption.KueueEvictionReason, framework.DescribeWorkload(wl)
	})
	// Done may last a single reconcile here (Kueue re-admits the workload
	// as soon as the force-deleted pods are gone): wait for its Event, and
	// read the reason and deadlines from the last record seen.
	env.Eventually(t, 90*time.Second, "victim preemption Done", func() (bool, string) {
		st, wl := rec.last()
		return wl != nil && s.eventCount(t, wl.Name, preemption.EventDone) > 0, fmt.Sprintf("phases %v, %d pods", phasesOf(st), len(s.pods(t, "low")))
	})
	done, wl := rec.last()
	raw, _ := json.Marshal(done)
	t.Logf("victim's %s, last seen: %s", v1alpha1.AnnotationPreemptionPhase, raw)
	if got := phasesOf(done); len(got) < 3 || got[0] != ladder.PhaseCheckpointing || got[2] != ladder.PhaseKilling {
		t.Errorf("phases %v, want Checkpointing, Terminating, Killing (the lost node confirms nothing)", got)
	}
	if done.Reason != preemption.ReasonNodeNotReady {
		t.Errorf("reason %q, want %s", done.Reason, preemption.ReasonNodeNotReady)
	}
	asked := phaseAt(done, ladder.PhaseCheckpointing)
	if done.KillDeadline == nil || done.KillDeadline.Sub(asked) > 8*time.Second {
		t.Errorf("kill deadline %v after the request, want max(timeout 3s, grace 2s) + slack 5s", done.KillDeadline)
	}
	if n := s.eventCount(t, wl.Name, preemption.EventDone); n != 1 {
		t.Errorf("%d %s Events, want 1", n, preemption.EventDone)
	}
	// The node comes back; Kueue re-admitted the workload and it runs again.
	env.SetKubelet(t, "n1", true)
	s.waitRunning(t, "low", 2)
}
