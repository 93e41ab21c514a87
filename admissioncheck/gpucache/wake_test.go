package gpucache

import (
	"testing"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Issue 17 cost item: plan status updates woke every waiting Workload. Now
// only an update that can have freed capacity wakes them.
func TestPlanUpdatesWakeOnlyWhenCapacityFrees(t *testing.T) {
	base := onePlan("wl", "wl-uid", "n1-g0", "")
	placed := base.DeepCopy()
	placed.Status.Phase = v1alpha1.PlanPlaced
	boundUncounted := base.DeepCopy()
	boundUncounted.Status.Bindings = []v1alpha1.SlotBinding{{PodSet: "main", PodUID: "not-yet-counted"}}
	boundCounted := base.DeepCopy()
	boundCounted.Status.Bindings = []v1alpha1.SlotBinding{{PodSet: "main", PodUID: "p"}}
	released := base.DeepCopy()
	released.Status.Phase = v1alpha1.PlanReleased
	moved := base.DeepCopy()
	moved.Spec.Assignments[0].GPUs[0].UUID = "n1-g1"
	for _, tc := range []struct {
		name   string
		update *v1alpha1.GPUPlan
		wake   bool
	}{
		{"phase only", placed, false},
		{"binding to a pod not counted yet", boundUncounted, false},
		{"binding to a counted pod (its GPUs were counted twice)", boundCounted, true},
		{"released", released, true},
		{"other slots", moved, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			woken := 0
			c := New(func() { woken++ })
			c.UpsertNode(node("n1", 2))
			c.UpsertPod(wholePod("p", "n1-g0"))
			c.UpsertPlan(base)
			woken = 0
			c.UpsertPlan(tc.update)
			if (woken > 0) != tc.wake {
				t.Errorf("woken %d times, want wake=%v", woken, tc.wake)
			}
		})
	}
}
