package webhooks

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
)

// TestLaterWebhookUndoesInjection pins down what the default pod setup
// (mutating webhook reinvoked IfNeeded, no validating call at creation)
// guarantees against another mutating webhook that runs after gpupack's and
// rewrites CUDA_DEVICE_MEMORY_LIMIT, and what ValidatePodCreate adds:
//   - an undo in the first round is re-stripped by gpupack's reinvocation;
//   - an undo repeated in the reinvocation round survives by default and is
//     denied with ValidatePodCreate.
func TestLaterWebhookUndoesInjection(t *testing.T) {
	env := framework.Start(t, framework.Options{NoKueue: true})
	once := env.Namespace(t, "undo-once")
	again := env.Namespace(t, "undo-again")
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		mgr.GetWebhookServer().Register("/undo", &webhook.Admission{Handler: admission.HandlerFunc(undoLimit)})
		return webhooks.Setup(mgr, webhooks.Config{})
	}, opts)
	mwc, vwc := webhooks.WebhookConfigurations(webhooks.DefaultServeOptions())
	// Sorted after gpupack's configuration, so it runs later in each round.
	undo := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "zz-undo"}}
	path := "/undo"
	for _, c := range []struct {
		ns     string
		policy admissionregistrationv1.ReinvocationPolicyType
	}{{once, admissionregistrationv1.NeverReinvocationPolicy}, {again, admissionregistrationv1.IfNeededReinvocationPolicy}} {
		w := mwc.Webhooks[0] // the pod webhook: same rules and matchConditions
		w.Name = "undo-" + strings.ToLower(string(c.policy)) + ".example.com"
		w.ClientConfig.Service = &admissionregistrationv1.ServiceReference{Path: &path}
		w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": c.ns}}
		w.ReinvocationPolicy = &c.policy
		undo.Webhooks = append(undo.Webhooks, w)
	}
	env.InstallWebhooks(t, opts, mwc, vwc, undo)

	oneGPU := limits(v1alpha1.ResourceNvidiaGPU, "1")
	limit := func(p *corev1.Pod) string {
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == v1alpha1.EnvMemoryLimit {
				return e.Value
			}
		}
		return ""
	}
	pod := func(ns, name string) *corev1.Pod {
		return gpuPod(ns, name, map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, corev1.Container{Resources: oneGPU})
	}

	p := pod(once, "p")
	env.MustCreate(t, p)
	if got := limit(p); got != "" {
		t.Errorf("first-round undo: stored %s = %q, want none (reinvocation re-strips)", v1alpha1.EnvMemoryLimit, got)
	}

	p = pod(again, "p")
	env.MustCreate(t, p)
	if got := limit(p); got != "80g" {
		t.Errorf("second-round undo without ValidatePodCreate: stored %q; the documented gap is gone — update docs/webhooks.md", got)
	}

	strict := webhooks.DefaultServeOptions()
	strict.ValidatePodCreate = true
	_, want := webhooks.WebhookConfigurations(strict)
	cur := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := env.Client.Get(env.Ctx, types.NamespacedName{Name: want.Name}, cur); err != nil {
		t.Fatal(err)
	}
	for i := range cur.Webhooks {
		cur.Webhooks[i].Rules = want.Webhooks[i].Rules
	}
	if err := env.Client.Update(env.Ctx, cur); err != nil {
		t.Fatal(err)
	}
	var err error
	env.Eventually(t, 30*time.Second, "ValidatePodCreate denies the second-round undo", func() (bool, string) {
		err = env.Client.Create(env.Ctx, pod(again, fmt.Sprintf("strict-%d", seqStrict.Add(1))))
		return err != nil, "created"
	})
	if !strings.Contains(err.Error(), "environment differs from what gpupack injects") {
		t.Errorf("strict create error = %v", err)
	}
	if err := env.Client.Create(env.Ctx, pod(once, "strict")); err != nil {
		t.Errorf("first-round undo with ValidatePodCreate: %v", err)
	}
}

var seqStrict atomic.Int64

// undoLimit is a webhook that does what a careless sidecar injector might:
// it sets CUDA_DEVICE_MEMORY_LIMIT to the whole GPU (harmless where the
// hook reads /etc/gpupack/limits, but still not what gpupack admits).
func undoLimit(_ context.Context, req admission.Request) admission.Response {
	p := &corev1.Pod{}
	if err := json.Unmarshal(req.Object.Raw, p); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	c := &p.Spec.Containers[0]
	found := false
	for i := range c.Env {
		if c.Env[i].Name == v1alpha1.EnvMemoryLimit {
			if c.Env[i].Value == "80g" {
				return admission.Allowed("")
			}
			c.Env[i].Value, found = "80g", true
		}
	}
	if !found {
		c.Env = append(c.Env, corev1.EnvVar{Name: v1alpha1.EnvMemoryLimit, Value: "80g"})
	}
	out, err := json.Marshal(p)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, out)
}
