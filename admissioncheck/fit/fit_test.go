package fit

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

const gi80 = 81920 // an 80 GiB card, as NVML reports A100-80GB

// mkNode builds a Ready node of n identical healthy GPUs named <name>-g<i>.
func mkNode(name string, n int, physMiB int64, labels ...string) Node {
	nd := Node{Name: name, Ready: true, Labels: map[string]string{}}
	for i := 0; i+1 < len(labels); i += 2 {
		nd.Labels[labels[i]] = labels[i+1]
	}
	for i := 0; i < n; i++ {
		nd.GPUs = append(nd.GPUs, GPU{UUID: fmt.Sprintf("%s-g%d", name, i), Index: i, Model: "test",
			PhysicalMiB: physMiB, AllocatableMiB: flavors.Allocatable(physMiB), Healthy: true})
	}
	return nd
}

func whole(name string, count, gpus int) PodSet {
	return PodSet{Name: name, Count: count, GPUsPerPod: gpus}
}

func shared(name string, count, gpus int, mib int64) PodSet {
	return PodSet{Name: name, Count: count, GPUsPerPod: gpus, MemoryMiB: mib}
}

func gang(ps ...PodSet) Gang { return Gang{PodSets: ps} }

func modelWith(t *testing.T, nodes []Node, usage ...Usage) *Model {
	t.Helper()
	m := NewModel(nodes)
	for _, u := range usage {
		if err := m.Use(u); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func exclusiveUse(uuid string) Usage {
	return Usage{UUID: uuid, MemoryMiB: flavors.Allocatable(gi80), Cores: 100, Exclusive: true}
}

// nodesOf returns the distinct nodes of a plan.
func nodesOf(r Result) []string {
	seen := map[string]bool{}
	var out []string
	for _, a := range r.Assignments {
		if !seen[a.Node] {
			seen[a.Node] = true
			out = append(out, a.Node)
		}
	}
	return out
}

func TestFitDecisions(t *testing.T) {
	eightGPUs := []Node{mkNode("n1", 8, gi80)}
	twoByFour := []Node{mkNode("a", 4, gi80), mkNode("b", 4, gi80)}
	var allBusy []Usage
	for i := 0; i < 8; i++ {
		allBusy = append(allBusy, exclusiveUse(fmt.Sprintf("n1-g%d", i)))
	}
	tainted := mkNode("t", 2, gi80)
	tainted.Taints = []corev1.Taint{{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule}}
	notReady := mkNode("nr", 8, gi80)
	notReady.Ready = false
	cordoned := mkNode("c", 8, gi80)
	cordoned.Unschedulable = true
	sick := mkNode("s", 2, gi80)
	sick.GPUs[1].Healthy = false

	cases := []struct {
		name      string
		nodes     []Node
		usage     []Usage
		gang      Gang
		opts      Options
		wantFits  bool
		wantNodes []string
		wantWhy   []string // substrings of Reasons, in order
	}{
		{
			name: "8 x 1 GPU on one 8-GPU node", nodes: eightGPUs,
			gang: gang(whole("worker", 8, 1)), wantFits: true, wantNodes: []string{"n1"},
		},
		{
			name: "second 8 x 1 GPU gang while the first holds every GPU", nodes: eightGPUs, usage: allBusy,
			gang:    gang(whole("worker", 8, 1)),
			wantWhy: []string{"cluster: 0 of 8 pods fit; binding constraint: only 0 whole GPUs are free (need 8 for pod set worker)"},
		},
		{
			name: "8 x 1 GPU on 2 nodes x 4", nodes: twoByFour,
			gang: gang(whole("master", 1, 1), whole("worker", 7, 1)), wantFits: true, wantNodes: []string{"a", "b"},
		},
		{
			name: "one 8-GPU pod cannot span 2 nodes x 4", nodes: twoByFour,
			gang:    gang(whole("worker", 1, 8)),
			wantWhy: []string{"cluster: 0 of 1 pods fit; binding constraint: only 0 nodes have 8 whole GPUs free (each pod needs 8 GPUs on one node; 8 whole GPUs are free in all)"},
		},
		{
			name: "3 x 50 GiB on 2 x 80 GiB does not fit", nodes: []Node{mkNode("n", 2, gi80)},
			gang:    gang(shared("worker", 3, 1, 51200)),
			wantWhy: []string{"cluster: 2 of 3 pods fit; binding constraint: only 2 GPUs have 51200 MiB free (need 51200 MiB per GPU on 3 GPUs)"},
		},
		{
			name: "3 x 30 GiB on 2 x 80 GiB fits", nodes: []Node{mkNode("n", 2, gi80)},
			gang: gang(shared("worker", 3, 1, 30720)), wantFits: true, wantNodes: []string{"n"},
		},
		{
			name: "memory above allocatable never fits, even on an idle GPU", nodes: []Node{mkNode("n", 1, gi80)},
			gang:    gang(shared("w", 1, 1, flavors.Allocatable(gi80)+1)),
			wantWhy: []string{"only 0 GPUs have 72229 MiB free (need 72229 MiB per GPU on 1 GPU)"},
		},
		{
			name: "exactly allocatable fits", nodes: []Node{mkNode("n", 1, gi80)},
			gang: gang(shared("w", 1, 1, flavors.Allocatable(gi80))), wantFits: true, wantNodes: []string{"n"},
		},
		{
			name: "shared pods cannot go on an exclusively held GPU", nodes: []Node{mkNode("n", 1, gi80)},
			usage: []Usage{exclusiveUse("n-g0")}, gang: gang(shared("w", 1, 1, 10)),
			wantWhy: []string{"only 0 GPUs have 10 MiB free"},
		},
		{
			name: "exclusive needs a GPU with no usage at all", nodes: []Node{mkNode("n", 1, gi80)},
			usage: []Usage{{UUID: "n-g0", MemoryMiB: 1}}, gang: gang(whole("w", 1, 1)),
			wantWhy: []string{"only 0 whole GPUs are free"},
		},
		{
			name: "cores cap sharing at 100 %", nodes: []Node{mkNode("n", 1, gi80)},
			usage:   []Usage{{UUID: "n-g0", MemoryMiB: 1000, Cores: 60}},
			gang:    gang(PodSet{Name: "w", Count: 1, GPUsPerPod: 1, MemoryMiB: 1000, Cores: 50}),
			wantWhy: []string{"only 0 GPUs have 50% SM free (need 50% per GPU on 1 GPU for pod set w)"},
		},
		{
			// As the webhook reads it: a share of allocatable, so 100 % is the
			// whole allocatable and two halves fill a GPU exactly.
			name: "memory percentage is a share of allocatable", nodes: []Node{mkNode("n", 1, gi80)},
			gang: gang(PodSet{Name: "w", Count: 2, GPUsPerPod: 1, MemoryPercent: 50}), wantFits: true,
		},
		{
			name: "two memory-percentage shares above allocatable", nodes: []Node{mkNode("n", 1, gi80)},
			gang:    gang(PodSet{Name: "w", Count: 2, GPUsPerPod: 1, MemoryPercent: 51}),
			wantWhy: []string{"cluster: 1 of 2 pods fit"},
		},
		{
			name: "100 % is the whole allocatable", nodes: []Node{mkNode("n", 1, gi80)},
			usage:   []Usage{{UUID: "n-g0", MemoryMiB: 1, Cores: 0}},
			gang:    gang(PodSet{Name: "w", Count: 1, GPUsPerPod: 1, MemoryPercent: 100}),
			wantWhy: []string{"only 0 GPUs have 100% of memory free"},
		},
		{
			name:  "NotReady, cordoned, tainted nodes and unhealthy GPUs are excluded",
			nodes: []Node{notReady, cordoned, tainted, sick},
			gang:  gang(whole("w", 2, 1)),
			wantWhy: []string{"cluster: 1 of 2 pods fit; binding constraint: only 1 whole GPU is free (need 2 for pod set w)",
				"excluded: 1 node NotReady, 1 node unschedulable, 1 unhealthy GPU"},
		},
		{
			name: "a toleration opens the tainted node", nodes: []Node{notReady, cordoned, tainted, sick},
			gang:     gang(PodSet{Name: "w", Count: 3, GPUsPerPod: 1, Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}}),
			wantFits: true, wantNodes: []string{"s", "t"},
		},
		{
			name: "nodeSelector is respected", nodes: []Node{mkNode("x", 8, gi80), mkNode("y", 1, gi80, "pool", "a")},
			gang:    gang(PodSet{Name: "w", Count: 2, GPUsPerPod: 1, NodeSelector: map[string]string{"pool": "a"}}),
			wantWhy: []string{"only 1 whole GPU is free (need 2 for pod set w)"},
		},
		{
			name: "no node matches at all", nodes: []Node{mkNode("x", 8, gi80), tainted},
			gang:    gang(PodSet{Name: "w", Count: 1, GPUsPerPod: 1, NodeSelector: map[string]string{"pool": "a"}}),
			wantWhy: []string{"no node can take pod set w: 2 nodes do not match its nodeSelector map[pool:a]"},
		},
		{
			name: "16 pods must stay in one rack",
			nodes: func() []Node {
				var ns []Node
				for i := 0; i < 10; i++ {
					ns = append(ns, mkNode(fmt.Sprintf("a%d", i), 1, gi80, "rack", "rack-a"))
				}
				for i := 0; i < 20; i++ {
					ns = append(ns, mkNode(fmt.Sprintf("b%02d", i), 1, gi80, "rack", "rack-b"))
				}
				return ns
			}(),
			gang: gang(whole("w", 16, 1)), opts: Options{Level: "rack"}, wantFits: true,
		},
		{
			name: "nodes without the level label are in no domain", nodes: []Node{mkNode("x", 8, gi80), mkNode("y", 1, gi80, "rack", "r1")},
			gang: gang(whole("w", 2, 1)), opts: Options{Level: "rack"},
			wantWhy: []string{"domain r1: 1 of 2 pods fit", "1 node has no rack label and is in no domain"},
		},
		{
			name: "two pod sets fit alone but not together", nodes: []Node{mkNode("n", 2, gi80)},
			gang:    gang(shared("a", 2, 1, 40000), shared("b", 2, 1, 33000)),
			wantWhy: []string{"cluster: 3 of 4 pods fit; binding constraint: pod sets a, b need 146000 MiB of GPU memory together; only 144456 MiB is free on GPUs with at least 33000 MiB free"},
		},
		{
			name: "two pod sets that share GPUs exactly", nodes: []Node{mkNode("n", 2, gi80)},
			gang: gang(shared("a", 2, 1, 40000), shared("b", 2, 1, 32228)), wantFits: true,
		},
		{
			name: "invalid gang", nodes: eightGPUs, gang: gang(PodSet{Name: "w", Count: 1, GPUsPerPod: 0}),
			wantWhy: []string{"invalid request: pod set \"w\": 0 GPUs per pod, want ≥ 1"},
		},
		{
			name: "no GPU pods at all", nodes: eightGPUs, gang: gang(PodSet{Name: "w", Count: 0, GPUsPerPod: 1}),
			wantFits: true, wantWhy: []string{"the workload requests no GPUs"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := modelWith(t, tc.nodes, tc.usage...)
			res := m.Fit(tc.gang, tc.opts)
			if res.Fits != tc.wantFits {
				t.Fatalf("Fits = %v, want %v; reasons: %q", res.Fits, tc.wantFits, res.Reasons)
			}
			if res.Fits {
				if err := checkPlan(tc.nodes, tc.usage, tc.gang, tc.opts.Level, res); err != nil {
					t.Fatalf("invalid plan: %v", err)
				}
			}
			if tc.wantNodes != nil {
				if d := cmp.Diff(tc.wantNodes, nodesOf(res)); d != "" {
					t.Errorf("nodes (-want +got):\n%s", d)
				}
			}
			all := strings.Join(res.Reasons, "\n")
			pos := 0
			for _, w := range tc.wantWhy {
				i := strings.Index(all[pos:], w)
				if i < 0 {
					t.Fatalf("reasons lack %q (in order); got:\n%s", w, all)
				}
				pos += i + len(w)
			}
		})
	}
}

func TestRackGangStaysInOneRack(t *testing.T) {
	var ns []Node
	for i := 0; i < 10; i++ {
		ns = append(ns, mkNode(fmt.Sprintf("a%d", i), 2, gi80, "rack", "rack-a", "leaf", fmt.Sprint(i%2)))
	}
	for i := 0; i < 12; i++ {
		ns = append(ns, mkNode(fmt.Sprintf("b%d", i), 2, gi80, "rack", "rack-b", "leaf", fmt.Sprint(i%3)))
	}
	m := NewModel(ns)
	for _, pol := range []string{v1alpha1.PolicyBestFit, v1alpha1.PolicyWorstFit} {
		res := m.Fit(gang(whole("w", 16, 1)), Options{Level: "rack", Levels: []string{"rack", "leaf"}, Policy: pol})
		if !res.Fits {
			t.Fatalf("%s: does not fit: %v", pol, res.Reasons)
		}
		want := map[string]string{v1alpha1.PolicyBestFit: "rack-a", v1alpha1.PolicyWorstFit: "rack-b"}[pol]
		if res.Domain != want || res.Level != "rack" {
			t.Errorf("%s: domain %s=%s, want rack=%s", pol, res.Level, res.Domain, want)
		}
		for _, a := range res.Assignments {
			if !strings.HasPrefix(a.Node, want[len(want)-1:]) {
				t.Errorf("%s: pod %d on %s outside %s", pol, a.Index, a.Node, want)
			}
		}
		if err := checkPlan(ns, nil, gang(whole("w", 16, 1)), "rack", res); err != nil {
			t.Error(err)
		}
	}
	// Sub-level locality: BestFit fills rack-a leaf 0 before leaf 1.
	res := m.Fit(gang(whole("w", 10, 1)), Options{Level: "rack", Levels: []string{"rack", "leaf"}})
	leaf0 := 0
	for _, a := range res.Assignments[:10] {
		var idx int
		fmt.Sscanf(a.Node, "a%d", &idx)
		if idx%2 == 0 {
			leaf0++
		}
	}
	if leaf0 != 10 {
		t.Errorf("%d of 10 pods in leaf 0, want all (leaf 0 has exactly 10 GPUs)", leaf0)
	}
}

func TestSearchBudget(t *testing.T) {
	// Two different pod sets force the search; a budget of one step cannot
	// place the first set's two pods.
	ns := []Node{mkNode("a", 2, gi80), mkNode("b", 2, gi80)}
	g := gang(whole("big", 2, 1), shared("small", 2, 1, 1000))
	res := NewModel(ns).Fit(g, Options{MaxSteps: 1})
	if res.Fits || !res.Exhausted {
		t.Fatalf("Fits=%v Exhausted=%v, want a stopped search", res.Fits, res.Exhausted)
	}
	if !strings.Contains(strings.Join(res.Reasons, "\n"), "search.maxSteps") {
		t.Errorf("reasons do not name the bound: %q", res.Reasons)
	}
	if res := NewModel(ns).Fit(g, Options{}); !res.Fits {
		t.Errorf("with the default budget: %v", res.Reasons)
	}
}

func TestMaxDomains(t *testing.T) {
	ns := []Node{mkNode("a", 1, gi80, "rack", "a"), mkNode("b", 1, gi80, "rack", "b")}
	m := modelWith(t, ns, Usage{UUID: "a-g0", MemoryMiB: 70000})
	// Domain a sorts first under BestFit (less free). A memory-percentage
	// request passes the aggregates there, so only the dry run rules a out,
	// and with one dry run allowed b is never tried.
	res := m.Fit(gang(PodSet{Name: "w", Count: 1, GPUsPerPod: 1, MemoryPercent: 50}), Options{Level: "rack", MaxDomains: 1})
	if res.Fits {
		t.Fatalf("fits with one dry run, want the budget to stop at domain a: %+v", res)
	}
	if !strings.Contains(strings.Join(res.Reasons, "\n"), "search.maxDomains") {
		t.Errorf("reasons do not name the bound: %q", res.Reasons)
	}
	if res := m.Fit(gang(PodSet{Name: "w", Count: 1, GPUsPerPod: 1, MemoryPercent: 50}), Options{Level: "rack"}); !res.Fits || res.Domain != "b" {
		t.Errorf("default bound: fits=%v domain=%q", res.Fits, res.Domain)
	}
}

func TestUseReleaseKeepAggregatesExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var ns []Node
	for i := 0; i < 12; i++ {
		n := mkNode(fmt.Sprintf("n%d", i), 1+rng.IntN(4), []int64{gi80, 40960}[rng.IntN(2)], "rack", fmt.Sprint(i%3))
		n.Ready = rng.IntN(8) > 0
		n.GPUs[0].Healthy = rng.IntN(5) > 0
		ns = append(ns, n)
	}
	m := NewModel(ns)
	m.level("rack")
	m.level("")
	var uuids []string
	for _, n := range ns {
		for _, g := range n.GPUs {
			uuids = append(uuids, g.UUID)
		}
	}
	var held []Usage
	for step := 0; step < 2000; step++ {
		if len(held) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(held))
			m.Release(held[i])
			held = append(held[:i], held[i+1:]...)
		} else {
			u := Usage{UUID: uuids[rng.IntN(len(uuids))], MemoryMiB: int64(rng.IntN(30000)), Cores: int32(rng.IntN(40)), Exclusive: rng.IntN(5) == 0}
			if err := m.Use(u); err != nil {
				t.Fatal(err)
			}
			held = append(held, u)
		}
		if step%97 != 0 {
			continue
		}
		c := m.Clone()
		fresh := NewModel(ns)
		for _, u := range held {
			_ = fresh.Use(u)
		}
		for _, key := range []string{"rack", ""} {
			for _, mm := range []*Model{m, c} {
				got, want := mm.level(key), fresh.level(key)
				if d := cmp.Diff(want.domains, got.domains, cmp.AllowUnexported(domainAgg{})); d != "" {
					t.Fatalf("step %d level %q: incremental aggregates differ from a rebuild (-want +got):\n%s", step, key, d)
				}
			}
		}
	}
	if err := m.Use(Usage{UUID: "nope"}); err == nil {
		t.Error("Use of an unknown GPU succeeded")
	}
}

