package gangfit

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
)

// TestClusterWithoutGPUNodesNeverRejects (issue 17, MultiKueue): a cluster
// with no GPU node — a MultiKueue manager, a fresh install, a pool scaled
// to zero — on which the gang-fit check is configured. Kueue reserves quota
// (the ClusterQueue has it); the check answers Retry, saying the inventory
// is empty, cycle after cycle, and never Rejected (which would deactivate
// the job). When a GPU node appears the job is admitted.
func TestClusterWithoutGPUNodesNeverRejects(t *testing.T) {
	s := setup(t, framework.Options{}, v1alpha1.GangFitParametersSpec{}, 8, framework.MakeNode("cpu-only").Obj())
	env := s.env
	env.MustCreate(t, framework.MakePyTorchJob("train", s.ns, "lq", 1, 1).Obj())
	env.Eventually(t, 60*time.Second, "two Retry cycles that say the inventory is empty", func() (bool, string) {
		wl := mustWorkload(t, s, "train")
		if st := checkState(wl); st != nil && st.State == kueue.CheckStateRejected {
			t.Fatalf("Rejected on a cluster without GPU nodes: %s", framework.DescribeWorkload(wl))
		}
		if !ptr.Deref(wl.Spec.Active, true) {
			t.Fatalf("deactivated: %s", framework.DescribeWorkload(wl))
		}
		n := 0
		for _, m := range s.events(t, wl.Name, admissioncheck.EventNoFit) {
			if contains(m, "no node has published a GPU inventory yet", "not rejecting") {
				n++
			}
		}
		st := checkState(wl)
		return n >= 1 && st != nil && ptr.Deref(st.RetryCount, 0) >= 2, fmt.Sprintf("%d events; %s", n, framework.DescribeWorkload(wl))
	})
	if wl := mustWorkload(t, s, "train"); admitted(wl) {
		t.Fatalf("admitted without GPUs: %s", framework.DescribeWorkload(wl))
	}
	env.CreateNode(t, framework.MakeNode("gpu").GPUs(2, framework.H100).Obj())
	wl := env.WaitForWorkloadOf(t, s.ns, "train", "PyTorchJob", admitted)
	if st := checkState(wl); st == nil || !strings.Contains(st.Message, "all 2 pods fit") {
		t.Errorf("check %+v", st)
	}
}

