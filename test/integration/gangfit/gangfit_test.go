package gangfit

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
)

// The seed's §0.1: two 8-GPU gangs submitted together on 8 free GPUs. Kueue
// reserves quota for both (the queue has 16); without gpupack both start and
// each holds part of the GPUs. With the check exactly one is admitted and
// runs, the other holds no pod and says why; when the first is gone the
// second is admitted.
func TestSeedDeadlockExactlyOneAdmitted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
	}{
		{"one node x 8 GPUs", []*corev1.Node{framework.MakeNode("n1").GPUs(8, framework.H100).Obj()}},
		{"two nodes x 4 GPUs", []*corev1.Node{framework.MakeNode("n1").GPUs(4, framework.H100).Obj(), framework.MakeNode("n2").GPUs(4, framework.H100).Obj()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := setup(t, framework.Options{Scheduler: true, TrainingOperator: true}, v1alpha1.GangFitParametersSpec{}, 8, tc.nodes...)
			env := s.env
			jobs := []*kftraining.PyTorchJob{
				framework.MakePyTorchJob("train-a", s.ns, "lq", 7, 1).Obj(),
				framework.MakePyTorchJob("train-b", s.ns, "lq", 7, 1).Obj(),
			}
			for _, j := range jobs {
				env.MustCreate(t, j)
			}
			var winner, loser string
			env.Eventually(t, 60*time.Second, "one job admitted and its 8 pods running", func() (bool, string) {
				winner, loser = "", ""
				for _, j := range jobs {
					wl, err := env.WorkloadOf(s.ns, j.Name, "PyTorchJob")
					if err != nil || wl == nil {
						return false, fmt.Sprint("no workload ", err)
					}
					if admitted(wl) {
						if winner != "" {
							t.Fatalf("both %s and %s admitted onto 8 GPUs", winner, j.Name)
						}
						winner = j.Name
					} else {
						loser = j.Name
					}
				}
				if winner == "" {
					return false, "none admitted"
				}
				return running(s.podsOf(t, winner)) == 8, fmt.Sprintf("%d pods of %s running", running(s.podsOf(t, winner)), winner)
			})
			// The other one is held without a single pod, and says why.
			env.Eventually(t, 30*time.Second, "the held job explains the shortage", func() (bool, string) {
				msgs := s.events(t, mustWorkload(t, s, loser).Name, admissioncheck.EventNoFit)
				for _, m := range msgs {
					if contains(m, "does not fit", "8") {
						return true, ""
					}
				}
				return false, fmt.Sprint(msgs)
			})
			if n := len(s.podsOf(t, loser)); n != 0 {
				t.Fatalf("held job %s has %d pods", loser, n)
			}
			if wl := mustWorkload(t, s, loser); admitted(wl) {
				t.Fatalf("held job admitted: %s", framework.DescribeWorkload(wl))
			}
			// The first one finishes (here: is deleted with its pods); the
			// second is admitted and runs.
			bg := metav1.DeletePropagationBackground
			for _, j := range jobs {
				if j.Name == winner {
					if err := env.Client.Delete(env.Ctx, j, &client.DeleteOptions{PropagationPolicy: &bg}); err != nil {
						t.Fatal(err)
					}
				}
			}
			env.Eventually(t, 90*time.Second, "second job admitted and running", func() (bool, string) {
				wl := mustWorkload(t, s, loser)
				return admitted(wl) && running(s.podsOf(t, loser)) == 8, framework.DescribeWorkload(wl)
			})
		})
	}
}

// mustWorkload returns a job's Workload, waiting for Kueue to create it.
func mustWorkload(t *testing.T, s *suite, job string) *kueue.Workload {
	t.Helper()
	return s.env.WaitForWorkloadOf(t, s.ns, job, "PyTorchJob", nil)
}

// fractional makes every replica ask for one shared GPU with mib MiB, as the
// gpupack webhook writes it (vgpu + gpu-memory resources).
func fractional(j *kftraining.PyTorchJob, mib int64) *kftraining.PyTorchJob {
	for _, rs := range j.Spec.PyTorchReplicaSpecs {
		c := &rs.Template.Spec.Containers[0]
		rl := corev1.ResourceList{
			v1alpha1.ResourceVGPU:      resource.MustParse("1"),
			v1alpha1.ResourceGPUMemory: *resource.NewQuantity(mib, resource.DecimalSI),
		}
		delete(c.Resources.Limits, v1alpha1.ResourceNvidiaGPU)
		delete(c.Resources.Requests, v1alpha1.ResourceNvidiaGPU)
		for k, v := range rl {
			c.Resources.Limits[k] = v
			c.Resources.Requests[k] = v
		}
	}
	return j
}

