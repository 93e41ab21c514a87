package fit

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// On clusters too big for the oracle, an exact engine must still be
// monotone: if a gang fits, the gang with one pod fewer fits; if it does
// not, the gang with one pod more does not. Every plan must also be valid.
func TestMonotoneOnMediumClusters(t *testing.T) {
	checked, fits, exhausted := 0, 0, 0
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		var nodes []Node
		var usage []Usage
		for i := 0; i < 6+rng.IntN(10); i++ {
			n := Node{Name: fmt.Sprintf("n%02d", i), Ready: rng.IntN(15) > 0,
				Labels: map[string]string{"rack": fmt.Sprint(i % 3)}}
			for j := 0; j < 8; j++ {
				phys := []int64{40960, 81920}[i%2]
				g := GPU{UUID: fmt.Sprintf("n%02d-%d", i, j), PhysicalMiB: phys, AllocatableMiB: phys * 9 / 10, Healthy: rng.IntN(20) > 0}
				n.GPUs = append(n.GPUs, g)
				switch rng.IntN(3) {
				case 0:
					usage = append(usage, Usage{UUID: g.UUID, MemoryMiB: g.AllocatableMiB, Cores: 100, Exclusive: true})
				case 1:
					usage = append(usage, Usage{UUID: g.UUID, MemoryMiB: int64(rng.IntN(int(g.AllocatableMiB))), Cores: int32(rng.IntN(60))})
				}
			}
			nodes = append(nodes, n)
		}
		var g Gang
		for k := 0; k < 1+rng.IntN(3); k++ {
			ps := PodSet{Name: fmt.Sprintf("ps%d", k), Count: 1 + rng.IntN(12), GPUsPerPod: []int{1, 1, 2, 4, 8}[rng.IntN(5)]}
			if rng.IntN(2) == 0 {
				ps.MemoryMiB = int64(2000 + rng.IntN(30000))
				ps.Cores = int32(rng.IntN(3) * 20)
			}
			g.PodSets = append(g.PodSets, ps)
		}
		level := []string{"", "rack"}[rng.IntN(2)]
		o := Options{Level: level, Policy: []string{v1alpha1.PolicyBestFit, v1alpha1.PolicyWorstFit}[seed%2]}
		m := NewModel(nodes)
		for _, u := range usage {
			if err := m.Use(u); err != nil {
				t.Fatal(err)
			}
		}
		res := m.Fit(g, o)
		if res.Exhausted {
			exhausted++
			continue
		}
		if res.Fits {
			fits++
			if err := checkPlan(nodes, usage, g, level, res); err != nil {
				t.Fatalf("seed %d: invalid plan: %v", seed, err)
			}
		}
		for k := range g.PodSets {
			h := Gang{PodSets: append([]PodSet(nil), g.PodSets...)}
			if res.Fits {
				if h.PodSets[k].Count == 0 {
					continue
				}
				h.PodSets[k].Count--
			} else {
				h.PodSets[k].Count++
			}
			r2 := m.Fit(h, o)
			if r2.Exhausted {
				continue
			}
			checked++
			if res.Fits && !r2.Fits {
				t.Fatalf("seed %d: gang fits but with one pod fewer in %s it does not: %q\ngang %+v", seed, g.PodSets[k].Name, r2.Reasons, h)
			}
			if !res.Fits && r2.Fits {
				t.Fatalf("seed %d: gang does not fit (%q) but with one pod more in %s it does\ngang %+v", seed, res.Reasons, g.PodSets[k].Name, h)
			}
		}
	}
	if checked < 300 || fits < 50 || fits > 250 {
		t.Errorf("weak sample: %d comparisons, %d of 300 gangs fit", checked, fits)
	}
	t.Logf("%d comparisons; %d gangs fit, %d searches ran out of steps", checked, fits, exhausted)
}
