package ladder

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var (
	t0  = time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	cfg = Config{DefaultCheckpointTimeout: 60 * time.Second, DefaultGrace: 30 * time.Second, Slack: 10 * time.Second, MaxStepsPerRank: 4}
)

func at(d time.Duration) time.Time           { return t0.Add(d) }
func ptr[T any](v T) *T                      { return &v }
func tr(p Phase, d time.Duration) Transition { return Transition{Phase: p, At: at(d)} }

// pod builds an observed pod.
type podB struct{ Pod }

func rank(name string) *podB { return &podB{Pod{Name: name, OptedIn: true, Grace: 90 * time.Second}} }
func plain(name string) *podB {
	return &podB{Pod{Name: name, Grace: 30 * time.Second}}
}
func (p *podB) requested() *podB { p.CheckpointRequested = true; return p }
func (p *podB) saved(steps ...int64) *podB {
	p.Reported = true
	p.Steps = steps
	p.CheckpointRequested = true
	return p
}
func (p *podB) steps(steps ...int64) *podB  { p.Steps = steps; return p }
func (p *podB) terminating() *podB          { p.Terminating = true; return p }
func (p *podB) finished() *podB             { p.Finished = true; return p }
func (p *podB) grace(d time.Duration) *podB { p.Grace = d; return p }
func pods(ps ...*podB) []Pod {
	out := make([]Pod, len(ps))
	for i, p := range ps {
		out[i] = p.Pod
	}
	return out
}

// checkpointing is the state right after an eviction at t0 of ranks a, b.
func checkpointing() State {
	return State{
		Phase: PhaseCheckpointing, Reason: "Preempted",
		Transitions:        []Transition{tr(PhaseCheckpointing, 0)},
		CheckpointDeadline: ptr(at(60 * time.Second)),
		Ranks:              map[string][]int64{"a": {}, "b": {}},
	}
}

