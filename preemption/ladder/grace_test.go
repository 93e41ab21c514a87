package ladder

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// The policy, not the tenant's terminationGracePeriodSeconds, bounds how
// long a victim holds its GPUs: every graceful delete ends by
// State.GraceDeadline (the eviction + the policy's timeout + margin), for
// opted-in and other victims alike, and pods already being deleted with
// their own hour-long grace get it shortened.
func TestPolicyGraceBoundsTheDelete(t *testing.T) {
	const hour = time.Hour
	tenant := func(b *podB) *podB { return b.grace(hour) } // terminationGracePeriodSeconds: 3600
	// deleting: the job controller deleted the pod at d with grace g.
	deleting := func(b *podB, d, g time.Duration) *podB {
		b.Terminating, b.DeletedAt, b.DeletionGrace = true, at(d), g
		return b
	}
	cases := map[string]struct {
		state State
		obs   Observation
		want  Decision
	}{
		"the eviction fixes the grace deadline": {
			obs: Observation{Now: t0, Evicted: true, Reason: "Preempted", CheckpointTimeout: 60 * time.Second, Grace: 90 * time.Second,
				Pods: pods(tenant(rank("a")))},
			want: Decision{State: State{Phase: PhaseCheckpointing, Reason: "Preempted", Transitions: []Transition{tr(PhaseCheckpointing, 0)},
				CheckpointDeadline: ptr(at(60 * time.Second)), GraceDeadline: ptr(at(90 * time.Second)), Ranks: map[string][]int64{"a": {}}},
				Entered: []Phase{PhaseCheckpointing}, Actions: []Action{{Kind: RequestCheckpoint, Pod: "a"}}, RequeueAfter: 60 * time.Second},
		},
		"checkpoint deadline passed: the delete asks deadline + margin − now, not the pod's hour": {
			state: func() State { s := checkpointing(); s.GraceDeadline = ptr(at(90 * time.Second)); return s }(),
			obs:   Observation{Now: at(60 * time.Second), Evicted: true, Pods: pods(tenant(rank("a").requested()), tenant(rank("b").requested()))},
			want: Decision{State: func() State {
				s := checkpointing()
				s.GraceDeadline = ptr(at(90 * time.Second))
				s.Phase = PhaseTerminating
				s.Transitions = append(s.Transitions, tr(PhaseTerminating, 60*time.Second))
				s.Outcomes = map[string]string{"a": OutcomeTimedOut, "b": OutcomeTimedOut}
				s.KillDeadline = ptr(at(90*time.Second + 10*time.Second))
				return s
			}(), Entered: []Phase{PhaseTerminating}, Actions: []Action{{Kind: Delete, Pod: "a", Grace: 30 * time.Second}, {Kind: Delete, Pod: "b", Grace: 30 * time.Second}}, RequeueAfter: 40 * time.Second},
		},
		"not opted in: the delete is bounded too": {
			obs: Observation{Now: t0, Evicted: true, Reason: "Preempted", CheckpointTimeout: 60 * time.Second, Grace: 90 * time.Second,
				Pods: pods(tenant(plain("a")))},
			want: Decision{State: State{Phase: PhaseTerminating, Reason: "Preempted", Transitions: []Transition{tr(PhaseTerminating, 0)},
				GraceDeadline: ptr(at(90 * time.Second)), KillDeadline: ptr(at(100 * time.Second))},
				Entered: []Phase{PhaseTerminating}, Actions: []Action{{Kind: Delete, Pod: "a", Grace: 90 * time.Second}}, RequeueAfter: 100 * time.Second},
		},
		"a shorter grace of the pod's own still wins": {
			obs: Observation{Now: t0, Evicted: true, Reason: "Preempted", CheckpointTimeout: 60 * time.Second, Grace: 90 * time.Second,
				Pods: pods(plain("a").grace(20 * time.Second))},
			want: Decision{State: State{Phase: PhaseTerminating, Reason: "Preempted", Transitions: []Transition{tr(PhaseTerminating, 0)},
				GraceDeadline: ptr(at(90 * time.Second)), KillDeadline: ptr(at(30 * time.Second))},
				Entered: []Phase{PhaseTerminating}, Actions: []Action{{Kind: Delete, Pod: "a", Grace: 20 * time.Second}}, RequeueAfter: 30 * time.Second},
		},
		"deleted by the job controller with an hour: shortened, counted from that deletion": {
			obs: Observation{Now: at(2 * time.Second), Evicted: true, Reason: "Preempted", CheckpointTimeout: 60 * time.Second, Grace: 90 * time.Second,
				Pods: pods(deleting(tenant(plain("a")), time.Second, hour), deleting(tenant(plain("b")), time.Second, 30*time.Second))},
			want: Decision{State: State{Phase: PhaseTerminating, Reason: "Preempted", Transitions: []Transition{tr(PhaseTerminating, 2*time.Second)},
				GraceDeadline: ptr(at(92 * time.Second)), KillDeadline: ptr(at(102 * time.Second))},
				// a: 92 s − 1 s; b ends at 31 s, inside the bound: untouched.
				Entered: []Phase{PhaseTerminating}, Actions: []Action{{Kind: Delete, Pod: "a", Grace: 91 * time.Second}}, RequeueAfter: 100 * time.Second},
		},
		"once shortened, not deleted again": {
			state: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 2*time.Second)},
				GraceDeadline: ptr(at(92 * time.Second)), KillDeadline: ptr(at(102 * time.Second))},
			obs: Observation{Now: at(3 * time.Second), Evicted: true, Pods: pods(deleting(tenant(plain("a")), time.Second, 91*time.Second))},
			want: Decision{State: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 2*time.Second)},
				GraceDeadline: ptr(at(92 * time.Second)), KillDeadline: ptr(at(102 * time.Second))}, RequeueAfter: 99 * time.Second},
		},
		"past the bound: one second, never a force delete before the kill deadline": {
			state: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)},
				GraceDeadline: ptr(at(10 * time.Second)), KillDeadline: ptr(at(20 * time.Second))},
			obs: Observation{Now: at(15 * time.Second), Evicted: true, Pods: pods(tenant(plain("a")), deleting(tenant(plain("b")), 12*time.Second, hour))},
			want: Decision{State: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)},
				GraceDeadline: ptr(at(10 * time.Second)), KillDeadline: ptr(at(20 * time.Second))},
				Actions: []Action{{Kind: Delete, Pod: "a", Grace: time.Second}, {Kind: Delete, Pod: "b", Grace: time.Second}}, RequeueAfter: 5 * time.Second},
		},
		"a record of an older manager (no grace deadline) keeps the pods' own grace": {
			state: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)}, KillDeadline: ptr(at(hour + 10*time.Second))},
			obs:   Observation{Now: at(time.Second), Evicted: true, Pods: pods(tenant(plain("a")), deleting(tenant(plain("b")), 0, hour))},
			want: Decision{State: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)}, KillDeadline: ptr(at(hour + 10*time.Second))},
				Actions: []Action{{Kind: Delete, Pod: "a"}}, RequeueAfter: hour + 9*time.Second},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := Step(cfg, tc.state, tc.obs)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Step (-want +got):\n%s", diff)
			}
		})
	}
}