func TestCloneIsIndependent(t *testing.T) {
	m := NewModel([]Node{mkNode("n", 1, gi80)})
	c := m.Clone()
	if err := c.Use(exclusiveUse("n-g0")); err != nil {
		t.Fatal(err)
	}
	if r := m.Fit(gang(whole("w", 1, 1)), Options{}); !r.Fits {
		t.Error("usage on the clone leaked into the original")
	}
	if r := c.Fit(gang(whole("w", 1, 1)), Options{}); r.Fits {
		t.Error("clone ignores its own usage")
	}
}

func TestFitDoesNotChangeUsage(t *testing.T) {
	m := NewModel([]Node{mkNode("n", 2, gi80)})
	for i := 0; i < 3; i++ {
		if r := m.Fit(gang(whole("w", 2, 1)), Options{}); !r.Fits {
			t.Fatalf("round %d: %v", i, r.Reasons)
		}
	}
	free, cores, holders, ok := m.GPUState("n-g1")
	if !ok || free != flavors.Allocatable(gi80) || cores != 100 || holders != 0 {
		t.Errorf("GPUState = %d %d %d %v after Fit", free, cores, holders, ok)
	}
}

func TestApplyingAPlanMakesTheSameGangNotFit(t *testing.T) {
	ns := []Node{mkNode("a", 4, gi80), mkNode("b", 4, gi80)}
	m := NewModel(ns)
	g := gang(whole("w", 6, 1))
	r := m.Fit(g, Options{})
	if !r.Fits {
		t.Fatal(r.Reasons)
	}
	for _, a := range r.Assignments {
		for _, u := range a.GPUs {
			if err := m.Use(u); err != nil {
				t.Fatal(err)
			}
		}
	}
	if r2 := m.Fit(g, Options{}); r2.Fits {
		t.Error("same GPUs planned twice")
	}
	if r3 := m.Fit(gang(whole("w", 2, 1)), Options{}); !r3.Fits {
		t.Errorf("the 2 GPUs left are not found: %v", r3.Reasons)
	}
}

