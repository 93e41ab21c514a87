package gpucache

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

func cpuFree(c *Cache) int64 {
	var v int64
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v, _ = s.Model.NodeFree("n1", corev1.ResourceCPU) })
	return v
}

func settledCPU(c *Cache) int64 {
	var v int64
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v, _ = s.Settled().NodeFree("n1", corev1.ResourceCPU) })
	return v
}

// Issue 17 item 5, incrementally: every pod bound to a GPU node holds its
// CPU there (GPU pod or not, terminating until gone); a plan slot no pod is
// counted on holds its pod's requests; a released plan's slot holds them
// for GhostTTL; each step leaves the model as a fresh rebuild would.
func TestCacheTracksNodeResources(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := New(nil)
	c.SetClock(func() time.Time { return now })
	n := node("n1", 2)
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourcePods: resource.MustParse("110")}
	c.UpsertNode(n)
	want := func(step string, cpu int64) {
		t.Helper()
		if got := cpuFree(c); got != cpu {
			t.Errorf("%s: %d mCPU free, want %d", step, got, cpu)
		}
		// The same state listed afresh (a restarted manager) agrees.
		fresh := New(nil)
		fresh.SetClock(func() time.Time { return now })
		c.mu.Lock()
		fresh.nodes, fresh.pods, fresh.terminating, fresh.nodeUse, fresh.termNode = c.nodes, c.pods, c.terminating, c.nodeUse, c.termNode
		fresh.plans, fresh.assumed, fresh.ghosts = c.plans, c.assumed, c.ghosts
		c.mu.Unlock()
		if got := cpuFree(fresh); got != cpu {
			t.Errorf("%s: a rebuilt model has %d mCPU free, the incremental one %d", step, got, cpu)
		}
	}
	want("empty", 16000)

	web := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "web"}, Spec: corev1.PodSpec{NodeName: "n1",
		Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	c.UpsertPod(web)
	want("a pod without GPUs", 12000)

	plan := onePlan("wl", "wl-uid", "n1-g0", "")
	plan.Annotations = map[string]string{v1alpha1.AnnotationPodRequests: `{"main":{"cpu":"6"}}`}
	c.UpsertPlan(plan)
	want("a plan slot without its pod", 6000)

	gpuPod := wholePod("p1", "n1-g0")
	gpuPod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("6")}
	c.UpsertPod(gpuPod)
	bound := plan.DeepCopy()
	bound.Status.Bindings = []v1alpha1.SlotBinding{{PodSet: "main", PodUID: "p1"}}
	c.UpsertPlan(bound)
	want("the slot's pod counts itself, the slot no longer", 6000)

	term := gpuPod.DeepCopy()
	term.DeletionTimestamp = &metav1.Time{Time: now}
	c.UpsertPod(term)
	want("terminating still holds", 6000)
	if got := settledCPU(c); got != 12000 {
		t.Errorf("settled: %d mCPU free, want 12000 once the terminating pod is gone", got)
	}

	c.UpsertPod(&corev1.Pod{ObjectMeta: web.ObjectMeta, Spec: web.Spec, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}})
	want("a finished pod holds nothing", 10000)

	c.DeletePlan(k8stypes.NamespacedName{Namespace: "ns", Name: "wl"}, bound.UID, "wl-uid")
	c.DeletePod("p1")
	want("released plan's ghost holds its slot", 10000)
	now = now.Add(GhostTTL + time.Second)
	want("ghost expired", 16000)
}
