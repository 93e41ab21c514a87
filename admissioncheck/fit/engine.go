package fit

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// seg names the pods of one original pod set inside a merged request.
type seg struct {
	name  string
	order int // position in Gang.PodSets
	count int
}

// req is a compiled pod set: identical pod sets of a gang are merged, since
// their pods are interchangeable (a PyTorchJob's master and workers usually
// are), which turns many gangs into one kind of pod that is decided exactly
// without search.
type req struct {
	segs   []seg
	count  int
	g      int
	mem    int64
	pct    int32
	cores  int32 // SM percent per GPU; 100 when exclusive
	excl   bool
	sel    map[string]string
	aff    *affinity // nil: no required node affinity
	tol    []corev1.Toleration
	label  string
	bitIdx uint
	// Resources other than GPUs per pod: as asked, and against the
	// model's index (bindRes); resMiss: asks for one no node lists.
	requests map[corev1.ResourceName]int64
	res      []int64
	resMiss  bool
	// apart: the requests (bit bitIdx) whose pods may not share a node
	// with this one's (required pod anti-affinity on kubernetes.io/hostname;
	// its own bit when its pods repel each other); avoid: nodes it may not
	// use because of pods already there.
	apart    uint64
	apartSet []string // the pod set names, closed under symmetry, sorted
	avoid    map[string]bool
}

// self reports whether r's own pods may not share a node.
func (r *req) self() bool { return r.apart&(1<<r.bitIdx) != 0 }

func (r *req) need(alloc int64) int64 {
	if r.mem > 0 {
		return r.mem
	}
	return max(1, alloc*int64(r.pct)/100)
}

// slots is how many pods of r one GPU can still serve (each pod uses a GPU
// at most once).
func (r *req) slots(g *gpuState) int64 {
	if !g.healthy {
		return 0
	}
	if r.excl {
		if g.whole() {
			return 1
		}
		return 0
	}
	if g.excl > 0 {
		return 0
	}
	s := g.free() / r.need(g.alloc)
	if g.share > 0 {
		s = min(s, int64(max(0, g.share-g.holders)))
	}
	if r.cores > 0 {
		s = min(s, int64(g.freeCores()/r.cores))
	}
	return s
}

func (r *req) apply(g *gpuState, sign int) Usage {
	u := Usage{MemoryMiB: r.need(g.alloc), Cores: r.cores}
	if r.excl {
		u = Usage{MemoryMiB: g.alloc, Cores: 100, Exclusive: true}
	}
	if sign > 0 {
		g.used += u.MemoryMiB
		g.cores += u.Cores
		g.holders++
		if u.Exclusive {
			g.excl++
		}
	} else {
		g.used -= u.MemoryMiB
		g.cores -= u.Cores
		g.holders--
		if u.Exclusive {
			g.excl--
		}
	}
	return u
}

func (r *req) describeMem() string {
	if r.mem > 0 {
		return fmt.Sprintf("%d MiB", r.mem)
	}
	return fmt.Sprintf("%d%% of memory", r.pct)
}

// validate checks a gang before any work; the error says what to fix.
func validate(g Gang) error {
	seen := map[string]bool{}
	for _, ps := range g.PodSets {
		switch {
		case ps.Name == "":
			return fmt.Errorf("a pod set has no name")
		case seen[ps.Name]:
			return fmt.Errorf("pod set %q appears twice", ps.Name)
		case ps.Count < 0:
			return fmt.Errorf("pod set %q: count %d < 0", ps.Name, ps.Count)
		case ps.GPUsPerPod < 1:
			return fmt.Errorf("pod set %q: %d GPUs per pod, want ≥ 1", ps.Name, ps.GPUsPerPod)
		case ps.MemoryMiB < 0:
			return fmt.Errorf("pod set %q: memory %d MiB < 0", ps.Name, ps.MemoryMiB)
		case ps.MemoryPercent < 0 || ps.MemoryPercent > 100:
			return fmt.Errorf("pod set %q: memory percentage %d not in 0–100", ps.Name, ps.MemoryPercent)
		case ps.MemoryMiB > 0 && ps.MemoryPercent > 0:
			return fmt.Errorf("pod set %q: both memory MiB and memory percentage set", ps.Name)
		case ps.Cores < 0 || ps.Cores > 100:
			return fmt.Errorf("pod set %q: cores %d%% not in 0–100", ps.Name, ps.Cores)
		}
		for _, a := range ps.Apart {
			if !slices.ContainsFunc(g.PodSets, func(o PodSet) bool { return o.Name == a }) {
				return fmt.Errorf("pod set %q: kept apart from pod set %q, which the gang does not have", ps.Name, a)
			}
		}
		// A pod set of no pods needs no node, whatever its affinity.
		if ps.Count > 0 {
			if err := affinityErr(ps.NodeAffinity); err != nil {
				return fmt.Errorf("pod set %q: no term of its required node affinity can be parsed, so it matches no node: %v", ps.Name, err)
			}
		}
		seen[ps.Name] = true
	}
	return nil
}

// apartSets closes the gang's Apart relation under symmetry: pod set name →
// the sorted names it may not share a node with.
func apartSets(g Gang) map[string][]string {
	rel := map[string]map[string]bool{}
	add := func(a, b string) {
		if rel[a] == nil {
			rel[a] = map[string]bool{}
		}
		rel[a][b] = true
	}
	for _, ps := range g.PodSets {
		for _, a := range ps.Apart {
			add(ps.Name, a)
			add(a, ps.Name)
		}
	}
	out := make(map[string][]string, len(rel))
	for n, set := range rel {
		names := make([]string, 0, len(set))
		for o := range set {
			names = append(names, o)
		}
		slices.Sort(names)
		out[n] = names
	}
	return out
}

