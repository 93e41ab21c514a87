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

// SetupFastPath keeps the installed pod webhook's fast-path condition in
// step with this manager: the fingerprint depends on the webhook
// configuration (and the release), which static manifests cannot know.
// Only that one condition is managed; the others stay as installed, and a
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

// SyncFastPath sets the fast-path condition of mwc's pod webhook to o's
// (removing it when o has no creators or fingerprint) and reports whether
// anything changed.
func SyncFastPath(mwc *admissionregistrationv1.MutatingWebhookConfiguration, o ServeOptions) bool {
	changed := false
	for i := range mwc.Webhooks {
		w := &mwc.Webhooks[i]
		if w.Name != PodMutatingWebhookName {
			continue
		}
		var want []admissionregistrationv1.MatchCondition
		if len(o.TemplatePodCreators) > 0 && o.TemplateFingerprint != "" {
			want = append(want, FastPathCondition(o.TemplatePodCreators, o.TemplateFingerprint))
		}
		for _, mc := range w.MatchConditions {
			if mc.Name != FastPathConditionName {
				want = append(want, mc)
			}
		}
		if !equality.Semantic.DeepEqual(want, w.MatchConditions) {
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
