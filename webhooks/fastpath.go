package webhooks

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/gpupack/gpupack/webhooks/mutation"
)

// PodMutatingWebhookName is the pod webhook's name in the mutating configuration.
const PodMutatingWebhookName = "mpod.gpupack.io"

// Keys of the gpupack-fastpath Secret besides the salt: the current epoch
// (random bytes, mixed into the marker) and the mutating configuration
// state it was last checked against ("<uid>/<generation>").
const (
	FastPathEpochKey   = "epoch"
	FastPathEpochOfKey = "epoch-of"
)

// fastPathEpochBytes is the size of a new epoch.
const fastPathEpochBytes = 16

var epochRenewals = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "gpupack_fastpath_epoch_renewals_total",
	Help: "Times the leader renewed the fast-path epoch because the mutating webhook configuration was not as it last left it (templates marked before send their pods through the pod webhook).",
})

func init() { metrics.Registry.MustRegister(epochRenewals) }

// SetupFastPath keeps the installed pod mutating webhook's match condition
// in step with this manager: the fingerprint depends on the webhook
// configuration (and the release), which static manifests cannot know. A
// re-applied manifest (GitOps, helm upgrade) is corrected on the next watch
// event. The leader writes.
//
// With an epoch (o from WithFastPath of a Config with FastPathEpoch), the
// leader also renews the epoch whenever the configuration is not the one
// it last wrote or checked (its UID and generation, recorded in the
// gpupack-fastpath Secret): it was deleted and made again, an entry was
// dropped and restored, someone edited it. Objects may have been stored
// unseen during such a period with a copy of the marker of then; under a
// new epoch no template marked before matches, so their pods meet the pod
// webhook. A restart alone keeps the epoch. Every replica follows the
// Secret (RefreshFastPathEpoch).
func SetupFastPath(mgr ctrl.Manager, o ServeOptions) error {
	c, r := mgr.GetClient(), mgr.GetAPIReader()
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhook-fast-path").
		For(&admissionregistrationv1.MutatingWebhookConfiguration{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			return obj.GetName() == o.MutatingName
		}))).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			// Read live: a stale cache would look like someone else's
			// edit (a needless renewal) or hide one for a while.
			mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := r.Get(ctx, req.NamespacedName, mwc); err != nil {
				return reconcile.Result{}, client.IgnoreNotFound(err)
			}
			if o.fastPathEpoch == nil {
				if !SyncFastPath(mwc, o) {
					return reconcile.Result{}, nil
				}
				// A conflict (the cert rotator writing caBundle) is retried.
				return reconcile.Result{}, c.Update(ctx, mwc)
			}
			return reconcile.Result{}, syncFastPathEpoch(ctx, c, r, mwc, o)
		}))
}

// syncFastPathEpoch is SetupFastPath's step with an epoch: renew it if mwc
// is not the configuration the Secret says it was last checked against,
// write the conditions of that epoch, and record mwc as it is after the
// write. The conditions are computed from the epoch decided here, never
// from the shared holder (which a refresh may have set to an older one).
func syncFastPathEpoch(ctx context.Context, c client.Client, r client.Reader, mwc *admissionregistrationv1.MutatingWebhookConfiguration, o ServeOptions) error {
	log := ctrl.LoggerFrom(ctx)
	s := &corev1.Secret{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: FastPathSecretName}, s); err != nil {
		return err
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	epoch := s.Data[FastPathEpochKey]
	if renew, why := EpochNeedsRenewal(s.Data[FastPathEpochOfKey], epoch, mwc); renew {
		epoch = make([]byte, fastPathEpochBytes)
		if _, err := rand.Read(epoch); err != nil {
			return err
		}
		s.Data[FastPathEpochKey] = epoch
		delete(s.Data, FastPathEpochOfKey)
		if err := c.Update(ctx, s); err != nil {
			return err // a conflict: read both again
		}
		epochRenewals.Inc()
		log.Info("renewed the fast-path epoch: templates marked before send their pods through the pod webhook", "reason", why, "configuration", mwc.Name)
	}
	o.fastPathEpoch.Set(epoch)
	o.TemplateFingerprint = o.fingerprintAt(epoch)
	if SyncFastPath(mwc, o) {
		if err := c.Update(ctx, mwc); err != nil {
			return err // a conflict: the next reconcile sees the other write and renews
		}
	}
	// mwc is now as this write left it (Update fills in the new generation).
	if of := epochOf(mwc); !bytes.Equal(s.Data[FastPathEpochOfKey], of) {
		s.Data[FastPathEpochOfKey] = of
		return c.Update(ctx, s)
	}
	return nil
}

func epochOf(mwc *admissionregistrationv1.MutatingWebhookConfiguration) []byte {
	return []byte(fmt.Sprintf("%s/%d", mwc.UID, mwc.Generation))
}

// EpochNeedsRenewal reports whether the fast-path epoch must be renewed
// before marking more templates, and why: there is none yet, or the
// configuration is not the one (UID and generation) recorded in of — the
// apiserver raises a configuration's generation on every change of its
// webhooks, so any entry dropped and restored, by whoever, shows here.
func EpochNeedsRenewal(of, epoch []byte, mwc *admissionregistrationv1.MutatingWebhookConfiguration) (bool, string) {
	switch {
	case len(epoch) == 0:
		return true, "no epoch yet"
	case len(of) == 0:
		return true, "the configuration was not recorded after the last renewal"
	case !bytes.Equal(of, epochOf(mwc)):
		return true, fmt.Sprintf("the configuration is %s, recorded %s (changed by someone else, or made again)", epochOf(mwc), of)
	}
	return false, ""
}

