package admissioncheck

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/gpucache"
)

// Issue 17 item 5 (lost node): a node that goes NotReady under a slot no
// pod is bound to yet is given gpucache.LostNodeGrace before the check
// re-plans (Retry): within it the Ready check stays and is looked at again
// when the grace ends; past it, or for a deleted node, Retry.
func TestLostNodeGraceBeforeReplanning(t *testing.T) {
	for _, tc := range []struct {
		name      string
		notReady  time.Duration // how long n1 has been NotReady; 0: deleted
		want      kueue.CheckState
		wantAfter bool
	}{
		{"NotReady for 5s", 5 * time.Second, kueue.CheckStateReady, true},
		{"NotReady past the grace", gpucache.LostNodeGrace + time.Minute, kueue.CheckStateRetry, false},
		{"deleted", 0, kueue.CheckStateRetry, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
			wl.Status.AdmissionChecks[0].State = kueue.CheckStateReady
			wl.Status.AdmissionChecks[0].PodSetUpdates = []kueue.PodSetUpdate{{Name: kueue.DefaultPodSetName, Annotations: map[string]string{v1alpha1.AnnotationPlan: "wl"}}}
			e := newEnv(t, gpuNode("n2", 1, nil), wl, planFor(wl, "n1-g0"))
			if tc.notReady > 0 {
				n := gpuNode("n1", 1, nil)
				n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(time.Now().Add(-tc.notReady))}}
				if err := e.c.Create(t.Context(), n); err != nil {
					t.Fatal(err)
				}
			}
			res := e.reconcile(wl)
			st := e.check(wl)
			if st.State != tc.want {
				t.Fatalf("check %s (%q), want %s", st.State, st.Message, tc.want)
			}
			if tc.wantAfter && (res.RequeueAfter <= 0 || res.RequeueAfter > gpucache.LostNodeGrace) {
				t.Errorf("requeue after %v, want when the grace ends", res.RequeueAfter)
			}
			if tc.want == kueue.CheckStateRetry && !strings.Contains(st.Message, "node n1") {
				t.Errorf("message %q does not name the node", st.Message)
			}
		})
	}
}
