package victims

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
)

var t0 = time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)

// kueueMessage is Kueue v0.17's preemptionMessage, verbatim in shape.
func kueueMessage(wlUID, jobUID string) string {
	return "Preempted to accommodate a workload (UID: " + wlUID + ", JobUID: " + jobUID + ") due to prioritization in the ClusterQueue; preemptor path: /plain; preemptee path: /plain"
}

func TestParsePreemptor(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want Preemptor
		ok   bool
	}{
		{kueueMessage("wl-1", "job-1"), Preemptor{"wl-1", "job-1"}, true},
		{kueueMessage("wl-1", "UNKNOWN"), Preemptor{WorkloadUID: "wl-1"}, true},
		{kueueMessage("UNKNOWN", "UNKNOWN"), Preemptor{}, false},
		{"Replaced to accommodate a workload (UID: wl-2, JobUID: job-2) due to workload slice aggregation", Preemptor{"wl-2", "job-2"}, true},
		{"Preempted to accommodate a higher priority workload", Preemptor{}, false},
		{"gpupack: Eviction of pod p-0; evicting the whole workload so it checkpoints and restarts together", Preemptor{}, false},
		{"", Preemptor{}, false},
		{"to accommodate a workload (UID: a) b, JobUID: c)", Preemptor{}, false},
	} {
		got, ok := ParsePreemptor(tc.msg)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: got %+v %v, want %+v %v", tc.msg, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParsePreemptor(f *testing.F) {
	f.Add(kueueMessage("wl-1", "job-1"))
	f.Add("Replaced to accommodate a workload (UID: , JobUID: ) due to x")
	f.Add("(UID: (UID: x, JobUID: y)")
	f.Fuzz(func(t *testing.T, msg string) {
		p, ok := ParsePreemptor(msg)
		if ok != p.Known() {
			t.Fatalf("%q: ok %v but %+v", msg, ok, p)
		}
		for _, s := range []string{p.WorkloadUID, p.JobUID} {
			if strings.ContainsAny(s, ",() \t\n") || s == "UNKNOWN" {
				t.Fatalf("%q: field %q", msg, s)
			}
		}
	})
}

// wlBuilder builds a victim or preemptor Workload.
type wlBuilder struct{ kueue.Workload }

func wl(name string) *wlBuilder {
	return &wlBuilder{kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)}}}
}

func (b *wlBuilder) cond(typ, reason, msg string, at time.Time) *wlBuilder {
	b.Status.Conditions = append(b.Status.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(at)})
	return b
}

// preemptedFor: as Kueue's IssuePreemptions writes it.
func (b *wlBuilder) preemptedFor(wlUID, jobUID string, at time.Time) *wlBuilder {
	m := kueueMessage(wlUID, jobUID)
	return b.cond(kueue.WorkloadEvicted, kueue.WorkloadEvictedByPreemption, m, at).cond(kueue.WorkloadPreempted, kueue.InClusterQueueReason, m, at)
}

func (b *wlBuilder) record(st ladder.State) *wlBuilder {
	raw, _ := json.Marshal(st)
	if b.Annotations == nil {
		b.Annotations = map[string]string{}
	}
	b.Annotations[v1alpha1.AnnotationPreemptionPhase] = string(raw)
	return b
}

func (b *wlBuilder) obj() *kueue.Workload { return &b.Workload }

func phaseRecord(p ladder.Phase, since time.Time, deadline time.Time) ladder.State {
	st := ladder.State{Phase: p, Transitions: []ladder.Transition{{Phase: ladder.PhaseCheckpointing, At: since}}}
	switch p {
	case ladder.PhaseCheckpointing:
		st.CheckpointDeadline = &deadline
	case ladder.PhaseTerminating:
		st.KillDeadline = &deadline
	}
	return st
}

