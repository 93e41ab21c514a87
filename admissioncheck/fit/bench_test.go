package fit

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/flavors"
)

// fragmented builds nodes × 8 H100s in racks of 50 nodes, where each GPU is
// in use with probability ½ by one shared holder taking 10–90 % of its
// allocatable memory and 0–50 % of its SMs.
func fragmented(nodes int, seed uint64) (*Model, []Node) {
	rng := rand.New(rand.NewPCG(seed, 1))
	const phys = 81559
	alloc := flavors.Allocatable(phys)
	ns := make([]Node, nodes)
	for i := range ns {
		n := Node{Name: fmt.Sprintf("node-%05d", i), Ready: true, Labels: map[string]string{
			"rack": fmt.Sprintf("rack-%03d", i/50), "kubernetes.io/hostname": fmt.Sprintf("node-%05d", i)}}
		for j := 0; j < 8; j++ {
			n.GPUs = append(n.GPUs, GPU{UUID: fmt.Sprintf("GPU-%05d-%d", i, j), Index: j, Model: "NVIDIA H100 80GB HBM3",
				PhysicalMiB: phys, AllocatableMiB: alloc, Healthy: true})
		}
		ns[i] = n
	}
	m := NewModel(ns)
	for _, n := range ns {
		for _, g := range n.GPUs {
			if rng.IntN(2) == 0 {
				_ = m.Use(Usage{UUID: g.UUID, MemoryMiB: alloc * int64(10+rng.IntN(81)) / 100, Cores: int32(rng.IntN(51))})
			}
		}
	}
	return m, ns
}

// benchFit times each decision and reports p50/p99/max besides ns/op.
func benchFit(b *testing.B, m *Model, g Gang, o Options) {
	first := m.Fit(g, o) // builds the level index once, as a long-lived model would
	// Wall time per decision, and the CPU time of this thread (the decision
	// runs on it; GC workers on other threads are not counted).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var d, cpu []time.Duration
	b.ResetTimer()
	for b.Loop() {
		c0, t0 := threadCPU(), time.Now()
		r := m.Fit(g, o)
		d = append(d, time.Since(t0))
		cpu = append(cpu, threadCPU()-c0)
		if r.Fits != first.Fits {
			b.Fatal("decision changed between runs")
		}
	}
	b.StopTimer()
	report := func(d []time.Duration, prefix string) {
		slices.Sort(d)
		q := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) }
		b.ReportMetric(q(0.5), prefix+"p50-µs")
		b.ReportMetric(q(0.99), prefix+"p99-µs")
		b.ReportMetric(float64(d[len(d)-1].Microseconds()), prefix+"max-µs")
	}
	report(d, "")
	report(cpu, "cpu-")
	fits := 0.0
	if first.Fits {
		fits = 1
	}
	b.ReportMetric(fits, "fits")
}

type benchGang struct {
	name string
	g    Gang
}

func benchGangs() []benchGang {
	return []benchGang{
		{"64x1-whole", gang(whole("worker", 64, 1))},
		{"64x1-20GiB", gang(shared("worker", 64, 1, 20480))},
		{"16x8-whole", gang(whole("worker", 16, 8))},
		{"16x8-20GiB", gang(shared("worker", 16, 8, 20480))},
		{"mixed-1x8whole+16x8-20GiB", gang(whole("master", 1, 8), shared("worker", 16, 8, 20480))},
	}
}

func BenchmarkFit(b *testing.B) { benchFitSizes(b, benchGangs()) }

// BenchmarkFitAffinity is BenchmarkFit with a required node affinity on
// every pod set that every node is checked against (a rack NotIn and a
// hostname NotIn of ten nodes): the cost of evaluating it.
func BenchmarkFitAffinity(b *testing.B) {
	hosts := make([]string, 10)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("node-%05d", 7*i)
	}
	aff := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "rack", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"rack-999"}},
		{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: hosts},
	}}}}
	gangs := benchGangs()
	for _, bg := range gangs {
		for i := range bg.g.PodSets {
			bg.g.PodSets[i].NodeAffinity = aff
		}
	}
	benchFitSizes(b, gangs)
}

func benchFitSizes(b *testing.B, gangs []benchGang) {
	for _, size := range []struct {
		name  string
		nodes int
	}{{"10kGPU", 1250}, {"100kGPU", 12500}} {
		m, _ := fragmented(size.nodes, 1)
		for _, level := range []string{"", "rack"} {
			for _, gg := range gangs {
				lv := level
				if lv == "" {
					lv = "cluster"
				}
				b.Run(fmt.Sprintf("%s/%s/%s", size.name, lv, gg.name), func(b *testing.B) {
					benchFit(b, m, gg.g, Options{Level: level, Levels: []string{"rack", "kubernetes.io/hostname"}})
				})
			}
		}
	}
}

