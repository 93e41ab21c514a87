package fit

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// The oracle is written independently of the engine and as plainly as
// possible: every pod, in order, tries every node and every set of distinct
// GPUs on it, with full backtracking. Exponential, so only for tiny clusters.

type oGPU struct {
	uuid        string
	phys, alloc int64
	healthy     bool
	used        int64
	cores       int32
	holders     int
	excl        bool
}

type oNode struct {
	name   string
	labels map[string]string
	taints []corev1.Taint
	usable bool
	gpus   []*oGPU
	// podSets: the pod set of every pod the oracle put here so far.
	podSets []PodSet
}

// oApart: a pod of a and one of b may not share a node (either names the
// other in Apart).
func oApart(a, b PodSet) bool {
	return slices.Contains(a.Apart, b.Name) || slices.Contains(b.Apart, a.Name)
}

// oAntiOK: a pod of ps may go on n as far as pod anti-affinity goes.
func oAntiOK(ps PodSet, n *oNode) bool {
	if slices.Contains(ps.AvoidNodes, n.name) {
		return false
	}
	for _, o := range n.podSets {
		if oApart(ps, o) {
			return false
		}
	}
	return true
}

func oTolerates(taints []corev1.Taint, tol []corev1.Toleration) bool {
	// The random cases only use Exists tolerations on the taint key.
	for _, t := range taints {
		if t.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		ok := false
		for _, x := range tol {
			if x.Key == t.Key && x.Operator == corev1.TolerationOpExists {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// oAffinity reads a required node affinity plainly: a node matches when
// every requirement of some term holds. A term with no requirements, or one
// that cannot be read, holds nowhere.
func oAffinity(ns *corev1.NodeSelector, name string, labels map[string]string) bool {
	if ns == nil {
		return true
	}
	for _, t := range ns.NodeSelectorTerms {
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			continue
		}
		holds, valid := true, true
		for _, r := range t.MatchExpressions {
			v, has := labels[r.Key]
			switch r.Operator {
			case corev1.NodeSelectorOpIn:
				holds = holds && has && slices.Contains(r.Values, v)
			case corev1.NodeSelectorOpNotIn:
				holds = holds && !(has && slices.Contains(r.Values, v))
			case corev1.NodeSelectorOpExists:
				holds = holds && has
			case corev1.NodeSelectorOpDoesNotExist:
				holds = holds && !has
			case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
				if len(r.Values) != 1 {
					valid = false
					break
				}
				want, err := strconv.ParseInt(r.Values[0], 10, 64)
				if err != nil {
					valid = false
					break
				}
				got, err := strconv.ParseInt(v, 10, 64)
				gt := r.Operator == corev1.NodeSelectorOpGt
				holds = holds && has && err == nil && (gt && got > want || !gt && got < want)
			default:
				valid = false
			}
		}
		for _, r := range t.MatchFields {
			v := ""
			if r.Key == "metadata.name" {
				v = name
			}
			switch {
			case len(r.Values) != 1:
				valid = false
			case r.Operator == corev1.NodeSelectorOpIn:
				holds = holds && v == r.Values[0]
			case r.Operator == corev1.NodeSelectorOpNotIn:
				holds = holds && v != r.Values[0]
			default:
				valid = false
			}
		}
		if valid && holds {
			return true
		}
	}
	return false
}

type oPod struct{ ps PodSet }

func oNeed(ps PodSet, g *oGPU) int64 {
	if ps.MemoryMiB > 0 {
		return ps.MemoryMiB
	}
	return max(1, g.alloc*int64(ps.MemoryPercent)/100)
}

func oCanHost(ps PodSet, g *oGPU) bool {
	if !g.healthy {
		return false
	}
	if ps.Exclusive() {
		return g.holders == 0
	}
	return !g.excl && g.alloc-g.used >= oNeed(ps, g) && 100-int64(g.cores) >= int64(ps.Cores)
}

func oSolve(nodes []*oNode, pods []oPod) bool {
	if len(pods) == 0 {
		return true
	}
	ps := pods[0].ps
	for _, n := range nodes {
		if !n.usable {
			continue
		}
		match := true
		for k, v := range ps.NodeSelector {
			if n.labels[k] != v {
				match = false
			}
		}
		if !match || !oAffinity(ps.NodeAffinity, n.name, n.labels) || !oTolerates(n.taints, ps.Tolerations) || !oAntiOK(ps, n) {
			continue
		}
		// every subset of size g
		var rec func(start int, chosen []*oGPU) bool
		rec = func(start int, chosen []*oGPU) bool {
			if len(chosen) == ps.GPUsPerPod {
				var undo []func()
				for _, g := range chosen {
					g := g
					if ps.Exclusive() {
						g.holders++
						g.excl = true
						undo = append(undo, func() { g.holders--; g.excl = false })
					} else {
						need := oNeed(ps, g)
						g.used += need
						g.cores += ps.Cores
						g.holders++
						undo = append(undo, func() { g.used -= need; g.cores -= ps.Cores; g.holders-- })
					}
				}
				n.podSets = append(n.podSets, ps)
				ok := oSolve(nodes, pods[1:])
				n.podSets = n.podSets[:len(n.podSets)-1]
				for _, u := range undo {
					u()
				}
				return ok
			}
			for i := start; i < len(n.gpus); i++ {
				if oCanHost(ps, n.gpus[i]) && rec(i+1, append(chosen, n.gpus[i])) {
					return true
				}
			}
			return false
		}
		if rec(0, nil) {
			return true
		}
	}
	return false
}

// oracleFits builds the oracle's own state from the inputs and tries every
// domain.
func oracleFits(nodes []Node, usage []Usage, g Gang, level string) bool {
	byUUID := map[string]*oGPU{}
	domains := map[string][]*oNode{}
	for _, n := range nodes {
		on := &oNode{name: n.Name, labels: n.Labels, taints: n.Taints, usable: n.Ready && !n.Unschedulable}
		for _, x := range n.GPUs {
			og := &oGPU{uuid: x.UUID, phys: x.PhysicalMiB, alloc: x.AllocatableMiB, healthy: x.Healthy}
			byUUID[x.UUID] = og
			on.gpus = append(on.gpus, og)
		}
		key := ""
		if level != "" {
			v, ok := n.Labels[level]
			if !ok {
				continue
			}
			key = v
		}
		domains[key] = append(domains[key], on)
	}
	for _, u := range usage {
		og := byUUID[u.UUID]
		og.used += u.MemoryMiB
		og.cores += u.Cores
		og.holders++
		if u.Exclusive {
			og.excl = true
		}
	}
	var pods []oPod
	for _, ps := range g.PodSets {
		for i := 0; i < ps.Count; i++ {
			pods = append(pods, oPod{ps})
		}
	}
	if len(pods) == 0 {
		return true // nothing to place
	}
	for _, dn := range domains {
		if oSolve(dn, pods) {
			return true
		}
	}
	return false
}

// checkPlan verifies a plan against the rules, independently of the engine.
func checkPlan(nodes []Node, usage []Usage, g Gang, level string, res Result) error {
	type st struct {
		node        string
		phys, alloc int64
		healthy     bool
		used        int64
		cores       int32
		holders     int
		excl        bool
	}
	gpus := map[string]*st{}
	nodeBy := map[string]Node{}
	for _, n := range nodes {
		nodeBy[n.Name] = n
		for _, x := range n.GPUs {
			gpus[x.UUID] = &st{node: n.Name, phys: x.PhysicalMiB, alloc: x.AllocatableMiB, healthy: x.Healthy}
		}
	}
	for _, u := range usage {
		s := gpus[u.UUID]
		s.used += u.MemoryMiB
		s.cores += u.Cores
		s.holders++
		s.excl = s.excl || u.Exclusive
	}
	psBy := map[string]PodSet{}
	seen := map[string]bool{}
	onNode := map[string][]PodSet{}
	for _, ps := range g.PodSets {
		psBy[ps.Name] = ps
	}
	for _, a := range res.Assignments {
		ps, ok := psBy[a.PodSet]
		if !ok || a.Index < 0 || a.Index >= ps.Count {
			return fmt.Errorf("assignment %s/%d not in the gang", a.PodSet, a.Index)
		}
		key := fmt.Sprintf("%s/%d", a.PodSet, a.Index)
		if seen[key] {
			return fmt.Errorf("pod %s assigned twice", key)
		}
		seen[key] = true
		n := nodeBy[a.Node]
		if !n.Ready || n.Unschedulable {
			return fmt.Errorf("pod %s on unusable node %s", key, a.Node)
		}
		if level != "" && n.Labels[level] != res.Domain {
			return fmt.Errorf("pod %s on node %s outside domain %s", key, a.Node, res.Domain)
		}
		if level != "" {
			if _, ok := n.Labels[level]; !ok {
				return fmt.Errorf("pod %s on node %s without level label", key, a.Node)
			}
		}
		for k, v := range ps.NodeSelector {
			if n.Labels[k] != v {
				return fmt.Errorf("pod %s on node %s breaks nodeSelector", key, a.Node)
			}
		}
		if !oAffinity(ps.NodeAffinity, n.Name, n.Labels) {
			return fmt.Errorf("pod %s on node %s breaks its required node affinity", key, a.Node)
		}
		if !oTolerates(n.Taints, ps.Tolerations) {
			return fmt.Errorf("pod %s on tainted node %s", key, a.Node)
		}
		if slices.Contains(ps.AvoidNodes, a.Node) {
			return fmt.Errorf("pod %s on node %s, which its pod set avoids", key, a.Node)
		}
		for _, o := range onNode[a.Node] {
			if oApart(ps, o) {
				return fmt.Errorf("pod %s on node %s beside a pod of %s, which it is kept apart from", key, a.Node, o.Name)
			}
		}
		onNode[a.Node] = append(onNode[a.Node], ps)
		if len(a.GPUs) != ps.GPUsPerPod {
			return fmt.Errorf("pod %s got %d GPUs, want %d", key, len(a.GPUs), ps.GPUsPerPod)
		}
		mine := map[string]bool{}
		for _, u := range a.GPUs {
			s, ok := gpus[u.UUID]
			if !ok || s.node != a.Node || !s.healthy || mine[u.UUID] {
				return fmt.Errorf("pod %s: bad GPU %s", key, u.UUID)
			}
			mine[u.UUID] = true
			if ps.Exclusive() {
				if s.holders != 0 || !u.Exclusive || u.MemoryMiB != s.alloc || u.Cores != 100 {
					return fmt.Errorf("pod %s: exclusive GPU %s not whole or badly recorded (%+v)", key, u.UUID, u)
				}
				s.excl = true
			} else {
				need := ps.MemoryMiB
				if need == 0 {
					need = max(1, s.alloc*int64(ps.MemoryPercent)/100)
				}
				if s.excl || u.MemoryMiB != need || u.Cores != ps.Cores {
					return fmt.Errorf("pod %s: GPU %s usage %+v, want %d MiB", key, u.UUID, u, need)
				}
			}
			s.used += u.MemoryMiB
			s.cores += u.Cores
			s.holders++
			if s.used > s.alloc || s.cores > 100 {
				return fmt.Errorf("GPU %s overcommitted: %d/%d MiB, %d%% cores", u.UUID, s.used, s.alloc, s.cores)
			}
		}
	}
	if len(seen) != g.Pods() {
		return fmt.Errorf("%d pods assigned, gang has %d", len(seen), g.Pods())
	}
	return nil
}

func randomCase(rng *rand.Rand) ([]Node, []Usage, Gang, string) {
	physes := []int64{1000, 2000, 3000}
	var nodes []Node
	var usage []Usage
	nn := 1 + rng.IntN(4)
	for i := 0; i < nn; i++ {
		n := Node{Name: fmt.Sprintf("n%d", i), Ready: rng.IntN(10) > 0, Unschedulable: rng.IntN(20) == 0,
			Labels: map[string]string{}}
		if rng.IntN(6) > 0 {
			n.Labels["rack"] = []string{"a", "b"}[rng.IntN(2)]
		}
		if rng.IntN(3) == 0 {
			n.Labels["pool"] = "x"
		}
		if rng.IntN(4) > 0 {
			n.Labels["gen"] = fmt.Sprint(1 + rng.IntN(3))
		}
		if rng.IntN(5) == 0 {
			n.Taints = []corev1.Taint{{Key: "dedicated", Effect: []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute}[rng.IntN(3)]}}
		}
		ng := 1 + rng.IntN(3)
		for j := 0; j < ng; j++ {
			phys := physes[rng.IntN(len(physes))]
			g := GPU{UUID: fmt.Sprintf("n%d-g%d", i, j), Index: j, PhysicalMiB: phys, AllocatableMiB: phys * int64(70+rng.IntN(21)) / 100, Healthy: rng.IntN(12) > 0}
			n.GPUs = append(n.GPUs, g)
			switch rng.IntN(4) {
			case 0:
				usage = append(usage, Usage{UUID: g.UUID, MemoryMiB: g.AllocatableMiB, Cores: 100, Exclusive: true})
			case 1:
				for k := 0; k <= rng.IntN(2); k++ {
					usage = append(usage, Usage{UUID: g.UUID, MemoryMiB: int64(100 + rng.IntN(900)), Cores: int32(rng.IntN(3) * 25)})
				}
			}
		}
		nodes = append(nodes, n)
	}
	var gang Gang
	nps := 1 + rng.IntN(3)
	total := 0
	for i := 0; i < nps; i++ {
		ps := PodSet{Name: fmt.Sprintf("ps%d", i), Count: rng.IntN(3), GPUsPerPod: 1 + rng.IntN(2)}
		if total+ps.Count > 5 {
			ps.Count = 5 - total
		}
		total += ps.Count
		switch rng.IntN(5) {
		case 0, 1:
			// exclusive
		case 2:
			ps.MemoryPercent = int32(10 + rng.IntN(60))
		default:
			ps.MemoryMiB = int64(200 + rng.IntN(1300))
		}
		if !ps.Exclusive() && rng.IntN(3) == 0 {
			ps.Cores = int32(20 + rng.IntN(50))
		}
		if rng.IntN(6) == 0 {
			ps.NodeSelector = map[string]string{"pool": "x"}
		}
		if rng.IntN(3) == 0 {
			ps.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		}
		if rng.IntN(4) == 0 {
			ps.NodeAffinity = randomAffinity(rng)
		}
		// Sometimes a twin pod set, to exercise merging.
		gang.PodSets = append(gang.PodSets, ps)
		if rng.IntN(4) == 0 && total < 5 {
			twin := ps
			twin.Name += "-twin"
			twin.Count = 1
			total++
			gang.PodSets = append(gang.PodSets, twin)
		}
	}
	level := ""
	if rng.IntN(2) == 0 {
		level = "rack"
	}
	return nodes, usage, gang, level
}

// randomAffinity: one or two terms of one or two requirements over the
// labels and names randomCase gives nodes, now and then one that cannot be
// parsed (it matches nothing, and alone makes the request invalid).
func randomAffinity(rng *rand.Rand) *corev1.NodeSelector {
	reqs := []corev1.NodeSelectorRequirement{
		{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}},
		{Key: "rack", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"b"}},
		{Key: "pool", Operator: corev1.NodeSelectorOpExists},
		{Key: "pool", Operator: corev1.NodeSelectorOpDoesNotExist},
		{Key: "gen", Operator: corev1.NodeSelectorOpGt, Values: []string{"1"}},
		{Key: "gen", Operator: corev1.NodeSelectorOpLt, Values: []string{"3"}},
		{Key: "gen", Operator: corev1.NodeSelectorOpIn, Values: []string{"1", "3"}},
		{Key: "gen", Operator: corev1.NodeSelectorOpGt, Values: []string{"two"}},
	}
	fields := []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n0"}},
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1"}},
	}
	ns := &corev1.NodeSelector{}
	for range 1 + rng.IntN(2) {
		var t corev1.NodeSelectorTerm
		for range 1 + rng.IntN(2) {
			if rng.IntN(5) == 0 {
				t.MatchFields = append(t.MatchFields, fields[rng.IntN(len(fields))])
			} else {
				t.MatchExpressions = append(t.MatchExpressions, reqs[rng.IntN(len(reqs))])
			}
		}
		ns.NodeSelectorTerms = append(ns.NodeSelectorTerms, t)
	}
	return ns
}

