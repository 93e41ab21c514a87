package fit

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// term builds a node selector term from "key op values..." requirements
// (values comma-separated); a key of metadata.name makes a matchFields one.
func term(reqs ...string) corev1.NodeSelectorTerm {
	var t corev1.NodeSelectorTerm
	for _, r := range reqs {
		f := strings.Fields(r)
		req := corev1.NodeSelectorRequirement{Key: f[0], Operator: corev1.NodeSelectorOperator(f[1])}
		if len(f) > 2 {
			req.Values = strings.Split(f[2], ",")
		}
		if f[0] == "metadata.name" {
			t.MatchFields = append(t.MatchFields, req)
		} else {
			t.MatchExpressions = append(t.MatchExpressions, req)
		}
	}
	return t
}

func required(terms ...corev1.NodeSelectorTerm) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: terms}
}

// affinityNodes: three one-GPU nodes with labels the cases select on.
func affinityNodes() []Node {
	return []Node{
		mkNode("a", 1, gi80, "gpu.product", "H100", "gen", "3", "pool", "a", corev1.LabelHostname, "a"),
		mkNode("b", 1, gi80, "gpu.product", "A100", "gen", "2", corev1.LabelHostname, "b"),
		mkNode("c", 1, gi80, "gpu.product", "H100", "gen", "1", "spot", "true", corev1.LabelHostname, "c"),
	}
}

// TestNodeAffinity checks which nodes a required node affinity admits: a
// gang of one whole-GPU pod per admitted node must fit there exactly, and
// one pod more must not fit.
func TestNodeAffinity(t *testing.T) {
	cases := []struct {
		name string
		aff  *corev1.NodeSelector
		sel  map[string]string
		want []string // the nodes admitted
	}{
		{"In", required(term("gpu.product In H100")), nil, []string{"a", "c"}},
		{"In with several values", required(term("gpu.product In H100,A100")), nil, []string{"a", "b", "c"}},
		{"NotIn", required(term("gpu.product NotIn H100")), nil, []string{"b"}},
		{"NotIn holds where the label is missing", required(term("spot NotIn true")), nil, []string{"a", "b"}},
		{"hostname NotIn", required(term(corev1.LabelHostname + " NotIn a,b")), nil, []string{"c"}},
		{"Exists", required(term("spot Exists")), nil, []string{"c"}},
		{"DoesNotExist", required(term("spot DoesNotExist")), nil, []string{"a", "b"}},
		{"Gt", required(term("gen Gt 1")), nil, []string{"a", "b"}},
		{"Lt", required(term("gen Lt 3")), nil, []string{"b", "c"}},
		{"Gt on a label that is not a number", required(term("pool Gt 0")), nil, nil},
		{"requirements of a term are ANDed", required(term("gpu.product In H100", "gen Gt 1")), nil, []string{"a"}},
		{"terms are ORed", required(term("gpu.product In A100"), term("spot Exists")), nil, []string{"b", "c"}},
		{"matchFields metadata.name In", required(term("metadata.name In a")), nil, []string{"a"}},
		{"matchFields metadata.name NotIn", required(term("metadata.name NotIn a")), nil, []string{"b", "c"}},
		{"matchFields ANDed with matchExpressions", required(term("gpu.product In H100", "metadata.name NotIn c")), nil, []string{"a"}},
		{"with a nodeSelector, both must hold", required(term("gpu.product In H100,A100")), map[string]string{"pool": "a"}, []string{"a"}},
		{"nodeSelector and affinity that exclude each other", required(term("gpu.product In A100")), map[string]string{"pool": "a"}, nil},
		{"an empty term matches nothing", required(corev1.NodeSelectorTerm{}), nil, nil},
		{"no terms match nothing", required(), nil, nil},
		{"an empty term does not hide the others", required(corev1.NodeSelectorTerm{}, term("gen Lt 2")), nil, []string{"c"}},
		{"a term that cannot be parsed matches nothing; the others still count",
			required(term("gen Gt x"), term("spot Exists")), nil, []string{"c"}},
		{"nil affinity admits every node", nil, nil, []string{"a", "b", "c"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := affinityNodes()
			ps := PodSet{Name: "w", Count: len(tc.want), GPUsPerPod: 1, NodeSelector: tc.sel, NodeAffinity: tc.aff}
			if len(tc.want) > 0 {
				res := modelWith(t, nodes).Fit(gang(ps), Options{})
				if !res.Fits {
					t.Fatalf("%d pods do not fit: %q", ps.Count, res.Reasons)
				}
				if err := checkPlan(nodes, nil, gang(ps), "", res); err != nil {
					t.Fatalf("invalid plan: %v", err)
				}
				if d := cmp.Diff(tc.want, nodesOf(res)); d != "" {
					t.Errorf("nodes (-want +got):\n%s", d)
				}
			}
			ps.Count++
			if res := modelWith(t, nodes).Fit(gang(ps), Options{}); res.Fits {
				t.Errorf("%d pods fit on %v, want only %v admitted", ps.Count, nodesOf(res), tc.want)
			}
			if got := oracleFits(nodes, nil, gang(ps), ""); got {
				t.Errorf("oracle: %d pods fit", ps.Count)
			}
		})
	}
}

