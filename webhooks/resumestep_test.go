package webhooks

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

func controllerRef(apiVersion, kind, name string, uid types.UID) []metav1.OwnerReference {
	yes := true
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: &yes}}
}

// The resume step reaches a pod through the chain its job's controllers
// build: an LWS group's worker → its worker StatefulSet → the group's
// leader Pod → the leader StatefulSet → the LeaderWorkerSet, where the
// coordinator records it; a Deployment's pod through its ReplicaSet. An
// owner reference whose UID is not the object's (a tenant's forgery), or a
// chain through a kind that is not passed through, gives no step.
func TestPodResumeStepThroughTheOwnerChain(t *testing.T) {
	step := map[string]string{v1alpha1.AnnotationLastConsistentCheckpoint: "1200"}
	set := &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "serve", Namespace: "ns", UID: "lws-uid", Annotations: step}}
	leaderSts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "serve", Namespace: "ns", UID: "lsts-uid",
		OwnerReferences: controllerRef("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", "lws-uid")}}
	leader := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "serve-0", Namespace: "ns", UID: "leader-uid",
		OwnerReferences: controllerRef("apps/v1", "StatefulSet", "serve", "lsts-uid")}}
	workerSts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "serve-0", Namespace: "ns", UID: "wsts-uid",
		OwnerReferences: controllerRef("v1", "Pod", "serve-0", "leader-uid")}}
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "dep-uid", Annotations: step}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "ns", UID: "rs-uid",
		OwnerReferences: controllerRef("apps/v1", "Deployment", "web", "dep-uid")}}
	// A Job whose CronJob carries the annotation: the step is the Job's
	// (none), the walk does not go on to a job kind above it.
	cron := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "ns", UID: "cron-uid", Annotations: step}}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nightly-1", Namespace: "ns", UID: "job-uid",
		OwnerReferences: controllerRef("batch/v1", "CronJob", "nightly", "cron-uid")}}

	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = appsv1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = lws.AddToScheme(s)
	m, err := mutation.New(mutation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(set, leaderSts, leader, workerSts, deploy, rs, cron, job).Build())

	for _, tc := range []struct {
		name   string
		owners []metav1.OwnerReference
		want   string
	}{
		{"LWS leader", controllerRef("apps/v1", "StatefulSet", "serve", "lsts-uid"), "1200"},
		{"LWS worker, through the leader pod", controllerRef("apps/v1", "StatefulSet", "serve-0", "wsts-uid"), "1200"},
		{"Deployment pod", controllerRef("apps/v1", "ReplicaSet", "web-1", "rs-uid"), "1200"},
		{"forged StatefulSet UID", controllerRef("apps/v1", "StatefulSet", "serve", "not-the-uid"), ""},
		{"forged LWS reference straight on the pod", controllerRef("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "serve", "other"), ""},
		{"Job of a CronJob", controllerRef("batch/v1", "Job", "nightly-1", "job-uid"), ""},
		{"no owner", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := gpuPod("10Gi")
			pod.OwnerReferences = tc.owners
			req := asAdmin(request(t, admissionv1.Create, pod, nil)) // a planned pod of any owner
			resp := h[PathMutatePod].Handle(context.Background(), req)
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			var got corev1.Pod
			apply(t, req, resp, &got)
			step := ""
			for _, e := range got.Spec.Containers[0].Env {
				if e.Name == v1alpha1.EnvResumeStep {
					step = e.Value
				}
			}
			if step != tc.want {
				t.Errorf("%s = %q, want %q", v1alpha1.EnvResumeStep, step, tc.want)
			}
		})
	}
}