func TestFitAgreesWithOracle(t *testing.T) {
	const cases = 6000
	fits, policies := 0, []string{v1alpha1.PolicyBestFit, v1alpha1.PolicyWorstFit}
	for seed := uint64(0); seed < cases; seed++ {
		rng := rand.New(rand.NewPCG(seed, 42))
		nodes, usage, gang, level := randomCase(rng)
		m := NewModel(nodes)
		// Build the level index before usage sometimes, so incremental
		// aggregate updates are exercised as well as fresh builds.
		if seed%2 == 0 {
			m.level(level)
		}
		for _, u := range usage {
			if err := m.Use(u); err != nil {
				t.Fatal(err)
			}
		}
		o := Options{Level: level, Policy: policies[seed%2], Levels: []string{"rack", "pool"}}
		before := m.Clone()
		res := m.Fit(gang, o)
		if d := cmp.Diff(before.gpus, m.gpus, cmp.AllowUnexported(gpuState{})); d != "" {
			t.Fatalf("seed %d: Fit changed GPU usage:\n%s", seed, d)
		}
		want := oracleFits(nodes, usage, gang, level)
		if res.Exhausted {
			t.Fatalf("seed %d: search exhausted on a tiny case", seed)
		}
		if res.Fits != want {
			t.Fatalf("seed %d: Fit = %v, oracle = %v\nnodes=%+v\nusage=%+v\ngang=%+v\nlevel=%q\nreasons=%v", seed, res.Fits, want, nodes, usage, gang, level, res.Reasons)
		}
		if res.Fits {
			fits++
			if err := checkPlan(nodes, usage, gang, level, res); err != nil {
				t.Fatalf("seed %d: invalid plan: %v\n%+v", seed, err, res.Assignments)
			}
		} else if len(res.Reasons) == 0 {
			t.Fatalf("seed %d: no reasons for not fitting", seed)
		}
	}
	// The generator must exercise both answers.
	if fits < cases/5 || fits > cases*4/5 {
		t.Errorf("%d of %d cases fit: generator is lopsided", fits, cases)
	}
	t.Logf("%d of %d random cases fit", fits, cases)
}

