package fit

import (
	"fmt"
	corev1 "k8s.io/api/core/v1"
	"strings"
)

// maxReasonDomains bounds the per-domain lines in Result.Reasons; every
// domain is still in Result.Domains.
const maxReasonDomains = 5

// constraint names, in plain words, why reqs[j] alone does not fit in this
// domain: the first of the limits below that it runs into.
func (s *scratch) constraint(j int) string {
	if why := s.resConstraint(j); why != "" {
		return why
	}
	r := s.reqs[j]
	var eligNodes, hostNodes int
	var whole, memOK, coresOK, hostable, slots, maxSlots int64
	for i := range s.nodes {
		n := &s.nodes[i]
		if n.elig&(1<<r.bitIdx) == 0 {
			continue
		}
		eligNodes++
		h := 0
		for gi := n.lo; gi < n.hi; gi++ {
			g := s.gpu(gi)
			if !g.healthy {
				continue
			}
			if g.whole() {
				whole++
			}
			if !r.excl && g.excl == 0 {
				if g.free() >= r.need(g.alloc) {
					memOK++
				}
				if g.freeCores() >= r.cores {
					coresOK++
				}
			}
			if x := r.slots(g); x > 0 {
				hostable++
				h++
				slots += x
				maxSlots = max(maxSlots, x)
			}
		}
		if h >= r.g {
			hostNodes++
		}
	}
	who := "pod set " + r.label
	wantGPUs := int64(r.count) * int64(r.g)
	if eligNodes == 0 {
		var why []string
		if s.unusable > 0 {
			why = append(why, plural(s.unusable, "node is", "nodes are")+" NotReady or unschedulable")
		}
		if s.selMiss[j] > 0 {
			why = append(why, fmt.Sprintf("%s not match its nodeSelector %v", plural(s.selMiss[j], "node does", "nodes do"), r.sel))
		}
		if s.affMiss[j] > 0 {
			w := fmt.Sprintf("%s not match its required node affinity %v", plural(s.affMiss[j], "node does", "nodes do"), r.aff)
			if r.aff.bad != nil {
				w += fmt.Sprintf(" (terms that cannot be parsed match no node: %v)", r.aff.bad)
			}
			why = append(why, w)
		}
		if s.tainted[j] > 0 {
			why = append(why, plural(s.tainted[j], "node has", "nodes have")+" taints it does not tolerate")
		}
		if s.avoided[j] > 0 {
			why = append(why, plural(s.avoided[j], "node runs", "nodes run")+" pods that its required pod anti-affinity keeps it away from (or whose anti-affinity keeps it away)")
		}
		if len(why) == 0 {
			why = append(why, "the domain has no GPU nodes")
		}
		return fmt.Sprintf("no node can take %s: %s", who, strings.Join(why, "; "))
	}
	// Which limit binds: if the GPUs that could serve the pod set would hold
	// more pods than fit, it is having g of them on one node; otherwise it
	// is how many GPUs (or shares of them) there are.
	units := slots // whole GPUs for an exclusive pod set (slots are 0/1)
	podsFit := s.capacity(j, int64(r.count))
	if r.self() && podsFit < int64(r.count) {
		s.ignoreApart = true
		free := s.capacity(j, int64(r.count))
		s.ignoreApart = false
		if free > podsFit {
			avoided := ""
			if s.avoided[j] > 0 {
				avoided = fmt.Sprintf("; %s pods it must keep away from", plural(s.avoided[j], "more node runs", "more nodes run"))
			}
			return fmt.Sprintf("%s: at most 1 pod per node (required pod anti-affinity, topologyKey %s), and only %s room for one (%d pods wanted%s)",
				who, corev1.LabelHostname, plural64(podsFit, "node has", "nodes have"), r.count, avoided)
		}
	}
	if podsFit < units/int64(r.g) {
		if r.excl {
			return fmt.Sprintf("only %s %d whole GPUs free (each pod needs %d GPUs on one node; %d whole GPUs are free in all)", plural(hostNodes, "node has", "nodes have"), r.g, r.g, whole)
		}
		return fmt.Sprintf("only %s %d GPUs with %s free (each pod needs %d GPUs on one node; %d such GPUs in all)", plural(hostNodes, "node has", "nodes have"), r.g, r.describeMem(), r.g, hostable)
	}
	if r.excl {
		return fmt.Sprintf("only %s free (need %d for %s)", plural64(whole, "whole GPU is", "whole GPUs are"), wantGPUs, who)
	}
	if r.cores > 0 && coresOK < memOK {
		return fmt.Sprintf("only %s %d%% SM free (need %d%% per GPU on %s for %s)", plural64(coresOK, "GPU has", "GPUs have"), r.cores, r.cores, plural64(wantGPUs, "GPU", "GPUs"), who)
	}
	if maxSlots <= 1 {
		return fmt.Sprintf("only %s %s free (need %s per GPU on %s)", plural64(memOK, "GPU has", "GPUs have"), r.describeMem(), r.describeMem(), plural64(wantGPUs, "GPU", "GPUs"))
	}
	return fmt.Sprintf("room for only %d GPU shares of %s (need %d: %d pods × %d GPUs)", slots, r.describeMem(), wantGPUs, r.count, r.g)
}

func plural(n int, one, many string) string { return plural64(int64(n), one, many) }

func plural64(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// reasons renders the per-domain reports and what was excluded cluster-wide.
func (m *Model) reasons(reps []DomainReport, li *levelIndex, reqs []*req, o Options) []string {
	var out []string
	if len(reps) == 0 {
		if o.Level == "" {
			out = append(out, "the cluster has no nodes")
		} else {
			out = append(out, fmt.Sprintf("no node has the topology label %s", o.Level))
		}
	}
	for i, r := range reps {
		if i == maxReasonDomains {
			out = append(out, fmt.Sprintf("… and %d more domains where at most %d pods fit", len(reps)-i, r.PodsFit))
			break
		}
		line := fmt.Sprintf("%s: %d of %d pods fit", domainLabel(o.Level, r.Domain), r.PodsFit, r.PodsWanted)
		if r.Constraint != "" {
			line += "; binding constraint: " + r.Constraint
		}
		out = append(out, line)
	}
	if li.missing > 0 {
		out = append(out, fmt.Sprintf("%s no %s label and %s in no domain", plural(li.missing, "node has", "nodes have"), o.Level, map[bool]string{true: "is", false: "are"}[li.missing == 1]))
	}
	var notReady, unsched, unhealthy int
	for i := range m.nodes {
		n := m.nodes[i].n
		switch {
		case !n.Ready:
			notReady++
		case n.Unschedulable:
			unsched++
		}
	}
	for i := range m.gpus {
		if !m.gpus[i].healthy {
			unhealthy++
		}
	}
	var ex []string
	if notReady > 0 {
		ex = append(ex, plural(notReady, "node", "nodes")+" NotReady")
	}
	if unsched > 0 {
		ex = append(ex, plural(unsched, "node", "nodes")+" unschedulable")
	}
	if unhealthy > 0 {
		ex = append(ex, plural(unhealthy, "unhealthy GPU", "unhealthy GPUs"))
	}
	if len(ex) > 0 {
		out = append(out, "excluded: "+strings.Join(ex, ", "))
	}
	return out
}
