package admissioncheck

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// acReconciler keeps the Active condition of every gang-fit AdmissionCheck:
// Kueue deactivates a ClusterQueue whose checks are not Active, so a bad
// parameters reference must say so where the platform team looks.
type acReconciler struct {
	client client.Client
}

func (a *acReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ac := &kueue.AdmissionCheck{}
	if err := a.client.Get(ctx, req.NamespacedName, ac); err != nil || ac.Spec.ControllerName != v1alpha1.ControllerName {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	cond := metav1.Condition{
		Type:               kueue.AdmissionCheckActive,
		Status:             metav1.ConditionTrue,
		Reason:             ReasonActive,
		Message:            "gpupack gang-fit check is active",
		ObservedGeneration: ac.Generation,
	}
	if _, err := loadParameters(ctx, a.client, ac.Spec.Parameters); err != nil {
		cond.Status = metav1.ConditionFalse
		cond.Reason = ReasonBadParametersRef
		var bad badParams
		if asBadParams(err, &bad) {
			cond.Reason = ReasonBadParameters
		}
		cond.Message = err.Error()
	}
	cur := ptr.Deref(apimeta.FindStatusCondition(ac.Status.Conditions, kueue.AdmissionCheckActive), metav1.Condition{})
	if cur.Status == cond.Status && cur.Reason == cond.Reason && cur.Message == cond.Message && cur.ObservedGeneration == cond.ObservedGeneration {
		return reconcile.Result{}, nil
	}
	apimeta.SetStatusCondition(&ac.Status.Conditions, cond)
	return reconcile.Result{}, client.IgnoreNotFound(a.client.Status().Update(ctx, ac))
}

// badParams marks parameters that exist but are unusable.
type badParams struct{ msg string }

func (b badParams) Error() string { return b.msg }

func asBadParams(err error, out *badParams) bool {
	b, ok := err.(badParams)
	if ok {
		*out = b
	}
	return ok
}

// loadParameters resolves an AdmissionCheck's parameters; nil ref = defaults.
func loadParameters(ctx context.Context, c client.Client, ref *kueue.AdmissionCheckParametersReference) (*v1alpha1.GangFitParameters, error) {
	if ref == nil {
		return &v1alpha1.GangFitParameters{}, nil
	}
	if ref.APIGroup != v1alpha1.GroupName || ref.Kind != "GangFitParameters" {
		return nil, fmt.Errorf("parameters must be %s GangFitParameters, not %s %s", v1alpha1.GroupName, ref.APIGroup, ref.Kind)
	}
	p := &v1alpha1.GangFitParameters{}
	if err := c.Get(ctx, client.ObjectKey{Name: ref.Name}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("GangFitParameters %q not found", ref.Name)
		}
		return nil, err
	}
	if err := validateParameters(p); err != nil {
		return nil, badParams{fmt.Sprintf("GangFitParameters %q: %v", ref.Name, err)}
	}
	return p, nil
}

// validateParameters repeats the CRD's rules (so objects created before a
// CRD upgrade are caught too) and adds what OpenAPI cannot say.
func validateParameters(p *v1alpha1.GangFitParameters) error {
	s := p.Spec
	seen := map[string]bool{}
	for _, l := range s.TopologyLevels {
		if l == "" {
			return fmt.Errorf("topologyLevels has an empty label key")
		}
		if seen[l] {
			return fmt.Errorf("topologyLevels repeats %q", l)
		}
		seen[l] = true
	}
	if s.RequiredLevel != "" && len(s.TopologyLevels) > 0 && !seen[s.RequiredLevel] && s.RequiredLevel != "kubernetes.io/hostname" {
		return fmt.Errorf("requiredLevel %q is not one of topologyLevels %v", s.RequiredLevel, s.TopologyLevels)
	}
	if b := s.Buffer.BufferPercent; b != nil && (*b < 0 || *b > 90) {
		return fmt.Errorf("buffer.bufferPercent %d is outside 0–90", *b)
	}
	if o := s.Buffer.DriverOverheadMiB; o != nil && *o < 0 {
		return fmt.Errorf("buffer.driverOverheadMiB %d is negative", *o)
	}
	mn, mx := ptr.Deref(s.RetryBackoff.MinSeconds, DefaultRetryMinSeconds), ptr.Deref(s.RetryBackoff.MaxSeconds, DefaultRetryMaxSeconds)
	if mn < 1 || mx < mn {
		return fmt.Errorf("retryBackoff: need 1 ≤ minSeconds (%d) ≤ maxSeconds (%d)", mn, mx)
	}
	return nil
}

func setupACReconciler(mgr ctrl.Manager) error {
	r := &acReconciler{client: mgr.GetClient()}
	// A change of parameters re-evaluates every gang-fit check.
	allChecks := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var acs kueue.AdmissionCheckList
		if err := mgr.GetClient().List(ctx, &acs); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, ac := range acs.Items {
			if ac.Spec.ControllerName == v1alpha1.ControllerName {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&ac)})
			}
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("gangfit-admissioncheck").
		For(&kueue.AdmissionCheck{}).
		Watches(&v1alpha1.GangFitParameters{}, allChecks).
		Complete(r)
}