// randomTightCase: mixed shared gangs packed tightly onto few GPUs, where a
// greedy placement often fails and the search has to backtrack.
func randomTightCase(rng *rand.Rand) ([]Node, []Usage, Gang, string) {
	var nodes []Node
	var usage []Usage
	for i := 0; i < 1+rng.IntN(3); i++ {
		n := Node{Name: fmt.Sprintf("n%d", i), Ready: true, Labels: map[string]string{"rack": "a"}}
		for j := 0; j < 1+rng.IntN(3); j++ {
			g := GPU{UUID: fmt.Sprintf("n%d-g%d", i, j), PhysicalMiB: 1000, AllocatableMiB: 900, Healthy: true}
			n.GPUs = append(n.GPUs, g)
			if rng.IntN(2) == 0 {
				usage = append(usage, Usage{UUID: g.UUID, MemoryMiB: int64(100 * rng.IntN(6)), Cores: int32(10 * rng.IntN(5))})
			}
		}
		nodes = append(nodes, n)
	}
	var gang Gang
	total := 0
	for k := 0; k < 2+rng.IntN(2) && total < 6; k++ {
		ps := PodSet{Name: fmt.Sprintf("ps%d", k), Count: 1 + rng.IntN(2), GPUsPerPod: 1 + rng.IntN(2),
			MemoryMiB: int64(100 * (1 + rng.IntN(6)))}
		if rng.IntN(3) == 0 {
			ps.Cores = int32(10 * (1 + rng.IntN(6)))
		}
		if rng.IntN(5) == 0 {
			ps.MemoryMiB = 0 // whole GPUs among the shares
		}
		ps.Count = min(ps.Count, 6-total)
		total += ps.Count
		gang.PodSets = append(gang.PodSets, ps)
	}
	return nodes, usage, gang, ""
}