func sortedSet(xs []string) []string {
	if len(xs) == 0 {
		return nil
	}
	out := slices.Clone(xs)
	slices.Sort(out)
	return slices.Compact(out)
}

func compile(g Gang) []*req {
	var reqs []*req
	apart := apartSets(g)
	for i, ps := range g.PodSets {
		if ps.Count == 0 {
			continue
		}
		r := &req{count: ps.Count, g: ps.GPUsPerPod, mem: ps.MemoryMiB, pct: ps.MemoryPercent,
			cores: ps.Cores, excl: ps.Exclusive(), sel: ps.NodeSelector, tol: ps.Tolerations, requests: ps.Requests,
			apartSet: apart[ps.Name]}
		avoid := sortedSet(ps.AvoidNodes)
		if r.excl {
			r.cores = 100
		}
		merged := false
		for _, o := range reqs {
			if o.g == r.g && o.mem == r.mem && o.pct == r.pct && o.cores == r.cores && o.excl == r.excl &&
				equalSel(o.sel, r.sel) && reflect.DeepEqual(o.aff.source(), ps.NodeAffinity) && reflect.DeepEqual(o.tol, r.tol) &&
				equalRequests(o.requests, r.requests) && slices.Equal(o.apartSet, r.apartSet) && equalAvoid(o.avoid, avoid) {
				o.segs = append(o.segs, seg{ps.Name, i, ps.Count})
				o.count += ps.Count
				merged = true
				break
			}
		}
		if !merged {
			// Compiled once per decision, and shared by requests with the same
			// affinity (a job's master and workers usually have one), so each
			// node is matched once.
			for _, o := range reqs {
				if ps.NodeAffinity != nil && o.aff != nil && reflect.DeepEqual(o.aff.src, ps.NodeAffinity) {
					r.aff = o.aff
					break
				}
			}
			if r.aff == nil {
				r.aff = newAffinity(ps.NodeAffinity)
			}
			if len(avoid) > 0 {
				r.avoid = make(map[string]bool, len(avoid))
				for _, n := range avoid {
					r.avoid[n] = true
				}
			}
			r.segs = []seg{{ps.Name, i, ps.Count}}
			reqs = append(reqs, r)
		}
	}
	for _, r := range reqs {
		names := make([]string, len(r.segs))
		for i, s := range r.segs {
			names[i] = s.name
		}
		r.label = strings.Join(names, "+")
	}
	// Hardest first: exclusive before shared, more GPUs per pod first, then
	// more memory per GPU. The last request is decided without search.
	slices.SortStableFunc(reqs, func(a, b *req) int {
		if a.excl != b.excl {
			if a.excl {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.g, a.g), cmp.Compare(b.mem, a.mem), cmp.Compare(b.pct, a.pct), cmp.Compare(b.cores, a.cores))
	})
	for i, r := range reqs {
		r.bitIdx = uint(i)
	}
	// Pod sets merge only with the same apart set, so a name maps to one
	// request; a request kept apart from a pod set that has no pods (not
	// compiled) has nothing to keep apart from.
	byName := map[string]*req{}
	for _, r := range reqs {
		for _, sg := range r.segs {
			byName[sg.name] = r
		}
	}
	for _, r := range reqs {
		for _, n := range r.apartSet {
			if o, ok := byName[n]; ok {
				r.apart |= 1 << o.bitIdx
			}
		}
	}
	return reqs
}

// equalAvoid: a request's avoided nodes (a set) equal the sorted names.
func equalAvoid(a map[string]bool, names []string) bool {
	if len(a) != len(names) {
		return false
	}
	for _, n := range names {
		if !a[n] {
			return false
		}
	}
	return true
}

