// Package victims decides whom a pod that Kueue admitted without a GPUPlan
// (its ClusterQueue has no gang-fit check) waits for at gpupack's placement
// gate: the workloads Kueue preempted to make room for it, for as long as
// the preemption coordinator still has them checkpointing or terminating.
//
// Kueue v0.17 names the preemptor on each victim
// (pkg/scheduler/preemption, preemptionMessage): the Preempted condition,
// and the Evicted condition with reason Preempted, carry
//
//	Preempted to accommodate a workload (UID: <workload UID>, JobUID: <job UID>) due to …
//
// ("Replaced to accommodate a workload (UID: …, JobUID: …)" for a workload
// slice). A victim names its preemptor; a pod of that preemptor waits for
// it, and nobody else does.
//
// The fallback, for victims that name nobody (a message this package
// cannot read, an eviction that is no preemption — a drain or a lost node
// evicted through Kueue by the coordinator, an admission check, a
// deactivation — whose freed quota anyone may have been admitted into):
// such a victim holds every pod whose Workload reserved its quota at or
// after the victim's eviction began, since only those can be using the
// quota it frees. A pod whose own Workload is not known (not in the cache
// yet) waits for every victim.
//
// The function here is pure; the ungater (webhooks/placement) translates
// the API objects and acts on the answer.
package victims

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/ladder"
)

// UnmarkedGrace is how long a workload Kueue has evicted counts as a
// victim before the coordinator has written its record (normally one
// reconcile): after it, an unmarked victim (the coordinator is off, or
// does not handle that workload) holds nobody.
const UnmarkedGrace = 30 * time.Second

// Preemptor is the workload a victim was preempted for, as Kueue names it.
type Preemptor struct {
	WorkloadUID string
	JobUID      string
}

// Known: the victim names a preemptor.
func (p Preemptor) Known() bool { return p.WorkloadUID != "" || p.JobUID != "" }

var preemptorRE = regexp.MustCompile(`to accommodate a workload \(UID: ([^,()\s]*), JobUID: ([^,()\s]*)\)`)

// ParsePreemptor reads the preemptor out of Kueue's preemption message;
// false when the message names none ("UNKNOWN" is Kueue's word for an
// empty value).
func ParsePreemptor(msg string) (Preemptor, bool) {
	m := preemptorRE.FindStringSubmatch(msg)
	if m == nil {
		return Preemptor{}, false
	}
	clean := func(s string) string {
		if s == "UNKNOWN" {
			return ""
		}
		return s
	}
	p := Preemptor{WorkloadUID: clean(m[1]), JobUID: clean(m[2])}
	return p, p.Known()
}

// Victim is a workload that is giving up quota it still uses.
type Victim struct {
	Namespace, Name string
	// Phase of the coordinator's record (Checkpointing, Terminating,
	// Killing); PhaseNone: Kueue evicted it and the coordinator has not
	// marked it yet.
	Phase ladder.Phase
	// EvictedAt is when the eviction began.
	EvictedAt time.Time
	// Deadline ends the current phase: the checkpoint deadline
	// (Checkpointing) or the force-delete deadline (Terminating); nil
	// when none applies.
	Deadline *time.Time
	// Preemptor is whom Kueue preempted it for; zero with Unattributed
	// saying why none is known.
	Preemptor    Preemptor
	Unattributed string
}

// Observe translates a Workload into a Victim; false when it holds
// nothing for anyone (no preemption under way, or its preemption is Done).
func Observe(wl *kueue.Workload) (Victim, bool) {
	v := Victim{Namespace: wl.Namespace, Name: wl.Name}
	evicted := trueCondition(wl, kueue.WorkloadEvicted)
	preempted := trueCondition(wl, kueue.WorkloadPreempted)
	st, err := preemption.PreemptionState(wl)
	switch {
	case err == nil && (st.Phase == ladder.PhaseCheckpointing || st.Phase == ladder.PhaseTerminating || st.Phase == ladder.PhaseKilling):
		v.Phase = st.Phase
		if len(st.Transitions) > 0 {
			v.EvictedAt = st.Transitions[0].At
		}
		switch st.Phase {
		case ladder.PhaseCheckpointing:
			v.Deadline = st.CheckpointDeadline
		case ladder.PhaseTerminating:
			v.Deadline = st.KillDeadline
		}
	case err == nil && st.Phase != ladder.PhaseNone:
		return Victim{}, false // Done: its pods are gone
	case evicted != nil || preempted != nil:
		// Not marked yet (or a record the coordinator will start afresh).
		v.Phase = ladder.PhaseNone
	default:
		return Victim{}, false
	}
	if v.EvictedAt.IsZero() {
		for _, c := range []*metav1.Condition{evicted, preempted} {
			if c != nil && (v.EvictedAt.IsZero() || c.LastTransitionTime.Before(&metav1.Time{Time: v.EvictedAt})) {
				v.EvictedAt = c.LastTransitionTime.Time
			}
		}
	}
	switch {
	case preempted != nil:
		v.Preemptor, _ = ParsePreemptor(preempted.Message)
	case evicted != nil && evicted.Reason == kueue.WorkloadEvictedByPreemption:
		v.Preemptor, _ = ParsePreemptor(evicted.Message)
	}
	if !v.Preemptor.Known() {
		switch {
		case preempted != nil || (evicted != nil && evicted.Reason == kueue.WorkloadEvictedByPreemption):
			v.Unattributed = "its preemption message names no workload"
		case evicted != nil:
			v.Unattributed = "evicted (" + evicted.Reason + "), not preempted for a workload"
		default:
			v.Unattributed = "no Kueue condition names a preemptor"
		}
	}
	return v, true
}

