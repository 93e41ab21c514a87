package gpucache

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/flavors"
)

// sharedPlan: plan name of workload wl, one slot on n1 taking 1000 MiB of
// uuid, its pod asking cpu (the plan records it).
func sharedPlan(name, uuid, cpu string) *v1alpha1.GPUPlan {
	p := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("obj-" + name)},
		Spec: v1alpha1.GPUPlanSpec{WorkloadUID: types.UID(name + "-uid"), Assignments: []v1alpha1.PodAssignment{
			{PodSet: "main", Node: "n1", GPUs: []v1alpha1.GPUAssignment{{UUID: uuid, MemoryMiB: 1000}}}}}}
	if cpu != "" {
		p.Annotations = map[string]string{v1alpha1.AnnotationPodRequests: `{"main":{"cpu":"` + cpu + `"}}`}
	}
	return p
}

// TestOverbookedSeesSlotsAndNodeResources (item 3 of the gang2 brief): a
// stored plan is reused only where it fits beside everything else as the
// model knows capacity — a GPU's sharing slots and its node's cpu, memory
// and pods too, not only GPU MiB and SM.
func TestOverbookedSeesSlotsAndNodeResources(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "a"}
	hamiNode := func(count int32) *corev1.Node {
		n := node("n1", 0)
		delete(n.Annotations, v1alpha1.AnnotationGPUs)
		n.Annotations[v1alpha1.AnnotationHAMiNodeRegister] = inventory.FormatHAMiLegacy([]inventory.HAMiDevice{
			{ID: "GPU-0", Count: count, DevMem: 81559, DevCore: 100, Type: "NVIDIA-H100-80GB-HBM3", Health: true}})
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("64Gi"), corev1.ResourcePods: resource.MustParse("110")}
		return n
	}
	cpuPod := func(uid, cpu string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ns", UID: types.UID(uid)},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	cases := []struct {
		name  string
		count int32
		pods  []*corev1.Pod
		plans []*v1alpha1.GPUPlan
		want  string
	}{{
		name:  "fits",
		count: 4,
		plans: []*v1alpha1.GPUPlan{sharedPlan("a", "GPU-0", "4")},
	}, {
		name:  "the GPU's one sharing slot is another plan's",
		count: 1,
		plans: []*v1alpha1.GPUPlan{sharedPlan("b", "GPU-0", ""), sharedPlan("a", "GPU-0", "")},
		want:  "no sharing slot left",
	}, {
		name:  "a pod took the node's cpu",
		count: 4,
		pods:  []*corev1.Pod{cpuPod("p", "6")},
		plans: []*v1alpha1.GPUPlan{sharedPlan("a", "GPU-0", "4")},
		want:  "node n1 of slot main/0 has cpu 2000m free, the slot's pod asks 4000m",
	}, {
		name:  "a plan without recorded requests holds GPUs only",
		count: 4,
		pods:  []*corev1.Pod{cpuPod("p", "8")},
		plans: []*v1alpha1.GPUPlan{sharedPlan("a", "GPU-0", "")},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := New(nil)
			c.UpsertNode(hamiNode(tc.count))
			for _, p := range tc.pods {
				c.UpsertPod(p)
			}
			for _, p := range tc.plans {
				c.UpsertPlan(p)
			}
			var why string
			var before, after int64
			c.Read(flavors.DefaultBuffer(), func(s *Snapshot) {
				before, _ = s.Model.NodeFree("n1", corev1.ResourceCPU)
				why = s.Overbooked(key)
				after, _ = s.Model.NodeFree("n1", corev1.ResourceCPU)
			})
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("Overbooked = %q, want %q", why, tc.want)
			}
			if before != after {
				t.Errorf("the model changed: cpu free %d before, %d after", before, after)
			}
		})
	}
}

