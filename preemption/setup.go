package preemption

import (
	"context"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/policy"
)

// Options configure the coordinator.
type Options struct {
	// Policy bounds how long a victim may checkpoint (defaults: see
	// preemption/policy). The coordinator and the eviction webhook use it.
	Policy policy.Policy
	// DefaultGrace is used for pods without terminationGracePeriodSeconds
	// (default 30s, Kubernetes' own default).
	DefaultGrace time.Duration
	// Slack is added to the grace period before the remaining pods are
	// force-deleted (default 30s).
	Slack time.Duration
	// EvictionWebhook registers the pods/eviction handler on the manager's
	// webhook server at EvictionWebhookPath.
	EvictionWebhook bool
	// Now is the clock (default time.Now).
	Now func() time.Time
	// SkipNameValidation lets a test start the coordinator again in the
	// same process (controller-runtime refuses a controller name twice).
	SkipNameValidation bool
}

func (o Options) withDefaults() Options {
	if o.DefaultGrace <= 0 {
		o.DefaultGrace = 30 * time.Second
	}
	if o.Slack <= 0 {
		o.Slack = 30 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// SetupWithManager registers the coordinator (Workload reconciler, field
// indexes, and optionally the eviction webhook) with mgr. The manager's
// scheme must hold core/v1 and Kueue's v1beta2 types.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	opts = opts.withDefaults()
	if err := setupIndexes(context.Background(), mgr); err != nil {
		return err
	}
	r := &Reconciler{
		client:   mgr.GetClient(),
		reader:   mgr.GetAPIReader(),
		recorder: mgr.GetEventRecorder(ControllerName),
		policy:   opts.Policy,
		cfg: ladder.Config{
			DefaultCheckpointTimeout: opts.Policy.Effective(policy.Victim{}).Timeout,
			DefaultGrace:             opts.DefaultGrace,
			Slack:                    opts.Slack,
			MaxStepsPerRank:          8,
		},
		now:           opts.Now,
		skipNameCheck: opts.SkipNameValidation,
	}
	if err := opts.Policy.Validate(); err != nil {
		return err
	}
	if err := r.setup(mgr); err != nil {
		return err
	}
	if opts.EvictionWebhook {
		h := NewEvictionHandler(mgr, opts.Policy)
		h.Now = opts.Now
		mgr.GetWebhookServer().Register(EvictionWebhookPath, &webhook.Admission{Handler: h})
	}
	return nil
}

// NewEvictionHandler is the pods/eviction handler with mgr's clients and
// the cluster's checkpoint policy (register it on the webhook server).
func NewEvictionHandler(mgr ctrl.Manager, p policy.Policy) *EvictionHandler {
	return &EvictionHandler{Reader: mgr.GetAPIReader(), Client: mgr.GetClient(), Policy: p, Now: time.Now}
}

// EvictionWebhookConfiguration is the ValidatingWebhookConfiguration for
// the eviction handler, pointing at a Service (namespace/name); install
// tooling (or a test harness) fills in the CA bundle or rewrites the client
// config.
func EvictionWebhookConfiguration(serviceNamespace, serviceName string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	none := admissionregistrationv1.SideEffectClassNoneOnDryRun
	ignore := admissionregistrationv1.Ignore
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "gpupack-preemption-eviction"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "eviction.preemption.gpupack.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
				Namespace: serviceNamespace, Name: serviceName, Path: ptr.To(EvictionWebhookPath),
			}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/eviction"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
			SideEffects:             &none,
			FailurePolicy:           &ignore,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](5),
		}},
	}
}
