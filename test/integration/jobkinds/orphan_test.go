package jobkinds

import (
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
)

// TestOrphaningDeleteOfAdmittedJobSet: alice (edit) deletes her admitted,
// running GPU JobSet with propagation Orphan (`kubectl delete
// --cascade=orphan`). The garbage collector removes the JobSet's owner
// reference from its Job — a GPU Job with no queue label of its own,
// which gpupack's Job webhook would refuse as a tenant's creation under
// the default Deny — and then lets the JobSet go. gpupack does not judge
// the collector's owner removal (gcRemovesOwners, one rule for Jobs,
// PyTorchJobs and every job kind), so the delete completes; before, the
// Job path refused it whenever the collector ran as kube-controller-manager
// (as here: --use-service-account-credentials=false), and the job kinds'
// path always, and the JobSet stayed terminating for good. What the orphan
// then runs stays counted: Kueue v0.17 keeps the JobSet's Workload
// admitted (kubernetes-sigs/kueue#1789) — asserted, as the premise
// docs/security.md ("Orphaning deletes") rests on.
func TestOrphaningDeleteOfAdmittedJobSet(t *testing.T) {
	needController(t, "jobset")
	s := startControllerSuite(t, framework.Options{JobSet: true, JobSetController: true}, webhooks.KindJobSet)
	env := s.env
	alice := tenant(t, env, s.ns)
	js := runnableJobSet("orph", s.ns, "low", 1, "30Gi", false)
	if err := alice.Create(env.Ctx, js); err != nil {
		t.Fatalf("alice's GPU JobSet: %v", err)
	}
	wl := env.WaitForWorkloadOf(t, s.ns, "orph", "JobSet", admitted)
	sel := client.MatchingLabels{labelJobSetName: "orph"}
	pods := s.waitPinned(t, "orph's pod", sel, 1)

	if err := alice.Delete(env.Ctx, js, client.PropagationPolicy(metav1.DeletePropagationOrphan)); err != nil {
		t.Fatalf("alice's orphaning delete: %v", err)
	}
	env.Eventually(t, 90*time.Second, "JobSet orph gone after its orphaning delete", func() (bool, string) {
		var got jobset.JobSet
		err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(js), &got)
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		var jobs batchv1.JobList
		_ = env.Client.List(env.Ctx, &jobs, client.InNamespace(s.ns), sel)
		var owners []string
		for _, j := range jobs.Items {
			owners = append(owners, fmt.Sprintf("%s owners %v", j.Name, j.OwnerReferences))
		}
		return false, fmt.Sprintf("JobSet: %v, finalizers %v, deleting since %v; Jobs: %v", err, got.Finalizers, got.DeletionTimestamp, owners)
	})
	var jobs batchv1.JobList
	if err := env.Client.List(env.Ctx, &jobs, client.InNamespace(s.ns), sel); err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 1 || len(jobs.Items[0].OwnerReferences) != 0 || jobs.Items[0].DeletionTimestamp != nil {
		t.Fatalf("after the orphaning delete, want JobSet orph's one Job left without owners: %+v", jobs.Items)
	}
	var pod corev1.Pod
	if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(&pods[0]), &pod); err != nil || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("the orphaned Job's pod: %v %v %s", err, pod.DeletionTimestamp, pod.Status.Phase)
	}
	// The premise: its GPUs stay counted, by the JobSet's Workload, still
	// admitted. The collector removed the Workload's owner reference
	// before it let the JobSet go (its orphan finalizer); Kueue reconciles
	// that update. A negative, so watched for a bounded while: admitted
	// at every look for 5 s.
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := wl.DeepCopy()
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(wl), got); err != nil {
			t.Fatalf("JobSet orph's Workload %s after the orphaning delete: %v (its orphan runs outside quota)", wl.Name, err)
		}
		if len(got.OwnerReferences) != 0 {
			t.Fatalf("JobSet orph's Workload %s still has owners after the JobSet is gone: %v", wl.Name, got.OwnerReferences)
		}
		if !admitted(got) || got.DeletionTimestamp != nil {
			t.Fatalf("JobSet orph's Workload after the orphaning delete is no longer admitted (its orphan Job runs outside quota; docs/security.md \"Orphaning deletes\" no longer holds): %s", framework.DescribeWorkload(got))
		}
		if time.Now().After(deadline) {
			t.Logf("Workload %s after the orphaning delete: %s; owners %v", got.Name, framework.DescribeWorkload(got), got.OwnerReferences)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}
