package fit

import (
	"math"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Never reports whether the gang can never fit: not even on an empty
// cluster where every node is Ready and schedulable and every GPU healthy
// (those conditions pass). Taints set by the node lifecycle controller
// (node.kubernetes.io/*) are transient too and are ignored; other taints,
// labels, GPU sizes and counts are taken as they are. Only a proof counts:
// the search here is unbounded in domains and steps, and an invalid request
// can never fit. The string says why, for the Rejected message. Its cost is
// bounded like Fit's: search.maxSteps per domain, and it stops at the first
// domain whose search runs out of steps.
func Never(nodes []Node, g Gang, o Options) (bool, string) {
	if err := validate(g); err != nil {
		return true, "invalid request: " + err.Error()
	}
	// Pods already running are not part of an empty cluster: the nodes they
	// keep a pod set off (pod anti-affinity) are no proof either.
	g.PodSets = slices.Clone(g.PodSets)
	for i := range g.PodSets {
		g.PodSets[i].AvoidNodes = nil
	}
	empty := make([]Node, len(nodes))
	for i, n := range nodes {
		n.Ready, n.Unschedulable = true, false
		n.GPUs = append([]GPU(nil), n.GPUs...)
		for j := range n.GPUs {
			n.GPUs[j].Healthy = true
		}
		var taints []corev1.Taint
		for _, t := range n.Taints {
			if !strings.HasPrefix(t.Key, "node.kubernetes.io/") {
				taints = append(taints, t)
			}
		}
		n.Taints = taints
		// Other resources (cpu, memory, …) are not a proof: allocatable
		// changes with kubelet settings and what runs there; a gang they
		// keep out waits (Retry), it is never Rejected for them.
		n.Resources = nil
		empty[i] = n
	}
	// Every domain may be searched, but the first one whose search runs
	// out of steps ends it: that domain is unproven, so the answer is no.
	o.MaxDomains = math.MaxInt
	o.proofOnly = true
	res := newModel(empty, false).Fit(g, o)
	if res.Fits || res.Exhausted {
		return false, ""
	}
	why := "it does not fit even on an empty cluster"
	if len(res.Reasons) > 0 {
		why += ": " + res.Reasons[0]
	}
	return true, why
}
