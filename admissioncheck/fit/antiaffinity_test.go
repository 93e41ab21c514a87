package fit

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func apart(ps PodSet, from ...string) PodSet     { ps.Apart = from; return ps }
func avoiding(ps PodSet, nodes ...string) PodSet { ps.AvoidNodes = nodes; return ps }

// TestFitPodAntiAffinity: required pod anti-affinity on
// kubernetes.io/hostname, as package inventory hands it to the engine.
// Without it the engine packs pods onto one node, where the scheduler
// would refuse all but the first.
func TestFitPodAntiAffinity(t *testing.T) {
	four := []Node{mkNode("a", 8, gi80), mkNode("b", 8, gi80), mkNode("c", 8, gi80), mkNode("d", 8, gi80)}
	cases := []struct {
		name      string
		nodes     []Node
		gang      Gang
		wantNodes []string // nodes used, in plan order ("" : does not fit)
		wantWhy   string   // part of the first reason when it does not fit
		never     bool
	}{{
		name:      "without anti-affinity four 1-GPU pods share the fullest node",
		nodes:     four,
		gang:      gang(whole("w", 4, 1)),
		wantNodes: []string{"a"},
	}, {
		name:      "one pod per node",
		nodes:     four,
		gang:      gang(apart(whole("w", 4, 1), "w")),
		wantNodes: []string{"a", "b", "c", "d"},
	}, {
		name:    "one pod per node, one pod more than nodes: never",
		nodes:   four,
		gang:    gang(apart(whole("w", 5, 1), "w")),
		wantWhy: "at most 1 pod per node (required pod anti-affinity, topologyKey kubernetes.io/hostname), and only 4 nodes have room for one (5 pods wanted)",
		never:   true,
	}, {
		name:      "nodes with a conflicting running pod are avoided",
		nodes:     four,
		gang:      gang(apart(avoiding(whole("w", 2, 1), "a", "b"), "w")),
		wantNodes: []string{"c", "d"},
	}, {
		name:    "avoided nodes are not a proof of never",
		nodes:   four,
		gang:    gang(apart(avoiding(whole("w", 3, 1), "a", "b"), "w")),
		wantWhy: "only 2 nodes have room for one (3 pods wanted; 2 more nodes run pods it must keep away from)",
	}, {
		name:    "every node avoided",
		nodes:   four[:2],
		gang:    gang(avoiding(whole("w", 1, 1), "a", "b")),
		wantWhy: "2 nodes run pods that its required pod anti-affinity keeps it away from",
	}, {
		name: "a master kept apart from its workers, the workers may share",
		// Master and workers are identical requests but may not merge: the
		// master needs a node of its own.
		nodes:     four[:2],
		gang:      gang(apart(whole("master", 1, 1), "worker"), whole("worker", 7, 1)),
		wantNodes: []string{"a", "b"},
	}, {
		name:    "a master kept apart from its workers, on one node: never",
		nodes:   four[:1],
		gang:    gang(apart(whole("master", 1, 1), "worker"), whole("worker", 1, 1)),
		wantWhy: "fit",
		never:   true,
	}, {
		name:  "twin pod sets kept apart alike merge and stay one per node",
		nodes: four[:3],
		gang: gang(apart(shared("master", 1, 1, 1000), "master", "worker"),
			apart(shared("worker", 2, 1, 1000), "master", "worker")),
		wantNodes: []string{"a", "b", "c"},
	}, {
		name:  "twin pod sets kept apart alike, too many",
		nodes: four[:2],
		gang: gang(apart(shared("master", 1, 1, 1000), "master", "worker"),
			apart(shared("worker", 2, 1, 1000), "master", "worker")),
		wantWhy: "at most 1 pod per node",
		never:   true,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := modelWith(t, tc.nodes)
			res := m.Fit(tc.gang, Options{})
			if tc.wantNodes != nil {
				if !res.Fits {
					t.Fatalf("does not fit: %v", res.Reasons)
				}
				if d := cmp.Diff(tc.wantNodes, nodesOf(res)); d != "" {
					t.Errorf("nodes (-want +got):\n%s", d)
				}
				if err := checkPlan(tc.nodes, nil, tc.gang, "", res); err != nil {
					t.Error(err)
				}
				return
			}
			if res.Fits {
				t.Fatalf("fits on %v, want not", nodesOf(res))
			}
			if len(res.Reasons) == 0 || !strings.Contains(res.Reasons[0], tc.wantWhy) {
				t.Errorf("reasons %q, want one containing %q", res.Reasons, tc.wantWhy)
			}
			if never, why := Never(tc.nodes, tc.gang, Options{}); never != tc.never {
				t.Errorf("Never = %v (%s), want %v", never, why, tc.never)
			}
		})
	}
}

func TestApartMustNameAPodSetOfTheGang(t *testing.T) {
	res := modelWith(t, []Node{mkNode("a", 1, gi80)}).Fit(gang(apart(whole("w", 1, 1), "nope")), Options{})
	if res.Fits || len(res.Reasons) != 1 || !strings.Contains(res.Reasons[0], `invalid request: pod set "w": kept apart from pod set "nope"`) {
		t.Errorf("got %v %q", res.Fits, res.Reasons)
	}
}
