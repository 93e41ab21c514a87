package ladder

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkStep: one reconcile's decision for a gang in Checkpointing with
// half the ranks reported (ranks keyed by UID, 8 steps each reported).
func BenchmarkStep(b *testing.B) {
	for _, n := range []int{256, 4096} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			st := State{Phase: PhaseCheckpointing, Transitions: []Transition{{PhaseCheckpointing, t0}},
				CheckpointDeadline: ptr(t0.Add(time.Minute)), Ranks: map[string][]int64{}}
			var obs Observation
			obs.Now, obs.Evicted = t0.Add(10*time.Second), true
			for i := range n {
				name := fmt.Sprintf("rank-%04d", i)
				p := rank(name).requested()
				p.UID = fmt.Sprintf("%08x-1234-4567-89ab-%012x", i, i)
				st.Ranks[p.UID] = nil
				if i%2 == 0 {
					p.saved(100, 90, 80, 70, 60, 50, 40, 30)
				}
				obs.Pods = append(obs.Pods, p.Pod)
			}
			b.ResetTimer()
			for b.Loop() {
				Step(cfg, st, obs)
			}
		})
	}
}