func TestStep(t *testing.T) {
	cases := map[string]struct {
		state State
		obs   Observation
		want  Decision
	}{
		"not evicted: nothing to do": {
			obs:  Observation{Now: t0, Pods: pods(rank("a"))},
			want: Decision{},
		},
		"eviction of an opted-in gang asks every rank to checkpoint": {
			obs: Observation{Now: t0, Evicted: true, Reason: "Preempted", Pods: pods(rank("a"), rank("b"), plain("launcher"))},
			want: Decision{
				State:        checkpointing(),
				Entered:      []Phase{PhaseCheckpointing},
				Actions:      []Action{{Kind: RequestCheckpoint, Pod: "a"}, {Kind: RequestCheckpoint, Pod: "b"}},
				RequeueAfter: 60 * time.Second,
			},
		},
		"job's own checkpoint timeout wins over the default": {
			obs: Observation{Now: t0, Evicted: true, Reason: "Preempted", CheckpointTimeout: 5 * time.Minute, Pods: pods(rank("a"))},
			want: Decision{
				State: State{Phase: PhaseCheckpointing, Reason: "Preempted", Transitions: []Transition{tr(PhaseCheckpointing, 0)},
					CheckpointDeadline: ptr(at(5 * time.Minute)), Ranks: map[string][]int64{"a": {}}},
				Entered:      []Phase{PhaseCheckpointing},
				Actions:      []Action{{Kind: RequestCheckpoint, Pod: "a"}},
				RequeueAfter: 5 * time.Minute,
			},
		},
		"not opted in: straight to graceful delete": {
			obs: Observation{Now: t0, Evicted: true, Reason: "Evicted", Pods: pods(plain("a"), plain("b").terminating())},
			want: Decision{
				State: State{Phase: PhaseTerminating, Reason: "Evicted", Transitions: []Transition{tr(PhaseTerminating, 0)},
					KillDeadline: ptr(at(40 * time.Second))},
				Entered:      []Phase{PhaseTerminating},
				Actions:      []Action{{Kind: Delete, Pod: "a"}},
				RequeueAfter: 40 * time.Second,
			},
		},
		"restarted manager mid-Checkpointing does not re-request": {
			state: checkpointing(),
			obs:   Observation{Now: at(10 * time.Second), Evicted: true, Pods: pods(rank("a").requested(), rank("b").requested())},
			want:  Decision{State: checkpointing(), RequeueAfter: 50 * time.Second},
		},
		"a rank whose request was lost is asked again": {
			state: checkpointing(),
			obs:   Observation{Now: at(10 * time.Second), Evicted: true, Pods: pods(rank("a").requested(), rank("b"))},
			want:  Decision{State: checkpointing(), Actions: []Action{{Kind: RequestCheckpoint, Pod: "b"}}, RequeueAfter: 50 * time.Second},
		},
		"one rank saved: keep waiting for the other": {
			state: checkpointing(),
			obs:   Observation{Now: at(10 * time.Second), Evicted: true, Pods: pods(rank("a").saved(100), rank("b").requested())},
			want: Decision{State: func() State {
				s := checkpointing()
				s.Ranks["a"] = []int64{100}
				s.Outcomes = map[string]string{"a": OutcomeSaved}
				return s
			}(), RequeueAfter: 50 * time.Second},
		},
		"all ranks saved: consistent step recorded, graceful delete": {
			state: checkpointing(),
			obs: Observation{Now: at(20 * time.Second), Evicted: true, Pods: pods(
				rank("a").saved(100, 90), rank("b").saved(100).grace(120*time.Second))},
			want: Decision{State: func() State {
				s := checkpointing()
				s.Phase = PhaseTerminating
				s.Transitions = append(s.Transitions, tr(PhaseTerminating, 20*time.Second))
				s.Ranks = map[string][]int64{"a": {100, 90}, "b": {100}}
				s.Outcomes = map[string]string{"a": OutcomeSaved, "b": OutcomeSaved}
				s.LastConsistentStep = ptr(int64(100))
				// The longest grace (120 s) runs from the request at t0.
				s.KillDeadline = ptr(at(120*time.Second + 10*time.Second))
				return s
			}(), Entered: []Phase{PhaseTerminating}, Actions: []Action{{Kind: Delete, Pod: "a", Grace: 100 * time.Second}, {Kind: Delete, Pod: "b", Grace: 100 * time.Second}}, RequeueAfter: 110 * time.Second},
		},
		"ranks disagree on the newest step: the newest common one": {
			state: checkpointing(),
			obs: Observation{Now: at(20 * time.Second), Evicted: true, Pods: pods(
				rank("a").saved(110, 100).terminating(), rank("b").saved(100, 90).terminating())},
			want: Decision{State: func() State {
				s := checkpointing()
				s.Phase = PhaseTerminating
				s.Transitions = append(s.Transitions, tr(PhaseTerminating, 20*time.Second))
				s.Ranks = map[string][]int64{"a": {110, 100}, "b": {100, 90}}
				s.Outcomes = map[string]string{"a": OutcomeSaved, "b": OutcomeSaved}
				s.LastConsistentStep = ptr(int64(100))
				s.KillDeadline = ptr(at(90*time.Second + 10*time.Second))
				return s
			}(), Entered: []Phase{PhaseTerminating}, RequeueAfter: 80 * time.Second},
		},
		"checkpoint timeout: the silent rank timed out, no consistent step": {
			state: checkpointing(),
			obs:   Observation{Now: at(60 * time.Second), Evicted: true, Pods: pods(rank("a").saved(100), rank("b").requested())},
			want: Decision{State: func() State {
				s := checkpointing()
				s.Phase = PhaseTerminating
				s.Transitions = append(s.Transitions, tr(PhaseTerminating, 60*time.Second))
				s.Ranks["a"] = []int64{100}
				s.Outcomes = map[string]string{"a": OutcomeSaved, "b": OutcomeTimedOut}
				s.KillDeadline = ptr(at(90*time.Second + 10*time.Second))
				return s
			}(), Entered: []Phase{PhaseTerminating}, Actions: []Action{{Kind: Delete, Pod: "a", Grace: 30 * time.Second}, {Kind: Delete, Pod: "b", Grace: 30 * time.Second}}, RequeueAfter: 40 * time.Second},
		},
		"a rank that saved and already left still counts as saved": {
			state: func() State {
				s := checkpointing()
				s.Ranks["a"] = []int64{7}
				s.Outcomes = map[string]string{"a": OutcomeSaved}
				return s
			}(),
			obs: Observation{Now: at(30 * time.Second), Evicted: true, Pods: pods(rank("b").saved(7))},
			want: Decision{State: func() State {
				s := checkpointing()
				s.Phase = PhaseTerminating
				s.Transitions = append(s.Transitions, tr(PhaseTerminating, 30*time.Second))
				s.Ranks = map[string][]int64{"a": {7}, "b": {7}}
				s.Outcomes = map[string]string{"a": OutcomeSaved, "b": OutcomeSaved}
				s.LastConsistentStep = ptr(int64(7))
				s.KillDeadline = ptr(at(90*time.Second + 10*time.Second))
				return s
			}(), Entered: []Phase{PhaseTerminating}, Actions: []Action{{Kind: Delete, Pod: "b", Grace: 60 * time.Second}}, RequeueAfter: 70 * time.Second},
		},
		"every rank gone during Checkpointing: through to Done at once": {
			state: checkpointing(),
			obs:   Observation{Now: at(5 * time.Second), Evicted: true, Pods: pods(rank("a").finished())},
			want: Decision{State: func() State {
				s := checkpointing()
				s.Phase = PhaseDone
				s.Transitions = append(s.Transitions, tr(PhaseTerminating, 5*time.Second), tr(PhaseDone, 5*time.Second))
				s.Outcomes = map[string]string{"a": OutcomeTimedOut, "b": OutcomeTimedOut}
				return s
			}(), Entered: []Phase{PhaseTerminating, PhaseDone}},
		},
		"grace + slack passed with pods left: force delete": {
			state: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)}, KillDeadline: ptr(at(40 * time.Second)),
				Ranks: map[string][]int64{"a": {}}, Outcomes: map[string]string{"a": OutcomeTimedOut}},
			obs: Observation{Now: at(41 * time.Second), Evicted: true, Pods: pods(rank("a").terminating(), plain("x").terminating())},
			want: Decision{
				State: State{Phase: PhaseKilling, Transitions: []Transition{tr(PhaseTerminating, 0), tr(PhaseKilling, 41*time.Second)},
					KillDeadline: ptr(at(40 * time.Second)), Ranks: map[string][]int64{"a": {}}, Outcomes: map[string]string{"a": OutcomeKilled}},
				Entered:      []Phase{PhaseKilling},
				Actions:      []Action{{Kind: ForceDelete, Pod: "a"}, {Kind: ForceDelete, Pod: "x"}},
				RequeueAfter: killRecheck,
			},
		},
		"before the kill deadline: only graceful deletes of pods not yet terminating": {
			state: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)}, KillDeadline: ptr(at(40 * time.Second))},
			obs:   Observation{Now: at(39 * time.Second), Evicted: true, Pods: pods(plain("a").terminating(), plain("b"))},
			want: Decision{
				State:        State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)}, KillDeadline: ptr(at(40 * time.Second))},
				Actions:      []Action{{Kind: Delete, Pod: "b"}},
				RequeueAfter: time.Second,
			},
		},
		"last pod gone: Done": {
			state: State{Phase: PhaseKilling, Transitions: []Transition{tr(PhaseTerminating, 0), tr(PhaseKilling, 41*time.Second)}},
			obs:   Observation{Now: at(42 * time.Second), Evicted: true},
			want: Decision{
				State:   State{Phase: PhaseDone, Transitions: []Transition{tr(PhaseTerminating, 0), tr(PhaseKilling, 41*time.Second), tr(PhaseDone, 42*time.Second)}},
				Entered: []Phase{PhaseDone},
			},
		},
		"Done stays while still evicted": {
			state: State{Phase: PhaseDone},
			obs:   Observation{Now: at(50 * time.Second), Evicted: true},
			want:  Decision{State: State{Phase: PhaseDone}},
		},
		"Done and re-admitted: reset": {
			state: State{Phase: PhaseDone},
			obs:   Observation{Now: at(50 * time.Second), Pods: pods(rank("a"))},
			want:  Decision{State: State{Phase: PhaseDone}, Reset: true},
		},
		"eviction cleared mid-ladder: the ladder still finishes": {
			state: State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)}, KillDeadline: ptr(at(40 * time.Second))},
			obs:   Observation{Now: at(10 * time.Second), Pods: pods(plain("a").terminating())},
			want: Decision{
				State:        State{Phase: PhaseTerminating, Transitions: []Transition{tr(PhaseTerminating, 0)}, KillDeadline: ptr(at(40 * time.Second))},
				RequeueAfter: 30 * time.Second,
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := Step(cfg, tc.state, tc.obs)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Step (-want +got):\n%s", diff)
			}
			// Idempotent: the same observation against the new state
			// enters nothing more.
			again := Step(cfg, got.State, tc.obs)
			if len(again.Entered) != 0 {
				t.Errorf("second Step with the same observation entered %v", again.Entered)
			}
		})
	}
}

