package topology

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	volcanotopology "volcano.sh/apis/pkg/apis/topology/v1alpha1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

const (
	spine = "network.topology.nvidia.com/spine"
	leaf  = "network.topology.nvidia.com/leaf"
	nvl   = v1alpha1.LabelNVLinkDomain
)

var levels3 = []string{spine, leaf, nvl}

func node(name string, kv ...string) Node {
	n := Node{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}
	for i := 0; i+1 < len(kv); i += 2 {
		n.Labels[kv[i]] = kv[i+1]
	}
	return n
}

// 3-level node: spine s, leaf l, NVLink domain d.
func node3(name, s, l, d string) Node { return node(name, spine, s, leaf, l, nvl, d) }

func TestTierOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		levels []string
		level  string
		tier   int
		ok     bool
	}{
		{"narrowest is tier 1", levels3, nvl, 1, true},
		{"middle", levels3, leaf, 2, true},
		{"broadest", levels3, spine, 3, true},
		{"hostname below the tree", append(append([]string{}, levels3...), corev1.LabelHostname), corev1.LabelHostname, 0, false},
		{"hostname does not count as a tier", []string{spine, leaf, corev1.LabelHostname}, leaf, 1, true},
		{"whole cluster", levels3, "", 0, false},
		{"unknown label", levels3, "rack", 0, false},
		{"no levels", nil, leaf, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tier, ok := TierOf(tc.levels, tc.level)
			if tier != tc.tier || ok != tc.ok {
				t.Fatalf("TierOf(%v, %q) = %d, %v; want %d, %v", tc.levels, tc.level, tier, ok, tc.tier, tc.ok)
			}
		})
	}
}

func TestDiscover(t *testing.T) {
	for _, tc := range []struct {
		name   string
		levels []string
		nodes  []Node
		want   Hierarchy
	}{
		{
			name:   "three levels",
			levels: levels3,
			nodes: []Node{
				node3("n4", "s1", "l2", "d3"), node3("n1", "s1", "l1", "d1"), node3("n2", "s1", "l1", "d1"),
				node3("n3", "s1", "l1", "d2"), node3("n5", "s2", "l3", "d4"),
			},
			want: Hierarchy{
				Levels: levels3,
				Domains: [][]Domain{
					{{Value: "s1", Children: []string{"l1", "l2"}}, {Value: "s2", Children: []string{"l3"}}},
					{{Value: "l1", Parent: "s1", Children: []string{"d1", "d2"}}, {Value: "l2", Parent: "s1", Children: []string{"d3"}}, {Value: "l3", Parent: "s2", Children: []string{"d4"}}},
					{{Value: "d1", Parent: "l1", Nodes: []string{"n1", "n2"}}, {Value: "d2", Parent: "l1", Nodes: []string{"n3"}}, {Value: "d3", Parent: "l2", Nodes: []string{"n4"}}, {Value: "d4", Parent: "l3", Nodes: []string{"n5"}}},
				},
			},
		},
		{
			name:   "hostname level is dropped",
			levels: []string{leaf, corev1.LabelHostname},
			nodes:  []Node{node("n1", leaf, "l1"), node("n2", leaf, "l1")},
			want: Hierarchy{
				Levels:  []string{leaf},
				Domains: [][]Domain{{{Value: "l1", Nodes: []string{"n1", "n2"}}}},
			},
		},
		{
			name:   "nodes missing a level are skipped",
			levels: levels3,
			nodes:  []Node{node3("gpu", "s1", "l1", "d1"), node("cpu", spine, "s1", leaf, "l1"), node("bare")},
			want: Hierarchy{
				Levels: levels3,
				Domains: [][]Domain{
					{{Value: "s1", Children: []string{"l1"}}},
					{{Value: "l1", Parent: "s1", Children: []string{"d1"}}},
					{{Value: "d1", Parent: "l1", Nodes: []string{"gpu"}}},
				},
				Skipped: []Skipped{{Node: "bare", Reason: "no " + spine + " label"}, {Node: "cpu", Reason: "no " + nvl + " label"}},
			},
		},
		{
			name:   "a domain under two parents goes under the majority",
			levels: []string{spine, leaf},
			nodes:  []Node{node("a", spine, "s2", leaf, "l1"), node("b", spine, "s1", leaf, "l1"), node("c", spine, "s2", leaf, "l1")},
			want: Hierarchy{
				Levels: []string{spine, leaf},
				Domains: [][]Domain{
					{{Value: "s2", Children: []string{"l1"}}},
					{{Value: "l1", Parent: "s2", Nodes: []string{"a", "b", "c"}}},
				},
				Conflicts: []string{leaf + "=l1 has nodes under " + spine + " [s1 s2]; placed under s2"},
			},
		},
		{
			name:   "no levels: no tree",
			levels: []string{corev1.LabelHostname},
			nodes:  []Node{node("n1")},
			want:   Hierarchy{Levels: []string{}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Discover(tc.levels, tc.nodes)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("Discover (-want +got):\n%s", diff)
			}
			// Any input order gives the same tree.
			rev := append([]Node(nil), tc.nodes...)
			for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
				rev[i], rev[j] = rev[j], rev[i]
			}
			if diff := cmp.Diff(got, Discover(tc.levels, rev), cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("order changed the tree:\n%s", diff)
			}
		})
	}
}

