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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// TestPlanOnlyFromTrustedControllers (issue 14, finding 6): a pod, or a
// job's pod template, carrying gpupack.io/plan is created only by a
// controller gpupack trusts, for its controlling owner, or by a cluster
// admin — on every path that reaches the webhook: a fractional pod, a
// whole-GPU pod, a CPU-only pod, a GPU in an init container, Job,
// PyTorchJob and JobSet templates. Kueue's own podSetUpdates (a job
// update) still bring the plan.
func TestPlanOnlyFromTrustedControllers(t *testing.T) {
	ctx := context.Background()
	m, err := mutation.New(mutation.Config{UnmanagedGPUs: mutation.UnmanagedGPUsConfig{Policy: mutation.UnmanagedAllow}})
	if err != nil {
		t.Fatal(err)
	}
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = appsv1.AddToScheme(s)
	victim := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: "ns", UID: "uid-victim", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	unqueued := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "alices", Namespace: "ns", UID: "uid-alices"}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "alices-rs", Namespace: "ns", UID: "uid-alices-rs"}}
	h := Handlers(m, fake.NewClientBuilder().WithScheme(s).WithObjects(victim, unqueued, rs).Build())
	ofUnqueued := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "alices", UID: "uid-alices", Controller: ptr.To(true)}}
	ofRS := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "alices-rs", UID: "uid-alices-rs", Controller: ptr.To(true)}}
	rsController := authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:replicaset-controller"}
	alice := authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}
	jobController := authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:job-controller"}
	jobsetController := authenticationv1.UserInfo{Username: "system:serviceaccount:jobset-system:jobset-controller-manager"}
	admin := authenticationv1.UserInfo{Username: "admin", Groups: []string{"system:masters"}}
	ofJob := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "victim", UID: "uid-victim", Controller: ptr.To(true)}}
	ofJobSet := []metav1.OwnerReference{{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "js", UID: "uid-js", Controller: ptr.To(true)}}
	plan := map[string]string{v1alpha1.AnnotationPlan: "plan-victim"}
	fractional := func(owners []metav1.OwnerReference) *corev1.Pod {
		p := gpuPod("4Gi")
		p.OwnerReferences = owners
		return p
	}
	whole := func(owners []metav1.OwnerReference) *corev1.Pod {
		p := wholeGPUPod("ns", "1")
		p.Annotations, p.OwnerReferences = map[string]string{v1alpha1.AnnotationPlan: "plan-victim"}, owners
		return p
	}
	cpuOnly := func(owners []metav1.OwnerReference) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "ns", Annotations: map[string]string{v1alpha1.AnnotationPlan: "plan-victim"}, OwnerReferences: owners},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
		return p
	}
	initGPU := func(owners []metav1.OwnerReference) *corev1.Pod {
		p := cpuOnly(owners)
		p.Spec.InitContainers = []corev1.Container{{Name: "sidecar", Image: "i", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}
		return p
	}
	job := func(owners []metav1.OwnerReference) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns", OwnerReferences: owners},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: plan},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}}}
	}
	pytorch := &kftraining.PyTorchJob{ObjectMeta: metav1.ObjectMeta{Name: "pt", Namespace: "ns"}, Spec: kftraining.PyTorchJobSpec{
		PyTorchReplicaSpecs: map[kftraining.ReplicaType]*kftraining.ReplicaSpec{kftraining.PyTorchJobReplicaTypeMaster: {
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: plan}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}}}}}
	js := testJobSet(nil, true, gpuTemplate(map[string]string{v1alpha1.AnnotationPlan: "plan-victim"}, "1"))
	for _, tc := range []struct {
		name string
		path string
		obj  any
		user authenticationv1.UserInfo
		deny string // "" = allowed
	}{
		{"tenant: fractional pod naming another job's plan", PathMutatePod, fractional(nil), alice, `created by "alice"`},
		{"tenant: fractional pod under the victim's Job", PathMutatePod, fractional(ofJob), alice, `created by "alice"`},
		{"tenant: whole-GPU pod", PathMutatePod, whole(ofJob), alice, `created by "alice"`},
		{"tenant: CPU-only pod carrying a plan", PathMutatePod, cpuOnly(nil), alice, `created by "alice"`},
		{"tenant: GPU in a native sidecar", PathMutatePod, initGPU(nil), alice, `created by "alice"`},
		{"Job controller: no owner", PathMutatePod, whole(nil), jobController, "no controlling owner"},
		{"Job controller: its Job's pod", PathMutatePod, fractional(ofJob), jobController, ""},
		{"Job controller: whole-GPU pod of its Job", PathMutatePod, whole(ofJob), jobController, ""},
		{"cluster admin", PathMutatePod, whole(nil), admin, ""},
		// A plan does not make a pod managed by itself: a trusted
		// controller's pod from a template nobody checked (round 2,
		// finding 3) is refused, even where unmanaged GPUs are allowed.
		{"ReplicaSet controller: a tenant's unqueued ReplicaSet's pod", PathMutatePod, fractional(ofRS), rsController, "Kueue will not manage it"},
		{"Job controller: a tenant's unqueued Job's CPU pod", PathMutatePod, cpuOnly(ofUnqueued), jobController, "Kueue will not manage it"},
		{"Job controller: a tenant's unqueued Job's whole-GPU pod", PathMutatePod, whole(ofUnqueued), jobController, "Kueue will not manage it"},
		{"tenant: Job template carrying a plan", PathMutateJob, job(nil), alice, `Job j carries the annotation gpupack.io/plan`},
		{"JobSet controller: its JobSet's Job", PathMutateJob, job(ofJobSet), jobsetController, ""},
		{"tenant: PyTorchJob template carrying a plan", PathMutatePyTorchJob, pytorch, alice, `PyTorchJob pt carries the annotation gpupack.io/plan`},
		{"tenant: JobSet template carrying a plan", PathMutateJobSet, js, alice, `JobSet js carries the annotation gpupack.io/plan`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t, admissionv1.Create, tc.obj, nil)
			req.UserInfo = tc.user
			resp := h[tc.path].Handle(ctx, req)
			switch {
			case tc.deny == "" && !resp.Allowed:
				t.Errorf("denied: %v", resp.Result.Message)
			case tc.deny != "" && (resp.Allowed || !strings.Contains(resp.Result.Message, tc.deny)):
				t.Errorf("allowed=%v %v, want denied with %q", resp.Allowed, resp.Result, tc.deny)
			}
		})
	}
	// Kueue's podSetUpdates: an update by Kueue's account writes the plan
	// into a suspended Job's template; that is not a creation.
	before := job(nil)
	before.Spec.Template.Annotations = nil
	req := request(t, admissionv1.Update, job(nil), before)
	req.UserInfo = authenticationv1.UserInfo{Username: "system:serviceaccount:kueue-system:kueue-controller-manager"}
	if resp := h[PathMutateJob].Handle(ctx, req); !resp.Allowed {
		t.Errorf("Kueue's podSetUpdates on a Job: denied: %v", resp.Result.Message)
	}
}