func TestFitAgreesWithOracleOnTightMixedGangs(t *testing.T) {
	const cases = 4000
	fits := 0
	for seed := uint64(0); seed < cases; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		nodes, usage, gang, level := randomTightCase(rng)
		m := NewModel(nodes)
		for _, u := range usage {
			if err := m.Use(u); err != nil {
				t.Fatal(err)
			}
		}
		res := m.Fit(gang, Options{Level: level, Policy: []string{v1alpha1.PolicyBestFit, v1alpha1.PolicyWorstFit}[seed%2]})
		want := oracleFits(nodes, usage, gang, level)
		if res.Exhausted || res.Fits != want {
			t.Fatalf("seed %d: Fit = %v (exhausted %v), oracle = %v\nnodes=%+v\nusage=%+v\ngang=%+v\nreasons=%v", seed, res.Fits, res.Exhausted, want, nodes, usage, gang, res.Reasons)
		}
		if res.Fits {
			fits++
			if err := checkPlan(nodes, usage, gang, level, res); err != nil {
				t.Fatalf("seed %d: invalid plan: %v", seed, err)
			}
		}
	}
	if fits < cases/5 || fits > cases*4/5 {
		t.Errorf("%d of %d cases fit: generator is lopsided", fits, cases)
	}
	t.Logf("%d of %d tight mixed cases fit", fits, cases)
}

