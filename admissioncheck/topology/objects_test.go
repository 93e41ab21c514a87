package topology

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	volcanotopology "volcano.sh/apis/pkg/apis/topology/v1alpha1"
)

func TestKueueTopology(t *testing.T) {
	for _, tc := range []struct {
		name    string
		levels  []string
		want    []string
		wantErr string
	}{
		{name: "same order", levels: levels3, want: levels3},
		{name: "hostname last", levels: []string{leaf, corev1.LabelHostname}, want: []string{leaf, corev1.LabelHostname}},
		{name: "hostname in the middle", levels: []string{corev1.LabelHostname, leaf}, wantErr: "can only be the last"},
		{name: "none", wantErr: "no topology levels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := KueueTopology("gpupack", tc.levels)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var levels []string
			for _, l := range got.Spec.Levels {
				levels = append(levels, l.NodeLabel)
			}
			if diff := cmp.Diff(tc.want, levels); diff != "" {
				t.Fatalf("levels (-want +got):\n%s", diff)
			}
			if got.Name != "gpupack" || got.Labels[LabelManagedBy] != ManagedByValue {
				t.Fatalf("metadata %+v", got.ObjectMeta)
			}
		})
	}
	a, _ := KueueTopology("x", levels3)
	b, _ := KueueTopology("x", levels3[1:])
	if !SameTopology(a, a.DeepCopy()) || SameTopology(a, b) {
		t.Fatal("SameTopology does not compare levels")
	}
}