func TestObserve(t *testing.T) {
	dl := t0.Add(5 * time.Minute)
	for _, tc := range []struct {
		name string
		wl   *kueue.Workload
		want *Victim
	}{
		{"running workload", wl("a").cond(kueue.WorkloadQuotaReserved, "QuotaReserved", "", t0).obj(), nil},
		{"checkpointing, preempted by Kueue", wl("v").preemptedFor("uid-p", "job-p", t0).record(phaseRecord(ladder.PhaseCheckpointing, t0, dl)).obj(),
			&Victim{Namespace: "ns", Name: "v", Phase: ladder.PhaseCheckpointing, EvictedAt: t0, Deadline: &dl, Preemptor: Preemptor{"uid-p", "job-p"}}},
		{"terminating", wl("v").preemptedFor("uid-p", "job-p", t0).record(phaseRecord(ladder.PhaseTerminating, t0, dl)).obj(),
			&Victim{Namespace: "ns", Name: "v", Phase: ladder.PhaseTerminating, EvictedAt: t0, Deadline: &dl, Preemptor: Preemptor{"uid-p", "job-p"}}},
		{"killing", wl("v").preemptedFor("uid-p", "job-p", t0).record(phaseRecord(ladder.PhaseKilling, t0, dl)).obj(),
			&Victim{Namespace: "ns", Name: "v", Phase: ladder.PhaseKilling, EvictedAt: t0, Preemptor: Preemptor{"uid-p", "job-p"}}},
		{"done: its pods are gone", wl("v").preemptedFor("uid-p", "job-p", t0).record(phaseRecord(ladder.PhaseDone, t0, dl)).obj(), nil},
		{"evicted by Kueue, not marked yet", wl("v").preemptedFor("uid-p", "", t0).obj(),
			&Victim{Namespace: "ns", Name: "v", Phase: ladder.PhaseNone, EvictedAt: t0, Preemptor: Preemptor{WorkloadUID: "uid-p"}}},
		{"a drain evicted through Kueue by the coordinator: nobody named",
			wl("v").cond(kueue.WorkloadEvicted, kueue.WorkloadEvictedDueToNodeFailures, "gpupack: Eviction of pod v-0; evicting the whole workload", t0).record(phaseRecord(ladder.PhaseCheckpointing, t0, dl)).obj(),
			&Victim{Namespace: "ns", Name: "v", Phase: ladder.PhaseCheckpointing, EvictedAt: t0, Deadline: &dl, Unattributed: "evicted (NodeFailures), not preempted for a workload"}},
		{"preempted, message from another Kueue version",
			wl("v").cond(kueue.WorkloadPreempted, kueue.InClusterQueueReason, "Preempted to make room", t0).record(phaseRecord(ladder.PhaseTerminating, t0, dl)).obj(),
			&Victim{Namespace: "ns", Name: "v", Phase: ladder.PhaseTerminating, EvictedAt: t0, Deadline: &dl, Unattributed: "its preemption message names no workload"}},
	} {
		got, ok := Observe(tc.wl)
		if (tc.want != nil) != ok {
			t.Errorf("%s: victim %v, want %v", tc.name, ok, tc.want != nil)
			continue
		}
		if tc.want != nil {
			if d := cmp.Diff(*tc.want, got); d != "" {
				t.Errorf("%s (-want +got):\n%s", tc.name, d)
			}
		}
	}
	bad := wl("v").preemptedFor("uid-p", "", t0).obj()
	bad.Annotations = map[string]string{v1alpha1.AnnotationPreemptionPhase: "{not json"}
	if v, ok := Observe(bad); !ok || v.Phase != ladder.PhaseNone {
		t.Errorf("unreadable record on an evicted workload: %+v %v, want an unmarked victim", v, ok)
	}
}

