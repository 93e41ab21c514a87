package gpucache

import "sort"

// FractionalSizesMiB are the common fractional request sizes the
// fragmentation report counts pods of (10, 20 and 40 GiB).
var FractionalSizesMiB = []int64{10240, 20480, 40960}

// DomainFree is what is free now in one topology domain, per GPU model,
// counting only healthy GPUs of Ready, schedulable nodes.
type DomainFree struct {
	// Domain is the value of the level label ("" without a level: the
	// whole cluster; nodes lacking the label are left out).
	Domain string
	Model  string
	GPUs   int
	// WholeFree GPUs have no holder: the largest gang of whole GPUs (one
	// per pod) that fits now, and the GPUs a multi-GPU pod may take.
	WholeFree int
	// LargestNodeWhole is the most whole GPUs free on one node: the widest
	// pod that fits now.
	LargestNodeWhole int
	FreeMiB          int64
	// PodsAt[i]: pods of FractionalSizesMiB[i] on one GPU each that fit now.
	PodsAt []int64
	// Fragmentation is the share of free memory that is not on whole free
	// GPUs: 0 when every free MiB is in whole GPUs, towards 1 when it is
	// scattered in slivers no whole-GPU request can use.
	Fragmentation float64
}

// Fragmentation reports free capacity per domain of level and GPU model.
func (s *Snapshot) Fragmentation(level string) []DomainFree {
	type key struct{ domain, model string }
	by := map[key]*DomainFree{}
	for _, n := range s.Nodes {
		if !n.Ready || n.Unschedulable {
			continue
		}
		domain := ""
		if level != "" {
			v, ok := n.Labels[level]
			if !ok {
				continue
			}
			domain = v
		}
		perModel := map[string]int{}
		for _, g := range n.GPUs {
			if !g.Healthy {
				continue
			}
			k := key{domain, g.Model}
			d, ok := by[k]
			if !ok {
				d = &DomainFree{Domain: domain, Model: g.Model, PodsAt: make([]int64, len(FractionalSizesMiB))}
				by[k] = d
			}
			d.GPUs++
			free, freeCores, holders, ok := s.Model.GPUState(g.UUID)
			if !ok {
				continue
			}
			d.FreeMiB += free
			if holders == 0 {
				d.WholeFree++
				perModel[g.Model]++
			}
			if freeCores > 0 {
				for i, size := range FractionalSizesMiB {
					d.PodsAt[i] += free / size
				}
			}
		}
		for m, w := range perModel {
			if d := by[key{domain, m}]; w > d.LargestNodeWhole {
				d.LargestNodeWhole = w
			}
		}
	}
	out := make([]DomainFree, 0, len(by))
	for _, d := range by {
		out = append(out, *d)
	}
	alloc := map[string]int64{}
	for _, n := range s.Nodes {
		for _, g := range n.GPUs {
			alloc[g.Model] = g.AllocatableMiB
		}
	}
	for i := range out {
		d := &out[i]
		if d.FreeMiB > 0 {
			whole := float64(int64(d.WholeFree) * alloc[d.Model])
			d.Fragmentation = max(0, 1-whole/float64(d.FreeMiB))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Domain != out[j].Domain {
			return out[i].Domain < out[j].Domain
		}
		return out[i].Model < out[j].Model
	})
	return out
}
