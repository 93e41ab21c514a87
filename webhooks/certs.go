package webhooks

import (
	"fmt"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
)

// CertOptions configure the built-in certificate rotator.
type CertOptions struct {
	ServeOptions
	// SecretName holds the CA and serving certificate (in Namespace).
	SecretName string
	// CertDir is where the manager's webhook server reads tls.crt/tls.key.
	CertDir string
	// RequireLeaderElection: only the leader rotates (several replicas).
	RequireLeaderElection bool
	// EvictionWebhook also injects the CA into the preemption coordinator's
	// pods/eviction configuration (gpupack-preemption-eviction).
	EvictionWebhook bool
}

// SetupCerts adds cert-controller's rotator to mgr: it generates a CA and a
// serving certificate for <ServiceName>.<Namespace>.svc into SecretName,
// rotates them before expiry, and injects the CA into both webhook
// configurations. The returned channel closes once the certificates are
// on disk; start serving readiness only after it. With cert-manager, skip
// this and set ServeOptions.CertManagerCertificate instead.
func SetupCerts(mgr ctrl.Manager, o CertOptions) (<-chan struct{}, error) {
	if o.Namespace == "" || o.ServiceName == "" || o.SecretName == "" || o.CertDir == "" {
		return nil, fmt.Errorf("webhook certs: namespace, service name, secret name and cert dir are required")
	}
	ready := make(chan struct{})
	hooks := []rotator.WebhookInfo{
		{Name: o.MutatingName, Type: rotator.Mutating},
		{Name: o.ValidatingName, Type: rotator.Validating},
	}
	if o.EvictionWebhook {
		hooks = append(hooks, rotator.WebhookInfo{Name: "gpupack-preemption-eviction", Type: rotator.Validating})
	}
	svc := fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace)
	err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:             types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName},
		CertDir:               o.CertDir,
		CAName:                "gpupack-webhook-ca",
		CAOrganization:        "gpupack",
		DNSName:               svc,
		ExtraDNSNames:         []string{svc + ".cluster.local"},
		IsReady:               ready,
		RequireLeaderElection: o.RequireLeaderElection,
		Webhooks:              hooks,
	})
	if err != nil {
		return nil, fmt.Errorf("webhook certs: %w", err)
	}
	return ready, nil
}
