package webhooks

import (
	"context"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/gpupack/gpupack/webhooks/mutation"
)

// PodMutatingWebhookName is the pod webhook's name in the mutating configuration.
const PodMutatingWebhookName = "mpod.gpupack.io"

// SetupFastPath keeps the installed pod mutating webhook's match condition
// in step with this manager: the fingerprint depends on the webhook
// configuration (and the release), which static manifests cannot know. A
// re-applied manifest (GitOps, helm upgrade) is corrected on the next watch
// event. The leader writes.
func SetupFastPath(mgr ctrl.Manager, o ServeOptions) error {
	c := mgr.GetClient()
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhook-fast-path").
		For(&admissionregistrationv1.MutatingWebhookConfiguration{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			return obj.GetName() == o.MutatingName
		}))).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := c.Get(ctx, req.NamespacedName, mwc); err != nil {
				return reconcile.Result{}, client.IgnoreNotFound(err)
			}
			if !SyncFastPath(mwc, o) {
				return reconcile.Result{}, nil
			}
			// A conflict (the cert rotator writing caBundle) is retried.
			return reconcile.Result{}, c.Update(ctx, mwc)
		}))
}

// SyncFastPath sets the match conditions of mwc's pod webhook to o's (the
// fast-path condition, or the plain asks-for-gpus without it) and reports
// whether anything changed. The manager owns that webhook's conditions.
func SyncFastPath(mwc *admissionregistrationv1.MutatingWebhookConfiguration, o ServeOptions) bool {
	changed := false
	want := podMutatingConditions(o)
	for i := range mwc.Webhooks {
		w := &mwc.Webhooks[i]
		if w.Name == PodMutatingWebhookName && !equality.Semantic.DeepEqual(want, w.MatchConditions) {
			w.MatchConditions = want
			changed = true
		}
	}
	return changed
}

// WithFastPath returns o with TemplateFingerprint set to cfg's, as the
// manager serving cfg writes it into templates.
func (o ServeOptions) WithFastPath(cfg Config) (ServeOptions, error) {
	m, err := mutation.New(cfg)
	if err != nil {
		return o, err
	}
	o.TemplateFingerprint = m.Fingerprint()
	return o, nil
}