// TestMultiKueueCheckRunsInTheWorker: two control planes, each with its
// own Kueue. The manager's ClusterQueue "cq" names only the MultiKueue
// check, dispatching to the worker; the worker's "cq" names gang-fit, next
// to its GPU nodes. A Job on the manager is planned and admitted in the
// worker (GPUPlan there), none in the manager. The misconfiguration: the
// manager's "cq2" names MultiKueue *and* gang-fit, with a GPU node of the
// manager's own that would fit: the manager's gang-fit makes no plan and
// says it belongs in the worker clusters (Retry, never Ready or Rejected).
func TestMultiKueueCheckRunsInTheWorker(t *testing.T) {
	worker := framework.Start(t, framework.Options{})
	manager := framework.Start(t, framework.Options{})
	spec := v1alpha1.GangFitParametersSpec{RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)}}
	for _, env := range []*framework.Env{worker, manager} {
		env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"}, Spec: spec})
		env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))
		env.StartManager(t, func(mgr ctrl.Manager) error { return admissioncheck.Setup(mgr, admissioncheck.Options{}) })
		env.WaitForAdmissionCheckActive(t, "gang-fit")
		env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	}
	worker.CreateNode(t, framework.MakeNode("w1").GPUs(4, framework.H100).Obj())
	manager.CreateNode(t, framework.MakeNode("m1").GPUs(4, framework.H100).Obj())

	// The worker: gang-fit on its ClusterQueues.
	worker.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 8, framework.H100).AdmissionChecks("gang-fit").Obj())
	// The manager: MultiKueue to the worker.
	kc, err := os.ReadFile(worker.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	manager.MustCreate(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "worker1", Namespace: "kueue-system"}, Data: map[string][]byte{"kubeconfig": kc}})
	manager.MustCreate(t, &kueue.MultiKueueCluster{ObjectMeta: metav1.ObjectMeta{Name: "worker1"},
		Spec: kueue.MultiKueueClusterSpec{ClusterSource: kueue.ClusterSource{KubeConfig: &kueue.KubeConfig{Location: "worker1", LocationType: kueue.SecretLocationType}}}})
	manager.MustCreate(t, &kueue.MultiKueueConfig{ObjectMeta: metav1.ObjectMeta{Name: "mkc"}, Spec: kueue.MultiKueueConfigSpec{Clusters: []string{"worker1"}}})
	manager.MustCreate(t, &kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: "mk"}, Spec: kueue.AdmissionCheckSpec{
		ControllerName: kueue.MultiKueueControllerName,
		Parameters:     &kueue.AdmissionCheckParametersReference{APIGroup: kueue.GroupVersion.Group, Kind: "MultiKueueConfig", Name: "mkc"}}})
	manager.WaitForAdmissionCheckActive(t, "mk")
	manager.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 8, framework.H100).AdmissionChecks("mk").Obj())
	manager.MustCreate(t, framework.MakeClusterQueue("cq2").GPUFlavor("gpu", 8, framework.H100).AdmissionChecks("mk", "gang-fit").Obj())
	ns := manager.Namespace(t, "team")
	worker.MustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	for _, env := range []*framework.Env{worker, manager} {
		env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "cq"))
	}
	worker.MustCreate(t, framework.MakeLocalQueue("lq2", ns, "cq"))
	manager.MustCreate(t, framework.MakeLocalQueue("lq2", ns, "cq2"))

	// The documented setup.
	job := framework.MakeJob("train", ns, "lq", 2, 1).Obj()
	job.Spec.ManagedBy = ptr.To(kueue.MultiKueueControllerName)
	manager.MustCreate(t, job)
	mwl := manager.WaitForWorkloadOf(t, ns, "train", "Job", admitted)
	var wwl *kueue.Workload
	worker.Eventually(t, 60*time.Second, "the worker's copy admitted through gang-fit", func() (bool, string) {
		var wls kueue.WorkloadList
		if err := worker.Client.List(worker.Ctx, &wls, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for i := range wls.Items {
			if wls.Items[i].Name == mwl.Name {
				wwl = &wls.Items[i]
				st := checkState(wwl)
				return admitted(wwl) && st != nil && st.State == kueue.CheckStateReady, framework.DescribeWorkload(wwl)
			}
		}
		return false, fmt.Sprintf("no workload %s in the worker (%d there)", mwl.Name, len(wls.Items))
	})
	var plan v1alpha1.GPUPlan
	if err := worker.Client.Get(worker.Ctx, client.ObjectKey{Namespace: ns, Name: wwl.Name}, &plan); err != nil || plan.Spec.PodCount != 2 {
		t.Errorf("worker plan: %v (%d pods)", err, plan.Spec.PodCount)
	}
	var plans v1alpha1.GPUPlanList
	if err := manager.Client.List(manager.Ctx, &plans); err != nil || len(plans.Items) != 0 {
		t.Errorf("manager plans: %v, %d", err, len(plans.Items))
	}

	// The misconfiguration.
	job2 := framework.MakeJob("train2", ns, "lq2", 2, 1).Obj()
	job2.Spec.ManagedBy = ptr.To(kueue.MultiKueueControllerName)
	manager.MustCreate(t, job2)
	manager.Eventually(t, 60*time.Second, "the manager's gang-fit says it belongs in the workers", func() (bool, string) {
		wl, err := manager.WorkloadOf(ns, "train2", "Job")
		if err != nil || wl == nil {
			return false, fmt.Sprint("no workload ", err)
		}
		if st := checkState(wl); st != nil && (st.State == kueue.CheckStateRejected || st.State == kueue.CheckStateReady) {
			t.Fatalf("manager's gang-fit %s: %s", st.State, framework.DescribeWorkload(wl))
		}
		var evs corev1.EventList
		_ = manager.Client.List(manager.Ctx, &evs, client.InNamespace(ns))
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == wl.Name && e.Reason == admissioncheck.EventMultiKueue && contains(e.Message, "MultiKueue (admission check mk)", "worker clusters") {
				return true, ""
			}
		}
		return false, framework.DescribeWorkload(wl)
	})
	if err := manager.Client.List(manager.Ctx, &plans); err != nil || len(plans.Items) != 0 {
		t.Errorf("manager plans: %v, %d", err, len(plans.Items))
	}
}
