package admissioncheck

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

// Under MultiKueue the check belongs in the worker clusters. On the
// manager — with GPU nodes that would fit the gang, or with none — it
// makes no plan and never becomes Ready or Rejected: Retry, naming the
// MultiKueue check and where gang-fit belongs.
func TestMultiKueueManagerNeverPlansOrRejects(t *testing.T) {
	for _, withGPUs := range []bool{true, false} {
		wl := admittedWorkload("wl", "wl-uid", 2, 1).obj()
		wl.Status.AdmissionChecks = append(wl.Status.AdmissionChecks, kueue.AdmissionCheckState{Name: "mk", State: kueue.CheckStatePending,
			LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 1, 23, 59, 0, 0, time.UTC))})
		mk := &kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: "mk"}, Spec: kueue.AdmissionCheckSpec{ControllerName: kueue.MultiKueueControllerName}}
		e := newEnv(t, mk, wl)
		if withGPUs {
			e = newEnv(t, mk, gpuNode("n1", 8, nil), wl)
		}
		e.reconcile(wl)
		st := e.check(wl)
		if st.State != kueue.CheckStateRetry || !strings.Contains(st.Message, "MultiKueue (admission check mk)") || !strings.Contains(st.Message, "worker clusters") {
			t.Errorf("GPU nodes %v: check %s (%q), want Retry naming MultiKueue", withGPUs, st.State, st.Message)
		}
		if e.plan("wl") != nil {
			t.Errorf("GPU nodes %v: a plan was made on the MultiKueue manager", withGPUs)
		}
	}
}
