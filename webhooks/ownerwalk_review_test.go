package webhooks

import (
	"context"
	"testing"

	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// Review rev14c (third outside review of the owner walk). Each test asserts
// the SAFE outcome, so it FAILS while the hole is open.

var rev14cFrameworks = []string{"batch/job", "kubeflow.org/pytorchjob", "pod", "deployment", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset"}

var rev14cTenant = authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}

// runsUngated fails t when resp admits pod with no gpupack placement gate
// and no Kueue admission gate (Kueue's pod webhook runs on the same pod;
// what it does is stated by the caller in why).
func runsUngated(t *testing.T, req admission.Request, resp admission.Response, why string) {
	t.Helper()
	if !resp.Allowed {
		return
	}
	got := &corev1.Pod{}
	apply(t, req, resp, got)
	for _, g := range got.Spec.SchedulingGates {
		if g.Name == v1alpha1.SchedulingGatePlacement {
			return
		}
	}
	t.Errorf("whole-GPU pod admitted with no gpupack gate; %s", why)
}

func ownerWalkGPUTemplate() corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("8")}}}}},
	}
}

// Finding 1: gpupack sees no ReplicaSet. A tenant creates her own
// ReplicaSet (GPU template, no kueue.x-k8s.io/pod-suspending-parent
// annotation) whose controller reference names her queued Deployment
// (paused, so the Deployment controller leaves the only active RS alone).
// The ReplicaSet controller (trusted) creates the pods. gpupack: RS ->
// Deployment is a podSetParent, the Deployment names a queue -> managed.
// Kueue v0.17 pod webhook: no suspending-parent annotation, so it runs
// FindAncestorJobManagedByKueue, which returns the Deployment (deployment
// integration: JobType Deployment, queue label) -> the pod is NOT gated.
// Kueue's deployment integration has no Workload of its own (noop
// reconciler): its pods are covered only by being gated one by one.
func TestOwnerWalkTenantReplicaSetUnderQueuedDeployment(t *testing.T) {
	yes := true
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "dep", Namespace: "ns", UID: "u-dep", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "dep-mine", Namespace: "ns", UID: "u-rs",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "dep", UID: "u-dep", Controller: &yes}}}}
	h := podIntegrationHandlers(t, mutation.Config{Kueue: mutation.KueueConfig{Frameworks: rev14cFrameworks}},
		dep, rs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
	pod := wholeGPUPod("ns", "8")
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "dep-mine", UID: "u-rs", Controller: &yes}}
	req := request(t, admissionv1.Create, pod, nil)
	req.UserInfo = authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:replicaset-controller"}
	resp := h[PathMutatePod].Handle(context.Background(), req)
	runsUngated(t, req, resp, "Kueue leaves it ungated too (no pod-suspending-parent annotation; ancestor Deployment dep is Kueue-managed), so it runs outside every quota")
}

// Finding 2: the StatefulSet webhook checks the owner chain at creation
// only; on update keepsManagement looks only at the queue label. A tenant
// creates a CPU StatefulSet (no queue label) controlled by her queued CPU
// pod (or her queued LWS), then updates its template to 8 whole GPUs:
// admitted. The StatefulSet controller (trusted) makes the pods; the pod
// walk STS -> Pod (a podSetParent) finds the queued pod managed. Kueue:
// no pod-suspending-parent annotation (Kueue's statefulset webhook adds
// it only to a STS with a queue label), FindAncestorJobManagedByKueue
// returns the leader pod -> not gated. The queued pod's Workload covers
// that one CPU pod only.
func TestOwnerWalkStatefulSetUpdateLaundersUnderQueuedPod(t *testing.T) {
	yes := true
	leader := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "ns", UID: "u-cpu", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	old := &appsv1.StatefulSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "sts", Namespace: "ns", UID: "u-sts",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "cpu", UID: "u-cpu", Controller: &yes}}},
		Spec: appsv1.StatefulSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}},
	}
	upd := old.DeepCopy()
	upd.Spec.Template = ownerWalkGPUTemplate()
	objs := []kruntime.Object{leader, upd, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}}
	cfg := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: rev14cFrameworks}}
	ctx := context.Background()

	t.Run("creating it with GPUs is denied (holds)", func(t *testing.T) {
		h := podIntegrationHandlers(t, cfg, objs...)
		req := request(t, admissionv1.Create, upd, nil)
		req.UserInfo = rev14cTenant
		if resp := h[PathMutateStatefulSet].Handle(ctx, req); resp.Allowed {
			t.Errorf("tenant's GPU StatefulSet under her queued pod admitted at creation")
		}
	})
	t.Run("adding GPUs by update", func(t *testing.T) {
		h := podIntegrationHandlers(t, cfg, objs...)
		req := request(t, admissionv1.Update, upd, old)
		req.UserInfo = rev14cTenant
		mr := h[PathMutateStatefulSet].Handle(ctx, req)
		vr := h[PathValidateStatefulSet].Handle(ctx, req)
		if mr.Allowed && vr.Allowed {
			t.Errorf("tenant's update giving 8 whole GPUs to her StatefulSet under her queued CPU pod admitted (mutating: %v, validating: %v)", mr.Result, vr.Result)
		}
	})
	t.Run("its pods", func(t *testing.T) {
		h := podIntegrationHandlers(t, cfg, objs...)
		pod := wholeGPUPod("ns", "8")
		pod.Labels = map[string]string{"app": "x"}
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "sts", UID: "u-sts", Controller: &yes}}
		req := request(t, admissionv1.Create, pod, nil)
		req.UserInfo = authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:statefulset-controller"}
		resp := h[PathMutatePod].Handle(ctx, req)
		runsUngated(t, req, resp, "Kueue leaves it ungated (ancestor Pod cpu is Kueue-managed, no pod-suspending-parent annotation), so it runs outside every quota")
	})
}

