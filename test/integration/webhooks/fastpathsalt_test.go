package webhooks

import (
	"fmt"
	"slices"
	"sync"
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

// TestSaltedMarkerOnly: the fast-path marker is salted with the
// installation's secret (the gpupack-fastpath Secret), so a template stored
// before gpupack was installed — here a Job a tenant made while no webhook
// was registered — cannot carry the current marker: the marker she could
// compute then (release + configuration, no salt) sends its pods to the
// webhook, which strips her LD_PRELOAD. Replicas starting together agree
// on one salt, and a restart keeps it (the same marker). Real apiserver.
func TestSaltedMarkerOnly(t *testing.T) {
	env := framework.Start(t, framework.Options{NoKueue: true})
	ctx := env.Ctx
	system := env.Namespace(t, "gpupack-sys")

	// Three replicas start at once: one create wins, the others read it.
	salts := make([][]byte, 3)
	var wg sync.WaitGroup
	for i := range salts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := webhooks.EnsureFastPathSalt(ctx, env.Client, system)
			if err != nil {
				t.Errorf("replica %d: %v", i, err)
			}
			salts[i] = s
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i := range salts {
		if len(salts[i]) != 32 || !slices.Equal(salts[i], salts[0]) {
			t.Fatalf("replicas read different or short salts: %x", salts)
		}
	}

	// What a tenant computes before install: the release and the
	// (documented, default) configuration, no salt.
	unsalted, err := mutation.New(webhooks.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "salted")
	nsObj := &corev1.Namespace{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels[mutation.NamespaceLabelUnmanagedGPUs] = "allow"
	if err := env.Client.Update(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	evil := corev1.EnvVar{Name: v1alpha1.EnvLDPreload, Value: "/evil.so"}
	job := func(name string) *batchv1.Job {
		return &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				NodeSelector:  map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"},
				Containers:    []corev1.Container{{Name: "c", Image: "trainer:test", Resources: limits(v1alpha1.ResourceNvidiaGPU, "1"), Env: []corev1.EnvVar{evil}}},
			}}},
		}
	}
	// Stored before gpupack is installed: nothing sees it.
	early := job("before-install")
	early.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationInjected: unsalted.Fingerprint()}
	env.MustCreate(t, early)

	cfg := webhooks.Config{FastPathSalt: salts[0]}
	serve, err := webhooks.DefaultServeOptions().WithFastPath(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if serve.TemplateFingerprint == unsalted.Fingerprint() {
		t.Errorf("the salted marker %s is the one anyone can compute", serve.TemplateFingerprint)
	}
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		if err := webhooks.Setup(mgr, cfg); err != nil {
			return err
		}
		return webhooks.SetupFastPath(mgr, serve)
	}, opts)
	mwc, vwc := webhooks.WebhookConfigurations(webhooks.DefaultServeOptions())
	env.InstallWebhooks(t, opts, mwc, vwc)
	want := webhooks.FastPathCondition(serve.TemplatePodCreators, serve.TemplateFingerprint)
	env.Eventually(t, 30*time.Second, "the manager installs the salted fast-path condition", func() (bool, string) {
		got := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mwc), got); err != nil {
			return false, err.Error()
		}
		for _, w := range got.Webhooks {
			if w.Name == webhooks.PodMutatingWebhookName {
				return slices.Contains(w.MatchConditions, want), fmt.Sprint(w.MatchConditions)
			}
		}
		return false, "no pod webhook"
	})

	controller, err := client.New(env.UserConfig(t, framework.UserKubeControllerManager, "system:masters"), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The Job controller makes a pod of the early Job: it meets the webhook.
	before := podMutations(t)
	p := podFromTemplate(early, "early-0")
	if err := controller.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	if d := podMutations(t) - before; d != 1 {
		t.Errorf("pod of a template stored before install with the unsalted marker: the pod webhook answered %v times, want 1", d)
	}
	if v, ok := envValue(p, v1alpha1.EnvLDPreload); ok {
		t.Errorf("pod of a template stored before install: LD_PRELOAD=%s survived", v)
	}

	// A Job applied now gets the salted marker, and its pods the fast path.
	now := job("after-install")
	env.MustCreate(t, now)
	if got := now.Spec.Template.Annotations[v1alpha1.AnnotationInjected]; got != serve.TemplateFingerprint {
		t.Fatalf("template marker %q, want the salted %q", got, serve.TemplateFingerprint)
	}
	before = podMutations(t)
	if err := controller.Create(ctx, podFromTemplate(now, "now-0")); err != nil {
		t.Fatal(err)
	}
	if d := podMutations(t) - before; d != 0 {
		t.Errorf("pod of a template marked by this installation: the pod webhook answered %v times, want 0", d)
	}

	// A restart reads the same salt: the same marker, the Job's pods stay fast.
	again, err := webhooks.EnsureFastPathSalt(ctx, env.Client, system)
	if err != nil {
		t.Fatal(err)
	}
	restarted, err := webhooks.DefaultServeOptions().WithFastPath(webhooks.Config{FastPathSalt: again})
	if err != nil {
		t.Fatal(err)
	}
	if restarted.TemplateFingerprint != serve.TemplateFingerprint {
		t.Errorf("after a restart the marker is %s, was %s", restarted.TemplateFingerprint, serve.TemplateFingerprint)
	}
}
