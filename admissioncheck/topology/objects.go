package topology

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanotopology "volcano.sh/apis/pkg/apis/topology/v1alpha1"
)

const (
	// LabelManagedBy marks the objects this package writes; only those are
	// ever updated or deleted.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is LabelManagedBy's value on them.
	ManagedByValue = "gpupack-topology"
	// AnnotationLevel and AnnotationDomain say which label and value a
	// HyperNode stands for (names are hashed, so people need these).
	AnnotationLevel  = "gpupack.io/topology-level"
	AnnotationDomain = "gpupack.io/topology-domain"

	// DefaultTopologyName names the generated Kueue Topology.
	DefaultTopologyName = "gpupack"

	maxNameLen = 63 // a DNS label: valid as a name and in exactMatch
)

// HyperNodeName is the stable, DNS-safe name of the HyperNode of one
// domain: "t<tier>-<value, sanitised>-<hash of level=value>". The hash keeps
// names unique when sanitising or truncating makes two values alike, and
// across levels that reuse a value.
func HyperNodeName(tier int, level, value string) string {
	h := fnv.New32a()
	h.Write([]byte(level + "=" + value))
	sum := fmt.Sprintf("%08x", h.Sum32())
	prefix := fmt.Sprintf("t%d-", tier)
	base := sanitize(value)
	if room := maxNameLen - len(prefix) - len(sum) - 1; len(base) > room {
		base = strings.Trim(base[:room], "-")
	}
	if base == "" {
		return prefix + sum
	}
	return prefix + base + "-" + sum
}

// sanitize lowercases and maps anything outside [a-z0-9-] to '-'.
func sanitize(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-")
}

// HyperNodes is the HyperNode tree of a hierarchy, narrowest tier first
// (the order to create them in): tier-1 HyperNodes list their nodes by exact
// name, higher tiers list the HyperNodes of their children.
func HyperNodes(h Hierarchy) []volcanotopology.HyperNode {
	n := len(h.Levels)
	var out []volcanotopology.HyperNode
	for i := n - 1; i >= 0; i-- {
		tier := n - i
		level := h.Levels[i]
		for _, d := range h.Domains[i] {
			hn := volcanotopology.HyperNode{
				TypeMeta: metav1.TypeMeta{APIVersion: volcanotopology.SchemeGroupVersion.String(), Kind: "HyperNode"},
				ObjectMeta: metav1.ObjectMeta{
					Name:        HyperNodeName(tier, level, d.Value),
					Labels:      map[string]string{LabelManagedBy: ManagedByValue},
					Annotations: map[string]string{AnnotationLevel: level, AnnotationDomain: d.Value},
				},
				Spec: volcanotopology.HyperNodeSpec{Tier: tier, TierName: tierName(level)},
			}
			if i == n-1 {
				for _, node := range d.Nodes {
					hn.Spec.Members = append(hn.Spec.Members, member(volcanotopology.MemberTypeNode, node))
				}
			} else {
				for _, c := range d.Children {
					hn.Spec.Members = append(hn.Spec.Members, member(volcanotopology.MemberTypeHyperNode, HyperNodeName(tier-1, h.Levels[i+1], c)))
				}
			}
			out = append(out, hn)
		}
	}
	return out
}

// tierName is the level's label key when Volcano's 253-character limit
// allows (a label key may have 316).
func tierName(level string) string {
	if len(level) > 253 {
		return ""
	}
	return level
}

func member(t volcanotopology.MemberType, name string) volcanotopology.MemberSpec {
	return volcanotopology.MemberSpec{Type: t, Selector: volcanotopology.MemberSelector{ExactMatch: &volcanotopology.ExactMatch{Name: name}}}
}

// KueueTopology is the Kueue Topology of levels, in the same order (broad to
// narrow). Kueue allows kubernetes.io/hostname only as the last level.
func KueueTopology(name string, levels []string) (*kueue.Topology, error) {
	if len(levels) == 0 {
		return nil, fmt.Errorf("no topology levels")
	}
	t := &kueue.Topology{
		TypeMeta:   metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "Topology"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManagedBy: ManagedByValue}},
	}
	for i, l := range levels {
		if l == corev1.LabelHostname && i != len(levels)-1 {
			return nil, fmt.Errorf("%s can only be the last topology level, not level %d of %v", corev1.LabelHostname, i+1, levels)
		}
		t.Spec.Levels = append(t.Spec.Levels, kueue.TopologyLevel{NodeLabel: l})
	}
	return t, nil
}

