package topology

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// Node is what discovery needs of a node.
type Node struct {
	Name   string
	Labels map[string]string
}

// Domain is one value of one level: a leaf switch, an NVLink domain…
type Domain struct {
	// Value of the level's label shared by the domain's nodes.
	Value string
	// Parent is the value of the next broader level ("" at the top).
	Parent string
	// Children are the values of the next narrower level, sorted; empty at
	// the narrowest level.
	Children []string
	// Nodes are the node names at the narrowest level, sorted; empty above.
	Nodes []string
}

// Skipped is a node left out of the tree, and why.
type Skipped struct {
	Node   string
	Reason string
}

// Hierarchy is the discovered tree.
type Hierarchy struct {
	// Levels are the label keys, broad to narrow, without kubernetes.io/hostname
	// (a node is not a domain of its own in Volcano's tree).
	Levels []string
	// Domains[i] are the domains of Levels[i], sorted by value.
	Domains [][]Domain
	// Skipped nodes lack a label of some level: Volcano's tree only holds
	// nodes that sit at every level.
	Skipped []Skipped
	// Conflicts describe domains whose nodes disagree about their parent
	// (labels that do not form a tree); each such domain is put under the
	// parent most of its nodes name (ties: the smallest value).
	Conflicts []string
}

// HyperLevels drops kubernetes.io/hostname from levels: that level is the
// node itself, below Volcano's tier 1.
func HyperLevels(levels []string) []string {
	out := make([]string, 0, len(levels))
	for _, l := range levels {
		if l != corev1.LabelHostname {
			out = append(out, l)
		}
	}
	return out
}

// TierOf is the Volcano tier of a level: 1 for the narrowest level above
// the nodes, counting up to the broadest. ok is false when the level names
// no HyperNode tier (empty, kubernetes.io/hostname — a single node needs no
// network constraint — or not one of levels).
func TierOf(levels []string, level string) (tier int, ok bool) {
	hl := HyperLevels(levels)
	for i, l := range hl {
		if l == level && level != "" {
			return len(hl) - i, true
		}
	}
	return 0, false
}

// Discover builds the tree of domains from node labels. It is deterministic:
// the same nodes in any order give the same Hierarchy.
func Discover(levels []string, nodes []Node) Hierarchy {
	h := Hierarchy{Levels: HyperLevels(levels)}
	n := len(h.Levels)
	if n == 0 {
		return h
	}
	sorted := append([]Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })

	// parentVotes[i][value][parent] counts nodes of level i's domain value
	// that name parent at level i-1.
	parentVotes := make([]map[string]map[string]int, n)
	leafNodes := map[string][]string{}
	for i := range parentVotes {
		parentVotes[i] = map[string]map[string]int{}
	}
	for _, nd := range sorted {
		vals := make([]string, n)
		missing := ""
		for i, l := range h.Levels {
			v := nd.Labels[l]
			if v == "" {
				missing = l
				break
			}
			vals[i] = v
		}
		if missing != "" {
			h.Skipped = append(h.Skipped, Skipped{Node: nd.Name, Reason: fmt.Sprintf("no %s label", missing)})
			continue
		}
		for i, v := range vals {
			parent := ""
			if i > 0 {
				parent = vals[i-1]
			}
			if parentVotes[i][v] == nil {
				parentVotes[i][v] = map[string]int{}
			}
			parentVotes[i][v][parent]++
		}
		leafNodes[vals[n-1]] = append(leafNodes[vals[n-1]], nd.Name)
	}

	h.Domains = make([][]Domain, n)
	for i := range h.Levels {
		values := make([]string, 0, len(parentVotes[i]))
		for v := range parentVotes[i] {
			values = append(values, v)
		}
		sort.Strings(values)
		for _, v := range values {
			parent, conflict := elect(parentVotes[i][v])
			if conflict {
				h.Conflicts = append(h.Conflicts, fmt.Sprintf("%s=%s has nodes under %s %s; placed under %s",
					h.Levels[i], v, h.Levels[i-1], joinKeys(parentVotes[i][v]), parent))
			}
			d := Domain{Value: v, Parent: parent}
			if i == n-1 {
				d.Nodes = leafNodes[v]
			}
			h.Domains[i] = append(h.Domains[i], d)
		}
	}
	// Children follow the elected parents, so each domain appears once; a
	// broader domain left without children (all of them elected another
	// parent) is dropped: a HyperNode needs members.
	for i := n - 1; i > 0; i-- {
		idx := map[string]int{}
		for j, d := range h.Domains[i-1] {
			idx[d.Value] = j
		}
		for _, d := range h.Domains[i] {
			p := &h.Domains[i-1][idx[d.Parent]]
			p.Children = append(p.Children, d.Value)
		}
		kept := h.Domains[i-1][:0]
		for _, d := range h.Domains[i-1] {
			if len(d.Children) > 0 {
				kept = append(kept, d)
			}
		}
		h.Domains[i-1] = kept
	}
	return h
}

// elect picks the parent most nodes name (ties: smallest value).
func elect(votes map[string]int) (parent string, conflict bool) {
	best, bestN := "", -1
	for p, c := range votes {
		if c > bestN || c == bestN && p < best {
			best, bestN = p, c
		}
	}
	return best, len(votes) > 1
}

func joinKeys(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return fmt.Sprint(keys)
}