// The durable state survives a JSON round trip (the Workload annotation)
// and a restarted manager decides exactly what the running one would.
func TestStateRoundTripDecidesTheSame(t *testing.T) {
	st := checkpointing()
	st.Ranks["a"] = []int64{5, 3}
	st.Outcomes = map[string]string{"a": OutcomeSaved}
	st.LastConsistentStep = ptr(int64(3))
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back State
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	obs := Observation{Now: at(30 * time.Second), Evicted: true, Pods: pods(rank("a").saved(5), rank("b").requested())}
	if diff := cmp.Diff(Step(cfg, st, obs), Step(cfg, back, obs), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("decision after restart differs (-before +after):\n%s", diff)
	}
}

// Walk random observation sequences: phases only ever move forward, every
// transition is timestamped in order, and no pod is force-deleted before
// the kill deadline.
func TestStepNeverGoesBack(t *testing.T) {
	order := map[Phase]int{PhaseNone: 0, PhaseCheckpointing: 1, PhaseTerminating: 2, PhaseKilling: 3, PhaseDone: 4}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var st State
		now := t0
		names := []string{"a", "b", "c"}
		for range 20 {
			now = now.Add(time.Duration(rng.IntN(30)) * time.Second)
			obs := Observation{Now: now, Evicted: rng.IntN(5) > 0}
			for _, n := range names {
				if rng.IntN(6) == 0 {
					continue // gone
				}
				p := rank(n)
				if rng.IntN(2) == 0 {
					p.requested()
				}
				if rng.IntN(3) == 0 {
					p.saved(int64(rng.IntN(4)))
				}
				if rng.IntN(3) == 0 {
					p.terminating()
				}
				obs.Pods = append(obs.Pods, p.Pod)
			}
			d := Step(cfg, st, obs)
			if order[d.State.Phase] < order[st.Phase] {
				t.Fatalf("phase went back %s → %s", st.Phase, d.State.Phase)
			}
			for i := 1; i < len(d.State.Transitions); i++ {
				if d.State.Transitions[i].At.Before(d.State.Transitions[i-1].At) {
					t.Fatalf("transitions out of order: %v", d.State.Transitions)
				}
			}
			for _, a := range d.Actions {
				if a.Kind == ForceDelete && (d.State.KillDeadline == nil || now.Before(*d.State.KillDeadline)) {
					t.Fatalf("force delete of %s before the kill deadline", a.Pod)
				}
			}
			if d.Reset {
				st = State{}
				continue
			}
			st = d.State
		}
	}
}