func TestNodeAffinityReasons(t *testing.T) {
	nodes := affinityNodes()
	one := func(aff *corev1.NodeSelector, sel map[string]string) Gang {
		return gang(PodSet{Name: "w", Count: 1, GPUsPerPod: 1, NodeSelector: sel, NodeAffinity: aff})
	}
	cases := []struct {
		name string
		gang Gang
		why  string
	}{
		{"no node matches", one(required(term("gpu.product In B200")), nil),
			"cluster: 0 of 1 pods fit; binding constraint: no node can take pod set w: 3 nodes do not match its required node affinity (gpu.product In [B200])"},
		{"terms in words", one(required(term("gpu.product In B200", "gen Gt 2"), term("metadata.name NotIn a", "spot Exists", "gen Gt 1")), nil),
			"3 nodes do not match its required node affinity (gpu.product In [B200], gen Gt [2]) or (spot Exists, gen Gt [1], metadata.name NotIn [a])"},
		{"counted apart from the nodeSelector", one(required(term("gen Gt 2")), map[string]string{"gpu.product": "A100"}),
			"no node can take pod set w: 2 nodes do not match its nodeSelector map[gpu.product:A100]; 1 node does not match its required node affinity (gen Gt [2])"},
		{"an empty affinity", one(required(), nil), "3 nodes do not match its required node affinity (no terms)"},
		{"terms that cannot be parsed are named", one(required(term("gen Gt x"), term("gpu.product In B200")), nil),
			`3 nodes do not match its required node affinity (gen Gt [x]) or (gpu.product In [B200]) (terms that cannot be parsed match no node: nodeSelectorTerms[0].matchExpressions[0].values[0]: Invalid value: "x": for 'Gt', 'Lt' operators, the value must be an integer)`},
		{"Gt with a value that is not an integer", one(required(term("gen Gt x")), nil),
			`invalid request: pod set "w": no term of its required node affinity can be parsed, so it matches no node: nodeSelectorTerms[0].matchExpressions[0].values[0]: Invalid value: "x": for 'Gt', 'Lt' operators, the value must be an integer`},
		{"an unknown operator", one(required(term("gen Above 2")), nil),
			`invalid request: pod set "w": no term of its required node affinity can be parsed, so it matches no node: nodeSelectorTerms[0].matchExpressions[0].operator: Unsupported value: "Above"`},
		{"matchFields with an operator other than In and NotIn", one(required(term("metadata.name Exists")), nil),
			`invalid request: pod set "w": no term of its required node affinity can be parsed`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := modelWith(t, nodes).Fit(tc.gang, Options{})
			if res.Fits {
				t.Fatalf("fits on %v", nodesOf(res))
			}
			if all := strings.Join(res.Reasons, "\n"); !strings.Contains(all, tc.why) {
				t.Errorf("reasons lack %q; got:\n%s", tc.why, all)
			}
		})
	}
}