// 3 × 50 GiB on 2 free × 80 GiB GPUs: Kueue's aggregate quota admits it, no
// GPU can take two. Held (Retry: two more GPUs exist but are busy) with a
// precise message; 3 × 30 GiB is admitted.
func TestFragmentationHeldWithPreciseMessage(t *testing.T) {
	s := setup(t, framework.Options{}, v1alpha1.GangFitParametersSpec{}, 4,
		framework.MakeNode("n1").GPUs(2, framework.H100).Obj(), framework.MakeNode("busy").GPUs(2, framework.H100).Obj())
	env := s.env
	holdGPUs(t, s, "busy", 2, false)
	big := fractional(framework.MakePyTorchJob("big", s.ns, "lq", 2, 1).Obj(), 50*1024)
	env.MustCreate(t, big)
	env.Eventually(t, 30*time.Second, "big job held with a per-GPU reason", func() (bool, string) {
		wl := mustWorkload(t, s, "big")
		for _, m := range s.events(t, wl.Name, admissioncheck.EventNoFit) {
			if contains(m, "51200") {
				return true, ""
			}
		}
		return false, framework.DescribeWorkload(wl)
	})
	if wl := mustWorkload(t, s, "big"); admitted(wl) {
		t.Fatalf("3 x 50 GiB admitted onto 2 x 80 GiB: %s", framework.DescribeWorkload(wl))
	}

	small := fractional(framework.MakePyTorchJob("small", s.ns, "lq", 2, 1).Obj(), 30*1024)
	env.MustCreate(t, small)
	wl := env.WaitForWorkloadOf(t, s.ns, "small", "PyTorchJob", admitted)
	var plan v1alpha1.GPUPlan
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: wl.Name}, &plan); err != nil {
		t.Fatalf("plan of admitted workload: %v", err)
	}
	perGPU := map[string]int64{}
	for _, a := range plan.Spec.Assignments {
		for _, g := range a.GPUs {
			perGPU[g.UUID] += g.MemoryMiB
		}
	}
	alloc := flavors.Allocatable(81559)
	total := int64(0)
	for u, m := range perGPU {
		if m > alloc {
			t.Errorf("GPU %s planned %d MiB > allocatable %d", u, m, alloc)
		}
		total += m
	}
	if plan.Spec.PodCount != 3 || total != 3*30*1024 {
		t.Errorf("plan has %d pods and %d MiB, want 3 pods and %d MiB", plan.Spec.PodCount, total, 3*30*1024)
	}
	if st := checkState(wl); st == nil || len(st.PodSetUpdates) == 0 || st.PodSetUpdates[0].Annotations[v1alpha1.AnnotationPlan] != plan.Name {
		t.Errorf("podSetUpdates do not name the plan: %+v", st)
	}
	if mustWorkload(t, s, "big"); admitted(mustWorkload(t, s, "big")) {
		t.Errorf("big admitted after small")
	}
}

// A 16-pod gang that must share one rack lands in the only rack that can
// hold it, although the cluster as a whole has room elsewhere too.
func TestRequiredLevelKeepsGangInOneRack(t *testing.T) {
	var nodes []*corev1.Node
	for i := 0; i < 3; i++ { // rack-a: 12 GPUs in all
		nodes = append(nodes, framework.MakeNode(fmt.Sprintf("a%d", i)).GPUs(4, framework.H100).Label(framework.LabelRack, "rack-a").Obj())
	}
	for i := 0; i < 2; i++ { // rack-b: 16 GPUs
		nodes = append(nodes, framework.MakeNode(fmt.Sprintf("b%d", i)).GPUs(8, framework.H100).Label(framework.LabelRack, "rack-b").Obj())
	}
	spec := v1alpha1.GangFitParametersSpec{TopologyLevels: []string{framework.LabelRack}, RequiredLevel: framework.LabelRack}
	s := setup(t, framework.Options{}, spec, 16, nodes...)
	s.env.MustCreate(t, framework.MakePyTorchJob("rack", s.ns, "lq", 15, 1).Obj())
	wl := s.env.WaitForWorkloadOf(t, s.ns, "rack", "PyTorchJob", admitted)
	st := checkState(wl)
	for _, u := range st.PodSetUpdates {
		if u.NodeSelector[framework.LabelRack] != "rack-b" {
			t.Errorf("pod set %s node selector %v, want %s=rack-b", u.Name, u.NodeSelector, framework.LabelRack)
		}
	}
	var plan v1alpha1.GPUPlan
	if err := s.env.Client.Get(s.env.Ctx, client.ObjectKey{Namespace: s.ns, Name: wl.Name}, &plan); err != nil {
		t.Fatal(err)
	}
	if plan.Spec.PodCount != 16 || plan.Spec.Domain != "rack-b" {
		t.Fatalf("plan: %d pods in %q", plan.Spec.PodCount, plan.Spec.Domain)
	}
	for _, a := range plan.Spec.Assignments {
		if !strings.HasPrefix(a.Node, "b") {
			t.Errorf("pod %s/%d planned on %s outside rack-b", a.PodSet, a.Index, a.Node)
		}
	}
}

