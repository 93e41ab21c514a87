package jobkinds

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// Review 10's two High findings (docs/security.md, "Review 10"), end to
// end: the unit PoCs (webhooks/review10_test.go) drive the handlers with
// requests shaped like the controllers'; here the real Trainer v2, JobSet
// controller, training operator and Kueue make them, and alice is a tenant
// with `edit` in her namespace. Each test fails "BROKEN: ..." when the
// promise breaks.

// TestReview10TrainerDoesNotAdoptTenantJobSet (review 10, F1): alice
// creates her own queued JobSet "mine" — the Trainer's rendering of a
// TrainJob "mine" (she had the Trainer render it for an earlier TrainJob
// of that name and copied it: the JobSet webhook keeps a JobSet's
// replicated jobs immutable, so only a JobSet equal to what the Trainer
// applies survives its apply) plus a replicated job "evil" asking for 8
// GPUs, more than her ClusterQueue's 2, so Kueue never admits it. Then she
// creates TrainJob "mine", CPU only, which Kueue admits at once. The
// Trainer server-side-applies JobSet "mine" with force: without gpupack's
// defence (updateCreator: an update that gives a GPU object a controller
// reference it did not have is judged as if no trusted controller had
// created it) her JobSet became the TrainJob's child, Kueue stopped
// accounting it, the Trainer resumed it with the TrainJob, and the
// 8-GPU Job ran on the TrainJob's admission. With the defence, gpupack's
// JobSet webhook refuses the Trainer's apply, and the Trainer says so on
// the TrainJob (Warning event TrainJobResourcesCreationFailed).
func TestReview10TrainerDoesNotAdoptTenantJobSet(t *testing.T) {
	needController(t, "jobset")
	needController(t, "trainer")
	s := startControllerSuite(t, framework.Options{TrainJob: true, JobSet: true, JobSetController: true, TrainerController: true},
		webhooks.KindTrainJob, webhooks.KindTrainingRuntime, webhooks.KindClusterTrainingRuntime, webhooks.KindJobSet)
	env := s.env
	// A node where the 8 GPUs fit, so that the evil Job, if it ever runs,
	// really runs (its quota, 2 GPUs, never admits it).
	env.MustCreate(t, framework.MakeNode("n2").GPUs(8, framework.H100).Obj())
	env.WaitForNodeReady(t, "n2")
	createRuntime(t, env, s.ns, trainingRuntime("torch", s.ns, "", false, false))
	alice := tenant(t, env, s.ns)

	// The Trainer's rendering of a TrainJob "mine": for one queued in a
	// LocalQueue that does not exist (never admitted, its JobSet stays as
	// the Trainer applied it), deleted once copied.
	probe := trainJob("mine", s.ns, "TrainingRuntime", "torch", "low", "")
	probe.GetLabels()["kueue.x-k8s.io/queue-name"] = "nowhere"
	if err := alice.Create(env.Ctx, probe); err != nil {
		t.Fatalf("alice's probe TrainJob: %v", err)
	}
	var rendered jobset.JobSet
	env.Eventually(t, 60*time.Second, "the Trainer's JobSet mine for the probe", func() (bool, string) {
		err := alice.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "mine"}, &rendered)
		return err == nil, fmt.Sprint(err)
	})
	// Background: the TrainJob goes first, so the Trainer has nothing
	// left to render the JobSet for (with foreground deletion it kept
	// re-creating it while the garbage collector deleted it).
	if err := alice.Delete(env.Ctx, probe, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 60*time.Second, "the probe, its JobSet and its Workload gone", func() (bool, string) {
		errJS := alice.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "mine"}, &jobset.JobSet{})
		errTJ := alice.Get(env.Ctx, client.ObjectKeyFromObject(probe), probe.DeepCopy())
		wl, _ := env.WorkloadOf(s.ns, "mine", "TrainJob")
		return apierrors.IsNotFound(errJS) && apierrors.IsNotFound(errTJ) && wl == nil, fmt.Sprintf("JobSet: %v; TrainJob: %v; Workload %v", errJS, errTJ, wl != nil)
	})

	mine := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: s.ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "lq"}},
		Spec: *rendered.Spec.DeepCopy()}
	mine.Spec.Suspend = ptr.To(true)
	for i := range mine.Spec.ReplicatedJobs {
		for k := range mine.Spec.ReplicatedJobs[i].Template.Spec.Template.Annotations {
			if strings.HasPrefix(k, "gpupack.io/") {
				delete(mine.Spec.ReplicatedJobs[i].Template.Spec.Template.Annotations, k)
			}
		}
	}
	evil := mine.Spec.ReplicatedJobs[0].DeepCopy()
	evil.Name = "evil"
	evil.Template.Spec.Parallelism, evil.Template.Spec.Completions = ptr.To[int32](1), ptr.To[int32](1)
	c := &evil.Template.Spec.Template.Spec.Containers[0]
	c.Image, c.Command = "alice/miner", []string{"mine"}
	c.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("8")}}
	mine.Spec.ReplicatedJobs = append(mine.Spec.ReplicatedJobs, *evil)
	// A re-creation by the Trainer still in flight for the deleted probe
	// may land late: clear it and create hers.
	var created *jobset.JobSet
	env.Eventually(t, 60*time.Second, "alice's queued GPU JobSet mine created", func() (bool, string) {
		created = mine.DeepCopy()
		err := alice.Create(env.Ctx, created)
		if apierrors.IsAlreadyExists(err) {
			late := &jobset.JobSet{}
			if gerr := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "mine"}, late); gerr == nil && metav1.GetControllerOf(late) != nil && metav1.GetControllerOf(late).UID == probe.GetUID() {
				_ = env.Client.Delete(env.Ctx, late, client.PropagationPolicy(metav1.DeletePropagationBackground))
			}
			return false, "a JobSet mine of the probe's is still there"
		}
		if err != nil {
			t.Fatalf("alice's queued GPU JobSet mine: %v", err)
		}
		return true, ""
	})
	env.WaitForWorkloadOf(t, s.ns, "mine", "JobSet", nil)

	if err := alice.Create(env.Ctx, trainJob("mine", s.ns, "TrainingRuntime", "torch", "low", "")); err != nil {
		t.Fatalf("alice's TrainJob mine: %v", err)
	}
	tjWl := env.WaitForWorkloadOf(t, s.ns, "mine", "TrainJob", admitted)
	if podSet(tjWl, "evil") != nil {
		t.Fatalf("the TrainJob's Workload has a pod set evil: %+v", tjWl.Spec.PodSets)
	}

	// The Trainer, for the resumed TrainJob, applies JobSet mine (it did
	// for the suspended one too): the apply is refused, or it adopts.
	evilSel := client.MatchingLabels{labelJobSetName: "mine", "jobset.sigs.k8s.io/replicatedjob-name": "evil"}
	var refusal string
	env.Eventually(t, 2*time.Minute, "the Trainer's apply of JobSet mine for the resumed TrainJob refused, or her JobSet adopted", func() (bool, string) {
		var js jobset.JobSet
		if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "mine"}, &js); err != nil {
			return false, err.Error()
		}
		if ref := metav1.GetControllerOf(&js); ref != nil {
			return true, ""
		}
		tj := getTrainJob(t, env, s.ns, "mine")
		refusal = trainJobEvents(t, env, s.ns, tj.GetUID(), "TrainJobResourcesCreationFailed", "JobSet mine asks for GPUs under an owner it cannot claim")
		resumed := apimeta.IsStatusConditionFalse(tj.Status.Conditions, trainer.TrainJobSuspended)
		return refusal != "" && resumed, fmt.Sprintf("refusal %q, conditions %+v", refusal, tj.Status.Conditions)
	})
	var js jobset.JobSet
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "mine"}, &js); err != nil {
		t.Fatal(err)
	}
	if js.UID != created.UID {
		t.Fatalf("JobSet mine is not alice's (UID %s, hers %s): %+v", js.UID, created.UID, js.OwnerReferences)
	}
	if ref := metav1.GetControllerOf(&js); ref != nil {
		// The evidence: what the adopted JobSet's evil Job did.
		var pods []corev1.Pod
		waitUpTo(90*time.Second, func() bool {
			pods = s.pods(t, evilSel)
			return len(pods) > 0 && pods[0].Status.Phase == corev1.PodRunning
		})
		t.Fatalf("BROKEN: alice's own queued JobSet mine (replicated job evil: 8 GPUs, image alice/miner) adopted by the Trainer's apply: its controller is now %s %s; evil's pods, none in the TrainJob's Workload (pod sets %s): %s; its own Workload: %s",
			ref.Kind, ref.Name, podSetNames(tjWl), describePods(pods), describeWorkloadOf(env, s.ns, "mine", "JobSet"))
	}
	if js.Spec.Suspend == nil || !*js.Spec.Suspend {
		t.Errorf("BROKEN: alice's JobSet mine, never admitted (8 GPUs over a quota of 2), resumed: %s", describeWorkloadOf(env, s.ns, "mine", "JobSet"))
	}
	// Its Jobs, the JobSet controller's (made suspended for a suspended
	// JobSet), are there — the controller had its chance — stay
	// suspended and make no pods.
	env.Eventually(t, 60*time.Second, "the JobSet controller's Jobs of alice's JobSet mine", func() (bool, string) {
		var jobs batchv1.JobList
		if err := env.Client.List(env.Ctx, &jobs, client.InNamespace(s.ns), client.MatchingLabels{labelJobSetName: "mine"}); err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs.Items {
			if j.Spec.Suspend == nil || !*j.Spec.Suspend {
				t.Fatalf("BROKEN: Job %s of alice's JobSet mine runs (not suspended)", j.Name)
			}
		}
		return len(jobs.Items) == len(js.Spec.ReplicatedJobs), fmt.Sprintf("%d Jobs, %d replicated jobs", len(jobs.Items), len(js.Spec.ReplicatedJobs))
	})
	if pods := s.pods(t, evilSel); len(pods) != 0 {
		t.Errorf("BROKEN: evil's pods exist: %s", describePods(pods))
	}
	if !strings.Contains(refusal, "JobSet mine asks for GPUs under an owner it cannot claim") || !strings.Contains(refusal, "Delete or rename the existing object") {
		t.Errorf("the TrainJob's TrainJobResourcesCreationFailed event does not carry gpupack's denial of the adoption: %q", refusal)
	}
	// What a platform engineer sees: the TrainJob admitted and "Resumed",
	// with no JobSet of its own, a Warning event carrying the denial, and
	// (the Trainer reads the status of whatever JobSet has its name) her
	// JobSet's replicated jobs in its jobsStatus.
	tj := getTrainJob(t, env, s.ns, "mine")
	var conds, jobsStatus []string
	for _, c := range tj.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	for _, j := range tj.Status.JobsStatus {
		jobsStatus = append(jobsStatus, fmt.Sprintf("%s(suspended %d)", j.Name, ptr.Deref(j.Suspended, 0)))
	}
	t.Logf("TrainJob mine: admitted (%s); conditions %v; jobsStatus %v; the Trainer's event: %s",
		framework.DescribeWorkload(tjWl), conds, jobsStatus, refusal)
}