// Property: with a policy grace, whatever the pods' own grace and however
// late the reconciles run, no graceful delete lets a pod live past the
// grace deadline (but by the one-second floor once it has passed), and the
// force delete comes at the grace deadline + slack at the latest.
func TestNoDeleteOutlivesTheGraceDeadline(t *testing.T) {
	for _, own := range []time.Duration{0, 2 * time.Second, 30 * time.Second, 330 * time.Second, time.Hour} {
		for _, optedIn := range []bool{true, false} {
			const timeout, bound = 60 * time.Second, 90 * time.Second
			var st State
			deletedAt := map[string]time.Time{}
			grace := map[string]time.Duration{}
			for now := t0; now.Before(t0.Add(2 * time.Hour)); now = now.Add(7 * time.Second) {
				var ps []Pod
				for _, n := range []string{"a", "b"} {
					p := Pod{Name: n, OptedIn: optedIn, Grace: own, CheckpointRequested: true}
					if n == "b" && now.After(t0) && deletedAt[n].IsZero() {
						// The job controller deletes b with its own grace.
						deletedAt[n], grace[n] = now, max(own, time.Second)
					}
					if !deletedAt[n].IsZero() {
						p.Terminating, p.DeletedAt, p.DeletionGrace = true, deletedAt[n], grace[n]
					}
					ps = append(ps, p)
				}
				d := Step(cfg, st, Observation{Now: now, Evicted: true, Reason: "Preempted", CheckpointTimeout: timeout, Grace: bound, Pods: ps})
				st = d.State
				for _, a := range d.Actions {
					switch a.Kind {
					case Delete:
						from := now
						if !deletedAt[a.Pod].IsZero() {
							from = deletedAt[a.Pod]
						} else {
							deletedAt[a.Pod] = now
						}
						if a.Grace <= 0 {
							t.Fatalf("own=%v optedIn=%v: delete of %s at T0+%v asks the pod's own grace", own, optedIn, a.Pod, now.Sub(t0))
						}
						grace[a.Pod] = a.Grace
						if end := from.Add(a.Grace); end.After(t0.Add(bound)) && a.Grace > time.Second {
							t.Errorf("own=%v optedIn=%v: delete of %s ends at T0+%v, past the bound T0+%v", own, optedIn, a.Pod, end.Sub(t0), bound)
						}
					case ForceDelete:
						if now.Sub(t0) > bound+cfg.Slack+7*time.Second {
							t.Errorf("own=%v optedIn=%v: force delete at T0+%v, after the bound + slack", own, optedIn, now.Sub(t0))
						}
					}
				}
				if st.Phase == PhaseKilling {
					break
				}
			}
			for n, from := range deletedAt {
				if end := from.Add(grace[n]); end.After(t0.Add(bound)) && own > 0 {
					t.Errorf("own=%v optedIn=%v: pod %s's last grace ends at T0+%v, past the bound", own, optedIn, n, end.Sub(t0))
				}
			}
		}
	}
}
