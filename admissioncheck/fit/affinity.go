package fit

import (
	"fmt"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// affinity is a pod set's required node affinity, compiled once per
// decision by the scheduler's own code (component-helpers nodeaffinity): terms
// are ORed, the requirements of a term ANDed, matchFields see metadata.name,
// and a term that cannot be parsed matches no node, exactly as when the pods
// are bound. A model's node names and labels never change, so each node's
// answer is kept for the rest of the decision.
type affinity struct {
	src   *corev1.NodeSelector
	match func(*corev1.Node) bool
	// bad holds the parse errors of the terms that match nothing (validate
	// refuses an affinity with no usable term at all).
	bad error
	// names: some term has matchFields, so the probe needs the node's name.
	// Without a name the helper puts nothing in the fields map it makes per
	// node, which halves the cost of a match.
	names bool
	memo  []int8      // per model node: 0 not asked yet, 1 matches, -1 does not
	probe corev1.Node // the node as the helper takes it: name and labels only
}

func newAffinity(ns *corev1.NodeSelector) *affinity {
	if ns == nil {
		return nil
	}
	a := &affinity{src: ns}
	for _, t := range ns.NodeSelectorTerms {
		a.names = a.names || len(t.MatchFields) > 0
	}
	sel, err := nodeaffinity.NewNodeSelector(ns)
	if err == nil {
		a.match = sel.Match
		return a
	}
	// The scheduler's reading (GetRequiredNodeAffinity): bad terms are
	// skipped, the others still select nodes.
	lazy := nodeaffinity.NewLazyErrorNodeSelector(ns)
	a.match = func(n *corev1.Node) bool { ok, _ := lazy.Match(n); return ok }
	a.bad = err
	return a
}

func (a *affinity) source() *corev1.NodeSelector {
	if a == nil {
		return nil
	}
	return a.src
}

// matches reports whether node ni of m satisfies the affinity.
func (a *affinity) matches(m *Model, ni int32) bool {
	if a.memo == nil {
		a.memo = make([]int8, len(m.nodes))
	}
	switch a.memo[ni] {
	case 1:
		return true
	case -1:
		return false
	}
	n := m.nodes[ni].n
	a.probe.Labels = n.Labels
	if a.names {
		a.probe.Name = n.Name
	}
	ok := a.match(&a.probe)
	a.memo[ni] = -1
	if ok {
		a.memo[ni] = 1
	}
	return ok
}

// affinityErr refuses an affinity none of whose terms can be parsed: it can
// never match a node (the scheduler would keep the pods Pending for ever),
// so the request is invalid. An affinity with at least one good term is
// evaluated on its good terms, as the scheduler does.
func affinityErr(ns *corev1.NodeSelector) error {
	if ns == nil {
		return nil
	}
	_, err := nodeaffinity.NewNodeSelector(ns)
	if err == nil {
		return nil
	}
	for _, t := range ns.NodeSelectorTerms {
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			continue // matches nothing, but is no parse error either
		}
		one := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{t}}
		if _, e := nodeaffinity.NewNodeSelector(one); e == nil {
			return nil
		}
	}
	return err
}

// maxAffinityText bounds the affinity as written in a reason (a NotIn list
// of host names can be long).
const maxAffinityText = 200

// String writes the affinity for reasons: terms in parentheses, ORed.
func (a *affinity) String() string {
	var b strings.Builder
	for i, t := range a.src.NodeSelectorTerms {
		if i > 0 {
			b.WriteString(" or ")
		}
		b.WriteByte('(')
		n := 0
		for _, reqs := range [][]corev1.NodeSelectorRequirement{t.MatchExpressions, t.MatchFields} {
			for _, r := range reqs {
				if n > 0 {
					b.WriteString(", ")
				}
				n++
				fmt.Fprintf(&b, "%s %s", r.Key, r.Operator)
				if len(r.Values) > 0 {
					fmt.Fprintf(&b, " %v", r.Values)
				}
			}
		}
		b.WriteByte(')')
	}
	s := b.String()
	if len(a.src.NodeSelectorTerms) == 0 {
		s = "(no terms)"
	}
	if len(s) > maxAffinityText {
		cut := maxAffinityText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