func TestDiff(t *testing.T) {
	h := Discover(levels3, []Node{node3("n1", "s1", "l1", "d1"), node3("n2", "s1", "l1", "d2")})
	desired := HyperNodes(h)
	stored := func(hns []volcanotopology.HyperNode) []volcanotopology.HyperNode {
		out := make([]volcanotopology.HyperNode, len(hns))
		for i := range hns {
			out[i] = *hns[i].DeepCopy()
			out[i].ResourceVersion = "7"
			out[i].UID = types.UID("uid-" + hns[i].Name)
		}
		return out
	}
	names := func(hns []volcanotopology.HyperNode) []string {
		var out []string
		for _, h := range hns {
			out = append(out, h.Name)
		}
		return out
	}
	d1 := HyperNodeName(1, nvl, "d1")
	d2 := HyperNodeName(1, nvl, "d2")
	l1 := HyperNodeName(2, leaf, "l1")
	s1 := HyperNodeName(3, spine, "s1")

	for _, tc := range []struct {
		name           string
		existing       []volcanotopology.HyperNode
		desired        []volcanotopology.HyperNode
		create         []string
		update         []string
		del            []string
		conflicts      int
		updatedMembers map[string]string // updated object → a member it must now have
	}{
		{name: "nothing exists", desired: desired, create: []string{d1, d2, l1, s1}},
		{name: "in sync writes nothing", existing: stored(desired), desired: desired},
		{
			name:     "a node moved: its domain and the old one change",
			existing: stored(desired),
			desired: HyperNodes(Discover(levels3, []Node{
				node3("n1", "s1", "l1", "d1"), node3("n2", "s1", "l1", "d1"),
			})),
			update: []string{d1, l1}, del: []string{d2}, updatedMembers: map[string]string{d1: "n2"},
		},
		{
			name:     "everything gone: broadest deleted first",
			existing: stored(desired),
			del:      []string{s1, l1, d1, d2},
		},
		{
			name: "foreign HyperNodes are never touched",
			existing: append(stored(desired), volcanotopology.HyperNode{
				ObjectMeta: metav1.ObjectMeta{Name: "hand-made"},
				Spec:       volcanotopology.HyperNodeSpec{Tier: 1},
			}),
			desired: desired,
		},
		{
			name: "a foreign HyperNode with a wanted name is a conflict",
			existing: []volcanotopology.HyperNode{{
				ObjectMeta: metav1.ObjectMeta{Name: d1},
				Spec:       volcanotopology.HyperNodeSpec{Tier: 1},
			}},
			desired: desired,
			create:  []string{d2, l1, s1}, conflicts: 1,
		},
		{
			name: "lost label is restored, other labels kept",
			existing: func() []volcanotopology.HyperNode {
				s := stored(desired)
				s[0].Annotations[AnnotationDomain] = "edited"
				s[0].Labels["team"] = "net"
				return s
			}(),
			desired: desired,
			update:  []string{d1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, conflicts := Diff(tc.desired, tc.existing)
			if diff := cmp.Diff(tc.create, names(c.Create)); diff != "" {
				t.Errorf("create (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.update, names(c.Update)); diff != "" {
				t.Errorf("update (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.del, names(c.Delete)); diff != "" {
				t.Errorf("delete (-want +got):\n%s", diff)
			}
			if len(conflicts) != tc.conflicts {
				t.Errorf("conflicts %v, want %d", conflicts, tc.conflicts)
			}
			if c.Empty() != (len(tc.create)+len(tc.update)+len(tc.del) == 0) {
				t.Errorf("Empty() = %v", c.Empty())
			}
			for _, u := range c.Update {
				if u.ResourceVersion != "7" {
					t.Errorf("update of %s lost its resourceVersion", u.Name)
				}
				if u.Labels[LabelManagedBy] != ManagedByValue || u.Annotations[AnnotationDomain] == "edited" {
					t.Errorf("update of %s does not restore metadata: %v %v", u.Name, u.Labels, u.Annotations)
				}
				if tc.name == "lost label is restored, other labels kept" && u.Labels["team"] != "net" {
					t.Errorf("update dropped a foreign label")
				}
				if want, ok := tc.updatedMembers[u.Name]; ok {
					found := false
					for _, m := range u.Spec.Members {
						found = found || m.Selector.ExactMatch.Name == want
					}
					if !found {
						t.Errorf("updated %s lacks member %s: %+v", u.Name, want, u.Spec.Members)
					}
				}
			}
		})
	}
}

// sameSpec agrees with a reflective comparison on every field that can differ.
func TestSameSpec(t *testing.T) {
	base := HyperNodes(Discover(levels3, []Node{node3("n1", "s1", "l1", "d1"), node3("n2", "s1", "l1", "d1")}))[0].Spec
	muts := map[string]func(*volcanotopology.HyperNodeSpec){
		"same":     func(*volcanotopology.HyperNodeSpec) {},
		"tier":     func(s *volcanotopology.HyperNodeSpec) { s.Tier = 2 },
		"tierName": func(s *volcanotopology.HyperNodeSpec) { s.TierName = "x" },
		"fewer":    func(s *volcanotopology.HyperNodeSpec) { s.Members = s.Members[:1] },
		"type":     func(s *volcanotopology.HyperNodeSpec) { s.Members[0].Type = volcanotopology.MemberTypeHyperNode },
		"name":     func(s *volcanotopology.HyperNodeSpec) { s.Members[1].Selector.ExactMatch.Name = "n3" },
		"regex": func(s *volcanotopology.HyperNodeSpec) {
			s.Members[0].Selector.RegexMatch = &volcanotopology.RegexMatch{Pattern: "n.*"}
		},
		"exact→regex": func(s *volcanotopology.HyperNodeSpec) {
			s.Members[0].Selector = volcanotopology.MemberSelector{RegexMatch: &volcanotopology.RegexMatch{Pattern: "n1"}}
		},
		"labels": func(s *volcanotopology.HyperNodeSpec) {
			s.Members[0].Selector = volcanotopology.MemberSelector{LabelMatch: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}}
		},
	}
	for name, mut := range muts {
		other := *base.DeepCopy()
		mut(&other)
		if got, want := sameSpec(&base, &other), cmp.Equal(base, other); got != want {
			t.Errorf("%s: sameSpec = %v, cmp.Equal = %v", name, got, want)
		}
	}
}
