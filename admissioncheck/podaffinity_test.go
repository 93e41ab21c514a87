package admissioncheck

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

// withAntiAffinity gives the pod set labels and one required pod
// anti-affinity term selecting them.
func (b *wlBuilder) withAntiAffinity(topologyKey string) *wlBuilder {
	t := &b.wl.Spec.PodSets[0].Template
	t.Labels = map[string]string{"app": "infer"}
	t.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		TopologyKey: topologyKey, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "infer"}}}}}}
	return b
}

// Issue 17 item 5 (pod anti-affinity): three one-GPU replicas, one per
// node, on three 8-GPU nodes. Without reading the anti-affinity the plan
// packs all three onto one node, where the scheduler refuses two of them
// and they stay Pending for ever, pinned there.
func TestPodAntiAffinityPlansOnePodPerNode(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 3, 1).withAntiAffinity(corev1.LabelHostname).obj()
	e := newEnv(t, gpuNode("n1", 8, nil), gpuNode("n2", 8, nil), gpuNode("n3", 8, nil), wl)
	e.reconcile(wl)
	if st := e.check(wl); st.State != kueue.CheckStateReady {
		t.Fatalf("check %s (%q), want Ready", st.State, st.Message)
	}
	nodes := map[string]int{}
	for _, a := range e.plan("wl").Spec.Assignments {
		nodes[a.Node]++
	}
	if len(nodes) != 3 {
		t.Errorf("plan puts the 3 pods on %v; want one per node", nodes)
	}
}

// A running pod the gang's anti-affinity selects keeps its node out of the
// plan; with a fourth replica there is no room and the check says why
// (Retry, not Rejected: the pod may go).
func TestPodAntiAffinityAvoidsRunningPods(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 2, 1).withAntiAffinity(corev1.LabelHostname).obj()
	running := holderPod("other-0", "other-uid", "n1", "", false, "n1-g0")
	running.Labels = map[string]string{"app": "infer"}
	e := newEnv(t, gpuNode("n1", 8, nil), gpuNode("n2", 8, nil), running, wl)
	e.reconcile(wl)
	st := e.check(wl)
	if st.State != kueue.CheckStateRetry || !strings.Contains(st.Message, "at most 1 pod per node") || !strings.Contains(st.Message, "pods it must keep away from") {
		t.Fatalf("check %s (%q), want Retry naming the anti-affinity", st.State, st.Message)
	}
	if e.plan("wl") != nil {
		t.Error("a plan was written")
	}
}

// Anti-affinity the plan cannot honour is refused, saying so, not planned.
func TestPodAntiAffinityOverAZoneIsRefusedClearly(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 2, 1).withAntiAffinity("topology.kubernetes.io/zone").obj()
	e := newEnv(t, gpuNode("n1", 8, nil), gpuNode("n2", 8, nil), wl)
	e.reconcile(wl)
	st := e.check(wl)
	if st.State != kueue.CheckStateRejected || !strings.Contains(st.Message, "the gang cannot be planned") || !strings.Contains(st.Message, "topology.kubernetes.io/zone") {
		t.Fatalf("check %s (%q), want Rejected naming the topology key", st.State, st.Message)
	}
	if e.plan("wl") != nil {
		t.Error("a plan was written")
	}
}

// Replicas admitted one Workload each (Kueue's pod integration makes a
// Deployment's pods one Workload per pod) are decided before any of their
// pods is bound: the second must be kept off the node the first one's plan
// holds, from the plan's record of its pods' labels. Without it BestFit
// puts the second on the fuller node, beside the first, where the
// scheduler refuses it once the first binds.
func TestPodAntiAffinityAgainstPlansWithoutPods(t *testing.T) {
	first := admittedWorkload("r0", "r0-uid", 1, 1).withAntiAffinity(corev1.LabelHostname).obj()
	second := admittedWorkload("r1", "r1-uid", 1, 1).withAntiAffinity(corev1.LabelHostname).obj()
	e := newEnv(t, gpuNode("n1", 8, nil), gpuNode("n2", 8, nil), first, second)
	e.reconcile(first)
	e.reconcile(second)
	var nodes []string
	for _, name := range []string{"r0", "r1"} {
		if st := e.check(map[string]*kueue.Workload{"r0": first, "r1": second}[name]); st.State != kueue.CheckStateReady {
			t.Fatalf("%s: check %s (%q)", name, st.State, st.Message)
		}
		nodes = append(nodes, e.plan(name).Spec.Assignments[0].Node)
	}
	if nodes[0] == nodes[1] {
		t.Errorf("both replicas planned on %s", nodes[0])
	}
}