// withAntiAffinity decorates a random gang with pod anti-affinity: pod sets
// kept apart from themselves and from each other, and nodes avoided.
func withAntiAffinity(rng *rand.Rand, nodes []Node, g Gang) Gang {
	for i := range g.PodSets {
		ps := &g.PodSets[i]
		ps.Apart, ps.AvoidNodes = nil, nil
		for _, o := range g.PodSets {
			if rng.IntN(4) == 0 {
				ps.Apart = append(ps.Apart, o.Name)
			}
		}
		if rng.IntN(3) == 0 {
			ps.Apart = append(ps.Apart, ps.Name) // one pod per node, the common case
		}
		for _, n := range nodes {
			if rng.IntN(6) == 0 {
				ps.AvoidNodes = append(ps.AvoidNodes, n.Name)
			}
		}
		// A twin is often kept apart alike, so that it merges.
		if strings.HasSuffix(ps.Name, "-twin") && rng.IntN(2) == 0 {
			orig := g.PodSets[i-1]
			ps.Apart, ps.AvoidNodes = nil, slices.Clone(orig.AvoidNodes)
			for _, a := range orig.Apart {
				ps.Apart = append(ps.Apart, a)
				if a == orig.Name {
					ps.Apart = append(ps.Apart, ps.Name)
				}
			}
			if slices.Contains(orig.Apart, orig.Name) {
				ps.Apart = append(ps.Apart, orig.Name)
				g.PodSets[i-1].Apart = append(g.PodSets[i-1].Apart, ps.Name)
			}
		}
	}
	return g
}

