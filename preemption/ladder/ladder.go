package ladder

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// killRecheck is how soon a Killing workload is looked at again: force
// deletes take effect at once unless something (a finalizer) holds the pod.
const killRecheck = 2 * time.Second

// Step moves a preemption one step: it never goes back a phase, may pass
// through several in one call (all ranks saved → Terminating → no pods left
// → Done), and is idempotent for a given observation.
func Step(cfg Config, st State, obs Observation) Decision {
	d := Decision{State: clone(st)}
	s := &d.State
	now := obs.Now
	live := map[string]Pod{} // by key (UID)
	for _, p := range obs.Pods {
		if !p.Finished && !replacement(s, p) {
			live[p.key()] = p
		}
	}
	if obs.Evicted && obs.PodLevel && s.Phase != PhaseDone && !s.WorkloadEvicted {
		d.EvictWorkload = true
		s.WorkloadEvicted = true
	}
	mergeSteps(cfg, s, obs.Pods)

	enter := func(p Phase) {
		s.Phase = p
		s.Transitions = append(s.Transitions, Transition{Phase: p, At: now})
		d.Entered = append(d.Entered, p)
	}

	for range 5 { // at most one pass per phase
		switch s.Phase {
		case PhaseNone:
			if !obs.Evicted {
				return d
			}
			s.Reason = obs.Reason
			for _, p := range obs.Pods {
				if p.OptedIn && !p.Finished {
					if s.Ranks == nil {
						s.Ranks = map[string][]int64{}
					}
					s.Ranks[p.key()] = capSteps(cfg, p.Steps)
				}
			}
			if obs.Grace > 0 {
				gd := now.Add(obs.Grace)
				s.GraceDeadline = &gd
			}
			if len(s.Ranks) == 0 {
				enter(PhaseTerminating)
				continue
			}
			timeout := obs.CheckpointTimeout
			if timeout <= 0 {
				timeout = cfg.DefaultCheckpointTimeout
			}
			deadline := now.Add(timeout)
			s.CheckpointDeadline = &deadline
			enter(PhaseCheckpointing)

		case PhaseCheckpointing:
			// A rank's answer is recorded at once: the pod may be gone
			// by the next look.
			waiting := false
			for name := range s.Ranks {
				p, ok := live[name]
				switch {
				case ok && p.Reported:
					setOutcome(s, name, OutcomeSaved)
				case ok && s.Outcomes[name] != OutcomeSaved:
					waiting = true
				}
			}
			if waiting && now.Before(*s.CheckpointDeadline) {
				for _, key := range slices.Sorted(maps.Keys(s.Ranks)) {
					if p, ok := live[key]; ok && !p.CheckpointRequested {
						d.Actions = append(d.Actions, Action{Kind: RequestCheckpoint, Pod: p.Name, UID: p.UID})
					}
				}
				d.RequeueAfter = s.CheckpointDeadline.Sub(now)
				return d
			}
			for name := range s.Ranks {
				if s.Outcomes[name] != OutcomeSaved {
					setOutcome(s, name, OutcomeTimedOut)
				}
			}
			enter(PhaseTerminating)

		case PhaseTerminating:
			if len(live) == 0 {
				enter(PhaseDone)
				continue
			}
			if s.KillDeadline == nil {
				grace := time.Duration(0)
				for _, p := range live {
					g := p.Grace
					if g <= 0 {
						g = cfg.DefaultGrace
					}
					grace = max(grace, g)
				}
				// The grace runs from the checkpoint request: that is when
				// each rank's agent started its own clock (SIGKILL at
				// request + grace − margin). Counting it again from now
				// would hold a lost node's GPUs for timeout + grace, about
				// twice the policy's bound.
				end := now.Add(grace)
				if asked, ok := s.Since(PhaseCheckpointing); ok {
					// max(request + grace, when Checkpointing ended — at
					// the latest its deadline, however late this step runs).
					ended := now
					if s.CheckpointDeadline != nil && s.CheckpointDeadline.Before(now) {
						ended = *s.CheckpointDeadline
					}
					end = maxTime(ended, asked.Add(grace))
				}
				// The policy bounds it, whatever grace the pods ask: a
				// tenant's terminationGracePeriodSeconds of an hour must
				// not hold the GPUs for an hour after the deadline.
				if s.GraceDeadline != nil && s.GraceDeadline.Before(end) {
					end = *s.GraceDeadline
				}
				kd := end.Add(cfg.Slack)
				s.KillDeadline = &kd
			}
			if now.Before(*s.KillDeadline) {
				end := s.KillDeadline.Add(-cfg.Slack)
				_, asked := s.Since(PhaseCheckpointing)
				bounded := asked || s.GraceDeadline != nil
				for _, key := range slices.Sorted(maps.Keys(live)) {
					p := live[key]
					switch {
					case !p.Terminating:
						var left time.Duration // 0: the pod's own grace
						if bounded {
							left = graceUntil(now, end)
						}
						d.Actions = append(d.Actions, Action{Kind: Delete, Pod: p.Name, UID: p.UID, Grace: left})
					case bounded && p.DeletionGrace > 0 && p.DeletedAt.Add(p.DeletionGrace).After(end.Add(time.Second)):
						// Deleted by someone else (the job controller
						// stopping a suspended job) with the pod's own,
						// longer grace: shorten it. The API server counts
						// the new grace from the first deletion.
						if g := graceUntil(p.DeletedAt, end); g < p.DeletionGrace {
							d.Actions = append(d.Actions, Action{Kind: Delete, Pod: p.Name, UID: p.UID, Grace: g})
						}
					}
				}
				d.RequeueAfter = s.KillDeadline.Sub(now)
				return d
			}
			enter(PhaseKilling)

		case PhaseKilling:
			if len(live) == 0 {
				enter(PhaseDone)
				continue
			}
			for _, key := range slices.Sorted(maps.Keys(live)) {
				p := live[key]
				d.Actions = append(d.Actions, Action{Kind: ForceDelete, Pod: p.Name, UID: p.UID})
				if _, rank := s.Ranks[key]; rank && s.Outcomes[key] != OutcomeSaved {
					setOutcome(s, key, OutcomeKilled)
				}
			}
			d.RequeueAfter = killRecheck
			return d

		case PhaseDone:
			// Reset only in a later step than the one that entered Done:
			// a pod-level trigger ends with its pods, and resetting at
			// once would drop the consistent step, the Event and the
			// metrics of that preemption.
			if !obs.Evicted && !slices.Contains(d.Entered, PhaseDone) {
				d.Reset = true
			}
			return d
		}
	}
	return d
}

