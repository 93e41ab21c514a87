package webhooks

import (
	"context"
	"crypto/rand"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FastPathSecretName is the Secret in the manager's namespace that holds
// the installation's fast-path salt (mutation.Config.FastPathSalt). The
// manager's Role may read and create it; tenants (edit in their own
// namespaces) cannot read it.
const FastPathSecretName = "gpupack-fastpath"

// FastPathSaltKey is the salt's key in the Secret.
const FastPathSaltKey = "salt"

// fastPathSaltBytes is the size of a new salt.
const fastPathSaltBytes = 32

// EnsureFastPathSalt returns the salt in namespace's gpupack-fastpath
// Secret, creating the Secret with 32 random bytes when there is none. Of
// replicas starting together one create wins; the others read its salt
// (AlreadyExists). The Secret is kept across restarts and upgrades, so the
// marker stays the same; a Secret without a full-size salt is an error, not
// replaced (someone wrote it; the fast path must not run on a known salt).
func EnsureFastPathSalt(ctx context.Context, c client.Client, namespace string) ([]byte, error) {
	key := client.ObjectKey{Namespace: namespace, Name: FastPathSecretName}
	read := func() ([]byte, error) {
		s := &corev1.Secret{}
		if err := c.Get(ctx, key, s); err != nil {
			return nil, err
		}
		salt := s.Data[FastPathSaltKey]
		if len(salt) < fastPathSaltBytes {
			return nil, fmt.Errorf("secret %s has %d bytes under %q, want at least %d; delete it to have a new one made", key, len(salt), FastPathSaltKey, fastPathSaltBytes)
		}
		return salt, nil
	}
	salt, err := read()
	if err == nil || !apierrors.IsNotFound(err) {
		return salt, err
	}
	fresh := make([]byte, fastPathSaltBytes)
	if _, err := rand.Read(fresh); err != nil {
		return nil, err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: FastPathSecretName, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "gpupack"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{FastPathSaltKey: fresh},
	}
	switch err := c.Create(ctx, s); {
	case err == nil:
		return fresh, nil
	case apierrors.IsAlreadyExists(err):
		return read()
	default:
		return nil, err
	}
}
