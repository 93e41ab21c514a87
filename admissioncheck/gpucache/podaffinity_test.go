package gpucache

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/flavors"
)

func runningPod(uid, node string, labels map[string]string, anti ...corev1.PodAffinityTerm) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ns", UID: types.UID(uid), Labels: labels},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if len(anti) > 0 {
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: anti}}
	}
	return p
}

// TestDecideAvoidsNodesOfConflictingPods: both directions of the
// scheduler's InterPodAffinity filter, on pods the cache learned from the
// informer: the gang's term selecting a running pod, and a running pod's
// term (any topologyKey) selecting the gang's template.
func TestDecideAvoidsNodesOfConflictingPods(t *testing.T) {
	app := map[string]string{"app": "infer"}
	mine := []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}
	zoneOf := func(n *corev1.Node, z string) *corev1.Node { n.Labels["zone"] = z; return n }
	cases := []struct {
		name string
		pods []*corev1.Pod
		aff  inventory.PodAffinity
		want []string
	}{{
		name: "no pods",
		aff:  inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: app, Anti: mine},
	}, {
		name: "the gang's term selects a running pod",
		pods: []*corev1.Pod{runningPod("p1", "n1", app), runningPod("p2", "n2", map[string]string{"app": "db"})},
		aff:  inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: app, Anti: mine},
		want: []string{"n1"},
	}, {
		name: "a running pod of another namespace is not selected",
		pods: []*corev1.Pod{func() *corev1.Pod { p := runningPod("p1", "n1", app); p.Namespace = "other"; return p }()},
		aff:  inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: app, Anti: mine},
	}, {
		name: "a finished pod does not count",
		pods: []*corev1.Pod{func() *corev1.Pod { p := runningPod("p1", "n1", app); p.Status.Phase = corev1.PodSucceeded; return p }()},
		aff:  inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: app, Anti: mine},
	}, {
		name: "a running pod's zone term keeps the gang out of its zone",
		pods: []*corev1.Pod{runningPod("p1", "n1", map[string]string{"app": "db"},
			corev1.PodAffinityTerm{TopologyKey: "zone", LabelSelector: &metav1.LabelSelector{MatchLabels: app}})},
		aff:  inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: app},
		want: []string{"n1", "n2"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := New(nil)
			c.UpsertNode(zoneOf(node("n1", 1), "z1"))
			c.UpsertNode(zoneOf(node("n2", 1), "z1"))
			c.UpsertNode(zoneOf(node("n3", 1), "z2"))
			for _, p := range tc.pods {
				c.UpsertPod(p)
			}
			g := fit.Gang{PodSets: []fit.PodSet{{Name: "w", Count: 1, GPUsPerPod: 1}}}
			var got fit.Gang
			c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { got, _ = s.avoid(g, []inventory.PodAffinity{tc.aff}, false, nil) })
			if d := cmp.Diff(tc.want, got.PodSets[0].AvoidNodes); d != "" {
				t.Errorf("AvoidNodes (-want +got):\n%s", d)
			}
			for _, p := range tc.pods {
				c.DeletePod(p.UID)
			}
			c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { got, _ = s.avoid(g, []inventory.PodAffinity{tc.aff}, false, nil) })
			if len(got.PodSets[0].AvoidNodes) != 0 {
				t.Errorf("pods deleted, still avoided: %v", got.PodSets[0].AvoidNodes)
			}
		})
	}
}

// A gang kept off its only node by a terminating pod waits (Pending),
// since it fits once the pod is gone; a running one makes it Retry.
func TestTerminatingConflictIsSettling(t *testing.T) {
	app := map[string]string{"app": "infer"}
	aff := []inventory.PodAffinity{{PodSet: "w", Namespace: "ns", Labels: app,
		Anti: []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}}}
	g := fit.Gang{PodSets: []fit.PodSet{{Name: "w", Count: 1, GPUsPerPod: 1}}}
	c := New(nil)
	c.UpsertNode(node("n1", 2))
	p := runningPod("old", "n1", app)
	c.UpsertPod(p)
	var v Verdict
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v = s.Decide(g, aff, fit.Options{}) })
	if v.Result.Fits || v.SettledFits || v.Never {
		t.Fatalf("running conflict: fits=%v settled=%v never=%v, want Retry", v.Result.Fits, v.SettledFits, v.Never)
	}
	p = p.DeepCopy()
	ts := metav1.NewTime(time.Unix(1000, 0))
	p.DeletionTimestamp = &ts
	c.UpsertPod(p)
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v = s.Decide(g, aff, fit.Options{}) })
	if v.Result.Fits || !v.SettledFits {
		t.Fatalf("terminating conflict: fits=%v settled=%v, want Pending", v.Result.Fits, v.SettledFits)
	}
	c.DeletePod(p.UID)
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v = s.Decide(g, aff, fit.Options{}) })
	if !v.Result.Fits {
		t.Fatalf("pod gone: %v", v.Result.Reasons)
	}
}