// replacement: a pod the job controller created after the eviction began
// (so not one of the victim's): an opted-in pod that is no rank (every
// live opted-in pod at the eviction is one), or any pod created after the
// eviction. Creation times have second resolution, hence the rank test
// first: a replacement created in the eviction's second is still caught.
func replacement(s *State, p Pod) bool {
	if len(s.Transitions) == 0 {
		return false
	}
	if _, rank := s.Ranks[p.key()]; rank {
		return false
	}
	return p.OptedIn || p.Created.After(s.Transitions[0].At)
}

func (p Pod) key() string {
	if p.UID != "" {
		return p.UID
	}
	return p.Name
}

// graceUntil is the grace, counted from from, that ends at end: whole
// seconds rounded down (never past the bound), at least one second (zero
// would be a force delete, which frees the object before the kubelet has
// stopped the containers, and so before their GPUs are free).
func graceUntil(from, end time.Time) time.Duration {
	return max(time.Second, end.Sub(from).Truncate(time.Second))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func setOutcome(s *State, rank, outcome string) {
	if s.Outcomes == nil {
		s.Outcomes = map[string]string{}
	}
	s.Outcomes[rank] = outcome
}

// mergeSteps folds newly reported steps into the ranks' records and
// recomputes the consistent step.
func mergeSteps(cfg Config, s *State, pods []Pod) {
	for _, p := range pods {
		old, ok := s.Ranks[p.key()]
		if !ok || len(p.Steps) == 0 {
			continue
		}
		s.Ranks[p.key()] = capSteps(cfg, append(slices.Clone(old), p.Steps...))
	}
	if step, ok := LastConsistent(s.Ranks); ok {
		s.LastConsistentStep = &step
	}
}

// capSteps sorts newest first, drops duplicates and keeps the newest
// MaxStepsPerRank.
func capSteps(cfg Config, steps []int64) []int64 {
	out := slices.Clone(steps)
	slices.SortFunc(out, func(a, b int64) int { return cmp.Compare(b, a) })
	out = slices.Compact(out)
	if cfg.MaxStepsPerRank > 0 && len(out) > cfg.MaxStepsPerRank {
		out = out[:cfg.MaxStepsPerRank]
	}
	if out == nil {
		out = []int64{}
	}
	return out
}

// LastConsistent returns the newest step that every rank completed: the
// largest step present in every rank's set. There is none when there are no
// ranks, or when some rank has no step in common with the others — naming
// the minimum of the newest steps instead would be wrong when a rank pruned
// it or never saved it.
func LastConsistent(ranks map[string][]int64) (int64, bool) {
	if len(ranks) == 0 {
		return 0, false
	}
	var common map[int64]bool
	for _, steps := range ranks {
		set := make(map[int64]bool, len(steps))
		for _, st := range steps {
			if common == nil || common[st] {
				set[st] = true
			}
		}
		common = set
		if len(common) == 0 {
			return 0, false
		}
	}
	best, ok := int64(0), false
	for st := range common {
		if !ok || st > best {
			best, ok = st, true
		}
	}
	return best, ok
}

func clone(s State) State {
	c := s
	c.Transitions = slices.Clone(s.Transitions)
	if s.Ranks != nil {
		c.Ranks = make(map[string][]int64, len(s.Ranks))
		for k, v := range s.Ranks {
			c.Ranks[k] = slices.Clone(v)
		}
	}
	c.Outcomes = maps.Clone(s.Outcomes)
	if s.CheckpointDeadline != nil {
		t := *s.CheckpointDeadline
		c.CheckpointDeadline = &t
	}
	if s.KillDeadline != nil {
		t := *s.KillDeadline
		c.KillDeadline = &t
	}
	if s.GraceDeadline != nil {
		t := *s.GraceDeadline
		c.GraceDeadline = &t
	}
	if s.LastConsistentStep != nil {
		v := *s.LastConsistentStep
		c.LastConsistentStep = &v
	}
	return c
}
