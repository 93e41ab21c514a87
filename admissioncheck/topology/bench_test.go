package topology

import (
	"fmt"
	"testing"
)

// cluster is a 3-level cluster of n nodes: 8 nodes per NVLink domain, 4
// domains per leaf, 8 leaves per spine.
func cluster(n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		d, l := i/8, i/32
		nodes[i] = node3(fmt.Sprintf("gpu-node-%05d", i), fmt.Sprintf("spine-%d", l/8), fmt.Sprintf("leaf-%d", l), fmt.Sprintf("nvl-%d", d))
	}
	return nodes
}

// What one reconcile computes after a node event: the tree, its objects,
// and the diff against the stored tree (here: in sync, the common case).
func BenchmarkReconcileTree(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		nodes := cluster(n)
		stored := HyperNodes(Discover(levels3, nodes))
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c, _ := Diff(HyperNodes(Discover(levels3, nodes)), stored)
				if !c.Empty() {
					b.Fatal("in-sync tree reported changes")
				}
			}
		})
	}
}