// BenchmarkUse is the cost of keeping the aggregates up to date.
func BenchmarkUse(b *testing.B) {
	m, ns := fragmented(1250, 2)
	m.Fit(gang(whole("w", 1, 1)), Options{Level: "rack"})
	m.Fit(gang(whole("w", 1, 1)), Options{})
	u := Usage{UUID: ns[7].GPUs[3].UUID, MemoryMiB: 1000, Cores: 10}
	for b.Loop() {
		_ = m.Use(u)
		m.Release(u)
	}
}

// BenchmarkClone is what a controller pays to evaluate on a private copy.
func BenchmarkClone(b *testing.B) {
	m, _ := fragmented(1250, 3)
	m.Fit(gang(whole("w", 1, 1)), Options{Level: "rack"})
	for b.Loop() {
		_ = m.Clone()
	}
}

// BenchmarkFitHard is a mixed gang in the zone where the aggregates pass but
// no placement is found: the search runs to search.maxSteps (default), so
// this is the worst-case latency of one domain.
func BenchmarkFitHard(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	var ns []Node
	for i := 0; i < 40; i++ {
		n := Node{Name: fmt.Sprintf("n%02d", i), Ready: true}
		for j := 0; j < 8; j++ {
			n.GPUs = append(n.GPUs, GPU{UUID: fmt.Sprintf("n%02d-%d", i, j), PhysicalMiB: 81920, AllocatableMiB: 72228, Healthy: true})
		}
		ns = append(ns, n)
	}
	m := NewModel(ns)
	for _, n := range ns {
		for _, g := range n.GPUs {
			_ = m.Use(Usage{UUID: g.UUID, MemoryMiB: int64(rng.IntN(40000))})
		}
	}
	g := gang(shared("a", 170, 2, 30000), shared("b", 170, 1, 25000), shared("c", 170, 1, 9000))
	if r := m.Fit(g, Options{}); r.Fits || !r.Exhausted {
		b.Fatalf("not the hard case any more: fits=%v exhausted=%v", r.Fits, r.Exhausted)
	}
	benchFit(b, m, g, Options{})
}

// BenchmarkFitCold is what a controller that rebuilds its model from the API
// on every decision pays: NewModel, every usage, then the first Fit (which
// builds the level index and node order).
func BenchmarkFitCold(b *testing.B) {
	for _, size := range []struct {
		name  string
		nodes int
	}{{"10kGPU", 1250}, {"100kGPU", 12500}} {
		_, ns := fragmented(size.nodes, 1)
		m0, _ := fragmented(size.nodes, 1)
		var usage []Usage
		for _, n := range ns {
			for _, g := range n.GPUs {
				if free, cores, _, _ := m0.GPUState(g.UUID); free < g.AllocatableMiB {
					usage = append(usage, Usage{UUID: g.UUID, MemoryMiB: g.AllocatableMiB - free, Cores: 100 - cores})
				}
			}
		}
		for _, level := range []string{"", "rack"} {
			b.Run(fmt.Sprintf("%s/%q/64x1-whole", size.name, level), func(b *testing.B) {
				for b.Loop() {
					m := NewModel(ns)
					for _, u := range usage {
						_ = m.Use(u)
					}
					if r := m.Fit(gang(whole("w", 64, 1)), Options{Level: level, Levels: []string{"rack", "kubernetes.io/hostname"}}); !r.Fits {
						b.Fatal(r.Reasons)
					}
				}
			})
		}
	}
}

// BenchmarkNever is the Rejected test a controller runs after a Retry: the
// gang on an empty copy of the cluster (16×8 whole GPUs per rack: never).
func BenchmarkNever(b *testing.B) {
	for _, size := range []struct {
		name  string
		nodes int
	}{{"10kGPU", 1250}, {"100kGPU", 12500}} {
		_, ns := fragmented(size.nodes, 1)
		b.Run(size.name, func(b *testing.B) {
			for b.Loop() {
				if never, _ := Never(ns, gang(whole("w", 60, 8)), Options{Level: "rack"}); !never {
					b.Fatal("60 × 8 GPUs fits a rack of 50 × 8")
				}
			}
		})
	}
}