func TestWaitsFor(t *testing.T) {
	dl := t0.Add(5 * time.Minute)
	named := Victim{Namespace: "ns", Name: "train", Phase: ladder.PhaseCheckpointing, EvictedAt: t0, Deadline: &dl, Preemptor: Preemptor{WorkloadUID: "uid-infer", JobUID: "pod-infer"}}
	namedOther := Victim{Namespace: "ns2", Name: "batch", Phase: ladder.PhaseTerminating, EvictedAt: t0, Preemptor: Preemptor{WorkloadUID: "uid-other"}}
	byJob := Victim{Namespace: "ns", Name: "old", Phase: ladder.PhaseKilling, EvictedAt: t0, Preemptor: Preemptor{JobUID: "pod-infer"}}
	drained := Victim{Namespace: "ns", Name: "drained", Phase: ladder.PhaseCheckpointing, EvictedAt: t0.Add(500 * time.Millisecond), Unattributed: "evicted (NodeFailures), not preempted for a workload"}
	unmarked := Victim{Namespace: "ns", Name: "fresh", EvictedAt: t0, Preemptor: Preemptor{WorkloadUID: "uid-infer"}}

	infer := func(reserved time.Time) Pod {
		return Pod{UID: "pod-infer", Workloads: []Workload{{UID: "uid-infer", ReservedAt: reserved}}}
	}
	bystander := func(reserved time.Time) Pod {
		return Pod{UID: "pod-by", Workloads: []Workload{{UID: "uid-by", ReservedAt: reserved}}}
	}
	names := func(vs []Victim) []string {
		out := []string{}
		for _, v := range vs {
			out = append(out, v.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		pod     Pod
		victims []Victim
		now     time.Time
		want    []string
	}{
		{"the preemptor waits for its victim", infer(t0.Add(time.Second)), []Victim{named, namedOther}, t0.Add(time.Minute), []string{"train"}},
		{"a pod nobody preempted for waits for nobody", bystander(t0.Add(time.Second)), []Victim{named, namedOther, byJob}, t0.Add(time.Minute), []string{}},
		{"named by the job UID only (a single pod's Workload)", Pod{UID: "pod-infer", Workloads: []Workload{{UID: "uid-x"}}}, []Victim{byJob}, t0.Add(time.Minute), []string{"old"}},
		{"unattributed: holds a pod admitted since its eviction (same second)", bystander(t0), []Victim{drained}, t0.Add(time.Minute), []string{"drained"}},
		{"unattributed: not a pod admitted before", bystander(t0.Add(-time.Second)), []Victim{drained}, t0.Add(time.Minute), []string{}},
		{"unattributed: admission time unknown holds", bystander(time.Time{}), []Victim{drained}, t0.Add(time.Minute), []string{"drained"}},
		{"own Workload unknown: waits for everyone", Pod{UID: "pod-z"}, []Victim{named, namedOther, drained}, t0.Add(time.Minute), []string{"drained", "train", "batch"}},
		{"unmarked victim within the grace", infer(t0), []Victim{unmarked}, t0.Add(UnmarkedGrace - time.Second), []string{"fresh"}},
		{"unmarked victim past the grace", infer(t0), []Victim{unmarked}, t0.Add(UnmarkedGrace), []string{}},
		{"no victims", infer(t0), nil, t0, []string{}},
	} {
		if d := cmp.Diff(tc.want, names(WaitsFor(tc.pod, tc.victims, tc.now))); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}

func TestDescribe(t *testing.T) {
	dl := t0.Add(5 * time.Minute)
	got := Describe([]Victim{
		{Namespace: "ns", Name: "a", Phase: ladder.PhaseCheckpointing, Deadline: &dl},
		{Namespace: "ns", Name: "b", Phase: ladder.PhaseTerminating, Deadline: &dl, Unattributed: "evicted (NodeFailures), not preempted for a workload"},
		{Namespace: "ns", Name: "c"},
		{Namespace: "ns", Name: "d", Phase: ladder.PhaseKilling},
		{Namespace: "ns", Name: "e", Phase: ladder.PhaseKilling},
	})
	want := "workload ns/a (Checkpointing, deadline 2026-12-02T03:05:00Z), " +
		"workload ns/b (Terminating, force delete after 2026-12-02T03:05:00Z; evicted (NodeFailures), not preempted for a workload, so it holds whoever was admitted since), " +
		"workload ns/c (evicted by Kueue, checkpoint protocol not started yet), and 2 more"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
