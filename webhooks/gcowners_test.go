package webhooks

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// TestGarbageCollectorOwnerRemovalOneRule: the garbage collector's owner
// changes meet one rule (gcRemovesOwners) on the Job, PyTorchJob and job
// kinds' paths. Removing owner references (an orphaning delete of the
// owner) is not judged, under its service account or as
// kube-controller-manager (without --use-service-account-credentials);
// the same removal by a tenant is judged as her creation of an ownerless
// GPU job (refused under Deny), and a controller reference added under
// the collector's name is judged as any adoption is. Before the rule the
// job kinds' path judged the collector's removal (a TrainJob orphaning its
// JobSet stayed terminating) while the Job path let the collector add any
// owner.
// gcFixture is the fixture of the garbage collector's tests: the webhook
// handlers (Jobs, PyTorchJobs and JobSets; Kueue's job, pytorchjob, jobset
// and trainjob integrations) over a queued JobSet js, Job anchor and
// TrainJob tj, and children(block, plan), a GPU child of each with no
// queue label of its own — a Job under js (its template carrying plan
// when plan is not ""), a PyTorchJob under anchor, a JobSet under tj —
// whose controller reference has blockOwnerDeletion block.
func gcFixture(t *testing.T) (h map[string]admission.Handler, children func(block bool, plan string) (*batchv1.Job, *kftraining.PyTorchJob, *jobset.JobSet)) {
	t.Helper()
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = jobset.AddToScheme(s)
	_ = trainer.AddToScheme(s)
	_ = kftraining.AddToScheme(s)
	queue := map[string]string{mutation.LabelQueueName: "q"}
	owners := []kruntime.Object{
		&jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "js", Namespace: "ns", UID: "u-js", Labels: queue}},
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "anchor", Namespace: "ns", UID: "u-anchor", Labels: queue}},
		&trainer.TrainJob{ObjectMeta: metav1.ObjectMeta{Name: "tj", Namespace: "ns", UID: "u-tj", Labels: queue}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
	}
	cfg := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "kubeflow.org/pytorchjob", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"}}, JobKinds: []string{KindJobSet}}
	m, err := mutation.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h = Handlers(m, fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(owners...).Build())
	gpu := wholeGPUPod("ns", "1").Spec
	children = func(block bool, plan string) (*batchv1.Job, *kftraining.PyTorchJob, *jobset.JobSet) {
		ref := func(apiVersion, kind, name, uid string) []metav1.OwnerReference {
			return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: ktypes.UID(uid), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(block)}}
		}
		jobTemplate := corev1.PodTemplateSpec{Spec: *gpu.DeepCopy()}
		if plan != "" {
			jobTemplate.Annotations = map[string]string{v1alpha1.AnnotationPlan: plan}
		}
		job := &batchv1.Job{TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"}, ObjectMeta: metav1.ObjectMeta{Name: "js-w-0", Namespace: "ns", UID: "u-job",
			OwnerReferences: ref("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "u-js")}, Spec: batchv1.JobSpec{Template: jobTemplate}}
		pt := &kftraining.PyTorchJob{TypeMeta: metav1.TypeMeta{APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob"}, ObjectMeta: metav1.ObjectMeta{Name: "pt", Namespace: "ns", UID: "u-pt",
			OwnerReferences: ref("batch/v1", "Job", "anchor", "u-anchor")},
			Spec: kftraining.PyTorchJobSpec{PyTorchReplicaSpecs: map[kftraining.ReplicaType]*kftraining.ReplicaSpec{
				kftraining.PyTorchJobReplicaTypeMaster: {Replicas: ptr.To[int32](1), Template: corev1.PodTemplateSpec{Spec: *gpu.DeepCopy()}}}}}
		js := &jobset.JobSet{TypeMeta: metav1.TypeMeta{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet"}, ObjectMeta: metav1.ObjectMeta{Name: "tj", Namespace: "ns", UID: "u-tjs",
			OwnerReferences: ref("trainer.kubeflow.org/v1alpha1", "TrainJob", "tj", "u-tj")},
			Spec: jobset.JobSetSpec{ReplicatedJobs: []jobset.ReplicatedJob{{Name: "node", Replicas: 1, Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: *gpu.DeepCopy()}}}}}}}
		return job, pt, js
	}
	return h, children
}

func TestGarbageCollectorOwnerRemovalOneRule(t *testing.T) {
	ctx := context.Background()
	h, children := gcFixture(t)
	job, pt, js := children(true, "")
	orphan := func(o metav1.Object) any {
		switch v := o.(type) {
		case *batchv1.Job:
			c := v.DeepCopy()
			c.OwnerReferences = nil
			return c
		case *kftraining.PyTorchJob:
			c := v.DeepCopy()
			c.OwnerReferences = nil
			return c
		case *jobset.JobSet:
			c := v.DeepCopy()
			c.OwnerReferences = nil
			return c
		}
		t.Fatalf("kind %T", o)
		return nil
	}

	gc := authenticationv1.UserInfo{Username: garbageCollector}
	kcm := authenticationv1.UserInfo{Username: "system:kube-controller-manager"}
	alice := authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}
	for _, k := range []struct {
		kind  string
		path  string
		child metav1.Object
	}{
		{"Job under a JobSet", PathMutateJob, job},
		{"PyTorchJob under a Job", PathMutatePyTorchJob, pt},
		{"JobSet under a TrainJob", PathMutateJobSet, js},
	} {
		for _, tc := range []struct {
			name     string
			user     authenticationv1.UserInfo
			old, obj any
			allow    bool
		}{
			{"the collector removes the owner (orphaning delete)", gc, k.child, orphan(k.child), true},
			{"kube-controller-manager removes the owner", kcm, k.child, orphan(k.child), true},
			{"the tenant removes the owner", alice, k.child, orphan(k.child), false},
			{"a controller reference added under the collector's name", gc, orphan(k.child), k.child, false},
		} {
			t.Run(k.kind+"/"+tc.name, func(t *testing.T) {
				req := request(t, admissionv1.Update, tc.obj, tc.old)
				req.UserInfo = tc.user
				resp := h[k.path].Handle(ctx, req)
				if resp.Allowed != tc.allow {
					t.Errorf("allowed=%v, want %v (%v)", resp.Allowed, tc.allow, resp.Result)
				}
			})
		}
	}
}
