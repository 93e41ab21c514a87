// Package foundation shows the test harness is real: the real Kueue
// manager suspends and queues a PyTorchJob behind a gpupack.io/gang-fit
// AdmissionCheck, and kube-scheduler + kwok run an admitted Job to
// completion on fake GPU nodes.
package foundation

import (
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/test/framework"
)

func TestPyTorchJobWaitsOnGangFitCheck(t *testing.T) {
	env := framework.Start(t, framework.Options{})
	ctx, c := env.Ctx, env.Client

	ac := framework.MakeGangFitCheck("gang-fit", "")
	env.MustCreate(t, ac)
	// Stand in for the check controller's Active condition only: Kueue
	// deactivates a ClusterQueue whose checks are not Active.
	env.SetAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("h100"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("h100", 16, framework.H100).AdmissionChecks("gang-fit").Obj())
	ns := env.Namespace(t, "team-a")
	env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "cq"))

	job := framework.MakePyTorchJob("train", ns, "lq", 2, 1).Obj()
	env.MustCreate(t, job)

	// Kueue reserves quota and lists the check's state in separate writes.
	wl := env.WaitForWorkloadOf(t, ns, job.Name, "PyTorchJob", func(wl *kueue.Workload) bool {
		return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved) && findCheck(wl, "gang-fit") != nil
	})
	if len(wl.Spec.PodSets) != 2 {
		t.Fatalf("workload has %d pod sets, want master + worker", len(wl.Spec.PodSets))
	}
	st := findCheck(wl, "gang-fit")
	if st == nil || st.State != kueue.CheckStatePending {
		t.Fatalf("check state = %+v, want Pending", st)
	}
	if apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) {
		t.Fatalf("workload admitted without its check")
	}
	// It stays that way: suspended, no pods.
	time.Sleep(2 * time.Second)
	var got kftraining.PyTorchJob
	if err := c.Get(ctx, client.ObjectKeyFromObject(job), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.RunPolicy.Suspend == nil || !*got.Spec.RunPolicy.Suspend {
		t.Fatalf("PyTorchJob was unsuspended while its check is Pending")
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		t.Fatalf("%d pods exist for a workload that is not admitted", len(pods.Items))
	}
}

func TestJobRunsOnFakeGPUNodes(t *testing.T) {
	env := framework.Start(t, framework.Options{Scheduler: true})
	ctx, c := env.Ctx, env.Client

	env.MustCreate(t, framework.MakeNode("gpu-node-1").GPUs(8, framework.H100).Obj())
	env.WaitForNodeReady(t, "gpu-node-1")
	env.MustCreate(t, framework.MakeResourceFlavor("h100"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("h100", 8, framework.H100).Obj())
	ns := env.Namespace(t, "team-b")
	env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "cq"))

	job := framework.MakeJob("hello", ns, "lq", 2, 1).Obj()
	env.MustCreate(t, job)

	env.Eventually(t, 60*time.Second, "job to complete", func() (bool, string) {
		var j batchv1.Job
		if err := c.Get(ctx, client.ObjectKeyFromObject(job), &j); err != nil {
			return false, err.Error()
		}
		for _, cond := range j.Status.Conditions {
			if cond.Type == batchv1.JobComplete && cond.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("succeeded=%d", j.Status.Succeeded)
	})
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) < 2 {
		t.Fatalf("%d pods, want 2", len(pods.Items))
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "gpu-node-1" {
			t.Errorf("pod %s bound to %q, want gpu-node-1", p.Name, p.Spec.NodeName)
		}
	}
}

func findCheck(wl *kueue.Workload, name string) *kueue.AdmissionCheckState {
	for i := range wl.Status.AdmissionChecks {
		if string(wl.Status.AdmissionChecks[i].Name) == name {
			return &wl.Status.AdmissionChecks[i]
		}
	}
	return nil
}