// Pod sets that differ only in their affinity are not merged.
func TestNodeAffinityKeepsPodSetsApart(t *testing.T) {
	nodes := affinityNodes()
	g := gang(
		PodSet{Name: "x", Count: 2, GPUsPerPod: 1, NodeAffinity: required(term("gpu.product In H100"))},
		PodSet{Name: "y", Count: 1, GPUsPerPod: 1, NodeAffinity: required(term("gpu.product In A100"))},
	)
	res := modelWith(t, nodes).Fit(g, Options{})
	if !res.Fits {
		t.Fatalf("does not fit: %q", res.Reasons)
	}
	if err := checkPlan(nodes, nil, g, "", res); err != nil {
		t.Fatal(err)
	}
	// The same affinity, twice: merged, and still honoured.
	same := gang(
		PodSet{Name: "x", Count: 1, GPUsPerPod: 1, NodeAffinity: required(term("gpu.product In H100"))},
		PodSet{Name: "y", Count: 1, GPUsPerPod: 1, NodeAffinity: required(term("gpu.product In H100"))},
	)
	if reqs := compile(same); len(reqs) != 1 {
		t.Errorf("%d requests, want the two pod sets merged", len(reqs))
	}
	res = modelWith(t, nodes).Fit(same, Options{})
	if err := checkPlan(nodes, nil, same, "", res); !res.Fits || err != nil {
		t.Errorf("fits=%v, plan: %v; reasons %q", res.Fits, err, res.Reasons)
	}
	// Different requests with the same affinity: two requests, one compiled
	// affinity, honoured by both.
	mixed := gang(
		PodSet{Name: "x", Count: 1, GPUsPerPod: 1, NodeAffinity: required(term("gpu.product In H100"))},
		PodSet{Name: "y", Count: 2, GPUsPerPod: 1, MemoryMiB: 30000, NodeAffinity: required(term("gpu.product In H100"))},
	)
	if reqs := compile(mixed); len(reqs) != 2 || reqs[0].aff != reqs[1].aff {
		t.Errorf("want two requests sharing one affinity, got %d", len(reqs))
	}
	res = modelWith(t, nodes).Fit(mixed, Options{})
	if err := checkPlan(nodes, nil, mixed, "", res); !res.Fits || err != nil {
		t.Errorf("fits=%v, plan: %v; reasons %q", res.Fits, err, res.Reasons)
	}
	mixed.PodSets[1].Count = 3 // one GPU is whole for x, the other takes two shares
	if res := modelWith(t, nodes).Fit(mixed, Options{}); res.Fits {
		t.Errorf("fits on %v, want no room on the H100 nodes", nodesOf(res))
	}
}

func TestNeverWithNodeAffinity(t *testing.T) {
	nodes := affinityNodes()
	down := nodes[1]
	down.Ready = false
	cases := []struct {
		name  string
		nodes []Node
		aff   *corev1.NodeSelector
		count int
		never bool
		why   string
	}{
		{"no node matches", nodes, required(term("gpu.product In B200")), 1, true, "3 nodes do not match its required node affinity"},
		{"too few nodes match", nodes, required(term("gpu.product In H100")), 3, true, "only 2 whole GPUs are free"},
		{"a NotReady node that matches may come back", []Node{nodes[0], down, nodes[2]}, required(term("gpu.product In A100")), 1, false, ""},
		{"nothing can be parsed", nodes, required(term("gen Gt x")), 1, true, "invalid request"},
		{"a pod set of no pods is not refused", nodes, required(term("gen Gt x")), 0, false, ""},
	}
	for _, tc := range cases {
		g := gang(PodSet{Name: "w", Count: tc.count, GPUsPerPod: 1, NodeAffinity: tc.aff})
		never, why := Never(tc.nodes, g, Options{})
		if never != tc.never || !strings.Contains(why, tc.why) {
			t.Errorf("%s: Never = %v %q, want %v %q", tc.name, never, why, tc.never, tc.why)
		}
	}
}

// The oracle's plain reading of an affinity and the engine's (the
// scheduler's code) agree node by node, bad terms included.
func TestOracleAffinityAgreesWithEngine(t *testing.T) {
	affs := []*corev1.NodeSelector{
		required(term("gpu.product In H100")), required(term("spot NotIn true")), required(term("gen Gt 1", "gpu.product In H100")),
		required(term("gen Lt 3"), term("metadata.name In a")), required(term("gen Gt x"), term("spot Exists")),
		required(corev1.NodeSelectorTerm{}), required(term("pool Gt 0")), required(term("metadata.name NotIn c")),
	}
	nodes := affinityNodes()
	m := NewModel(nodes)
	for _, ns := range affs {
		a := newAffinity(ns)
		for i, n := range nodes {
			if got, want := a.matches(m, int32(i)), oAffinity(ns, n.Name, n.Labels); got != want {
				t.Errorf("%v on node %s: engine %v, oracle %v", a, n.Name, got, want)
			}
		}
	}
}

// A long affinity (say, a NotIn of many hosts) is cut short in reasons.
func TestAffinityTextIsBounded(t *testing.T) {
	hosts := make([]string, 50)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("gpu-node-%03d", i)
	}
	s := newAffinity(required(term(corev1.LabelHostname + " NotIn " + strings.Join(hosts, ",")))).String()
	if !strings.HasPrefix(s, "(kubernetes.io/hostname NotIn [gpu-node-000 gpu-node-001") || !strings.HasSuffix(s, "…") || len(s) > maxAffinityText+len("…") {
		t.Errorf("text %q (%d bytes)", s, len(s))
	}
}
