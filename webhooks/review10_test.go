package webhooks

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/gpupack/gpupack/webhooks/mutation"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// Review 10 (hostile re-review of the review-9 answers). Each test asserts
// the promise and fails with "BROKEN: ..." while the hole is open.

// TestReview10OwnerCacheMissRefusedUnderAllow (availability regression of
// review 9 F1): the pod webhook reads a pod's Job owner from the manager's
// cache (kueueView.owner: Cached for Jobs and PyTorchJobs). The Job
// controller creates a Job's pods milliseconds after the Job, often before
// the cache has it. Before 764e571 a cache miss only made the pod
// "unmanaged", which the policy Allow and a namespace's opt-out admit; now
// every "cannot be read" is PosesAsChild, refused whatever the policy says.
// An unqueued GPU Job's pods, created by the Job controller itself, are
// refused under Allow and in opted-out namespaces until the cache catches
// up (FailedCreate, Job controller backoff). The promise under opt-out is
// only "never takes another job's slot or plan": a pod of a Job nobody
// queued, which is in the API, takes neither.
func TestReview10OwnerCacheMissRefusedUnderAllow(t *testing.T) {
	ctx := context.Background()
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	etl := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "etl", Namespace: "lab", UID: "u-etl"}} // no queue label
	nsLab := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab", Labels: map[string]string{mutation.NamespaceLabelUnmanagedGPUs: "allow"}}}
	nsPlain := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}
	etlNs := etl.DeepCopy()
	etlNs.Namespace, etlNs.UID = "ns", "u-etl-ns"
	queued := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "etl", Namespace: "ns", UID: "u-queued", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	liveQueued := fake.NewClientBuilder().WithScheme(s).WithObjects(etl, queued, nsLab, nsPlain).Build()
	live := fake.NewClientBuilder().WithScheme(s).WithObjects(etl, etlNs, nsLab, nsPlain).Build()
	stale := fake.NewClientBuilder().WithScheme(s).Build() // the cache has not seen the Jobs yet
	jobController := authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:job-controller"}
	allow := mutation.Config{UnmanagedGPUs: mutation.UnmanagedGPUsConfig{Policy: mutation.UnmanagedAllow}}
	for _, tc := range []struct {
		name string
		cfg  mutation.Config
		ns   string
		uid  string
	}{
		{"opted-out namespace", mutation.Config{}, "lab", "u-etl"},
		{"policy Allow", allow, "ns", "u-etl-ns"},
		// Under the default Deny, a queued Job's pod: the owner missing
		// from the cache made it "cannot be read", refused (the owner is
		// now read live on a cache miss).
		{"queued Job, policy Deny", mutation.Config{}, "ns", "u-queued"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := mutation.New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			l := live
			if tc.uid == "u-queued" {
				l = liveQueued
			}
			h := HandlersWith(m, Readers{Cached: stale, Live: l})
			p := wholeGPUPod(tc.ns, "1")
			p.Name = "etl-abcde"
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "etl", UID: types.UID(tc.uid), Controller: ptr.To(true)}}
			req := request(t, admissionv1.Create, p, nil)
			req.Namespace = tc.ns
			req.UserInfo = jobController
			if resp := h[PathMutatePod].Handle(ctx, req); !resp.Allowed {
				t.Fatalf("BROKEN: the Job controller's pod of unqueued Job etl (in the API, not yet in the cache) refused where unmanaged GPUs are allowed: %v", resp.Result.Message)
			}
		})
	}
}

// TestReview10PosesAsChildUnderAllowNeedsOwnerControllers (availability
// regression of review 9 F1, on upgrade): under the policy Allow the list
// unmanagedGPUs.ownerControllers did not matter before 764e571 (a child
// whose creator was not on it was "unmanaged", and Allow admits that); now
// such a child is PosesAsChild, refused whatever the policy. KubeRay's
// Helm chart installs its operator in the release namespace (often
// default), not ray-system as DefaultOwnerControllers assumes: every GPU
// pod KubeRay makes for a queued RayCluster is refused after the upgrade,
// in a cluster whose administrator allowed unmanaged GPUs everywhere. The
// promise under Allow is only "never takes another job's slot or plan";
// only the owners whose controllers copy a plan into their children
// (JobSet, MPIJob, TrainJob: gpupack-job-plan's `propagates`) make an
// untrusted child a danger to it.
func TestReview10PosesAsChildUnderAllowNeedsOwnerControllers(t *testing.T) {
	ctx := context.Background()
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = ray.AddToScheme(s)
	rc := &ray.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "rc", Namespace: "ns", UID: "u-rc", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	c := fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(rc, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).Build()
	cfg := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "ray.io/raycluster"}},
		UnmanagedGPUs: mutation.UnmanagedGPUsConfig{Policy: mutation.UnmanagedAllow}}
	m, err := mutation.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	head := wholeGPUPod("ns", "1")
	head.Name = "rc-head-x"
	head.OwnerReferences = []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "rc", UID: "u-rc", Controller: ptr.To(true)}}
	req := request(t, admissionv1.Create, head, nil)
	req.UserInfo = authenticationv1.UserInfo{Username: "system:serviceaccount:default:kuberay-operator"}
	if resp := Handlers(m, c)[PathMutatePod].Handle(ctx, req); !resp.Allowed {
		t.Fatalf("BROKEN: under the policy Allow, KubeRay's head pod of a queued RayCluster (KubeRay installed in namespace default) refused: %v", resp.Result.Message)
	}
}

