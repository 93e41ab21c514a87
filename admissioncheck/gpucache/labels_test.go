package gpucache

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/flavors"
)

func rackNode(name, rack string, gpus int) *corev1.Node {
	n := node(name, gpus)
	n.Labels = map[string]string{"rack": rack, "kubernetes.io/hostname": name}
	return n
}

func fitIn(c *Cache, g fit.Gang, o fit.Options) (bool, string) {
	var ok bool
	var where string
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) {
		r := s.Model.Fit(g, o)
		ok, where = r.Fits, r.Domain
		if !ok {
			where = fmt.Sprint(r.Reasons)
		}
	})
	return ok, where
}

// Issue 17 cost item: a label-only node change updates the built model in
// place (no rebuild under the lock), and decides exactly as a model built
// afresh from the same nodes: level domains, node selectors and orders
// follow the new labels.
func TestLabelOnlyChangeIsIncremental(t *testing.T) {
	c := New(nil)
	for i := 0; i < 4; i++ {
		c.UpsertNode(rackNode(fmt.Sprintf("n%d", i), fmt.Sprint("r", i%2), 4))
	}
	rack := fit.Options{Levels: []string{"rack"}, Level: "rack"}
	gang3 := fit.Gang{PodSets: []fit.PodSet{{Name: "w", Count: 3, GPUsPerPod: 4}}}
	pool := fit.Gang{PodSets: []fit.PodSet{{Name: "w", Count: 1, GPUsPerPod: 1, NodeSelector: map[string]string{"pool": "a"}}}}
	if ok, _ := fitIn(c, gang3, rack); ok {
		t.Fatal("3 nodes' worth fits a rack of 2 nodes")
	}
	_, _ = fitIn(c, pool, fit.Options{})
	v := c.views[flavors.DefaultBuffer()]
	model := v.model

	// n1 moves to rack r0 (now 3 nodes) and joins pool a.
	moved := rackNode("n1", "r0", 4)
	moved.Labels["pool"] = "a"
	c.UpsertNode(moved)
	if v.dirty || v.model != model {
		t.Fatal("a label change rebuilt the model")
	}
	ok, where := fitIn(c, gang3, rack)
	if !ok || where != "r0" {
		t.Errorf("after the move: fits=%v in %s, want r0", ok, where)
	}
	if ok, why := fitIn(c, pool, fit.Options{}); !ok {
		t.Errorf("pool a: %s", why)
	}

	// The same nodes listed afresh agree.
	fresh := New(nil)
	c.mu.Lock()
	for _, e := range c.nodes {
		fresh.UpsertNode(e.obj)
	}
	c.mu.Unlock()
	if ok2, where2 := fitIn(fresh, gang3, rack); ok2 != ok || where2 != where {
		t.Errorf("fresh model: fits=%v in %s; incremental: %v in %s", ok2, where2, ok, where)
	}

	// A GPU product label is not a label-only change: it decides the GPUs.
	prod := moved.DeepCopy()
	prod.Labels[flavors.LabelGPUProduct] = "NVIDIA-H100-80GB-HBM3"
	c.UpsertNode(prod)
	if !v.dirty {
		t.Error("a GPU product label change did not rebuild")
	}
}

// BenchmarkLabelOnlyChange: one node's label changes (one no level reads,
// or the rack level's own), then one decision reads the model (12 500
// nodes × 8 GPUs, 50 000 holder pods).
func BenchmarkLabelOnlyChange(b *testing.B) {
	c := New(nil)
	nodes := make([]*corev1.Node, 12500)
	for i := range nodes {
		var gs []v1alpha1.GPUInfo
		for g := 0; g < 8; g++ {
			gs = append(gs, v1alpha1.GPUInfo{UUID: fmt.Sprintf("n%05d-g%d", i, g), Index: g, Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559})
		}
		nodes[i] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%05d", i), Labels: map[string]string{"rack": fmt.Sprint("rack-", i/16)},
			Annotations: map[string]string{v1alpha1.AnnotationGPUs: v1alpha1.FormatGPUs(gs)}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
		c.UpsertNode(nodes[i])
	}
	for i := 0; i < 50000; i++ {
		p := wholePod(k8stypes.UID(fmt.Sprint("p", i)), fmt.Sprintf("n%05d-g%d", (i/4)*2%12500, i%4))
		p.Spec.NodeName = fmt.Sprintf("n%05d", (i/4)*2%12500)
		c.UpsertPod(p)
	}
	g := fit.Gang{PodSets: []fit.PodSet{{Name: "w", Count: 2, GPUsPerPod: 8}}}
	o := fit.Options{Levels: []string{"rack"}, Level: "rack"}
	fitIn(c, g, o)
	for _, key := range []string{"gpupack.io/other", "rack"} {
		b.Run(key, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				n := nodes[i%len(nodes)].DeepCopy()
				n.Labels[key] = fmt.Sprint("rack-", i%7)
				c.UpsertNode(n)
				fitIn(c, g, o)
			}
		})
	}
}