// TestReview10ReparentedPyTorchJobRefused (review 10, F2): alice's queued
// GPU PyTorchJob "big" (3 GPUs over a quota of 2: Kueue keeps it
// suspended) and her tiny CPU Job "anchor", which Kueue admits. She gives
// big a controller reference to anchor: for Kueue v0.17 big is then
// anchor's child (FindAncestorJobManagedByKueue), which it does not
// suspend while anchor is admitted, so she could resume it and the
// training operator would make its GPU pods outside quota. gpupack's
// PyTorchJob webhook refuses the update (an owner change judged as a
// creation by her: ownerChange).
func TestReview10ReparentedPyTorchJobRefused(t *testing.T) {
	s := startControllerSuite(t, framework.Options{TrainingOperator: true})
	env := s.env
	alice := tenant(t, env, s.ns)

	anchor := framework.MakeJob("anchor", s.ns, "lq", 1, 0).Obj()
	if err := alice.Create(env.Ctx, anchor); err != nil {
		t.Fatalf("alice's Job anchor: %v", err)
	}
	env.WaitForWorkloadOf(t, s.ns, "anchor", "Job", admitted)
	big := framework.MakePyTorchJob("big", s.ns, "lq", 2, 1).Obj()
	if err := alice.Create(env.Ctx, big); err != nil {
		t.Fatalf("alice's PyTorchJob big: %v", err)
	}
	env.WaitForWorkloadOf(t, s.ns, "big", "PyTorchJob", nil)
	if err := alice.Get(env.Ctx, client.ObjectKeyFromObject(anchor), anchor); err != nil {
		t.Fatal(err)
	}

	// A merge patch (an UPDATE to admission, no resourceVersion to
	// conflict with the training operator's status writes).
	reparent, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{
		{APIVersion: "batch/v1", Kind: "Job", Name: "anchor", UID: anchor.UID, Controller: ptr.To(true)}}}})
	if err != nil {
		t.Fatal(err)
	}
	bigSel := client.MatchingLabels{"training.kubeflow.org/job-name": "big"}
	if err := alice.Patch(env.Ctx, big, client.RawPatch(types.MergePatchType, reparent)); err == nil {
		// The attack's next step: resume it.
		patch := []byte(`{"spec":{"runPolicy":{"suspend":false}}}`)
		perr := alice.Patch(env.Ctx, big, client.RawPatch("application/merge-patch+json", patch))
		var pods []corev1.Pod
		waitUpTo(90*time.Second, func() bool {
			pods = s.pods(t, bigSel)
			return len(pods) > 0 && pods[0].Status.Phase == corev1.PodRunning
		})
		t.Fatalf("BROKEN: alice's queued GPU PyTorchJob big re-parented under her admitted Job anchor by an update; resumed by her (%v): its pods %s; its Workload: %s",
			perr, describePods(pods), describeWorkloadOf(env, s.ns, "big", "PyTorchJob"))
	} else if !strings.Contains(err.Error(), "PyTorchJob big asks for GPUs but Kueue will not manage it") {
		t.Errorf("the re-parenting refused, but not by gpupack's owner-change judgement: %v", err)
	} else {
		t.Logf("refused: %v", err)
	}
	if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(big), big); err != nil {
		t.Fatal(err)
	}
	if len(big.OwnerReferences) != 0 || big.Spec.RunPolicy.Suspend == nil || !*big.Spec.RunPolicy.Suspend {
		t.Errorf("BROKEN: big stored with owners %v, suspend %v", big.OwnerReferences, big.Spec.RunPolicy.Suspend)
	}
	if wl, _ := env.WorkloadOf(s.ns, "big", "PyTorchJob"); wl == nil || admitted(wl) {
		t.Errorf("big's Workload (3 GPUs over a quota of 2) missing or admitted: %v", wl)
	}
	// The training operator has seen big (its Suspended condition): it
	// had its chance to make pods.
	env.Eventually(t, 60*time.Second, "the training operator's Suspended condition on big", func() (bool, string) {
		got := &kftraining.PyTorchJob{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(big), got); err != nil {
			return false, err.Error()
		}
		for _, c := range got.Status.Conditions {
			if c.Type == kftraining.JobSuspended && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", got.Status.Conditions)
	})
	if pods := s.pods(t, bigSel); len(pods) != 0 {
		t.Errorf("BROKEN: pods of big exist: %s", describePods(pods))
	}
}

