package ladder

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkStep: one reconcile's decision for a 256-rank gang in
// Checkpointing with half the ranks reported.
func BenchmarkStep(b *testing.B) {
	st := State{Phase: PhaseCheckpointing, Transitions: []Transition{{PhaseCheckpointing, t0}},
		CheckpointDeadline: ptr(t0.Add(time.Minute)), Ranks: map[string][]int64{}}
	var obs Observation
	obs.Now, obs.Evicted = t0.Add(10*time.Second), true
	for i := range 256 {
		name := fmt.Sprintf("rank-%03d", i)
		st.Ranks[name] = nil
		p := rank(name).requested()
		if i%2 == 0 {
			p.saved(100, 90)
		}
		obs.Pods = append(obs.Pods, p.Pod)
	}
	for b.Loop() {
		Step(cfg, st, obs)
	}
}
