package gpucache

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/flavors"
)

func node(name string, gpus int) *corev1.Node {
	var gs []v1alpha1.GPUInfo
	for i := 0; i < gpus; i++ {
		gs = append(gs, v1alpha1.GPUInfo{UUID: name + "-g" + string(rune('0'+i)), Index: i, Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559})
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"rack": "r1"}, Annotations: map[string]string{v1alpha1.AnnotationGPUs: v1alpha1.FormatGPUs(gs)}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

func wholePod(uid types.UID, uuid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: string(uid), Namespace: "ns", UID: uid, Annotations: map[string]string{v1alpha1.AnnotationDevices: uuid + ":71903"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func onePlan(name string, wl types.UID, uuid string, bound types.UID) *v1alpha1.GPUPlan {
	p := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("obj-" + name)},
		Spec: v1alpha1.GPUPlanSpec{WorkloadUID: wl, Assignments: []v1alpha1.PodAssignment{
			{PodSet: "main", Node: "n1", GPUs: []v1alpha1.GPUAssignment{{UUID: uuid, MemoryMiB: 71903, Exclusive: true}}}}},
		Status: v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlanned}}
	if bound != "" {
		p.Status.Bindings = []v1alpha1.SlotBinding{{PodSet: "main", PodUID: bound}}
	}
	return p
}

// free lists the GPUs of n1 with no holder.
func free(c *Cache) []string {
	var out []string
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) {
		for _, n := range s.Nodes {
			for _, g := range n.GPUs {
				if _, _, h, _ := s.Model.GPUState(g.UUID); h == 0 {
					out = append(out, g.UUID)
				}
			}
		}
	})
	return out
}

func TestCacheFollowsTheUsageRule(t *testing.T) {
	now := time.Unix(0, 0)
	key := types.NamespacedName{Namespace: "ns", Name: "wl"}
	steps := []struct {
		name string
		do   func(c *Cache)
		want []string
	}{
		{"empty", func(*Cache) {}, []string{"n1-g0", "n1-g1"}},
		{"plan slot reserves", func(c *Cache) { c.UpsertPlan(onePlan("wl", "w1", "n1-g0", "")) }, []string{"n1-g1"}},
		{"its pod bound by UID counts instead", func(c *Cache) {
			c.UpsertPod(wholePod("p1", "n1-g0"))
			c.UpsertPlan(onePlan("wl", "w1", "n1-g0", "p1"))
		}, []string{"n1-g1"}},
		{"the pod finishes: the slot is reserved again", func(c *Cache) {
			p := wholePod("p1", "n1-g0")
			p.Status.Phase = corev1.PodSucceeded
			c.UpsertPod(p)
		}, []string{"n1-g1"}},
		{"plan released: held for GhostTTL", func(c *Cache) { c.DeletePlan(key, "obj-wl", "w1") }, []string{"n1-g1"}},
		{"then free", func(*Cache) { now = now.Add(GhostTTL + time.Second) }, []string{"n1-g0", "n1-g1"}},
		{"assumed plan counts", func(c *Cache) { c.Assume(onePlan("wl", "w2", "n1-g1", "")) }, []string{"n1-g0"}},
		{"late delete of an earlier plan of the name leaves it", func(c *Cache) { c.DeletePlan(key, "obj-earlier", "w2") }, []string{"n1-g0"}},
		{"forgotten after a failed write", func(c *Cache) { c.Forget(key, "w2") }, []string{"n1-g0", "n1-g1"}},
		{"a heartbeat does not rebuild; a node update with the same GPUs keeps usage", func(c *Cache) {
			c.UpsertPod(wholePod("p2", "n1-g1"))
			n := node("n1", 2)
			n.ResourceVersion = "2"
			c.UpsertNode(n)
		}, []string{"n1-g0"}},
		{"a node change rebuilds with every holder", func(c *Cache) {
			n := node("n1", 2)
			n.Labels["rack"] = "r2"
			c.UpsertNode(n)
		}, []string{"n1-g0"}},
		{"pod gone", func(c *Cache) { c.DeletePod("p2") }, []string{"n1-g0", "n1-g1"}},
	}
	c := New(nil)
	c.SetClock(func() time.Time { return now })
	c.UpsertNode(node("n1", 2))
	for _, st := range steps {
		st.do(c)
		got := free(c)
		if len(got) != len(st.want) {
			t.Fatalf("%s: free %v, want %v", st.name, got, st.want)
		}
		for i := range got {
			if got[i] != st.want[i] {
				t.Fatalf("%s: free %v, want %v", st.name, got, st.want)
			}
		}
	}
}

