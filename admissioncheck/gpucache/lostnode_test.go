package gpucache

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Issue 17 item 5 (lost node): a node that becomes NotReady, cordoned or
// deleted under a plan slot no pod is bound to wakes that plan's Workload
// at once; bound slots (their pod is there already) and other nodes do not.
func TestLostNodeWakesPlansWithUnboundSlots(t *testing.T) {
	notReady := func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now()}}
	}
	cordoned := func(n *corev1.Node) { n.Spec.Unschedulable = true }
	for _, tc := range []struct {
		name   string
		change func(c *Cache)
		want   string
	}{
		{"NotReady", func(c *Cache) { n := node("n1", 2); notReady(n); c.UpsertNode(n) }, "[ns/unbound]"},
		{"cordoned", func(c *Cache) { n := node("n1", 2); cordoned(n); c.UpsertNode(n) }, "[ns/unbound]"},
		{"deleted", func(c *Cache) { c.DeleteNode("n1") }, "[ns/unbound]"},
		{"a label change only", func(c *Cache) { n := node("n1", 2); n.Labels["x"] = "y"; c.UpsertNode(n) }, "[]"},
		{"another node lost", func(c *Cache) { n := node("n2", 1); notReady(n); c.UpsertNode(n) }, "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(nil)
			var got []types.NamespacedName
			c.SetOnNodeLost(func(k []types.NamespacedName) { got = append(got, k...) })
			c.UpsertNode(node("n1", 2))
			c.UpsertNode(node("n2", 1))
			c.UpsertPod(wholePod("p", "n1-g1"))
			c.UpsertPlan(onePlan("unbound", "wl-a", "n1-g0", ""))
			c.UpsertPlan(onePlan("bound", "wl-b", "n1-g1", "p"))
			tc.change(c)
			if fmt.Sprint(got) != tc.want {
				t.Errorf("woken %v, want %s", got, tc.want)
			}
		})
	}
}

// A NotReady node is lost only after LostNodeGrace (a kubelet restart is
// not a lost node); a deleted or cordoned one at once.
func TestNodeLostGrace(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := New(nil)
	c.SetClock(func() time.Time { return now })
	n := node("n1", 1)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(now.Add(-10 * time.Second))}}
	c.UpsertNode(n)
	if lost, wait := c.NodeLost("n1"); lost || wait != LostNodeGrace-10*time.Second {
		t.Errorf("NotReady 10s: lost=%v wait=%v, want not yet, wait %v", lost, wait, LostNodeGrace-10*time.Second)
	}
	now = now.Add(LostNodeGrace)
	if lost, _ := c.NodeLost("n1"); !lost {
		t.Error("NotReady past the grace: not lost")
	}
	c.UpsertNode(node("n2", 1))
	if lost, wait := c.NodeLost("n2"); lost || wait != 0 {
		t.Errorf("Ready node: lost=%v wait=%v", lost, wait)
	}
	if lost, _ := c.NodeLost("gone"); !lost {
		t.Error("deleted node: not lost")
	}
}
