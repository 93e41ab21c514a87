// Package fit is gpupack's gang-fit engine: given a cluster model (nodes →
// GPUs with their allocatable memory and current usage) and a gang (pod sets
// of identical pods, each wanting some GPUs), it answers whether *every* pod
// fits *at once*, GPU by GPU, inside one topology domain — and if so, where.
//
// The package is pure: no API client, no clock, no globals. The controller
// and the offline CLI translate API objects into these types (package
// inventory) and results back. See docs/gang-fit.md for the rules, the
// domain-choice policy and the exactness guarantee.
package fit

import (
	corev1 "k8s.io/api/core/v1"
)

// GPU is one physical GPU of a node.
type GPU struct {
	UUID  string
	Model string
	Index int
	// PhysicalMiB is the memory NVML reports.
	PhysicalMiB int64
	// AllocatableMiB is what may be handed to pods (flavors.Buffer.Allocatable).
	AllocatableMiB int64
	Healthy        bool
	// MaxShare is how many pods may hold the GPU at once (HAMi's split
	// count, sharing slots); 0: no limit beyond memory and cores.
	MaxShare int32
}

// Node is one node as the engine sees it.
type Node struct {
	Name          string
	Labels        map[string]string
	Taints        []corev1.Taint
	Ready         bool
	Unschedulable bool
	GPUs          []GPU
	// Resources is the node's allocatable of everything but GPUs — cpu,
	// memory, pods, ephemeral-storage, extended resources such as rdma/* —
	// in milli-units (Quantity.MilliValue). nil: not known, and then not
	// planned against; a resource a pod asks for and the node does not
	// list is 0 there.
	Resources map[corev1.ResourceName]int64
}

// Usage is one holder's use of one GPU: a running or pinned pod, or a slot of
// another workload's plan. Exclusive usage is recorded with the GPU's whole
// allocatable MiB and 100 % cores.
type Usage struct {
	UUID      string
	MemoryMiB int64
	Cores     int32
	Exclusive bool
}

// PodSet is a group of identical pods.
type PodSet struct {
	Name       string
	Count      int
	GPUsPerPod int
	// MemoryMiB per GPU; 0 (with MemoryPercent 0) means an exclusive whole GPU.
	MemoryMiB int64
	// MemoryPercent is HAMi's gpumem-percentage, read as a share of each
	// GPU's allocatable memory (as the webhook reads it), an alternative to
	// MemoryMiB.
	MemoryPercent int32
	// Cores is the SM percent per GPU; 0 means 100 when exclusive, else none.
	Cores        int32
	NodeSelector map[string]string
	// NodeAffinity is the template's required node affinity
	// (requiredDuringSchedulingIgnoredDuringExecution), read as the
	// scheduler reads it; nil when there is none.
	NodeAffinity *corev1.NodeSelector
	Tolerations  []corev1.Toleration
	// Requests per pod of everything but GPUs (cpu, memory,
	// ephemeral-storage, extended resources), milli-units; each pod also
	// takes one of the node's pods.
	Requests map[corev1.ResourceName]int64
	// Apart names the pod sets of the gang (this one included, when its own
	// pods repel each other) whose pods may not run on a node where a pod
	// of this pod set runs: required pod anti-affinity with topologyKey
	// kubernetes.io/hostname, in either direction (the scheduler checks the
	// incoming pod's terms and the running pods' terms alike). The relation
	// is read as symmetric. Package inventory derives it from the
	// templates.
	Apart []string
	// AvoidNodes are nodes the pod set's pods may not be placed on because
	// of pods already there: a running pod its anti-affinity excludes, or
	// one whose anti-affinity excludes it. They depend on the cluster's
	// state, so Never ignores them.
	AvoidNodes []string
}

// Exclusive reports whether the pod set wants whole GPUs.
func (p PodSet) Exclusive() bool { return p.MemoryMiB == 0 && p.MemoryPercent == 0 }

// Gang is every pod set of one workload; all of them must fit together.
type Gang struct {
	PodSets []PodSet
}

// Pods is the number of pods in the gang.
func (g Gang) Pods() int {
	n := 0
	for _, ps := range g.PodSets {
		n += ps.Count
	}
	return n
}

// Default search bounds (GangFitParameters.spec.search).
const (
	DefaultMaxSteps   int64 = 200000
	DefaultMaxDomains       = 64
)

// Options configure one decision.
type Options struct {
	// Levels are the topology label keys, broad → narrow. Within the chosen
	// domain, nodes are ordered by the values of the levels narrower than
	// Level, so a gang's pods cluster in as few sub-domains as possible.
	Levels []string
	// Level is the node label key every pod must share one value of; ""
	// makes the whole cluster one domain. Nodes without the label are in no
	// domain.
	Level string
	// Policy is v1alpha1.PolicyBestFit (default) or v1alpha1.PolicyWorstFit.
	Policy string
	// MaxSteps bounds the backtracking placements tried per domain
	// (default DefaultMaxSteps).
	MaxSteps int64
	// MaxDomains bounds how many domains that pass the aggregate checks are
	// dry-run (default DefaultMaxDomains).
	MaxDomains int

	// proofOnly: stop at the first domain whose search runs out of steps
	// (Never: an unproven domain already means "not never").
	proofOnly bool
}

// Result is one decision.
type Result struct {
	Fits bool
	// Level and Domain name the chosen domain (Domain is "" when Level is "").
	Level, Domain string
	Assignments   []Assignment
	// Domains reports every candidate domain, best first: how many pods fit
	// there and the binding constraint.
	Domains []DomainReport
	// Reasons explain the decision in plain words, most useful first.
	Reasons []string
	// Exhausted is true when some domain's search hit MaxSteps: the answer
	// "does not fit" is then not proven for that domain.
	Exhausted bool
	// Steps is the number of placements the search tried (all domains).
	Steps int64
}

// Assignment places one pod. GPUs are distinct GPUs of Node; for an
// exclusive pod set each Usage is Exclusive with MemoryMiB = the GPU's whole
// allocatable and Cores = 100.
type Assignment struct {
	PodSet string
	Index  int
	Node   string
	GPUs   []Usage
}

// DomainReport describes one candidate domain.
type DomainReport struct {
	Domain string
	// PodsFit is how many of the gang's pods fit in the domain at once: exact
	// for a gang of one kind of pod; for mixed gangs the most the search
	// placed together (or the per-pod-set capacity when it was not searched).
	PodsFit, PodsWanted int
	// Constraint is the binding constraint in plain words; "" when it fits.
	// When nothing fits, only the 16 closest domains are analysed in words;
	// the others say so.
	Constraint string
}
