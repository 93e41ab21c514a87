package admissioncheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/util/admissioncheck"
	"sigs.k8s.io/kueue/pkg/workload"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// A Workload keeps its name and UID across evictions and re-admissions, and
// its plan is named after it: neither tells one admission's plan from the
// next one's. The admission is the quota reservation: the QuotaReserved
// condition's lastTransitionTime, recorded on the plan as
// gpupack.io/admission.

// admissionOf names wl's current quota reservation ("" if it holds none).
func admissionOf(wl *kueue.Workload) string {
	c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
	if c == nil || c.Status != metav1.ConditionTrue {
		return ""
	}
	return c.LastTransitionTime.UTC().Format(time.RFC3339)
}

// planOfAdmission reports whether plan was made for wl's current admission:
// same Workload UID, not released, and the same admission (a plan written
// before the admission was recorded counts as this admission's).
func planOfAdmission(plan *v1alpha1.GPUPlan, wl *kueue.Workload) bool {
	if plan.Spec.WorkloadUID != wl.UID || plan.Status.Phase == v1alpha1.PlanReleased {
		return false
	}
	a, ok := plan.Annotations[v1alpha1.AnnotationAdmission]
	return !ok || a == admissionOf(wl)
}

// staleReady reports whether a Ready check state was written before wl's
// current quota reservation began: it belongs to an earlier admission (an
// eviction that did not go through Kueue's own path left it Ready).
func staleReady(wl *kueue.Workload, st *kueue.AdmissionCheckState) bool {
	c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
	return c != nil && c.Status == metav1.ConditionTrue && st.LastTransitionTime.Before(&c.LastTransitionTime)
}

// resetReady puts the workload's Ready gang-fit checks back to Pending, with
// no podSetUpdates, once it no longer holds the reservation they were
// written for, as Kueue's own eviction does (workload.Evict resets every
// check). An eviction written by another controller (the preemption
// coordinator sets the Evicted condition itself) leaves them Ready, and
// Kueue would then admit the next reservation at once with podSetUpdates
// naming the released plan. Nothing is written once Kueue has reserved quota
// again (the next reconcile sees that admission).
func (r *workloadReconciler) resetReady(ctx context.Context, wl *kueue.Workload, checks []kueue.AdmissionCheckReference) error {
	if workload.IsFinished(wl) {
		return nil
	}
	cur := wl.DeepCopy()
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			cur = &kueue.Workload{}
			if err := r.apiReader().Get(ctx, client.ObjectKeyFromObject(wl), cur); err != nil {
				return err
			}
			if cur.UID != wl.UID || workload.IsFinished(cur) || reservationUsable(cur) {
				return errReservationChanged
			}
		}
		first = false
		changed := false
		for _, name := range checks {
			old := admissioncheck.FindAdmissionCheck(cur.Status.AdmissionChecks, name)
			if old == nil || old.State != kueue.CheckStateReady {
				continue
			}
			ns := kueue.AdmissionCheckState{Name: name, State: kueue.CheckStatePending,
				Message:             truncate(fmt.Sprintf("Reset to Pending: the workload no longer holds the reservation this check was Ready for (%s); the next admission is planned afresh", whyNoReservation(cur))),
				RequeueAfterSeconds: old.RequeueAfterSeconds, RetryCount: old.RetryCount}
			workload.SetAdmissionCheckState(&cur.Status.AdmissionChecks, ns, r.clock)
			changed = true
		}
		if !changed {
			return nil
		}
		return r.client.Status().Update(ctx, cur, client.FieldOwner(FieldOwner))
	})
	if errors.Is(err, errReservationChanged) {
		return nil
	}
	return err
}

// reservationUsable: the workload holds quota and is neither evicted,
// finished nor deactivated (the state in which the check decides).
func reservationUsable(wl *kueue.Workload) bool {
	return workload.HasQuotaReservation(wl) && !workload.IsFinished(wl) && !workload.IsEvicted(wl) && workload.IsActive(wl)
}

func whyNoReservation(wl *kueue.Workload) string {
	switch {
	case workload.IsEvicted(wl):
		c := apimeta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted)
		return "evicted: " + c.Reason
	case !workload.IsActive(wl):
		return "deactivated"
	default:
		return "quota released"
	}
}
