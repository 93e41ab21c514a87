package fit

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const gib = int64(1) << 30

// withRes gives a node allocatable cpu (cores), memory (GiB) and pods, plus
// any extra resources (milli-units).
func withRes(n Node, cpu, memGiB, pods int64, extra ...any) Node {
	n.Resources = map[corev1.ResourceName]int64{corev1.ResourceCPU: cpu * 1000, corev1.ResourceMemory: memGiB * gib * 1000, corev1.ResourcePods: pods * 1000}
	for i := 0; i+1 < len(extra); i += 2 {
		n.Resources[corev1.ResourceName(extra[i].(string))] = extra[i+1].(int64)
	}
	return n
}

func asking(ps PodSet, cpu, memGiB int64, extra ...any) PodSet {
	ps.Requests = map[corev1.ResourceName]int64{}
	if cpu > 0 {
		ps.Requests[corev1.ResourceCPU] = cpu * 1000
	}
	if memGiB > 0 {
		ps.Requests[corev1.ResourceMemory] = memGiB * gib * 1000
	}
	for i := 0; i+1 < len(extra); i += 2 {
		ps.Requests[corev1.ResourceName(extra[i].(string))] = extra[i+1].(int64)
	}
	return ps
}

type nodeUse struct {
	node      string
	cpu, mem  int64
	pods      int64
	resources map[corev1.ResourceName]int64
}

// Issue 17 item 5: a gang whose pods fit the GPUs but not the CPU, memory,
// pods or extended resources of those nodes is not planned there.
func TestNodeResourcesLimitPlacement(t *testing.T) {
	cases := []struct {
		name    string
		nodes   []Node
		use     []nodeUse
		g       Gang
		fits    bool
		nodes1  int    // distinct nodes of the plan, when it fits
		wantMsg string // in the first reason, when it does not
	}{
		{"GPUs and CPU free", []Node{withRes(mkNode("a", 8, gi80), 64, 512, 110)},
			nil, gang(asking(whole("w", 2, 4), 16, 64)), true, 1, ""},
		{"GPUs free, CPU only for one pod", []Node{withRes(mkNode("a", 8, gi80), 16, 512, 110)},
			nil, gang(asking(whole("w", 2, 4), 10, 64)), false, 0, "only 1 of 2 pods fit the other resources"},
		{"CPU for one pod per node: spread over two nodes", []Node{withRes(mkNode("a", 8, gi80), 16, 512, 110), withRes(mkNode("b", 8, gi80), 16, 512, 110)},
			nil, gang(asking(whole("w", 2, 4), 10, 64)), true, 2, ""},
		{"memory held by other pods", []Node{withRes(mkNode("a", 8, gi80), 64, 512, 110)},
			[]nodeUse{{node: "a", mem: 480 * gib * 1000, pods: 3}}, gang(asking(whole("w", 1, 1), 1, 64)), false, 0, "memory on 1 node"},
		{"pods allocatable used up", []Node{withRes(mkNode("a", 8, gi80), 64, 512, 12)},
			[]nodeUse{{node: "a", pods: 11}}, gang(whole("w", 2, 1)), false, 0, "pods on 1 node"},
		{"extended resource only on one node", []Node{withRes(mkNode("a", 8, gi80), 64, 512, 110), withRes(mkNode("b", 8, gi80), 64, 512, 110, "rdma/hca", int64(4000))},
			nil, gang(asking(whole("w", 2, 4), 1, 1, "rdma/hca", int64(1000))), true, 1, ""},
		{"extended resource no node lists", []Node{withRes(mkNode("a", 8, gi80), 64, 512, 110)},
			nil, gang(asking(whole("w", 1, 1), 1, 1, "rdma/hca", int64(1000))), false, 0, "rdma/hca"},
		{"a node without resources is not limited by them", []Node{mkNode("a", 8, gi80)},
			nil, gang(asking(whole("w", 2, 4), 1000, 1)), true, 1, ""},
		{"mixed pod sets share the node's CPU", []Node{withRes(mkNode("a", 8, gi80), 20, 512, 110)},
			nil, gang(asking(whole("m", 1, 4), 12, 1), asking(whole("w", 1, 4), 12, 1)), false, 0, "fit the other resources"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := NewModel(tc.nodes)
			for _, u := range tc.use {
				req := map[corev1.ResourceName]int64{corev1.ResourceCPU: u.cpu, corev1.ResourceMemory: u.mem}
				m.UseNode(u.node, req, u.pods)
			}
			before := freeOf(m, tc.nodes)
			res := m.Fit(tc.g, Options{})
			if res.Fits != tc.fits {
				t.Fatalf("fits=%v, want %v (%v)", res.Fits, tc.fits, res.Reasons)
			}
			if tc.fits {
				if strings.HasPrefix(tc.name, "extended resource only on one node") && nodesOf(res)[0] != "b" {
					t.Errorf("planned on %v, want b (the only node with rdma/hca)", nodesOf(res))
				}
				if got := len(nodesOf(res)); got != tc.nodes1 {
					t.Errorf("plan on %d nodes %v, want %d", got, nodesOf(res), tc.nodes1)
				}
			} else if len(res.Reasons) == 0 || !strings.Contains(strings.Join(res.Reasons, "; "), tc.wantMsg) {
				t.Errorf("reasons %q, want %q", res.Reasons, tc.wantMsg)
			}
			if after := freeOf(m, tc.nodes); after != before {
				t.Errorf("the dry run left resources taken: %v → %v", before, after)
			}
		})
	}
}