func TestHyperNodeName(t *testing.T) {
	long := ""
	for len(long) < 100 {
		long += "Leaf_Switch."
	}
	for _, tc := range []struct {
		tier         int
		level, value string
	}{
		{1, nvl, "d1"},
		{2, leaf, "LEAF.A_1"},
		{3, spine, "--"},
		{2, leaf, long},
		{1, nvl, "4f6b2c1e-9d2e-4c3f-a1b2-0123456789ab.7"},
	} {
		name := HyperNodeName(tc.tier, tc.level, tc.value)
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("HyperNodeName(%d, %q, %q) = %q, not a DNS label: %v", tc.tier, tc.level, tc.value, name, errs)
		}
		if again := HyperNodeName(tc.tier, tc.level, tc.value); again != name {
			t.Errorf("unstable name: %q then %q", name, again)
		}
	}
	// Values that sanitise alike, and one value at two levels, stay apart.
	names := map[string]string{}
	for _, in := range [][2]string{{leaf, "a.b"}, {leaf, "a_b"}, {leaf, "A-B"}, {spine, "a.b"}} {
		n := HyperNodeName(2, in[0], in[1])
		if prev, dup := names[n]; dup {
			t.Errorf("%v and %s both named %s", in, prev, n)
		}
		names[n] = fmt.Sprint(in)
	}
	if got, want := HyperNodeName(1, nvl, "d1")[:6], "t1-d1-"; got != want {
		t.Errorf("name starts %q, want %q (readable tier and value)", got, want)
	}
}

func TestHyperNodes(t *testing.T) {
	h := Discover(levels3, []Node{
		node3("n1", "s1", "l1", "d1"), node3("n2", "s1", "l1", "d2"), node3("n3", "s1", "l2", "d3"),
	})
	name := func(tier int, level, v string) string { return HyperNodeName(tier, level, v) }
	hn := func(tier int, level, v string, t volcanotopology.MemberType, members ...string) summary {
		return summary{Name: name(tier, level, v), Tier: tier, TierName: level, Level: level, Domain: v, Type: t, Members: members}
	}
	want := []summary{
		hn(1, nvl, "d1", volcanotopology.MemberTypeNode, "n1"),
		hn(1, nvl, "d2", volcanotopology.MemberTypeNode, "n2"),
		hn(1, nvl, "d3", volcanotopology.MemberTypeNode, "n3"),
		hn(2, leaf, "l1", volcanotopology.MemberTypeHyperNode, name(1, nvl, "d1"), name(1, nvl, "d2")),
		hn(2, leaf, "l2", volcanotopology.MemberTypeHyperNode, name(1, nvl, "d3")),
		hn(3, spine, "s1", volcanotopology.MemberTypeHyperNode, name(2, leaf, "l1"), name(2, leaf, "l2")),
	}
	if diff := cmp.Diff(want, summarize(t, HyperNodes(h))); diff != "" {
		t.Fatalf("HyperNodes (-want +got):\n%s", diff)
	}
}