func TestLastConsistent(t *testing.T) {
	cases := map[string]struct {
		ranks  map[string][]int64
		want   int64
		wantOK bool
	}{
		"no ranks":                {wantOK: false},
		"one rank":                {ranks: map[string][]int64{"a": {3, 9, 5}}, want: 9, wantOK: true},
		"agree":                   {ranks: map[string][]int64{"a": {10, 9}, "b": {10, 9}}, want: 10, wantOK: true},
		"one ahead":               {ranks: map[string][]int64{"a": {11, 10}, "b": {10, 9}}, want: 10, wantOK: true},
		"min of newest is absent": {ranks: map[string][]int64{"a": {12, 8}, "b": {10, 8}}, want: 8, wantOK: true},
		"nothing in common":       {ranks: map[string][]int64{"a": {12}, "b": {10}}, wantOK: false},
		"a rank never saved":      {ranks: map[string][]int64{"a": {12}, "b": {}}, wantOK: false},
	}
	for name, tc := range cases {
		got, ok := LastConsistent(tc.ranks)
		if ok != tc.wantOK || (ok && got != tc.want) {
			t.Errorf("%s: LastConsistent = %d %v, want %d %v", name, got, ok, tc.want, tc.wantOK)
		}
	}
}

// Against brute force: try every step from high to low.
func TestLastConsistentBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		ranks := map[string][]int64{}
		for r := range 1 + rng.IntN(4) {
			var steps []int64
			for range rng.IntN(5) {
				steps = append(steps, int64(rng.IntN(8)))
			}
			ranks[string(rune('a'+r))] = steps
		}
		want, wantOK := int64(0), false
		for s := int64(7); s >= 0 && !wantOK; s-- {
			all := true
			for _, steps := range ranks {
				has := false
				for _, x := range steps {
					has = has || x == s
				}
				all = all && has
			}
			if all {
				want, wantOK = s, true
			}
		}
		got, ok := LastConsistent(ranks)
		if ok != wantOK || got != want {
			t.Fatalf("LastConsistent(%v) = %d %v, brute force %d %v", ranks, got, ok, want, wantOK)
		}
	}
}