// TestReview10StatefulSetStartOrdinal (review 9 F2's guard): the
// StatefulSet controller names its pods <set>-<ordinal> for ordinals
// from spec.ordinals.start (GA in 1.31) to start+replicas-1; the guard
// takes ordinals from 0 to replicas-1. With a start of 2 and 2 replicas,
// the real pod set-3 is refused and a pod set-0, which the controller
// never makes (and deletes as out of range), is walked through. Only a
// leader StatefulSet is judged this way, and LWS v0.8 sets no start
// ordinal on it, so today this is latent.
func TestReview10StatefulSetStartOrdinal(t *testing.T) {
	ctx := context.Background()
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = appsv1.AddToScheme(s)
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "bob", Namespace: "ns", UID: "u-bob"},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2), Ordinals: &appsv1.StatefulSetOrdinals{Start: 2}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(sts).Build()
	m, err := mutation.New(mutation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	k := kueueView{m: m, r: Readers{Cached: c, Live: c}}
	ref := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "bob", UID: "u-bob", Controller: ptr.To(true)}
	for _, tc := range []struct {
		pod  string
		made bool
	}{{"bob-2", true}, {"bob-3", true}, {"bob-0", false}, {"bob-1", false}, {"bob-4", false}} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: tc.pod, Namespace: "ns"}}
		no := k.statefulSetPod(ctx, p, ref)
		if tc.made && no != "" {
			t.Errorf("BROKEN: pod %s, which StatefulSet bob (start 2, 2 replicas) makes, refused: %s", tc.pod, no)
		}
		if !tc.made && no == "" {
			t.Errorf("BROKEN: pod %s, which StatefulSet bob (start 2, 2 replicas) never makes, walked through as its pod", tc.pod)
		}
	}
}

// TestReview10ReparentedPyTorchJobLeavesKueue (new, High): the Job
// handler and every kind of kinds.go judge a GPU object whose owner
// references change as a creation by the one who changes them (issue 14
// finding 6, round 2: "a tenant's queued Job re-parented under another job
// is no longer Kueue's, and she could resume it with GPUs and no quota");
// the PyTorchJob handler does not (ptMutator.Handle, Update: only
// keepsManagement, which looks at the queue label). Alice creates a GPU
// PyTorchJob with her queue label (Kueue suspends it and makes it a
// Workload) and a tiny CPU Job "anchor" with her queue label, which Kueue
// admits; then she sets the PyTorchJob's controller reference to anchor.
// Kueue v0.17 now finds a managed ancestor (FindAncestorJobManagedByKueue):
// the PyTorchJob is anchor's child, which Kueue never suspends while anchor
// is admitted, so she resumes it (runPolicy.suspend=false) and its GPU pods
// run outside quota. Its pods come from a marked template, by the trusted
// training operator: they take the fast path, and the pod webhook would
// take them as anchor's anyway. The same re-parenting of a GPU Job is
// refused (control row).
func TestReview10ReparentedPyTorchJobLeavesKueue(t *testing.T) {
	ctx := context.Background()
	anchor := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "anchor", Namespace: "ns", UID: "u-anchor", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	h := handlers(t, mutation.Config{}, anchor, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
	under := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "anchor", UID: "u-anchor", Controller: ptr.To(true)}}
	queue := map[string]string{mutation.LabelQueueName: "q"}
	spec := wholeGPUPod("ns", "1").Spec

	oldJob := &batchv1.Job{TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"}, ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "ns", UID: "u-big", Labels: queue},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: spec}}}
	newJob := oldJob.DeepCopy()
	newJob.OwnerReferences = under

	oldPT := &kftraining.PyTorchJob{TypeMeta: metav1.TypeMeta{APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob"}, ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "ns", UID: "u-big-pt", Labels: queue},
		Spec: kftraining.PyTorchJobSpec{RunPolicy: kftraining.RunPolicy{Suspend: ptr.To(true)}, PyTorchReplicaSpecs: map[kftraining.ReplicaType]*kftraining.ReplicaSpec{
			kftraining.PyTorchJobReplicaTypeMaster: {Replicas: ptr.To[int32](1), Template: corev1.PodTemplateSpec{Spec: spec}}}}}
	newPT := oldPT.DeepCopy()
	newPT.OwnerReferences = under

	for _, tc := range []struct {
		name     string
		path     string
		old, obj any
	}{
		{"Job (control)", PathMutateJob, oldJob, newJob},
		{"PyTorchJob", PathMutatePyTorchJob, oldPT, newPT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := asTenant(request(t, admissionv1.Update, tc.obj, tc.old))
			resp := h[tc.path].Handle(ctx, req)
			if resp.Allowed {
				t.Fatalf("BROKEN: alice's queued GPU %s re-parented under her own queued Job anchor by an update (no longer Kueue's while anchor is admitted, so she can resume it outside quota) was allowed", tc.name)
			}
			// Her own re-parenting is no controller's adoption: the
			// refusal tells her to go through Kueue.
			if msg := resp.Result.Message; strings.Contains(msg, "Delete or rename") || !strings.Contains(msg, "submit it through Kueue") {
				t.Errorf("the refusal of her re-parenting: %s", msg)
			}
		})
	}
}

