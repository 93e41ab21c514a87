package security

import (
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/webhooks"
)

// TestFastPathSaltIsTheManagersOnly: under the shipped RBAC the manager
// makes and reads its fast-path salt (webhooks.EnsureFastPathSalt in
// gpupack-system), and a tenant with `edit` can read neither the Secret nor
// the MutatingWebhookConfiguration whose match condition names the marker
// (she only sees the marker on her own jobs' templates, and every template
// she stores is seen by a job webhook).
func TestFastPathSaltIsTheManagersOnly(t *testing.T) {
	c := startCluster(t)
	ctx := c.env.Ctx
	salt, err := webhooks.EnsureFastPathSalt(ctx, c.manager(t), webhooks.DefaultServeOptions().Namespace)
	if err != nil {
		t.Fatalf("the manager, under the shipped RBAC, making its salt: %v", err)
	}
	again, err := webhooks.EnsureFastPathSalt(ctx, c.manager(t), webhooks.DefaultServeOptions().Namespace)
	if err != nil || string(again) != string(salt) {
		t.Fatalf("the manager reading its salt back: %v (same: %v)", err, string(again) == string(salt))
	}
	key := client.ObjectKey{Namespace: webhooks.DefaultServeOptions().Namespace, Name: webhooks.FastPathSecretName}
	if err := c.alice.Get(ctx, key, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("a tenant reading %s: %v, want forbidden", key, err)
	}
	if err := c.alice.List(ctx, &corev1.SecretList{}, client.InNamespace(key.Namespace)); !apierrors.IsForbidden(err) {
		t.Errorf("a tenant listing secrets in %s: %v, want forbidden", key.Namespace, err)
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.alice.Get(ctx, client.ObjectKey{Name: webhooks.DefaultServeOptions().MutatingName}, mwc); !apierrors.IsForbidden(err) {
		t.Errorf("a tenant reading the mutating webhook configuration: %v, want forbidden", err)
	}
	if err := c.alice.List(ctx, &admissionregistrationv1.MutatingWebhookConfigurationList{}); !apierrors.IsForbidden(err) {
		t.Errorf("a tenant listing mutating webhook configurations: %v, want forbidden", err)
	}
}