// TestOverbookedSeesPodAntiAffinity: a stored plan learned from the API (an
// earlier leader's write, planned before this process saw the pods or
// plans next to it) is reused only where the scheduler could still bind
// its pods: not on a node where its pod set's required anti-affinity
// selects a running pod or another plan's unbound slot, nor where a running
// pod's or another plan's own terms select its pods. Its own slots (kept
// apart when it was planned) and its own bound pods do not count against it.
func TestOverbookedSeesPodAntiAffinity(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "a"}
	app := map[string]string{"app": "infer"}
	db := map[string]string{"app": "db"}
	apart := func(sel map[string]string) []corev1.PodAffinityTerm {
		return []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: sel}}}
	}
	// plan: name, slots on nodes (one GPU each, index i), its pods' labels
	// and anti-affinity terms, bindings slot i → pod uid.
	plan := func(name string, labels map[string]string, anti []corev1.PodAffinityTerm, bound map[int32]string, nodes ...string) *v1alpha1.GPUPlan {
		p := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("obj-" + name)},
			Spec: v1alpha1.GPUPlanSpec{WorkloadUID: types.UID(name + "-uid")}}
		for i, n := range nodes {
			p.Spec.Assignments = append(p.Spec.Assignments, v1alpha1.PodAssignment{PodSet: "main", Index: int32(i), Node: n,
				GPUs: []v1alpha1.GPUAssignment{{UUID: n + "-g" + string(rune('0'+i)), MemoryMiB: 1000}}})
		}
		for i, uid := range bound {
			p.Status.Bindings = append(p.Status.Bindings, v1alpha1.SlotBinding{PodSet: "main", Index: i, PodName: uid, PodUID: types.UID(uid)})
		}
		if f := inventory.FormatPodAffinity([]inventory.PodAffinity{{PodSet: "main", Labels: labels, Anti: anti}}); f != "" {
			p.Annotations = map[string]string{v1alpha1.AnnotationPodAffinity: f}
		}
		return p
	}
	cases := []struct {
		name  string
		pods  []*corev1.Pod
		plans []*v1alpha1.GPUPlan
		want  string
	}{{
		name:  "nothing else on its nodes",
		plans: []*v1alpha1.GPUPlan{plan("a", app, apart(app), nil, "n1", "n2")},
	}, {
		name:  "its own slots are apart and do not count against each other",
		pods:  []*corev1.Pod{runningPod("other", "n3", app)},
		plans: []*v1alpha1.GPUPlan{plan("a", app, apart(app), nil, "n1", "n2")},
	}, {
		name:  "its term selects a running pod on a planned node",
		pods:  []*corev1.Pod{runningPod("p1", "n2", app)},
		plans: []*v1alpha1.GPUPlan{plan("a", app, apart(app), nil, "n1", "n2")},
		want:  "slot main/1 on node n2 conflicts",
	}, {
		name:  "a running pod's own term selects its pods",
		pods:  []*corev1.Pod{runningPod("p1", "n1", db, apart(app)...)},
		plans: []*v1alpha1.GPUPlan{plan("a", app, nil, nil, "n1")},
		want:  "slot main/0 on node n1 conflicts",
	}, {
		name:  "another plan's unbound slot its term selects",
		plans: []*v1alpha1.GPUPlan{plan("b", app, nil, nil, "n1"), plan("a", app, apart(app), nil, "n1")},
		want:  "slot main/0 on node n1 conflicts",
	}, {
		name:  "another plan's terms select its pods",
		plans: []*v1alpha1.GPUPlan{plan("b", db, apart(app), nil, "n1"), plan("a", app, nil, nil, "n1")},
		want:  "slot main/0 on node n1 conflicts",
	}, {
		name:  "its own bound pod is not another pod",
		pods:  []*corev1.Pod{runningPod("mine", "n3", app)},
		plans: []*v1alpha1.GPUPlan{plan("a", app, apart(app), map[int32]string{0: "mine"}, "n3", "n1")},
	}, {
		name:  "a running pod of another namespace is not selected",
		pods:  []*corev1.Pod{func() *corev1.Pod { p := runningPod("p1", "n1", app); p.Namespace = "other"; return p }()},
		plans: []*v1alpha1.GPUPlan{plan("a", app, apart(app), nil, "n1")},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := New(nil)
			for _, n := range []string{"n1", "n2", "n3"} {
				c.UpsertNode(node(n, 2))
			}
			for _, p := range tc.pods {
				c.UpsertPod(p)
			}
			for _, p := range tc.plans {
				c.UpsertPlan(p)
			}
			var why string
			c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { why = s.Overbooked(key) })
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("Overbooked = %q, want %q", why, tc.want)
			}
		})
	}
}