// A victim on a lost node (no rank answers, nothing confirms a graceful
// delete) is force-deleted once the pods' grace — counted from the
// checkpoint request, as each agent counts it — plus the slack has passed:
// about the policy's bound (timeout + margin), not timeout + grace (2×).
func TestLostNodeReleasedWithinTheBound(t *testing.T) {
	const timeout, margin, slack = 5 * time.Minute, 30 * time.Second, 30 * time.Second
	c := Config{DefaultGrace: 30 * time.Second, Slack: slack, MaxStepsPerRank: 4}
	grace := timeout + margin // what the pod webhook sets
	mk := func(terminating bool) []Pod {
		var ps []Pod
		for _, n := range []string{"a", "b"} {
			p := Pod{Name: n, UID: "uid-" + n, OptedIn: true, Grace: grace, CheckpointRequested: true, Terminating: terminating}
			ps = append(ps, p)
		}
		return ps
	}
	var st State
	deleted := false
	for now := t0; now.Before(t0.Add(3 * timeout)); now = now.Add(time.Second) {
		d := Step(c, st, Observation{Now: now, Evicted: true, Reason: "Preempted", CheckpointTimeout: timeout, Pods: mk(deleted)})
		st = d.State
		for _, a := range d.Actions {
			switch a.Kind {
			case Delete:
				deleted = true
				if a.Grace <= 0 || now.Add(a.Grace).After(t0.Add(grace)) {
					t.Errorf("graceful delete at %v asks for %v: past the agents' own kill at T0+%v", now.Sub(t0), a.Grace, grace)
				}
			case ForceDelete:
				if got := now.Sub(t0); got > grace+slack || got < grace {
					t.Fatalf("force delete at T0+%v, want between the grace (%v) and grace + slack (%v)", got, grace, grace+slack)
				}
				return
			}
		}
	}
	t.Fatal("never force-deleted")
}