func TestNever(t *testing.T) {
	ns := []Node{mkNode("a", 8, gi80, "rack", "r1"), mkNode("b", 8, gi80, "rack", "r2")}
	down := ns[1]
	down.Ready = false
	down.Taints = []corev1.Taint{{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute}}
	cases := []struct {
		name  string
		nodes []Node
		gang  Gang
		opts  Options
		never bool
		why   string
	}{
		{"fits now", ns, gang(whole("w", 8, 1)), Options{}, false, ""},
		{"16 GPUs per pod on 8-GPU nodes", ns, gang(whole("w", 1, 16)), Options{}, true, "only 0 nodes have 16 whole GPUs free"},
		{"more memory than allocatable", ns, gang(shared("w", 1, 1, gi80)), Options{}, true, "need 81920 MiB per GPU"},
		{"bigger than any rack", ns, gang(whole("w", 9, 1)), Options{Level: "rack"}, true, "8 of 9 pods fit"},
		{"fits the cluster though not a rack", ns, gang(whole("w", 9, 1)), Options{}, false, ""},
		{"a NotReady node may come back", []Node{ns[0], down}, gang(whole("w", 16, 1)), Options{}, false, ""},
		{"invalid request", ns, gang(whole("w", 1, 0)), Options{}, true, "invalid request"},
	}
	for _, tc := range cases {
		never, why := Never(tc.nodes, tc.gang, tc.opts)
		if never != tc.never || !strings.Contains(why, tc.why) {
			t.Errorf("%s: Never = %v %q, want %v %q", tc.name, never, why, tc.never, tc.why)
		}
	}
}