// tenant gives alice `edit` in ns, with the job kinds' API groups
// aggregated into it (as the operators' charts do with their
// aggregate-to-edit roles; no clusterrole-aggregation controller runs
// here), and returns her client.
func tenant(t *testing.T, env *framework.Env, ns string) client.Client {
	t.Helper()
	env.MustCreate(t, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "job-kinds-edit", Labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kubeflow.org", "jobset.x-k8s.io", "trainer.kubeflow.org"}, Resources: []string{"*"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	})
	env.AggregateClusterRole(t, "view") // edit aggregates view
	env.AggregateClusterRole(t, "edit")
	env.MustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-edit", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}}})
	c, err := client.New(env.UserConfig(t, "alice"), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// trainJobEvents is the message of an event of reason on the TrainJob
// of UID uid that contains want, else of the latest such event ("" when
// there is none): an apply may also fail otherwise now and then (a
// webhook timeout under load), and the name was the probe's too.
func trainJobEvents(t *testing.T, env *framework.Env, ns string, uid types.UID, reason, want string) string {
	t.Helper()
	var evs corev1.EventList
	if err := env.Client.List(env.Ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	msg, last := "", time.Time{}
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind != "TrainJob" || e.InvolvedObject.UID != uid || e.Reason != reason {
			continue
		}
		if strings.Contains(e.Message, want) {
			return e.Message
		}
		at := e.LastTimestamp.Time
		if e.EventTime.After(at) {
			at = e.EventTime.Time
		}
		if !at.Before(last) {
			msg, last = e.Message, at
		}
	}
	return msg
}

// waitUpTo polls cond until it holds or timeout passes (evidence for a
// failure message, never a pass condition).
func waitUpTo(timeout time.Duration, cond func() bool) {
	for deadline := time.Now().Add(timeout); !cond() && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
	}
}

func describePods(pods []corev1.Pod) string {
	if len(pods) == 0 {
		return "none"
	}
	var out []string
	for _, p := range pods {
		gpus := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceNvidiaGPU]
		out = append(out, fmt.Sprintf("%s %s on %q (nvidia.com/gpu %s)", p.Name, p.Status.Phase, p.Spec.NodeName, gpus.String()))
	}
	return strings.Join(out, "; ")
}

func describeWorkloadOf(env *framework.Env, ns, name, kind string) string {
	wl, err := env.WorkloadOf(ns, name, kind)
	if err != nil || wl == nil {
		return fmt.Sprintf("none (%v)", err)
	}
	return framework.DescribeWorkload(wl)
}

func podSetNames(wl *kueue.Workload) string {
	var n []string
	for _, ps := range wl.Spec.PodSets {
		n = append(n, string(ps.Name))
	}
	return strings.Join(n, ",")
}