// Pods are ranks by UID: the job controller's replacement of a rank (same
// name, new UID, created after the eviction) is neither asked, nor counted
// as the rank's answer, nor deleted, nor waited for.
func TestRecreatedPodIsNotTheRank(t *testing.T) {
	st := State{Phase: PhaseCheckpointing, Reason: "DisruptionTarget", Transitions: []Transition{tr(PhaseCheckpointing, 0)},
		CheckpointDeadline: ptr(at(time.Minute)), Ranks: map[string][]int64{"uid-1": {}}}
	again := Pod{Name: "a", UID: "uid-2", OptedIn: true, Grace: 30 * time.Second, Created: at(5 * time.Second), Reported: true, Steps: []int64{999}}
	d := Step(cfg, st, Observation{Now: at(10 * time.Second), Evicted: true, Pods: []Pod{again}})
	if len(d.Actions) != 0 {
		t.Errorf("actions on the replacement pod: %+v", d.Actions)
	}
	if d.State.Outcomes["uid-1"] == OutcomeSaved || d.State.LastConsistentStep != nil || len(d.State.Ranks["uid-1"]) != 0 {
		t.Errorf("the replacement's report was taken as the rank's: %+v", d.State)
	}
	if d.State.Phase != PhaseDone {
		t.Errorf("phase %s: the rank is gone, the replacement must not be waited for", d.State.Phase)
	}
	// Created in the eviction's own second (creation times are whole
	// seconds, so it reads as before the eviction), while Killing.
	killing := State{Phase: PhaseKilling, Transitions: []Transition{tr(PhaseCheckpointing, 500*time.Millisecond), tr(PhaseKilling, time.Minute)},
		KillDeadline: ptr(at(time.Minute)), Ranks: map[string][]int64{"uid-1": {}}}
	again.Created = t0
	d = Step(cfg, killing, Observation{Now: at(61 * time.Second), Evicted: true, Pods: []Pod{again}})
	if len(d.Actions) != 0 || d.State.Phase != PhaseDone {
		t.Errorf("replacement created in the eviction's second: actions %+v, phase %s; want none and Done", d.Actions, d.State.Phase)
	}
}

// A pod-level trigger ends with its pods: Done is entered (and reported)
// in one step, the record reset only in a later one.
func TestDoneBeforeReset(t *testing.T) {
	st := State{Phase: PhaseTerminating, Reason: "Eviction", Transitions: []Transition{tr(PhaseCheckpointing, 0), tr(PhaseTerminating, time.Second)},
		KillDeadline: ptr(at(time.Minute)), Ranks: map[string][]int64{"a": {5}}, Outcomes: map[string]string{"a": OutcomeSaved}, LastConsistentStep: ptr(int64(5))}
	d := Step(cfg, st, Observation{Now: at(2 * time.Second)}) // the trigger left with the pod
	if d.Reset || d.State.Phase != PhaseDone || !slices.Contains(d.Entered, PhaseDone) {
		t.Fatalf("first step: %+v, want Done entered and no reset", d)
	}
	if d2 := Step(cfg, d.State, Observation{Now: at(3 * time.Second)}); !d2.Reset {
		t.Fatalf("second step: %+v, want reset", d2)
	}
	if d3 := Step(cfg, d.State, Observation{Now: at(3 * time.Second), Evicted: true}); d3.Reset {
		t.Fatalf("still evicted: %+v, want no reset", d3)
	}
}

// A pod-level trigger asks for the Workload's eviction through Kueue in
// every phase until Done; Kueue's own eviction never does.
func TestPodLevelTriggerEvictsTheWorkload(t *testing.T) {
	obs := Observation{Now: t0, Evicted: true, PodLevel: true, Reason: "Eviction", Pods: pods(rank("a"))}
	d := Step(cfg, State{}, obs)
	if !d.EvictWorkload || d.State.Phase != PhaseCheckpointing {
		t.Fatalf("%+v, want Checkpointing and EvictWorkload", d)
	}
	// Once asked, never again in this preemption: a stale view of the old
	// trigger must not evict the next admission.
	if d2 := Step(cfg, d.State, obs); d2.EvictWorkload {
		t.Error("the Workload's eviction asked twice")
	}
	obs.PodLevel = false
	if d := Step(cfg, State{}, obs); d.EvictWorkload {
		t.Error("Kueue's eviction asked again")
	}
	if d := Step(cfg, State{Phase: PhaseDone}, Observation{Now: t0, Evicted: true, PodLevel: true}); d.EvictWorkload {
		t.Error("EvictWorkload after Done")
	}
}