// Changes are the writes that bring existing HyperNodes to the desired ones.
type Changes struct {
	Create []volcanotopology.HyperNode
	// Update holds existing objects with the desired spec, labels and
	// annotations applied (resourceVersion kept).
	Update []volcanotopology.HyperNode
	// Delete holds managed HyperNodes nobody wants any more, broadest tier
	// first, so a parent never names a deleted child for long.
	Delete []volcanotopology.HyperNode
}

// Empty reports whether nothing needs writing.
func (c Changes) Empty() bool { return len(c.Create)+len(c.Update)+len(c.Delete) == 0 }

// Diff compares desired HyperNodes with the existing managed ones. An
// existing HyperNode without LabelManagedBy is never touched: if it has a
// wanted name, the wanted one is left out (and reported in conflicts).
func Diff(desired, existing []volcanotopology.HyperNode) (c Changes, conflicts []string) {
	have := map[string]*volcanotopology.HyperNode{}
	for i := range existing {
		have[existing[i].Name] = &existing[i]
	}
	want := map[string]bool{}
	for _, d := range desired {
		want[d.Name] = true
		cur, ok := have[d.Name]
		switch {
		case !ok:
			c.Create = append(c.Create, d)
		case cur.Labels[LabelManagedBy] != ManagedByValue:
			conflicts = append(conflicts, fmt.Sprintf("HyperNode %s exists and is not managed by gpupack", d.Name))
		case !sameHyperNode(cur, &d):
			u := *cur.DeepCopy()
			u.Spec = d.Spec
			u.Labels = merge(u.Labels, d.Labels)
			u.Annotations = merge(u.Annotations, d.Annotations)
			c.Update = append(c.Update, u)
		}
	}
	for i := range existing {
		e := existing[i]
		if !want[e.Name] && e.Labels[LabelManagedBy] == ManagedByValue {
			c.Delete = append(c.Delete, e)
		}
	}
	// Broadest first, then by name.
	sort.Slice(c.Delete, func(i, j int) bool {
		if c.Delete[i].Spec.Tier != c.Delete[j].Spec.Tier {
			return c.Delete[i].Spec.Tier > c.Delete[j].Spec.Tier
		}
		return c.Delete[i].Name < c.Delete[j].Name
	})
	return c, conflicts
}

func sameHyperNode(cur, want *volcanotopology.HyperNode) bool {
	if !sameSpec(&cur.Spec, &want.Spec) {
		return false
	}
	for k, v := range want.Labels {
		if cur.Labels[k] != v {
			return false
		}
	}
	for k, v := range want.Annotations {
		if cur.Annotations[k] != v {
			return false
		}
	}
	return true
}

// sameSpec compares HyperNode specs field by field: a reconcile compares
// every HyperNode of the cluster, and reflection made that half its cost.
func sameSpec(a, b *volcanotopology.HyperNodeSpec) bool {
	if a.Tier != b.Tier || a.TierName != b.TierName || len(a.Members) != len(b.Members) {
		return false
	}
	for i := range a.Members {
		x, y := &a.Members[i], &b.Members[i]
		if x.Type != y.Type {
			return false
		}
		xs, ys := &x.Selector, &y.Selector
		if (xs.ExactMatch == nil) != (ys.ExactMatch == nil) || xs.ExactMatch != nil && xs.ExactMatch.Name != ys.ExactMatch.Name {
			return false
		}
		if (xs.RegexMatch == nil) != (ys.RegexMatch == nil) || xs.RegexMatch != nil && xs.RegexMatch.Pattern != ys.RegexMatch.Pattern {
			return false
		}
		if (xs.LabelMatch != nil || ys.LabelMatch != nil) && !equality.Semantic.DeepEqual(xs.LabelMatch, ys.LabelMatch) {
			return false
		}
	}
	return true
}

func merge(dst, src map[string]string) map[string]string {
	if dst == nil {
		dst = map[string]string{}
	}
	for k, v := range src {
		dst[k] = v
	}
	return dst
}

// SameTopology reports whether an existing Kueue Topology has the wanted
// levels. Levels are immutable in Kueue: a different one must be replaced.
func SameTopology(cur, want *kueue.Topology) bool {
	return equality.Semantic.DeepEqual(cur.Spec.Levels, want.Spec.Levels)
}