// summary is a HyperNode in one line of fields, for readable diffs.
type summary struct {
	Name, TierName, Level, Domain string
	Tier                          int
	Type                          volcanotopology.MemberType
	Members                       []string
}

func summarize(t *testing.T, hns []volcanotopology.HyperNode) []summary {
	t.Helper()
	var out []summary
	for _, hn := range hns {
		s := summary{Name: hn.Name, Tier: hn.Spec.Tier, TierName: hn.Spec.TierName, Level: hn.Annotations[AnnotationLevel], Domain: hn.Annotations[AnnotationDomain]}
		if hn.Labels[LabelManagedBy] != ManagedByValue {
			t.Errorf("%s lacks the managed-by label", hn.Name)
		}
		for _, m := range hn.Spec.Members {
			if s.Type != "" && m.Type != s.Type {
				t.Errorf("%s mixes member types", hn.Name)
			}
			s.Type = m.Type
			if m.Selector.ExactMatch == nil || m.Selector.RegexMatch != nil || m.Selector.LabelMatch != nil {
				t.Errorf("%s: member %+v is not an exact match", hn.Name, m)
				continue
			}
			s.Members = append(s.Members, m.Selector.ExactMatch.Name)
		}
		out = append(out, s)
	}
	return out
}

// Random label assignments always give a valid tree: every fully labelled
// node is in exactly one tier-1 HyperNode, every HyperNode below the top is
// a member of exactly one HyperNode one tier up, names are unique DNS labels.
func TestHyperNodesTreeProperty(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 300; iter++ {
		nLevels := 1 + rng.Intn(4)
		lv := make([]string, nLevels)
		for i := range lv {
			lv[i] = fmt.Sprintf("example.com/level-%d", i)
		}
		var nodes []Node
		full := map[string]bool{}
		for i := 0; i < 1+rng.Intn(40); i++ {
			n := node(fmt.Sprintf("node-%d", i))
			complete := true
			for _, l := range lv {
				if rng.Intn(20) == 0 {
					complete = false
					continue
				}
				n.Labels[l] = fmt.Sprintf("V%d.x", rng.Intn(4))
			}
			if complete {
				full[n.Name] = true
			}
			nodes = append(nodes, n)
		}
		hns := HyperNodes(Discover(lv, nodes))
		byName := map[string]volcanotopology.HyperNode{}
		parents := map[string]int{}
		inTier1 := map[string]int{}
		for _, hn := range hns {
			if _, dup := byName[hn.Name]; dup {
				t.Fatalf("iter %d: duplicate name %s", iter, hn.Name)
			}
			if errs := validation.IsDNS1123Label(hn.Name); len(errs) > 0 {
				t.Fatalf("iter %d: %s: %v", iter, hn.Name, errs)
			}
			byName[hn.Name] = hn
			if len(hn.Spec.Members) == 0 {
				t.Fatalf("iter %d: %s has no members", iter, hn.Name)
			}
			for _, m := range hn.Spec.Members {
				if hn.Spec.Tier == 1 {
					inTier1[m.Selector.ExactMatch.Name]++
				} else {
					parents[m.Selector.ExactMatch.Name]++
				}
			}
		}
		for n := range full {
			if inTier1[n] != 1 {
				t.Fatalf("iter %d: node %s is in %d tier-1 HyperNodes", iter, n, inTier1[n])
			}
		}
		if len(inTier1) != len(full) {
			t.Fatalf("iter %d: %d nodes in the tree, %d fully labelled", iter, len(inTier1), len(full))
		}
		for _, hn := range hns {
			if hn.Spec.Tier < nLevels && parents[hn.Name] != 1 {
				t.Fatalf("iter %d: %s (tier %d) has %d parents", iter, hn.Name, hn.Spec.Tier, parents[hn.Name])
			}
			if hn.Spec.Tier > 1 {
				for _, m := range hn.Spec.Members {
					if c, ok := byName[m.Selector.ExactMatch.Name]; !ok || c.Spec.Tier != hn.Spec.Tier-1 {
						t.Fatalf("iter %d: %s names %s, not a HyperNode of tier %d", iter, hn.Name, m.Selector.ExactMatch.Name, hn.Spec.Tier-1)
					}
				}
			}
		}
	}
}