func equalRequests(a, b map[corev1.ResourceName]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func equalSel(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if w, ok := labels[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// tolerated: every NoSchedule/NoExecute taint is tolerated (PreferNoSchedule
// never keeps a pod off a node).
func tolerated(taints []corev1.Taint, tol []corev1.Toleration) bool {
	for i := range taints {
		t := &taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		ok := false
		for j := range tol {
			if tol[j].ToleratesTaint(logr.Discard(), t, true) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func (o Options) withDefaults() Options {
	if o.MaxSteps <= 0 {
		o.MaxSteps = DefaultMaxSteps
	}
	if o.MaxDomains <= 0 {
		o.MaxDomains = DefaultMaxDomains
	}
	if o.Policy == "" {
		o.Policy = v1alpha1.PolicyBestFit
	}
	return o
}

// narrower returns the levels under o.Level (all of them when Level is "" or
// not listed), without kubernetes.io/hostname: a node is its own
// sub-domain, and grouping by it would only undo the node packing order.
func (o Options) narrower() []string {
	levels := o.Levels
	for i, l := range o.Levels {
		if l == o.Level {
			levels = o.Levels[i+1:]
			break
		}
	}
	out := make([]string, 0, len(levels))
	for _, l := range levels {
		if l != o.Level && l != corev1.LabelHostname {
			out = append(out, l)
		}
	}
	return out
}

// Fit decides whether the whole gang fits now inside one domain of o.Level.
// It does not change the model's usage (it may cache a level index).
func (m *Model) Fit(g Gang, o Options) Result {
	o = o.withDefaults()
	if err := validate(g); err != nil {
		return Result{Level: o.Level, Reasons: []string{"invalid request: " + err.Error()}}
	}
	reqs := compile(g)
	if len(reqs) == 0 {
		return Result{Fits: true, Level: o.Level, Reasons: []string{"the workload requests no GPUs"}}
	}
	if len(reqs) > 64 {
		return Result{Level: o.Level, Reasons: []string{fmt.Sprintf("invalid request: %d distinct pod sets, at most 64 supported", len(reqs))}}
	}
	m.bindRes(reqs)
	li := m.level(o.Level)
	var res Result
	res.Level = o.Level

	// Aggregate pruning: necessary conditions only, so no feasible domain is
	// ever dropped here.
	type cand struct {
		d  *domainAgg
		di int
	}
	var cands []cand
	for di, d := range li.domains {
		if aggregateOK(d, reqs) {
			cands = append(cands, cand{d, di})
		}
	}
	worst := o.Policy == v1alpha1.PolicyWorstFit
	slices.SortFunc(cands, func(a, b cand) int {
		c := cmp.Or(cmp.Compare(a.d.freeMiB, b.d.freeMiB), cmp.Compare(a.d.whole, b.d.whole))
		if worst {
			c = -c
		}
		return cmp.Or(c, strings.Compare(a.d.name, b.d.name))
	})
	reports := make(map[int]DomainReport)
	tried := 0
	for _, c := range cands {
		if tried >= o.MaxDomains {
			break
		}
		tried++
		s := m.newScratch(c.d, reqs, o)
		ok, rep := s.run(o.MaxSteps)
		res.Steps += s.steps
		if s.exhausted {
			res.Exhausted = true
			if o.proofOnly {
				s.undoAll()
				return res
			}
		}
		reports[c.di] = rep
		if ok {
			res.Assignments = s.assignments(m)
		}
		s.undoAll()
		if ok {
			res.Fits = true
			res.Domain = c.d.name
			res.Domains = []DomainReport{rep}
			res.Reasons = []string{fmt.Sprintf("%s: all %d pods fit (%s, %s)", domainLabel(o.Level, c.d.name), rep.PodsWanted, o.Policy, policyWhy(worst))}
			return res
		}
	}
	// Not fitting: count what fits in every domain, then explain the closest
	// ones in words (the text costs more than the counting).
	index := map[string]int{}
	for di, d := range li.domains {
		index[d.name] = di
		rep, ok := reports[di]
		if !ok {
			rep = m.newScratch(d, reqs, o).capacityReport(false)
		}
		res.Domains = append(res.Domains, rep)
	}
	slices.SortStableFunc(res.Domains, func(a, b DomainReport) int {
		return cmp.Or(cmp.Compare(b.PodsFit, a.PodsFit), strings.Compare(a.Domain, b.Domain))
	})
	for i := range res.Domains {
		rep := &res.Domains[i]
		if rep.Constraint != "" {
			continue
		}
		if i >= maxExplained {
			rep.Constraint = fmt.Sprintf("not analysed further (only the %d closest domains are)", maxExplained)
			continue
		}
		d := li.domains[index[rep.Domain]]
		*rep = m.newScratch(d, reqs, o).capacityReport(true)
		if rep.Constraint == "" && tried >= o.MaxDomains && aggregateOK(d, reqs) {
			rep.Constraint = fmt.Sprintf("not tried: only %d domains are dry-run per decision (search.maxDomains)", o.MaxDomains)
		}
	}
	res.Reasons = m.reasons(res.Domains, li, reqs, o)
	return res
}

func policyWhy(worst bool) string {
	if worst {
		return "the feasible domain with the most free memory"
	}
	return "the feasible domain with the least free memory"
}

func domainLabel(level, name string) string {
	if level == "" {
		return "cluster"
	}
	return "domain " + name
}

// aggregateOK applies the per-domain counters: free whole GPUs, nodes by
// number of whole GPUs, and the free-MiB histogram. Each test is an upper
// bound of what the domain can hold, so failing one proves the gang cannot
// fit there.
func aggregateOK(d *domainAgg, reqs []*req) bool {
	var exclGPUs int64
	var fracMiB int64
	for _, r := range reqs {
		need := int64(r.count) * int64(r.g)
		if r.excl {
			exclGPUs += need
			var pods int64
			for k, n := range d.nodesByWhole {
				pods += int64(n) * int64(k/r.g)
			}
			if pods < int64(r.count) {
				return false
			}
			continue
		}
		if int64(d.gpus) < int64(r.g) {
			return false
		}
		if r.mem == 0 {
			continue // per-GPU need depends on the model; left to the scan
		}
		fracMiB += need * r.mem
		var slots int64
		for b, n := range d.hist {
			if n > 0 {
				slots += int64(n) * (histUpper(b) / r.mem)
			}
		}
		if slots < need {
			return false
		}
	}
	return exclGPUs <= int64(d.whole) && fracMiB <= d.freeMiB
}

// scratch is one domain prepared for a dry run: its usable nodes in
// placement order with their eligibility per request. The dry run places
// pods on the model's own GPU states and undoes every placement before Fit
// returns (undoAll), so nothing is copied and the aggregates, which the dry
// run never touches, stay right.
type scratch struct {
	m        *Model
	reqs     []*req
	nodes    []snode
	name     string
	steps    int64
	maxSteps int64

	exhausted   bool
	loosest     bool // second dive: GPU classes loosest first
	ignoreRes   bool // capacity by GPUs alone (for messages)
	ignoreApart bool // capacity without the one-pod-per-node rule (for messages)
	placed      int
	maxPlaced   int
	stack       []placed
	// per-domain exclusion counts for messages
	unusable int
	selMiss  []int
	affMiss  []int
	tainted  []int
	avoided  []int
	// here counts the pods placed per node (s.nodes index) and request,
	// row-major; only kept when some request is kept apart from another.
	here []int32
}

type snode struct {
	ni     int32
	lo, hi int32 // the node's GPUs in Model.gpus
	elig   uint64
}

type placed struct {
	req  int
	node int
	gpus []int32 // Model.gpus indices
}

func (s *scratch) gpu(i int32) *gpuState { return &s.m.gpus[i] }

// undoAll removes every placement of the dry run from the model.
func (s *scratch) undoAll() {
	for i := len(s.stack) - 1; i >= 0; i-- {
		p := s.stack[i]
		for _, gi := range p.gpus {
			s.reqs[p.req].apply(s.gpu(gi), -1)
		}
		s.takeRes(s.reqs[p.req], s.nodes[p.node].ni, -1)
		s.count(p.req, p.node, -1)
	}
	s.stack = s.stack[:0]
	s.placed = 0
}

// staticOrder ranks nodes by the values of the levels narrower than the
// domain's (then by name); it depends only on labels, so it is computed once
// per set of levels and shared by clones.
type staticOrder struct {
	sub  []int32 // per node: rank of its narrower-levels tuple
	rank []int32 // per node: position in (tuple, name) order
	byRk []int32 // rank → node
}

func (m *Model) order(narrow []string) *staticOrder {
	key := strings.Join(narrow, "\x00")
	if so, ok := m.orders[key]; ok {
		return so
	}
	idx := make([]int32, len(m.nodes))
	tuples := make([][]string, len(m.nodes))
	for i := range idx {
		idx[i] = int32(i)
		t := make([]string, len(narrow))
		for k, l := range narrow {
			t[k] = m.nodes[i].n.Labels[l]
		}
		tuples[i] = t
	}
	slices.SortFunc(idx, func(a, b int32) int {
		return cmp.Or(slices.Compare(tuples[a], tuples[b]), strings.Compare(m.nodes[a].n.Name, m.nodes[b].n.Name))
	})
	so := &staticOrder{sub: make([]int32, len(m.nodes)), rank: make([]int32, len(m.nodes)), byRk: idx}
	sub := int32(-1)
	for r, ni := range idx {
		if r == 0 || !slices.Equal(tuples[ni], tuples[idx[r-1]]) {
			sub++
		}
		so.sub[ni] = sub
		so.rank[ni] = int32(r)
	}
	m.orders[key] = so
	return so
}

func (m *Model) newScratch(d *domainAgg, reqs []*req, o Options) *scratch {
	k := len(reqs)
	miss := make([]int, 4*k) // one allocation for the four counts
	s := &scratch{m: m, reqs: reqs, name: d.name, selMiss: miss[:k:k], affMiss: miss[k : 2*k : 2*k], tainted: miss[2*k : 3*k : 3*k], avoided: miss[3*k:]}
	so := m.order(o.narrower())
	worst := o.Policy == v1alpha1.PolicyWorstFit
	if len(m.eligBuf) != len(m.nodes) {
		m.eligBuf = make([]uint64, len(m.nodes))
		m.subFree = make([]int64, len(m.nodes))
		m.subWhole = make([]int64, len(m.nodes))
		m.subPos = make([]int32, len(m.nodes))
		m.subSeen = make([]bool, len(m.nodes))
	}
	// Pass 1: eligible nodes, and free memory / whole GPUs per sub-domain.
	cands := m.candBuf[:0]
	subs := m.subsBuf[:0]
	for _, ni := range d.nodes {
		n := &m.nodes[ni]
		if !n.usable {
			s.unusable++
			continue
		}
		var elig uint64
		for i, r := range reqs {
			switch {
			case !selects(r.sel, n.n.Labels):
				s.selMiss[i]++
			case r.aff != nil && !r.aff.matches(m, ni):
				s.affMiss[i]++
			case !tolerated(n.n.Taints, r.tol):
				s.tainted[i]++
			case r.avoid[n.n.Name]:
				s.avoided[i]++
			default:
				elig |= 1 << uint(i)
			}
		}
		if elig == 0 {
			continue
		}
		m.eligBuf[ni] = elig
		cands = append(cands, ni)
		sub := so.sub[ni]
		if !m.subSeen[sub] {
			m.subSeen[sub] = true
			subs = append(subs, sub)
		}
		m.subFree[sub] += n.freeMiB
		m.subWhole[sub] += int64(n.whole)
	}
	// Sub-domains (values of the narrower levels) in locality order: those
	// that could hold the whole gang by themselves first, tightest first
	// (BestFit) or roomiest first (WorstFit); then the rest roomiest first,
	// so a gang that must spread spans as few of them as possible.
	var gangMiB, gangWhole int64
	for _, r := range reqs {
		if r.excl {
			gangWhole += int64(r.count * r.g)
		} else {
			gangMiB += int64(r.count*r.g) * r.mem
		}
	}
	alone := func(sub int32) bool { return m.subFree[sub] >= gangMiB && m.subWhole[sub] >= gangWhole }
	slices.SortFunc(subs, func(a, b int32) int {
		if alone(a) != alone(b) {
			if alone(a) {
				return -1
			}
			return 1
		}
		c := cmp.Compare(m.subFree[b], m.subFree[a]) // roomiest first
		if alone(a) && !worst {
			c = -c
		}
		return cmp.Or(c, cmp.Compare(a, b))
	})
	for i, sub := range subs {
		m.subPos[sub] = int32(i)
	}
	// Pass 2: within a sub-domain, BestFit fills the fullest nodes first (to
	// keep empty nodes whole for large pods), WorstFit the emptiest; then
	// name. Packed into one integer so sorting is cheap.
	keys := m.keyBuf[:0]
	for _, ni := range cands {
		n := &m.nodes[ni]
		free := min(n.freeMiB, 1<<24-1)
		if worst {
			free = 1<<24 - 1 - free
		}
		keys = append(keys, uint64(m.subPos[so.sub[ni]])<<44|uint64(free)<<20|uint64(so.rank[ni]))
	}
	for _, sub := range subs {
		m.subFree[sub], m.subWhole[sub], m.subSeen[sub] = 0, 0, false
	}
	m.candBuf, m.subsBuf = cands, subs
	m.tmpBuf = sortKeys(keys, m.tmpBuf)
	m.keyBuf = keys
	if cap(m.nodeBuf) < len(keys) {
		m.nodeBuf = make([]snode, len(keys))
	}
	s.nodes = m.nodeBuf[:len(keys)]
	for i, k := range keys {
		ni := so.byRk[k&(1<<20-1)]
		n := &m.nodes[ni]
		s.nodes[i] = snode{ni: ni, lo: n.lo, hi: n.hi, elig: m.eligBuf[ni]}
	}
	for _, r := range reqs {
		if r.apart != 0 {
			s.here = make([]int32, len(s.nodes)*k)
			break
		}
	}
	return s
}

// blocked: a pod kept apart from r already runs on node i (s.nodes index)
// in this dry run.
func (s *scratch) blocked(r *req, i int) bool {
	if r.apart == 0 {
		return false
	}
	row := s.here[i*len(s.reqs) : (i+1)*len(s.reqs)]
	for j := range row {
		if row[j] > 0 && r.apart&(1<<uint(j)) != 0 {
			return true
		}
	}
	return false
}

// perNode caps how many more pods of r node i can take besides GPUs and
// resources: none where a pod kept apart from it runs, one where its own
// pods repel each other.
func (s *scratch) perNode(r *req, i int, limit int64) int64 {
	switch {
	case s.ignoreApart:
	case s.blocked(r, i):
		return 0
	case r.self():
		return min(limit, 1)
	}
	return limit
}

// count records a placement (+1) or its undo (-1) of request j on node i.
func (s *scratch) count(j, i, sign int) {
	if s.here != nil {
		s.here[i*len(s.reqs)+j] += int32(sign)
	}
}

// mayHost is a cheap necessary test from the node's counters: can the node
// take even one pod of r?
func (s *scratch) mayHost(r *req, n *snode) bool {
	nd := &s.m.nodes[n.ni]
	if nd.hasRes && s.nodeCap(r, n.ni) < 1 {
		return false
	}
	if r.excl {
		return int(nd.whole) >= r.g
	}
	return r.mem == 0 || nd.freeMiB >= r.mem*int64(r.g)
}

// nodeSlots fills buf with r's slots on node n's GPUs.
func (s *scratch) nodeSlots(r *req, n *snode, buf []int64) []int64 {
	buf = buf[:0]
	for i := n.lo; i < n.hi; i++ {
		buf = append(buf, r.slots(s.gpu(i)))
	}
	return buf
}

// podCap is the most pods (≤ limit) that each need g distinct GPUs when GPU
// i can serve slots[i] of them: the largest p with Σ min(slots[i], p) ≥ p·g
// (Gale–Ryser for a 0/1 matrix with row sums g and column sums ≤ slots).
func podCap(slots []int64, g int, limit int64) int64 {
	var total int64
	for _, x := range slots {
		total += x
	}
	hi := min(limit, total/int64(g))
	lo := int64(0)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		var sum int64
		for _, x := range slots {
			sum += min(x, mid)
		}
		if sum >= mid*int64(g) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// capacity is how many pods of reqs[j] the domain could hold on its own now.
func (s *scratch) capacity(j int, limit int64) int64 {
	r := s.reqs[j]
	var buf [16]int64
	var total int64
	for i := range s.nodes {
		n := &s.nodes[i]
		if n.elig&(1<<r.bitIdx) == 0 || !s.mayHost(r, n) || s.blocked(r, i) {
			continue
		}
		s.steps++ // scans count against search.maxSteps like placements
		total += podCap(s.nodeSlots(r, n, buf[:0]), r.g, s.perNode(r, i, min(limit-total, s.nodeCap(r, n.ni))))
		if total >= limit {
			break
		}
	}
	return total
}

// run dry-runs the gang in this domain.
func (s *scratch) run(maxSteps int64) (bool, DomainReport) {
	s.maxSteps = maxSteps
	rep := DomainReport{Domain: s.name}
	for _, r := range s.reqs {
		rep.PodsWanted += r.count
	}
	// Each pod set alone first: exact, and it names the binding constraint.
	fitAlone := 0
	failing := -1
	for j, r := range s.reqs {
		c := s.capacity(j, int64(r.count))
		fitAlone += int(c)
		if int(c) < r.count && failing < 0 {
			failing = j
		}
	}
	if failing >= 0 {
		rep.PodsFit = fitAlone
		rep.Constraint = s.constraint(failing)
		return false, rep
	}
	if ok, why, fit := s.jointOK(0, true); !ok {
		rep.PodsFit, rep.Constraint = fit, why
		return false, rep
	}
	// Two dives over the same complete search space, tightest GPUs first
	// then loosest first, each with half the budget: a hard instance that
	// defeats one order rarely defeats both. A dive that ends without
	// running out of steps is a proof either way.
	s.steps = 0
	s.maxSteps = maxSteps / 2
	ok := s.place(0, 0, 0)
	if !ok && s.exhausted {
		s.exhausted, s.loosest, s.maxSteps = false, true, maxSteps
		ok = s.place(0, 0, 0)
	}
	if ok {
		rep.PodsFit = rep.PodsWanted
		return true, rep
	}
	rep.PodsFit = s.maxPlaced
	if s.exhausted {
		rep.Constraint = fmt.Sprintf("search stopped after %d steps (search.maxSteps) without finding a placement; not proven impossible", s.steps)
	} else {
		rep.Constraint = fmt.Sprintf("pod sets %s each fit alone but not together (GPUs they would share are too small for both)", s.labels())
	}
	return false, rep
}

func (s *scratch) labels() string {
	names := make([]string, len(s.reqs))
	for i, r := range s.reqs {
		names[i] = r.label
	}
	return strings.Join(names, ", ")
}

// maxExplained bounds the domains whose binding constraint is put in words
// when nothing fits; the others get their pod counts only.
const maxExplained = 16

// capacityReport describes a domain without searching it: how many pods fit
// (each pod set alone, or the joint estimate) and, with explain, why not.
func (s *scratch) capacityReport(explain bool) DomainReport {
	rep := DomainReport{Domain: s.name}
	failing := -1
	for j, r := range s.reqs {
		rep.PodsWanted += r.count
		c := s.capacity(j, int64(r.count))
		rep.PodsFit += int(c)
		if int(c) < r.count && failing < 0 {
			failing = j
		}
	}
	switch {
	case !explain:
	case failing >= 0:
		rep.Constraint = s.constraint(failing)
	default:
		if ok, why, fit := s.jointOK(0, true); !ok {
			rep.PodsFit, rep.Constraint = fit, why
		}
	}
	return rep
}

// place places pod k of reqs[j] on a node at index ≥ lb. Pods of one request
// are identical, so they are placed in non-decreasing node order; nodes in
// the same state (and eligibility) are tried once per decision; GPUs in the
// same state are interchangeable, so a pod chooses how many GPUs of each
// state class it takes, not which. The last request is decided exactly by
// capacity and placed greedily.
func (s *scratch) place(j, k, lb int) bool {
	if j == len(s.reqs) {
		return true
	}
	r := s.reqs[j]
	if k == r.count {
		if !s.boundOK(j + 1) {
			return false
		}
		return s.place(j+1, 0, 0)
	}
	if k == 0 && j == len(s.reqs)-1 {
		c := s.capacity(j, int64(r.count))
		if int(c) < r.count {
			s.maxPlaced = max(s.maxPlaced, s.placed+int(c))
			return false
		}
		s.greedy(j)
		return true
	}
	var seen map[string]bool
	for ni := lb; ni < len(s.nodes); ni++ {
		n := &s.nodes[ni]
		if n.elig&(1<<r.bitIdx) == 0 || !s.mayHost(r, n) || s.blocked(r, ni) {
			continue
		}
		classes := s.classes(r, n)
		if classes == nil {
			continue
		}
		sig := s.signature(n, ni)
		if seen == nil {
			seen = map[string]bool{}
		}
		if seen[sig] {
			continue
		}
		seen[sig] = true
		counts := make([]int, len(classes))
		if s.choose(j, k, ni, classes, counts, 0, r.g) {
			return true
		}
		if s.exhausted {
			return false
		}
	}
	return false
}

// choose enumerates how many GPUs to take from each class (tightest first).
func (s *scratch) choose(j, k, ni int, classes [][]int32, counts []int, c, left int) bool {
	if left == 0 {
		s.steps++
		if s.steps > s.maxSteps {
			s.exhausted = true
			return false
		}
		r := s.reqs[j]
		p := placed{req: j, node: ni}
		for ci, cnt := range counts {
			for x := 0; x < cnt; x++ {
				gi := classes[ci][x]
				r.apply(s.gpu(gi), +1)
				p.gpus = append(p.gpus, gi)
			}
		}
		s.takeRes(r, s.nodes[ni].ni, +1)
		s.count(j, ni, +1)
		s.stack = append(s.stack, p)
		s.placed++
		s.maxPlaced = max(s.maxPlaced, s.placed)
		if s.place(j, k+1, ni) {
			return true
		}
		s.placed--
		s.stack = s.stack[:len(s.stack)-1]
		for _, gi := range p.gpus {
			r.apply(s.gpu(gi), -1)
		}
		s.takeRes(r, s.nodes[ni].ni, -1)
		s.count(j, ni, -1)
		return false
	}
	if c == len(classes) {
		return false
	}
	// Take as many as possible from the tightest class first.
	for take := min(left, len(classes[c])); take >= 0; take-- {
		counts[c] = take
		if s.choose(j, k, ni, classes, counts, c+1, left-take) {
			return true
		}
		if s.exhausted {
			counts[c] = 0
			return false
		}
	}
	counts[c] = 0
	return false
}

// classes groups the node's GPUs that can host one more GPU of r by state,
// tightest first; nil when fewer than r.g can.
func (s *scratch) classes(r *req, n *snode) [][]int32 {
	hostable := 0
	for i := n.lo; i < n.hi; i++ {
		if r.slots(s.gpu(i)) > 0 {
			hostable++
		}
	}
	if hostable < r.g {
		return nil
	}
	var classes [][]int32
	for i := n.lo; i < n.hi; i++ {
		g := s.gpu(i)
		if r.slots(g) == 0 {
			continue
		}
		placedIn := false
		for ci, cl := range classes {
			if sameState(s.gpu(cl[0]), g) {
				classes[ci] = append(cl, i)
				placedIn = true
				break
			}
		}
		if !placedIn {
			classes = append(classes, []int32{i})
		}
	}
	slices.SortStableFunc(classes, func(a, b []int32) int {
		x, y := s.gpu(a[0]), s.gpu(b[0])
		c := cmp.Or(cmp.Compare(x.free(), y.free()), cmp.Compare(x.freeCores(), y.freeCores()), cmp.Compare(x.alloc, y.alloc), cmp.Compare(x.phys, y.phys))
		if s.loosest {
			return -c
		}
		return c
	})
	return classes
}

// sameState: two GPUs no future placement can tell apart.
func sameState(a, b *gpuState) bool {
	return a.phys == b.phys && a.alloc == b.alloc && a.free() == b.free() && a.freeCores() == b.freeCores() &&
		a.whole() == b.whole() && (a.excl > 0) == (b.excl > 0) && a.healthy == b.healthy && shareLeft(a) == shareLeft(b)
}

// shareLeft is how many more holders a GPU may take (-1: no limit).
func shareLeft(g *gpuState) int32 {
	if g.share == 0 {
		return -1
	}
	return max(0, g.share-g.holders)
}

// signature identifies a node's state for symmetry breaking: eligibility and
// the sorted multiset of its GPU states.
func (s *scratch) signature(n *snode, ni int) string {
	type t struct{ phys, alloc, free, cores, flags, share int64 }
	ts := make([]t, 0, n.hi-n.lo)
	for i := n.lo; i < n.hi; i++ {
		g := s.gpu(i)
		var f int64
		if g.whole() {
			f |= 1
		}
		if g.excl > 0 {
			f |= 2
		}
		if g.healthy {
			f |= 4
		}
		ts = append(ts, t{g.phys, g.alloc, g.free(), int64(g.freeCores()), f, int64(shareLeft(g))})
	}
	slices.SortFunc(ts, func(a, b t) int {
		return cmp.Or(cmp.Compare(a.phys, b.phys), cmp.Compare(a.alloc, b.alloc), cmp.Compare(a.free, b.free), cmp.Compare(a.cores, b.cores), cmp.Compare(a.flags, b.flags), cmp.Compare(a.share, b.share))
	})
	b := strconv.AppendUint(nil, n.elig, 36)
	// Nodes with pods of different requests on them are not interchangeable
	// when requests are kept apart.
	if s.here != nil {
		for _, c := range s.here[ni*len(s.reqs) : (ni+1)*len(s.reqs)] {
			b = append(b, ':')
			b = strconv.AppendInt(b, int64(c), 36)
		}
	}
	// Nodes with other free resources other than GPUs are not interchangeable.
	if alloc, used := s.m.resOf(n.ni); alloc != nil {
		for i := range alloc {
			b = append(b, ';')
			b = strconv.AppendInt(b, alloc[i]-used[i], 36)
		}
	}
	for _, x := range ts {
		b = append(b, '|')
		b = strconv.AppendInt(b, x.phys, 36)
		b = append(b, ',')
		b = strconv.AppendInt(b, x.alloc, 36)
		b = append(b, ',')
		b = strconv.AppendInt(b, x.free, 36)
		b = append(b, ',')
		b = strconv.AppendInt(b, x.cores, 36)
		b = append(b, ',')
		b = strconv.AppendInt(b, x.flags, 36)
	}
	return string(b)
}

// boundOK: every remaining request still fits alone, and together they fit
// the domain's whole GPUs and usable free memory (jointOK).
func (s *scratch) boundOK(from int) bool {
	for j := from; j < len(s.reqs); j++ {
		r := s.reqs[j]
		if int(s.capacity(j, int64(r.count))) < r.count {
			return false
		}
	}
	ok, _, _ := s.jointOK(from, false)
	return ok
}

// jointOK tests the requests from `from` on together, as necessary
// conditions: exclusive ones need that many whole GPUs on their nodes;
// shared ones (by MiB) need their total memory within the free memory of
// GPUs that can take at least the smallest of them (smaller leftovers are
// useless to all). When explain is set and a test fails it says which, and
// estimates how many pods fit.
func (s *scratch) jointOK(from int, explain bool) (bool, string, int) {
	var exclNeed, fracNeed int64
	var exclMask, fracMask uint64
	minMem := int64(-1)
	for j := from; j < len(s.reqs); j++ {
		r := s.reqs[j]
		switch {
		case r.excl:
			exclNeed += int64(r.count * r.g)
			exclMask |= 1 << r.bitIdx
		case r.mem > 0:
			fracNeed += int64(r.count*r.g) * r.mem
			fracMask |= 1 << r.bitIdx
			if minMem < 0 || r.mem < minMem {
				minMem = r.mem
			}
		}
	}
	if (exclNeed == 0 && fracNeed == 0) || len(s.reqs)-from < 2 {
		return true, "", 0 // one request alone is decided exactly by capacity
	}
	var whole, usable int64
	for i := range s.nodes {
		n := &s.nodes[i]
		if n.elig&(exclMask|fracMask) == 0 {
			continue
		}
		s.steps++
		for gi := n.lo; gi < n.hi; gi++ {
			g := s.gpu(gi)
			if !g.healthy {
				continue
			}
			if n.elig&exclMask != 0 && g.whole() {
				whole++
			}
			if n.elig&fracMask != 0 && minMem > 0 {
				if f := g.free(); f >= minMem {
					usable += f
				}
			}
		}
		if whole >= exclNeed && usable >= fracNeed {
			return true, "", 0
		}
	}
	if whole >= exclNeed && usable >= fracNeed {
		return true, "", 0
	}
	if !explain {
		return false, "", 0
	}
	// Estimate: requests in order, each while memory (or whole GPUs) last.
	fit, leftMiB, leftWhole := 0, usable, whole
	for j := from; j < len(s.reqs); j++ {
		r := s.reqs[j]
		var p int64
		switch {
		case r.excl:
			p = min(int64(r.count), leftWhole/int64(r.g))
			leftWhole -= p * int64(r.g)
		case r.mem > 0:
			p = min(int64(r.count), leftMiB/(int64(r.g)*r.mem))
			leftMiB -= p * int64(r.g) * r.mem
		default:
			p = int64(r.count)
		}
		fit += int(p)
	}
	if whole < exclNeed {
		return false, fmt.Sprintf("pod sets %s need %d whole GPUs together; %d are free", s.labels(), exclNeed, whole), fit
	}
	return false, fmt.Sprintf("pod sets %s need %d MiB of GPU memory together; only %d MiB is free on GPUs with at least %d MiB free", s.labels(), fracNeed, usable, minMem), fit
}

// greedy places every pod of reqs[j], known to fit by capacity: nodes in
// order, each filled up to its capacity, each pod taking the GPUs with the
// most slots left — the order that realises the Gale–Ryser bound.
func (s *scratch) greedy(j int) {
	r := s.reqs[j]
	left := int64(r.count)
	var buf [16]int64
	for ni := range s.nodes {
		if left == 0 {
			return
		}
		n := &s.nodes[ni]
		if n.elig&(1<<r.bitIdx) == 0 || !s.mayHost(r, n) || s.blocked(r, ni) {
			continue
		}
		slots := s.nodeSlots(r, n, buf[:0])
		p := podCap(slots, r.g, s.perNode(r, ni, min(left, s.nodeCap(r, n.ni))))
		for ; p > 0; p-- {
			idx := make([]int, len(slots))
			for i := range idx {
				idx[i] = i
			}
			// Most slots first; among equals the tighter GPU (binpack).
			slices.SortStableFunc(idx, func(a, b int) int {
				return cmp.Or(cmp.Compare(slots[b], slots[a]), cmp.Compare(s.gpu(n.lo+int32(a)).free(), s.gpu(n.lo+int32(b)).free()))
			})
			pl := placed{req: j, node: ni}
			for _, i := range idx[:r.g] {
				gi := n.lo + int32(i)
				r.apply(s.gpu(gi), +1)
				slots[i]--
				pl.gpus = append(pl.gpus, gi)
			}
			s.takeRes(r, n.ni, +1)
			s.count(j, ni, +1)
			s.stack = append(s.stack, pl)
			s.steps++
			s.placed++
			left--
		}
	}
}

// assignments turns the placement stack into per-pod-set assignments.
func (s *scratch) assignments(m *Model) []Assignment {
	next := make([]int, len(s.reqs)) // pods placed so far per request
	type ordered struct {
		a     Assignment
		order int
	}
	out := make([]ordered, 0, len(s.stack))
	for _, p := range s.stack {
		r := s.reqs[p.req]
		k := next[p.req]
		next[p.req]++
		sg, idx := r.segs[0], k
		for _, x := range r.segs {
			if idx < x.count {
				sg = x
				break
			}
			idx -= x.count
		}
		n := &s.nodes[p.node]
		a := Assignment{PodSet: sg.name, Index: idx, Node: m.nodes[n.ni].n.Name}
		for _, gi := range p.gpus {
			g := s.gpu(gi)
			u := Usage{UUID: m.info[gi].UUID, MemoryMiB: r.need(g.alloc), Cores: r.cores}
			if r.excl {
				u = Usage{UUID: m.info[gi].UUID, MemoryMiB: g.alloc, Cores: 100, Exclusive: true}
			}
			a.GPUs = append(a.GPUs, u)
		}
		out = append(out, ordered{a, sg.order})
	}
	slices.SortStableFunc(out, func(x, y ordered) int {
		return cmp.Or(cmp.Compare(x.order, y.order), cmp.Compare(x.a.Index, y.a.Index))
	})
	res := make([]Assignment, len(out))
	for i, o := range out {
		res[i] = o.a
	}
	return res
}

// sortKeys sorts keys ascending: an LSD radix sort (8-bit digits, passes
// with a single digit value skipped) for large domains, where it is several
// times faster than a comparison sort; tmp is scratch space, returned for
// reuse.
func sortKeys(keys, tmp []uint64) []uint64 {
	if len(keys) < 1024 {
		slices.Sort(keys)
		return tmp
	}
	if cap(tmp) < len(keys) {
		tmp = make([]uint64, len(keys))
	}
	tmp = tmp[:len(keys)]
	src, dst := keys, tmp
	for shift := uint(0); shift < 64; shift += 8 {
		var count [256]int
		for _, k := range src {
			count[(k>>shift)&0xff]++
		}
		if count[(src[0]>>shift)&0xff] == len(src) {
			continue // every key has this digit
		}
		pos := 0
		for i, c := range count {
			count[i] = pos
			pos += c
		}
		for _, k := range src {
			d := (k >> shift) & 0xff
			dst[count[d]] = k
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
	return tmp
}