func trueCondition(wl *kueue.Workload, t string) *metav1.Condition {
	c := apimeta.FindStatusCondition(wl.Status.Conditions, t)
	if c == nil || c.Status != metav1.ConditionTrue {
		return nil
	}
	return c
}

// Workload is one of the waiting pod's own Kueue Workloads.
type Workload struct {
	UID string
	// ReservedAt is when it reserved quota (zero: unknown).
	ReservedAt time.Time
}

// OfWorkload translates the pod's Workload.
func OfWorkload(wl *kueue.Workload) Workload {
	w := Workload{UID: string(wl.UID)}
	if c := trueCondition(wl, kueue.WorkloadQuotaReserved); c != nil {
		w.ReservedAt = c.LastTransitionTime.Time
	}
	return w
}

// Pod is the pod at the gate: its UID (Kueue's JobUID of a single pod's
// Workload) and its Workloads (none: not known yet).
type Pod struct {
	UID       string
	Workloads []Workload
}

// WaitsFor returns the victims pod waits for (sorted by namespace/name):
// those naming one of its Workloads (or the pod itself as the job); those
// naming nobody, if one of its Workloads reserved quota since their
// eviction began; every victim, if its Workloads are not known. A victim
// the coordinator has not marked counts for UnmarkedGrace after its
// eviction.
func WaitsFor(pod Pod, victims []Victim, now time.Time) []Victim {
	var out []Victim
	for _, v := range victims {
		if v.Phase == ladder.PhaseNone && !v.EvictedAt.IsZero() && now.Sub(v.EvictedAt) >= UnmarkedGrace {
			continue
		}
		if waits(pod, v) {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b Victim) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

func waits(pod Pod, v Victim) bool {
	if len(pod.Workloads) == 0 {
		// Who it is is not known (its Workload not in the cache yet):
		// waiting for everyone is the safe answer.
		return true
	}
	if v.Preemptor.Known() {
		if v.Preemptor.JobUID != "" && v.Preemptor.JobUID == pod.UID {
			return true
		}
		for _, w := range pod.Workloads {
			if v.Preemptor.WorkloadUID != "" && w.UID == v.Preemptor.WorkloadUID {
				return true
			}
		}
		return false
	}
	// Nobody named: whoever took quota since the eviction began may be
	// using what the victim frees. Condition times have second resolution.
	since := v.EvictedAt.Truncate(time.Second)
	for _, w := range pod.Workloads {
		if w.ReservedAt.IsZero() || !w.ReservedAt.Before(since) {
			return true
		}
	}
	return false
}

// Describe names the victims for an Event: at most three, each with its
// phase and deadline, and how many more.
func Describe(vs []Victim) string {
	var parts []string
	for i, v := range vs {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(vs)-3))
			break
		}
		var s string
		switch {
		case v.Phase == ladder.PhaseNone:
			s = "evicted by Kueue, checkpoint protocol not started yet"
		case v.Deadline != nil && v.Phase == ladder.PhaseCheckpointing:
			s = "Checkpointing, deadline " + v.Deadline.UTC().Format(time.RFC3339)
		case v.Deadline != nil:
			s = string(v.Phase) + ", force delete after " + v.Deadline.UTC().Format(time.RFC3339)
		default:
			s = string(v.Phase)
		}
		if v.Unattributed != "" {
			s += "; " + v.Unattributed + ", so it holds whoever was admitted since"
		}
		parts = append(parts, "workload "+v.Namespace+"/"+v.Name+" ("+s+")")
	}
	return strings.Join(parts, ", ")
}