// A victim's terminating pods keep their GPUs counted until they are gone:
// the preemptor stays Pending (not Retry, which would waste Kueue's
// preemption) with a message, then is admitted.
func TestTerminatingPodsHoldGPUsUntilGone(t *testing.T) {
	s := setup(t, framework.Options{}, v1alpha1.GangFitParametersSpec{}, 8, framework.MakeNode("n1").GPUs(8, framework.H100).Obj())
	env := s.env
	victim := holdGPUs(t, s, "n1", 8, true)
	// Grace 0: no kubelet runs here to confirm a graceful stop, so the
	// finalizer alone decides when the pod is gone.
	if err := env.Client.Delete(env.Ctx, victim, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	env.MustCreate(t, framework.MakePyTorchJob("preemptor", s.ns, "lq", 7, 1).Obj())
	env.Eventually(t, 30*time.Second, "preemptor Pending on terminating pods", func() (bool, string) {
		wl := mustWorkload(t, s, "preemptor")
		st := checkState(wl)
		return st != nil && st.State == kueue.CheckStatePending && strings.Contains(st.Message, "terminating"), framework.DescribeWorkload(wl)
	})
	// It stays Pending, never Retry, while the pod is there.
	for i := 0; i < 20; i++ {
		wl := mustWorkload(t, s, "preemptor")
		if st := checkState(wl); st == nil || st.State != kueue.CheckStatePending || st.RetryCount != nil || admitted(wl) {
			t.Fatalf("preemptor left Pending while the victim terminates: %s", framework.DescribeWorkload(wl))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := env.Client.Patch(env.Ctx, victim, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		t.Fatal(err)
	}
	env.WaitForWorkloadOf(t, s.ns, "preemptor", "PyTorchJob", admitted)
}

// The ledger is in the API: a manager killed after admitting one gang and
// restarted never hands that gang's GPUs to another.
func TestRestartedManagerDoesNotDoubleBook(t *testing.T) {
	s := setup(t, framework.Options{}, v1alpha1.GangFitParametersSpec{}, 8, framework.MakeNode("n1").GPUs(8, framework.H100).Obj())
	env := s.env
	env.MustCreate(t, framework.MakePyTorchJob("first", s.ns, "lq", 7, 1).Obj())
	env.WaitForWorkloadOf(t, s.ns, "first", "PyTorchJob", admitted)
	s.stop()
	s.startManager(t)
	env.MustCreate(t, framework.MakePyTorchJob("second", s.ns, "lq", 7, 1).Obj())
	env.Eventually(t, 30*time.Second, "second held by the first's plan", func() (bool, string) {
		wl := mustWorkload(t, s, "second")
		return len(s.events(t, wl.Name, admissioncheck.EventNoFit)) > 0, framework.DescribeWorkload(wl)
	})
	for i := 0; i < 20; i++ {
		if wl := mustWorkload(t, s, "second"); admitted(wl) {
			t.Fatalf("second admitted onto GPUs the first holds: %s", framework.DescribeWorkload(wl))
		}
		time.Sleep(100 * time.Millisecond)
	}
	var first kftraining.PyTorchJob
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "first"}, &first); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(env.Ctx, &first); err != nil {
		t.Fatal(err)
	}
	// No garbage collector runs here: delete the first's workload as it would.
	if wl := mustWorkload(t, s, "first"); wl != nil {
		_ = env.Client.Delete(env.Ctx, wl)
	}
	env.WaitForWorkloadOf(t, s.ns, "second", "PyTorchJob", admitted)
}

// An AdmissionCheck naming missing parameters is marked inactive with a
// reason, and becomes Active once they exist.
func TestBadParametersRef(t *testing.T) {
	s := setup(t, framework.Options{NoKueue: true}, v1alpha1.GangFitParametersSpec{}, 8)
	env := s.env
	env.MustCreate(t, framework.MakeGangFitCheck("broken", "missing"))
	cond := func() *metav1.Condition {
		var ac kueue.AdmissionCheck
		if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: "broken"}, &ac); err != nil {
			t.Fatal(err)
		}
		return apimeta.FindStatusCondition(ac.Status.Conditions, kueue.AdmissionCheckActive)
	}
	env.Eventually(t, 20*time.Second, "inactive with BadParametersRef", func() (bool, string) {
		c := cond()
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == admissioncheck.ReasonBadParametersRef && strings.Contains(c.Message, "missing"), fmt.Sprint(c)
	})
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "missing"}})
	env.Eventually(t, 20*time.Second, "active once parameters exist", func() (bool, string) {
		c := cond()
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprint(c)
	})
}

// holdGPUs creates a pod pinned (gpupack.io/devices) to n whole GPUs of a
// node, as a placed pod of another workload; withFinalizer keeps it
// terminating after deletion until the test lets it go.
func holdGPUs(t *testing.T, s *suite, node string, n int, withFinalizer bool) *corev1.Pod {
	t.Helper()
	var devs []v1alpha1.DeviceAssignment
	for i := 0; i < n; i++ {
		devs = append(devs, v1alpha1.DeviceAssignment{UUID: fmt.Sprintf("GPU-%s-%d", node, i), MemoryMiB: flavors.Allocatable(81559)})
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder-" + node, Namespace: s.ns,
			Annotations: map[string]string{v1alpha1.AnnotationDevices: v1alpha1.FormatDevices(devs)}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: *resource.NewQuantity(int64(n), resource.DecimalSI)}}}}},
	}
	if withFinalizer {
		p.Finalizers = []string{"test.gpupack.io/hold"}
	}
	s.env.MustCreate(t, p)
	return p
}