func TestPodCapMatchesBruteForce(t *testing.T) {
	// podCap must equal the most pods a greedy-by-brute-force assignment
	// can place: checked on every slot vector up to 4 GPUs × 3 slots.
	var rec func(slots []int64, g int) int64
	rec = func(slots []int64, g int) int64 {
		best := int64(0)
		// choose g distinct GPUs with slots > 0, recurse
		var pick func(start int, left int) bool
		var chosen []int
		pick = func(start, left int) bool {
			if left == 0 {
				for _, i := range chosen {
					slots[i]--
				}
				if v := 1 + rec(slots, g); v > best {
					best = v
				}
				for _, i := range chosen {
					slots[i]++
				}
				return false
			}
			for i := start; i < len(slots); i++ {
				if slots[i] > 0 {
					chosen = append(chosen, i)
					pick(i+1, left-1)
					chosen = chosen[:len(chosen)-1]
				}
			}
			return false
		}
		pick(0, g)
		return best
	}
	for n := 1; n <= 4; n++ {
		total := 1
		for i := 0; i < n; i++ {
			total *= 4
		}
		for code := 0; code < total; code++ {
			slots := make([]int64, n)
			c := code
			for i := range slots {
				slots[i] = int64(c % 4)
				c /= 4
			}
			for g := 1; g <= n; g++ {
				want := rec(append([]int64(nil), slots...), g)
				if got := podCap(slots, g, 1<<30); got != want {
					t.Fatalf("podCap(%v, g=%d) = %d, want %d", slots, g, got, want)
				}
			}
		}
	}
}

