package webhooks

import (
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// podMutations counts the pod mutating webhook's answers in this process.
func podMutations(t *testing.T) float64 {
	t.Helper()
	n, err := framework.CounterSum("gpupack_webhook_admissions_total", map[string]string{"webhook": "mutating", "kind": "Pod"})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// podFromTemplate is a pod as the Job controller makes it: the template,
// its labels, a controller reference to the Job, its own env.
func podFromTemplate(job *batchv1.Job, name string) *corev1.Pod {
	tmpl := job.Spec.Template.DeepCopy()
	p := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	p.Name, p.Namespace = name, job.Namespace
	p.Labels = map[string]string{"batch.kubernetes.io/job-name": job.Name}
	p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}
	for i := range p.Spec.Containers {
		p.Spec.Containers[i].Env = append(p.Spec.Containers[i].Env, corev1.EnvVar{Name: "JOB_COMPLETION_INDEX", Value: "0"})
	}
	return p
}

func envValue(p *corev1.Pod, name string) (string, bool) {
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func hasGate(s *corev1.PodSpec, name string) bool {
	for _, g := range s.SchedulingGates {
		if g.Name == name {
			return true
		}
	}
	return false
}

// TestPodFastPath: pods the Job controller makes from a template gpupack
// already injected skip the pod webhook (the manager installs the match
// condition for its configuration); every pod that misses a part of the
// condition — another user, another owner, a stale marker, a plan without
// the gate, a resume step — is still mutated. Through the real apiserver,
// which evaluates the CEL condition.
func TestPodFastPath(t *testing.T) {
	env := framework.Start(t, framework.Options{NoKueue: true})
	ctx := env.Ctx
	cfg := webhooks.Config{}
	serve, err := webhooks.DefaultServeOptions().WithFastPath(cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		if err := webhooks.Setup(mgr, cfg); err != nil {
			return err
		}
		return webhooks.SetupFastPath(mgr, serve)
	}, opts)
	// As the manifests ship them: without the fast path; the manager adds it.
	mwc, vwc := webhooks.WebhookConfigurations(webhooks.DefaultServeOptions())
	env.InstallWebhooks(t, opts, mwc, vwc)
	fastPathInstalled := func() (bool, string) {
		got := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mwc), got); err != nil {
			return false, err.Error()
		}
		for _, w := range got.Webhooks {
			if w.Name != webhooks.PodMutatingWebhookName {
				continue
			}
			want := webhooks.FastPathCondition(serve.TemplatePodCreators, serve.TemplateFingerprint)
			for _, c := range w.MatchConditions {
				if c == want {
					return true, ""
				}
			}
			return false, fmt.Sprintf("conditions %v", w.MatchConditions)
		}
		return false, "no pod webhook"
	}
	env.Eventually(t, 30*time.Second, "the manager installs the fast-path condition", fastPathInstalled)

	ns := env.Namespace(t, "fast")
	// No Kueue here: the namespace opts out of the unmanaged-GPU policy,
	// and the template carries the plan Kueue's podSetUpdates would write
	// (a fractional pod without a plan is denied, and never takes the fast
	// path).
	nsObj := &corev1.Namespace{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels[mutation.NamespaceLabelUnmanagedGPUs] = "allow"
	if err := env.Client.Update(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: ns, Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationPlan: "plan-0"}}, Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"},
			Containers: []corev1.Container{{Name: "trainer", Image: "trainer:test", Resources: limits(v1alpha1.ResourceNvidiaGPU, "1"),
				Env: []corev1.EnvVar{{Name: v1alpha1.EnvLDPreload, Value: "/evil.so"}}}},
		}}},
	}
	env.MustCreate(t, job)
	if got := job.Spec.Template.Annotations[v1alpha1.AnnotationInjected]; got != serve.TemplateFingerprint {
		t.Fatalf("template marker %q, want %q", got, serve.TemplateFingerprint)
	}
	if q := job.Spec.Template.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMemory]; q.Value() != 20480 {
		t.Fatalf("template not converted: %v", job.Spec.Template.Spec.Containers[0].Resources)
	}
	if _, ok := envValue(&corev1.Pod{Spec: job.Spec.Template.Spec}, v1alpha1.EnvLDPreload); ok {
		t.Fatal("tenant LD_PRELOAD survived in the template")
	}

	newClient := func(user string) client.Client {
		c, err := client.New(env.UserConfig(t, user, "system:masters"), client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	controller := newClient(framework.UserKubeControllerManager)
	tenant := newClient("alice")
	evil := corev1.EnvVar{Name: v1alpha1.EnvLDPreload, Value: "/evil.so"}
	noPreload := func(p *corev1.Pod) string {
		if v, ok := envValue(p, v1alpha1.EnvLDPreload); ok {
			return "LD_PRELOAD=" + v + " survived"
		}
		return ""
	}

	// The Job controller's pod skips the webhook and arrives complete.
	before := podMutations(t)
	fast := podFromTemplate(job, "fast")
	if err := controller.Create(ctx, fast); err != nil {
		t.Fatal(err)
	}
	if d := podMutations(t) - before; d != 0 {
		t.Errorf("the pod webhook answered %v times for the controller's pod from a marked template", d)
	}
	if q := fast.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMemory]; q.Value() != 20480 || len(fast.Spec.Volumes) != 0 {
		t.Errorf("fast-path pod: resources %v, volumes %v", fast.Spec.Containers[0].Resources, fast.Spec.Volumes)
	}

	// Everything else still meets the webhook.
	for _, tc := range []struct {
		name   string
		c      client.Client
		change func(*corev1.Pod)
		check  func(*corev1.Pod) string
	}{
		{"a tenant copying a marked template, plus LD_PRELOAD", tenant, func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, evil)
		}, noPreload},
		{"the controller, for a ReplicaSet", controller, func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u-rs", Controller: ptr.To(true)}}
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, evil)
		}, noPreload},
		{"a stale marker", controller, func(p *corev1.Pod) {
			p.Annotations[v1alpha1.AnnotationInjected] = "0000000000000000"
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, evil)
		}, noPreload},
		{"a plan without the placement gate", controller, func(p *corev1.Pod) {
			p.Spec.SchedulingGates = nil
		}, func(p *corev1.Pod) string {
			if !hasGate(&p.Spec, v1alpha1.SchedulingGatePlacement) {
				return fmt.Sprintf("gates %v", p.Spec.SchedulingGates)
			}
			return ""
		}},
		{"a resume step", controller, func(p *corev1.Pod) {
			p.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint] = "700"
		}, func(p *corev1.Pod) string {
			if v, _ := envValue(p, v1alpha1.EnvResumeStep); v != "700" {
				return "no " + v1alpha1.EnvResumeStep
			}
			return ""
		}},
	} {
		before := podMutations(t)
		p := podFromTemplate(job, fmt.Sprintf("slow-%d", int(before)))
		tc.change(p)
		if err := tc.c.Create(ctx, p); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if d := podMutations(t) - before; d != 1 {
			t.Errorf("%s: the pod webhook answered %v times, want 1", tc.name, d)
		}
		if msg := tc.check(p); msg != "" {
			t.Errorf("%s: %s", tc.name, msg)
		}
	}

	// A fractional pod without a plan from a marked template (a job Kueue
	// started without gang-fit) is not skipped: the webhook denies it.
	before = podMutations(t)
	noPlan := podFromTemplate(job, "no-plan")
	delete(noPlan.Annotations, v1alpha1.AnnotationPlan)
	noPlan.Spec.SchedulingGates = nil
	if err := controller.Create(ctx, noPlan); err == nil || !strings.Contains(err.Error(), "has no gpupack.io/plan") {
		t.Errorf("a fractional pod without a plan: %v, want the webhook's denial", err)
	}
	if d := podMutations(t) - before; d != 1 {
		t.Errorf("a fractional pod without a plan: the pod webhook answered %v times, want 1", d)
	}

	// Kueue starting the job writes the plan into the template; the job
	// webhook adds the placement gate there, so the pods are gated — and
	// take the fast path. Stopping it (plan gone) takes the gate away.
	setPlan := func(plan string) {
		t.Helper()
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			t.Fatal(err)
		}
		if plan == "" {
			delete(job.Spec.Template.Annotations, v1alpha1.AnnotationPlan)
		} else {
			job.Spec.Template.Annotations[v1alpha1.AnnotationPlan] = plan
		}
		if err := env.Client.Update(ctx, job); err != nil {
			t.Fatal(err)
		}
	}
	setPlan("plan-1")
	if !hasGate(&job.Spec.Template.Spec, v1alpha1.SchedulingGatePlacement) || job.Spec.Template.Annotations[v1alpha1.AnnotationInjected] != serve.TemplateFingerprint {
		t.Fatalf("started job: gates %v, annotations %v", job.Spec.Template.Spec.SchedulingGates, job.Spec.Template.Annotations)
	}
	before = podMutations(t)
	planned := podFromTemplate(job, "planned")
	if err := controller.Create(ctx, planned); err != nil {
		t.Fatal(err)
	}
	if d := podMutations(t) - before; d != 0 || !hasGate(&planned.Spec, v1alpha1.SchedulingGatePlacement) {
		t.Errorf("planned pod: %v webhook answers, gates %v", d, planned.Spec.SchedulingGates)
	}
	setPlan("")
	if hasGate(&job.Spec.Template.Spec, v1alpha1.SchedulingGatePlacement) {
		t.Errorf("stopped job keeps the gate: %v", job.Spec.Template.Spec.SchedulingGates)
	}
	// Kueue starts a batch Job in one update: plan and suspend=false
	// together. The apiserver accepts the gate the webhook adds to that
	// update (a suspended Job that never ran may change its gates).
	job.Spec.Template.Annotations[v1alpha1.AnnotationPlan] = "plan-2"
	job.Spec.Suspend = ptr.To(false)
	if err := env.Client.Update(ctx, job); err != nil {
		t.Fatalf("starting the job as Kueue does: %v", err)
	}
	if !hasGate(&job.Spec.Template.Spec, v1alpha1.SchedulingGatePlacement) {
		t.Errorf("started job: gates %v", job.Spec.Template.Spec.SchedulingGates)
	}

	// A re-applied manifest (helm upgrade, GitOps) drops the condition; the
	// manager puts it back.
	got := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mwc), got); err != nil {
		t.Fatal(err)
	}
	if !webhooks.SyncFastPath(got, webhooks.ServeOptions{}) {
		t.Fatal("nothing to remove")
	}
	if err := env.Client.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the manager restores the fast-path condition", fastPathInstalled)
}