// ReadFastPathEpoch returns the current epoch in namespace's
// gpupack-fastpath Secret (nil while the leader has not made one).
func ReadFastPathEpoch(ctx context.Context, r client.Reader, namespace string) ([]byte, error) {
	s := &corev1.Secret{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: FastPathSecretName}, s); err != nil {
		return nil, err
	}
	return s.Data[FastPathEpochKey], nil
}

// RefreshFastPathEpoch keeps every replica's epoch (the marker its job
// webhooks write) at the Secret's, read every period. A replica behind
// the leader only writes a stale marker, whose pods meet the pod webhook.
func RefreshFastPathEpoch(mgr ctrl.Manager, namespace string, epoch *mutation.FastPathEpoch, period time.Duration) error {
	r := mgr.GetAPIReader()
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			if e, err := ReadFastPathEpoch(ctx, r, namespace); err == nil && len(e) > 0 && !bytes.Equal(e, epoch.Get()) {
				epoch.Set(e)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}))
}

// SyncFastPath sets the match conditions of mwc's pod webhook to o's (the
// fast-path condition, or the plain asks-for-gpus without it) and reports
// whether anything changed. The manager owns that webhook's conditions.
// The StatefulSet clause is in only while mwc's StatefulSet entry holds
// (statefulSetEntryHolds).
func SyncFastPath(mwc *admissionregistrationv1.MutatingWebhookConfiguration, o ServeOptions) bool {
	changed := false
	want := podMutatingConditions(o, statefulSetEntryHolds(mwc, o))
	for i := range mwc.Webhooks {
		w := &mwc.Webhooks[i]
		if w.Name == PodMutatingWebhookName && !equality.Semantic.DeepEqual(want, w.MatchConditions) {
			w.MatchConditions = want
			changed = true
		}
	}
	return changed
}

// statefulSetEntryHolds: mwc's StatefulSet entry sees every StatefulSet
// create and update that its pod entry's namespaces hold, and fails
// closed — as WebhookConfigurations(o) renders it (rules, conditions,
// path, failurePolicy Fail, no object selector), with the pod entry's
// namespace selector and service. Only then is every StatefulSet template
// gpupack's, and its pods may skip the pod webhook.
func statefulSetEntryHolds(mwc *admissionregistrationv1.MutatingWebhookConfiguration, o ServeOptions) bool {
	if !o.statefulSetFastPath() {
		return false
	}
	name := jobKindWebhookName("m", KindStatefulSet)
	find := func(ws []admissionregistrationv1.MutatingWebhook, n string) *admissionregistrationv1.MutatingWebhook {
		for i := range ws {
			if ws[i].Name == n {
				return &ws[i]
			}
		}
		return nil
	}
	rendered, _ := WebhookConfigurations(o)
	want, have, pod := find(rendered.Webhooks, name), find(mwc.Webhooks, name), find(mwc.Webhooks, PodMutatingWebhookName)
	if want == nil || have == nil || pod == nil {
		return false
	}
	return have.FailurePolicy != nil && *have.FailurePolicy == admissionregistrationv1.Fail &&
		(have.MatchPolicy == nil || *have.MatchPolicy == admissionregistrationv1.Equivalent) &&
		equality.Semantic.DeepEqual(want.Rules, have.Rules) &&
		equality.Semantic.DeepEqual(want.MatchConditions, have.MatchConditions) &&
		equality.Semantic.DeepEqual(pod.NamespaceSelector, have.NamespaceSelector) &&
		(have.ObjectSelector == nil || (len(have.ObjectSelector.MatchLabels) == 0 && len(have.ObjectSelector.MatchExpressions) == 0)) &&
		sameServer(have.ClientConfig, pod.ClientConfig, *want.ClientConfig.Service.Path, PathMutatePod)
}

// sameServer: entry cc calls the server that pod (the pod entry, at
// podPath) calls, at path: the same Service (namespace, name, port), or
// the same URL but for the path.
func sameServer(cc, pod admissionregistrationv1.WebhookClientConfig, path, podPath string) bool {
	switch hs, ps := cc.Service, pod.Service; {
	case hs != nil && ps != nil && cc.URL == nil && pod.URL == nil:
		port := func(s *admissionregistrationv1.ServiceReference) int32 {
			if s.Port == nil {
				return 443
			}
			return *s.Port
		}
		return hs.Namespace == ps.Namespace && hs.Name == ps.Name && port(hs) == port(ps) && hs.Path != nil && *hs.Path == path
	case hs == nil && ps == nil && cc.URL != nil && pod.URL != nil:
		base, ok := strings.CutSuffix(*pod.URL, podPath)
		return ok && *cc.URL == base+path
	}
	return false
}

// WithFastPath returns o with TemplateFingerprint set to cfg's, as the
// manager serving cfg writes it into templates (and, with
// cfg.FastPathEpoch, the epoch SetupFastPath keeps).
func (o ServeOptions) WithFastPath(cfg Config) (ServeOptions, error) {
	m, err := mutation.New(cfg)
	if err != nil {
		return o, err
	}
	o.TemplateFingerprint = m.Fingerprint()
	o.fastPathEpoch = cfg.FastPathEpoch
	o.fingerprintAt = m.FingerprintAt
	return o, nil
}