func TestHistogramBounds(t *testing.T) {
	prev := -1
	for f := int64(0); f < 1<<20; f += 1 + f/64 {
		b := histBucket(f)
		if b < prev || b >= histBuckets {
			t.Fatalf("bucket(%d) = %d not monotonic / in range", f, b)
		}
		if up := histUpper(b); up < f {
			t.Fatalf("histUpper(bucket(%d)=%d) = %d < %d", f, b, up, f)
		}
		if b > 0 && histUpper(b-1) >= f {
			t.Fatalf("bucket(%d) = %d but the previous bucket already reaches %d", f, b, histUpper(b-1))
		}
		prev = b
	}
}

func TestSubDomainLocality(t *testing.T) {
	// Leaves of one rack with 4, 16 and 9 free GPUs (one GPU per node).
	var ns []Node
	for leaf, n := range map[string]int{"a": 4, "b": 16, "c": 9} {
		for i := 0; i < n; i++ {
			ns = append(ns, mkNode(fmt.Sprintf("%s%02d", leaf, i), 1, gi80, "rack", "r", "leaf", leaf))
		}
	}
	m := NewModel(ns)
	o := Options{Level: "rack", Levels: []string{"rack", "leaf", "kubernetes.io/hostname"}}
	leaves := func(r Result) map[string]int {
		out := map[string]int{}
		for _, a := range r.Assignments {
			out[a.Node[:1]]++
		}
		return out
	}
	cases := []struct {
		name   string
		pods   int
		policy string
		want   map[string]int
	}{
		{"BestFit: the tightest leaf that holds the gang", 8, v1alpha1.PolicyBestFit, map[string]int{"c": 8}},
		{"WorstFit: the roomiest leaf that holds the gang", 8, v1alpha1.PolicyWorstFit, map[string]int{"b": 8}},
		{"too big for any leaf: as few leaves as possible", 20, v1alpha1.PolicyBestFit, map[string]int{"b": 16, "c": 4}},
	}
	for _, tc := range cases {
		o.Policy = tc.policy
		r := m.Fit(gang(whole("w", tc.pods, 1)), o)
		if !r.Fits {
			t.Fatalf("%s: %v", tc.name, r.Reasons)
		}
		if d := cmp.Diff(tc.want, leaves(r)); d != "" {
			t.Errorf("%s: pods per leaf (-want +got):\n%s", tc.name, d)
		}
	}
}

func TestSortKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	var tmp []uint64
	for _, n := range []int{0, 1, 5, 1023, 1024, 5000} {
		for _, mask := range []uint64{0xff, 0xffff_0000_0000, ^uint64(0)} {
			keys := make([]uint64, n)
			for i := range keys {
				keys[i] = rng.Uint64() & mask
			}
			want := append([]uint64(nil), keys...)
			slices.Sort(want)
			tmp = sortKeys(keys, tmp)
			if !slices.Equal(want, keys) {
				t.Fatalf("n=%d mask=%x: not sorted", n, mask)
			}
		}
	}
}

func TestNeverNeedsAProof(t *testing.T) {
	// Find small gangs that cannot fit an empty cluster but need the search
	// to show it; with a budget too small for the search Never must say
	// "not never", with the default it must say "never".
	found := 0
	for seed := uint64(0); seed < 3000 && found < 5; seed++ {
		nodes, _, g, _ := randomTightCase(rand.New(rand.NewPCG(seed, 7)))
		full := NewModel(nodes).Fit(g, Options{})
		tiny := NewModel(nodes).Fit(g, Options{MaxSteps: 1})
		if full.Fits || full.Exhausted || !tiny.Exhausted {
			continue
		}
		found++
		if never, why := Never(nodes, g, Options{MaxSteps: 1}); never {
			t.Errorf("seed %d: Never with an exhausted search = true (%s)", seed, why)
		}
		if never, _ := Never(nodes, g, Options{}); !never {
			t.Errorf("seed %d: Never with a complete search = false", seed)
		}
	}
	if found < 3 {
		t.Fatalf("only %d cases needing the search found", found)
	}
}