func TestOnFreeFiresWhenCapacityFrees(t *testing.T) {
	fired := 0
	c := New(func() { fired++ })
	c.UpsertNode(node("n1", 1))
	fired = 0
	c.UpsertPod(wholePod("p", "n1-g0"))
	if fired != 0 {
		t.Errorf("a pod taking GPUs fired onFree")
	}
	c.DeletePod("p")
	if fired != 1 {
		t.Errorf("a holder pod gone fired onFree %d times, want 1", fired)
	}
}

func TestDecideNeverRejectsAnIncompleteInventory(t *testing.T) {
	g := fit.Gang{PodSets: []fit.PodSet{{Name: "main", Count: 1, GPUsPerPod: 4}}}
	c := New(nil)
	var v Verdict
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v = s.Decide(g, nil, fit.Options{}) })
	if !v.Never || v.Incomplete == "" {
		t.Errorf("no nodes: %+v, want Never with Incomplete set (a manager cluster without GPUs must not reject)", v)
	}
	c.UpsertNode(node("n1", 2))
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v = s.Decide(g, nil, fit.Options{}) })
	if !v.Never || v.Incomplete != "" {
		t.Errorf("complete inventory of 2-GPU nodes: %+v, want Never and complete", v)
	}
}

func TestFragmentation(t *testing.T) {
	c := New(nil)
	c.UpsertNode(node("n1", 2))
	p := wholePod("p", "n1-g0")
	p.Annotations[v1alpha1.AnnotationDevices] = "n1-g0:30000"
	p.Annotations[v1alpha1.AnnotationGPUCores] = "20"
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceVGPU: resource.MustParse("1"),
		v1alpha1.ResourceGPUMemory: resource.MustParse("30000"), v1alpha1.ResourceGPUCores: resource.MustParse("20")}
	c.UpsertPod(p)
	var fr []DomainFree
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { fr = s.Fragmentation("rack") })
	if len(fr) != 1 {
		t.Fatalf("%+v", fr)
	}
	d := fr[0]
	// n1-g1 whole (71903 MiB); n1-g0 has 41903 MiB left in a sliver.
	if d.Domain != "r1" || d.GPUs != 2 || d.WholeFree != 1 || d.LargestNodeWhole != 1 || d.FreeMiB != 71903+41903 {
		t.Errorf("%+v", d)
	}
	if d.PodsAt[2] != 1+1 || d.PodsAt[0] != 7+4 {
		t.Errorf("pods at 10/20/40 GiB = %v", d.PodsAt)
	}
	if want := 1 - 71903.0/(71903+41903); d.Fragmentation < want-1e-9 || d.Fragmentation > want+1e-9 {
		t.Errorf("fragmentation %v, want %v", d.Fragmentation, want)
	}
}

// Outside review: ghosts were pruned only by Read, which a standby replica
// never calls, so they piled up for its lifetime.
func TestGhostsExpireWithoutDecisions(t *testing.T) {
	c := New(nil)
	now := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	c.SetClock(func() time.Time { return now })
	for i := 0; i < 100; i++ {
		p := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p%d", i), UID: types.UID(fmt.Sprintf("u%d", i))},
			Spec: v1alpha1.GPUPlanSpec{WorkloadUID: types.UID(fmt.Sprintf("w%d", i)), Assignments: []v1alpha1.PodAssignment{{PodSet: "main", Node: "n1",
				GPUs: []v1alpha1.GPUAssignment{{UUID: "n1-g0", MemoryMiB: 1}}}}}}
		c.UpsertPlan(p)
		c.DeletePlan(types.NamespacedName{Namespace: "ns", Name: p.Name}, p.UID, p.Spec.WorkloadUID)
		now = now.Add(GhostTTL) // each earlier ghost is past its time by the next delete
	}
	c.mu.Lock()
	n := len(c.ghosts)
	c.mu.Unlock()
	if n > 2 {
		t.Errorf("%d ghosts kept after 100 releases spaced GhostTTL apart with no decision; want at most 2", n)
	}
}