// A plan slot whose pod is not bound yet stands for it: the gang's terms
// select the plan's recorded labels, and the plan's recorded terms select
// the gang; once the pod is bound it counts itself.
func TestPlanSlotsStandForTheirPods(t *testing.T) {
	app := map[string]string{"app": "infer"}
	terms := []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}
	rec := inventory.FormatPodAffinity([]inventory.PodAffinity{{PodSet: "main", Labels: app, Anti: terms}})
	cases := []struct {
		name string
		aff  inventory.PodAffinity
		ann  string
		want []string
	}{
		{"the gang's terms select the plan's pods", inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: map[string]string{"app": "other"}, Anti: terms}, inventory.FormatPodAffinity([]inventory.PodAffinity{{PodSet: "main", Labels: app}}), []string{"n1"}},
		{"the plan's terms select the gang", inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: app}, rec, []string{"n1"}},
		{"neither", inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: map[string]string{"app": "db"}}, rec, nil},
		{"a plan without the record", inventory.PodAffinity{PodSet: "w", Namespace: "ns", Labels: app, Anti: terms}, "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := New(nil)
			c.UpsertNode(node("n1", 1))
			c.UpsertNode(node("n2", 1))
			p := onePlan("p", "p-uid", "n1-g0", "")
			if tc.ann != "" {
				p.Annotations = map[string]string{v1alpha1.AnnotationPodAffinity: tc.ann}
			}
			c.UpsertPlan(p)
			g := fit.Gang{PodSets: []fit.PodSet{{Name: "w", Count: 1, GPUsPerPod: 1}}}
			var got fit.Gang
			c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { got, _ = s.avoid(g, []inventory.PodAffinity{tc.aff}, false, nil) })
			if d := cmp.Diff(tc.want, got.PodSets[0].AvoidNodes); d != "" {
				t.Errorf("AvoidNodes (-want +got):\n%s", d)
			}
		})
	}
	// Bound: the pod (with other labels now) counts, not the slot.
	c := New(nil)
	c.UpsertNode(node("n1", 1))
	p := onePlan("p", "p-uid", "n1-g0", "pod-1")
	p.Annotations = map[string]string{v1alpha1.AnnotationPodAffinity: rec}
	c.UpsertPlan(p)
	c.UpsertPod(runningPod("pod-1", "n1", map[string]string{"app": "relabelled"}))
	var got fit.Gang
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) {
		got, _ = s.avoid(fit.Gang{PodSets: []fit.PodSet{{Name: "w", Count: 1, GPUsPerPod: 1}}}, []inventory.PodAffinity{{PodSet: "w", Namespace: "ns", Labels: map[string]string{"x": "y"}, Anti: terms}}, false, nil)
	})
	if len(got.PodSets[0].AvoidNodes) != 0 {
		t.Errorf("the bound pod's own labels do not match, still avoided: %v", got.PodSets[0].AvoidNodes)
	}
}

// A terminating pod's zone term keeps the gang out of its zone now, not once
// it is gone (settled).
func TestTerminatingZoneTermIsSettling(t *testing.T) {
	app := map[string]string{"app": "infer"}
	c := New(nil)
	for _, n := range []string{"n1", "n2"} {
		nd := node(n, 1)
		nd.Labels["zone"] = "z1"
		c.UpsertNode(nd)
	}
	p := runningPod("old", "n1", map[string]string{"app": "db"},
		corev1.PodAffinityTerm{TopologyKey: "zone", LabelSelector: &metav1.LabelSelector{MatchLabels: app}})
	ts := metav1.NewTime(time.Unix(1000, 0))
	p.DeletionTimestamp = &ts
	c.UpsertPod(p)
	g := fit.Gang{PodSets: []fit.PodSet{{Name: "w", Count: 1, GPUsPerPod: 1}}}
	aff := []inventory.PodAffinity{{PodSet: "w", Namespace: "ns", Labels: app}}
	var now, settled fit.Gang
	var byTerm bool
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) {
		now, byTerm = s.avoid(g, aff, false, nil)
		settled, _ = s.avoid(g, aff, true, nil)
	})
	if d := cmp.Diff([]string{"n1", "n2"}, now.PodSets[0].AvoidNodes); d != "" || !byTerm {
		t.Errorf("now: byTerminating %v, AvoidNodes (-want +got):\n%s", byTerm, d)
	}
	if len(settled.PodSets[0].AvoidNodes) != 0 {
		t.Errorf("settled still avoids %v", settled.PodSets[0].AvoidNodes)
	}
}
