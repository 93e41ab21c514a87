package security

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// TestJobKindsUnmanagedAtCreation (open finding 4): a tenant's Deployment
// or StatefulSet that asks for GPUs and that Kueue will not manage is
// denied when it is applied, with the reason, not only when the
// ReplicaSet or StatefulSet controller later fails to create its pods.
// (JobSets and LeaderWorkerSets take the same path; their CRDs are not
// installed here: webhooks.TestJobKindsUnmanagedGPUs covers all four.)
func TestJobKindsUnmanagedAtCreation(t *testing.T) {
	c := startClusterWith(t, []string{webhooks.KindDeployment, webhooks.KindStatefulSet})
	env, ctx := c.env, c.env.Ctx
	tmpl := func() corev1.PodTemplateSpec {
		p := wholeGPUPod("", "", "2")
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}}, Spec: p.Spec}
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	objs := func(ns, name string, labels map[string]string) []client.Object {
		return []client.Object{
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Spec: appsv1.DeploymentSpec{Selector: sel, Template: tmpl()}},
			&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Spec: appsv1.StatefulSetSpec{Selector: sel, Template: tmpl()}},
		}
	}
	kinds := []string{"Deployment", "StatefulSet"}
	for i, o := range objs(c.open, "infer", nil) {
		denied(t, kinds[i]+" with GPUs and no queue name", c.alice.Create(ctx, o), kinds[i]+" infer asks for GPUs but Kueue will not manage it (no kueue.x-k8s.io/queue-name label")
	}
	// Kueue's deployment/statefulset integrations are not in this
	// webhook's kueue.frameworks: a queue label alone does not make Kueue
	// manage it.
	for i, o := range objs(c.open, "queued", map[string]string{mutation.LabelQueueName: "gpu"}) {
		denied(t, kinds[i]+" with a queue name Kueue will not read", c.alice.Create(ctx, o), "integration is not in gpupack's kueue.frameworks")
	}
	lab := env.Namespace(t, "lab")
	env.MustCreate(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-edit", Namespace: lab},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}},
	})
	if err := env.Client.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lab}},
		mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{mutation.NamespaceLabelUnmanagedGPUs: "allow"}}})); err != nil {
		t.Fatal(err)
	}
	for i, o := range objs(lab, "infer", nil) {
		if err := c.alice.Create(ctx, o); err != nil {
			t.Errorf("%s with GPUs in a namespace that opted out: %v", kinds[i], err)
		}
	}
	for i, o := range objs(c.open, "cpu", nil) {
		cpu := o.DeepCopyObject().(client.Object)
		switch x := cpu.(type) {
		case *appsv1.Deployment:
			x.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		case *appsv1.StatefulSet:
			x.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		}
		if err := c.alice.Create(ctx, cpu); err != nil {
			t.Errorf("CPU-only %s: %v", kinds[i], err)
		}
	}
}