// TestReview10TrainerAdoptsTenantJobSet (new, High): the walk passes a
// JobSet up to its TrainJob because "the check is what makes sure the
// controller, not a tenant, made the middle link" (intermediateOK,
// checkedAtCreation), and a GPU object whose owners change is judged "as a
// creation by the one who changes them" (kinds.go). The Trainer breaks
// both: v2.2.0 (pkg/runtime/framework/plugins/jobset/jobset.go Build,
// pkg/controller/trainjob_controller.go:164) server-side-applies the
// JobSet named as the TrainJob with ForceOwnership and never checks who
// made an existing one; replicatedJobs is a list map, so a tenant's extra
// entries survive the apply. Alice creates a GPU JobSet "mine" with her
// queue label (managed by itself, suspended) whose replicatedJobs are the
// ones her TrainJob's runtime makes plus "evil" (8 GPUs, her image), then a
// TrainJob "mine" asking for little. The Trainer's apply adds the
// TrainJob's controller reference: judged as the Trainer's, allowed; on
// admission the JobSet controller makes the evil Jobs, taken in as the
// TrainJob's (Kueue too: FindAncestorJobManagedByKueue), while the
// TrainJob's Workload has no pod set for them: GPUs outside quota.
func TestReview10TrainerAdoptsTenantJobSet(t *testing.T) {
	ctx := context.Background()
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = jobset.AddToScheme(s)
	_ = trainer.AddToScheme(s)
	queue := map[string]string{mutation.LabelQueueName: "q"}
	tj := &trainer.TrainJob{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: "ns", UID: "u-tj", Labels: queue}}
	ctl := []metav1.OwnerReference{{APIVersion: "trainer.kubeflow.org/v1alpha1", Kind: "TrainJob", Name: "mine", UID: "u-tj", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	gpu := wholeGPUPod("ns", "8").Spec
	gpu.Containers[0].Image = "alice/miner"
	cpu := corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: "pytorch"}}}
	mine := &jobset.JobSet{TypeMeta: metav1.TypeMeta{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: "ns", UID: "u-js", Labels: queue},
		Spec: jobset.JobSetSpec{Suspend: ptr.To(true), ReplicatedJobs: []jobset.ReplicatedJob{
			{Name: "node", Replicas: 1, Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: cpu}}}},
			{Name: "evil", Replicas: 1, Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: gpu}}}},
		}}}
	adopted := mine.DeepCopy()
	adopted.OwnerReferences = ctl
	c := fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(tj, adopted, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).Build()
	cfg := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"}}, JobKinds: []string{KindJobSet}}
	m, err := mutation.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, c)

	// 1. Alice's own queued GPU JobSet: Kueue manages it by its label.
	create := asTenant(request(t, admissionv1.Create, mine, nil))
	if resp := h[PathMutateJobSet].Handle(ctx, create); !resp.Allowed {
		t.Fatalf("setup: alice's queued GPU JobSet refused: %v", resp.Result.Message)
	}
	// 2. The Trainer's server-side apply of JobSet "mine" for TrainJob
	// "mine": her JobSet gets the TrainJob as its controller.
	apply := request(t, admissionv1.Update, adopted, mine)
	apply.UserInfo = authenticationv1.UserInfo{Username: "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"}
	adoption := h[PathMutateJobSet].Handle(ctx, apply)
	adoptionAllowed := adoption.Allowed
	// Whoever reads the Trainer's event learns what is in the way.
	if !adoptionAllowed && !strings.Contains(adoption.Result.Message, "Delete or rename the existing object") {
		t.Errorf("the refusal of the adoption does not say to clear the existing JobSet: %s", adoption.Result.Message)
	}
	// 3. On admission the JobSet controller makes the evil Job.
	evil := &batchv1.Job{TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"}, ObjectMeta: metav1.ObjectMeta{Name: "mine-evil-0", Namespace: "ns",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "mine", UID: "u-js", Controller: ptr.To(true)}}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: gpu}}}
	jr := request(t, admissionv1.Create, evil, nil)
	jr.UserInfo = authenticationv1.UserInfo{Username: "system:serviceaccount:jobset-system:jobset-controller-manager"}
	jobResp := h[PathMutateJob].Handle(ctx, jr)
	if adoptionAllowed && jobResp.Allowed {
		t.Fatalf("BROKEN: alice's own GPU JobSet, adopted by the Trainer's apply under her TrainJob, is walked through as the TrainJob's: its replicatedJob evil (8 GPUs, image alice/miner, no pod set of the TrainJob's Workload) runs as the TrainJob's child, outside quota")
	}
}
