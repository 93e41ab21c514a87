package security

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpupack/gpupack/webhooks/mutation"
)

// TestTenantPodUnderItsOwnQueuedJob: a tenant with `edit` creates a queued
// GPU Job (which Kueue would keep suspended until admitted), then a bare
// whole-GPU pod whose controller reference names that Job, UID and all.
// Kueue never gates a Job's pods, so had gpupack counted the pod as
// managed through the Job it would run on free GPUs outside every quota.
// It is refused; the same pod from the Job controller's account (which
// makes a Job's pods) is admitted.
func TestTenantPodUnderItsOwnQueuedJob(t *testing.T) {
	c := startCluster(t)
	ctx := c.env.Ctx
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "waiting", Namespace: c.open, Labels: map[string]string{mutation.LabelQueueName: "gpu"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: wholeGPUPod("", "", "1").Spec.Containers}}}}
	if err := c.alice.Create(ctx, job); err != nil {
		t.Fatalf("queued GPU Job: %v", err)
	}
	owned := func(name string) *corev1.Pod {
		p := wholeGPUPod(c.open, name, "8")
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}
		return p
	}
	denied(t, "a tenant's pod naming its own queued Job as controller", c.alice.Create(ctx, owned("squat")), `was created by "alice"`)
	jobController := c.as(t, "system:serviceaccount:kube-system:job-controller", []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, nil)
	if err := jobController.Create(ctx, owned("from-the-controller")); err != nil {
		t.Fatalf("the Job controller creating the Job's pod: %v", err)
	}
}