// TestGPUJobReparentedIsJudgedAgain (round 2, finding 4): a tenant's
// queued GPU Job given a controller reference to another job by an update
// is judged as a creation by her — Kueue would leave it as that job's
// child, and she could resume it outside every quota.
func TestGPUJobReparentedIsJudgedAgain(t *testing.T) {
	ctx := context.Background()
	victim := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: "ns", UID: "uid-victim", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	h := handlers(t, mutation.Config{}, victim)
	own := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "alices", Namespace: "ns", UID: "uid-alices", Labels: map[string]string{mutation.LabelQueueName: "q"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: *wholeGPUPod("ns", "1").Spec.DeepCopy()}}}
	moved := own.DeepCopy()
	moved.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "victim", UID: "uid-victim", Controller: ptr.To(true)}}
	for _, tc := range []struct {
		name  string
		user  authenticationv1.UserInfo
		allow bool
	}{
		{"tenant", authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}, false},
		// The collector only removes owners (gcRemovesOwners); a
		// reference added under its name is judged as anyone's.
		{"garbage collector", authenticationv1.UserInfo{Username: garbageCollector}, false},
	} {
		req := request(t, admissionv1.Update, moved, own)
		req.UserInfo = tc.user
		if resp := h[PathMutateJob].Handle(ctx, req); resp.Allowed != tc.allow {
			t.Errorf("%s: allowed=%v, want %v (%v)", tc.name, resp.Allowed, tc.allow, resp.Result)
		}
	}
	// Any other update of hers is not judged again.
	same := own.DeepCopy()
	same.Labels["x"] = "y"
	req := request(t, admissionv1.Update, same, own)
	req.UserInfo = authenticationv1.UserInfo{Username: "alice"}
	if resp := h[PathMutateJob].Handle(ctx, req); !resp.Allowed {
		t.Errorf("an update keeping the owners: denied: %v", resp.Result)
	}
}