// Finding 3 (wrongful denial): a queue-labelled GPU pod whose ReplicaSet
// is controlled by a kind Kueue does not know (an Argo Rollout) is gated
// by Kueue by its own label (FindAncestorJobManagedByKueue stops at the
// unknown Rollout), yet gpupack denies it: podSetParent allows only a
// Deployment above a ReplicaSet. Same for a StatefulSet made by an
// operator (a Kubeflow Notebook) where Kueue's statefulset integration is
// off.
func TestOwnerWalkQueuedPodUnderForeignReplicaSetOwnerIsAdmitted(t *testing.T) {
	yes := true
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "ro-abc", Namespace: "ns", UID: "u-rs",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "argoproj.io/v1alpha1", Kind: "Rollout", Name: "ro", UID: "u-ro", Controller: &yes}}}}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "nb", Namespace: "ns", UID: "u-sts",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubeflow.org/v1", Kind: "Notebook", Name: "nb", UID: "u-nb", Controller: &yes}}}}
	for _, tc := range []struct {
		name       string
		frameworks []string
		ref        metav1.OwnerReference
		user       string
	}{
		{"Argo Rollout's ReplicaSet", rev14cFrameworks, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "ro-abc", UID: "u-rs", Controller: &yes}, "system:serviceaccount:kube-system:replicaset-controller"},
		{"Notebook's StatefulSet, statefulset integration off", []string{"batch/job", "pod"}, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "nb", UID: "u-sts", Controller: &yes}, "system:serviceaccount:kube-system:statefulset-controller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := podIntegrationHandlers(t, mutation.Config{Kueue: mutation.KueueConfig{Frameworks: tc.frameworks}},
				rs, sts, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
			pod := wholeGPUPod("ns", "1")
			pod.Labels = map[string]string{mutation.LabelQueueName: "q"}
			pod.OwnerReferences = []metav1.OwnerReference{tc.ref}
			req := request(t, admissionv1.Create, pod, nil)
			req.UserInfo = authenticationv1.UserInfo{Username: tc.user}
			if resp := h[PathMutatePod].Handle(context.Background(), req); !resp.Allowed {
				t.Errorf("queue-labelled pod Kueue gates by its own label denied: %v", resp.Result.Message)
			}
		})
	}
}

// Finding 4: under the DEFAULT config (Kueue runs batch/job and
// kubeflow.org/pytorchjob only; no pod integration, so nothing gates a
// pod) the walk passes through an owner of a kind Kueue knows but does
// not run — a RayCluster (or an MPIJob, RayJob, StatefulSet) — up to a
// queued Job, and trusts the chain because the LAST link's creator
// (KubeRay, the StatefulSet controller) is trusted. The middle link is the
// tenant's own object, which gpupack never checks at creation (RayCluster,
// MPIJob, RayJob are not unmanagedChecked) or checks at creation only
// (StatefulSet: a GPU template added by update passes keepsManagement).
// Her queued Job stays suspended; the pods run with whole GPUs, no quota.
func TestOwnerWalkDefaultConfigTenantMiddleLinkUnderQueuedJob(t *testing.T) {
	yes := true
	queued := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "queued", Namespace: "ns", UID: "u-queued", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	jobRef := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "queued", UID: "u-queued", Controller: &yes}}
	rc := &ray.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "rc", Namespace: "ns", UID: "u-rc", OwnerReferences: jobRef}}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "sts", Namespace: "ns", UID: "u-sts", OwnerReferences: jobRef}}
	m, err := mutation.New(mutation.Config{}) // defaults
	if err != nil {
		t.Fatal(err)
	}
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = appsv1.AddToScheme(s)
	_ = ray.AddToScheme(s)
	for _, tc := range []struct {
		name string
		ref  metav1.OwnerReference
		user string
	}{
		{"KubeRay's pod of the tenant's RayCluster", metav1.OwnerReference{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "rc", UID: "u-rc", Controller: &yes}, "system:serviceaccount:ray-system:kuberay-operator"},
		{"StatefulSet controller's pod of the tenant's StatefulSet", metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "sts", UID: "u-sts", Controller: &yes}, "system:serviceaccount:kube-system:statefulset-controller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Handlers(m, fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(queued, rc, sts, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).Build())
			pod := wholeGPUPod("ns", "8")
			pod.OwnerReferences = []metav1.OwnerReference{tc.ref}
			req := request(t, admissionv1.Create, pod, nil)
			req.UserInfo = authenticationv1.UserInfo{Username: tc.user}
			resp := h[PathMutatePod].Handle(context.Background(), req)
			runsUngated(t, req, resp, "Kueue's pod integration is off (default), so nothing gates it, and Job queued stays suspended: it runs outside every quota")
		})
	}
	// (The RayCluster itself is not checked at creation: RayClusters,
	// RayJobs and MPIJobs meet the policy through their pods.)
}
