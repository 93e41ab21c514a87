package security

import (
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
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

// TestStatefulSetStoredUnseenKeepsItsTemplate shows, against the real
// apiserver under the shipped RBAC, why StatefulSet (LWS) pods are not on
// the pod webhook's fast path (docs/webhooks.md, "Why LWS pods still meet
// the pod webhook"): while no StatefulSet entry is installed (the shipped
// configurations without the LWS or StatefulSet integration; the manager
// adds it after it starts), a StatefulSet a tenant stores keeps whatever
// template she wrote — an injection marker, the placement gate, Kueue's
// pod-suspending-parent annotation and NVIDIA_VISIBLE_DEVICES=all — and
// once the entry is there she scales it through statefulsets/scale, which
// no StatefulSet webhook sees. The marker here is the unsalted one of
// before; the salt stops a precomputed marker, not one she copies from
// her own Job's template before such a period and that is current again
// after it, so the StatefulSet fast path stays off. (An update of the
// StatefulSet itself does reach the webhook.)
func TestStatefulSetStoredUnseenKeepsItsTemplate(t *testing.T) {
	c := startClusterWith(t, nil) // as the manifests ship: Pod, Job, PyTorchJob
	env, ctx, ns := c.env, c.env.Ctx, c.open
	m, err := mutation.New(webhooks.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := wholeGPUPod("", "", "1")
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: v1alpha1.EnvVisibleDevices, Value: "all"}}
	forged := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "forged", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "forged"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "forged", mutation.LabelQueueName: "gpu"},
				Annotations: map[string]string{v1alpha1.AnnotationInjected: m.Fingerprint(), "kueue.x-k8s.io/pod-suspending-parent": "statefulset"}}, Spec: p.Spec}}}
	if err := c.alice.Create(ctx, forged); err != nil {
		t.Fatalf("the tenant's StatefulSet before the manager adds the StatefulSet entry: %v", err)
	}

	// The manager adds the StatefulSet entry (SyncJobKinds, --job-kinds).
	serve := webhooks.DefaultServeOptions()
	serve.JobKinds = []string{webhooks.KindStatefulSet}
	want, _ := webhooks.WebhookConfigurations(serve)
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: serve.MutatingName}, mwc); err != nil {
		t.Fatal(err)
	}
	podURL := *mwc.Webhooks[0].ClientConfig.URL
	for _, w := range want.Webhooks {
		if w.Name == "mstatefulset.gpupack.io" {
			u := strings.TrimSuffix(podURL, webhooks.PathMutatePod) + webhooks.PathMutateStatefulSet
			w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: mwc.Webhooks[0].ClientConfig.CABundle}
			mwc.Webhooks = append(mwc.Webhooks, w)
		}
	}
	if err := env.Client.Update(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	probe := forged.DeepCopy()
	env.Eventually(t, 30*time.Second, "gpupack's StatefulSet webhook sees new StatefulSets", func() (bool, string) {
		probe.Name, probe.ResourceVersion = fmt.Sprintf("probe-%d", time.Now().UnixNano()), ""
		err := c.alice.Create(ctx, probe)
		return err != nil && strings.Contains(err.Error(), "gpupack"), fmt.Sprint(err)
	})

	// Scaled up through the scale subresource: no StatefulSet webhook.
	scale, err := c.aliceCS.AppsV1().StatefulSets(ns).GetScale(ctx, "forged", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = 1
	if _, err := c.aliceCS.AppsV1().StatefulSets(ns).UpdateScale(ctx, "forged", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("scaling through statefulsets/scale: %v", err)
	}
	got := &appsv1.StatefulSet{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(forged), got); err != nil {
		t.Fatal(err)
	}
	tmpl := got.Spec.Template
	if *got.Spec.Replicas != 1 || tmpl.Annotations[v1alpha1.AnnotationInjected] != m.Fingerprint() || len(tmpl.Spec.SchedulingGates) != 1 ||
		len(tmpl.Spec.Containers[0].Env) != 1 || tmpl.Spec.Containers[0].Env[0].Name != v1alpha1.EnvVisibleDevices {
		t.Errorf("the stored StatefulSet changed: replicas %d, annotations %v, gates %v, env %v", *got.Spec.Replicas, tmpl.Annotations, tmpl.Spec.SchedulingGates, tmpl.Spec.Containers[0].Env)
	}
	// An update of the StatefulSet itself meets the webhook, which takes
	// the tenant's NVIDIA_VISIBLE_DEVICES out of the template.
	got.Labels = map[string]string{"touched": "true"}
	if err := c.alice.Update(ctx, got); err != nil {
		t.Fatalf("updating the StatefulSet: %v", err)
	}
	if env := got.Spec.Template.Spec.Containers[0].Env; len(env) != 0 {
		t.Errorf("updated StatefulSet: env %v, annotations %v, want the webhook to strip %s", env, got.Spec.Template.Annotations, v1alpha1.EnvVisibleDevices)
	}
	t.Logf("after an update: template annotations %v, gates %v", got.Spec.Template.Annotations, got.Spec.Template.Spec.SchedulingGates)
}