// TestFitAgreesWithOracleUnderAntiAffinity: the random cases of
// TestFitAgreesWithOracle and of the tight mixed gangs, with pod
// anti-affinity on top (pod sets kept apart from themselves and each
// other, nodes avoided), against the oracle.
func TestFitAgreesWithOracleUnderAntiAffinity(t *testing.T) {
	const cases = 4000
	fits, policies := 0, []string{v1alpha1.PolicyBestFit, v1alpha1.PolicyWorstFit}
	for seed := uint64(0); seed < cases; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1717))
		var (
			nodes []Node
			usage []Usage
			gang  Gang
			level string
		)
		if seed%4 == 3 {
			nodes, usage, gang, level = randomTightCase(rng)
		} else {
			nodes, usage, gang, level = randomCase(rng)
		}
		gang = withAntiAffinity(rng, nodes, gang)
		m := NewModel(nodes)
		for _, u := range usage {
			if err := m.Use(u); err != nil {
				t.Fatal(err)
			}
		}
		before := m.Clone()
		res := m.Fit(gang, Options{Level: level, Policy: policies[seed%2], Levels: []string{"rack", "pool"}})
		if d := cmp.Diff(before.gpus, m.gpus, cmp.AllowUnexported(gpuState{})); d != "" {
			t.Fatalf("seed %d: Fit changed GPU usage:\n%s", seed, d)
		}
		want := oracleFits(nodes, usage, gang, level)
		if res.Exhausted || res.Fits != want {
			t.Fatalf("seed %d: Fit = %v (exhausted %v), oracle = %v\nnodes=%+v\nusage=%+v\ngang=%+v\nlevel=%q\nreasons=%v", seed, res.Fits, res.Exhausted, want, nodes, usage, gang, level, res.Reasons)
		}
		if res.Fits {
			fits++
			if err := checkPlan(nodes, usage, gang, level, res); err != nil {
				t.Fatalf("seed %d: invalid plan: %v\n%+v", seed, err, res.Assignments)
			}
		} else if len(res.Reasons) == 0 {
			t.Fatalf("seed %d: no reasons for not fitting", seed)
		}
	}
	if fits < cases/5 || fits > cases*4/5 {
		t.Errorf("%d of %d cases fit: generator is lopsided", fits, cases)
	}
	t.Logf("%d of %d random cases with pod anti-affinity fit", fits, cases)
}