func freeOf(m *Model, nodes []Node) string {
	var b strings.Builder
	for _, n := range nodes {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourcePods, "rdma/hca"} {
			v, _ := m.NodeFree(n.Name, r)
			b.WriteString(string(r))
			b.WriteByte('=')
			b.WriteString(strconv.FormatInt(v, 10))
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// ReleaseNode undoes UseNode; Clone does not share what is used.
func TestNodeResourcesUseReleaseClone(t *testing.T) {
	m := NewModel([]Node{withRes(mkNode("a", 1, gi80), 8, 64, 110)})
	m.UseNode("a", map[corev1.ResourceName]int64{corev1.ResourceCPU: 6000}, 1)
	c := m.Clone()
	m.ReleaseNode("a", map[corev1.ResourceName]int64{corev1.ResourceCPU: 6000}, 1)
	if v, _ := m.NodeFree("a", corev1.ResourceCPU); v != 8000 {
		t.Errorf("cpu free %d after release, want 8000", v)
	}
	if v, _ := c.NodeFree("a", corev1.ResourceCPU); v != 2000 {
		t.Errorf("clone cpu free %d, want 2000 (not shared with the original)", v)
	}
	m.ReleaseNode("a", map[corev1.ResourceName]int64{corev1.ResourceCPU: 6000}, 1)
	if v, _ := m.NodeFree("a", corev1.ResourceCPU); v != 8000 {
		t.Errorf("cpu free %d after a second release, want 8000 (clamped)", v)
	}
}

// Never ignores resources other than GPUs: a gang they keep out waits.
func TestNeverIgnoresNodeResources(t *testing.T) {
	nodes := []Node{withRes(mkNode("a", 8, gi80), 4, 64, 110)}
	g := gang(asking(whole("w", 1, 1), 64, 1))
	if res := NewModel(nodes).Fit(g, Options{}); res.Fits {
		t.Fatal("fits a node with 4 CPUs")
	}
	if never, why := Never(nodes, g, Options{}); never {
		t.Errorf("Never (%s): node CPU must not make Rejected", why)
	}
}

// A GPU with a sharing-slot count (HAMi's split count) takes at most that
// many pods, whatever memory is left.
func TestGPUSharingSlots(t *testing.T) {
	n := mkNode("a", 1, gi80)
	n.GPUs[0].MaxShare = 2
	m := NewModel([]Node{n})
	if res := m.Fit(gang(shared("s", 2, 1, 10240)), Options{}); !res.Fits {
		t.Fatalf("2 pods on a GPU of 2 slots: %v", res.Reasons)
	}
	if res := m.Fit(gang(shared("s", 3, 1, 10240)), Options{}); res.Fits {
		t.Errorf("3 pods planned on a GPU of 2 slots")
	}
	if err := m.Use(Usage{UUID: "a-g0", MemoryMiB: 10240, Cores: 0}); err != nil {
		t.Fatal(err)
	}
	if res := m.Fit(gang(shared("s", 2, 1, 10240)), Options{}); res.Fits {
		t.Errorf("2 more pods planned on a GPU with 1 slot left")
	}
}

// BenchmarkFitNodeResources is BenchmarkFit's 10k-GPU cases with every node
// publishing cpu/memory/pods (half used by holders) and every pod asking
// cpu and memory: the cost of planning against them.
func BenchmarkFitNodeResources(b *testing.B) {
	_, ns := fragmented(1250, 1)
	for i := range ns {
		ns[i] = withRes(ns[i], 192, 2048, 110)
	}
	m := NewModel(ns)
	for i, n := range ns {
		if i%2 == 0 {
			m.UseNode(n.Name, map[corev1.ResourceName]int64{corev1.ResourceCPU: 96000, corev1.ResourceMemory: 1024 * gib * 1000}, 4)
		}
	}
	base, _ := fragmented(1250, 1) // same GPU usage, no node resources
	for _, gg := range benchGangs() {
		g := gg.g
		for i := range g.PodSets {
			g.PodSets[i] = asking(g.PodSets[i], 8, 64)
		}
		for _, level := range []string{"", "rack"} {
			lv := level
			if lv == "" {
				lv = "cluster"
			}
			o := Options{Level: level, Levels: []string{"rack", "kubernetes.io/hostname"}}
			b.Run(fmt.Sprintf("%s/%s/with-resources", lv, gg.name), func(b *testing.B) { benchFit(b, m, g, o) })
			b.Run(fmt.Sprintf("%s/%s/gpus-only", lv, gg.name), func(b *testing.B) { benchFit(b, base, gg.g, o) })
		}
	}
}
