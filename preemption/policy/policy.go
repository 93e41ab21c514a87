// Package policy is the one place that decides how long a preempted (or
// drained) victim may take to checkpoint: the cluster's defaults and caps,
// and the rule that combines them with the tenant's own
// gpupack.io/checkpoint-timeout.
//
//	effective = min(tenant annotation if set, else Default; cap)
//	cap       = the smallest of the caps that match the victim's priority
//	            class and ClusterQueue, else Max
//
// The tenant may ask for less, never more. The coordinator, the eviction
// webhook and (through the deadline written next to the checkpoint
// request) the in-pod agent all apply the same figure.
//
// How long a victim holds its GPUs follows from it:
//
//	grace = effective + Margin
//
// the pod webhook caps a GPU pod's terminationGracePeriodSeconds at
// MaxGrace of its class (the longest grace any request of that class can
// get), and the coordinator deletes a victim's pods asking no more than
// what is left of grace counted from the eviction, whatever the pod's own
// grace says.
package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Defaults: one set for every part of gpupack.
const (
	// DefaultTimeout applies when the tenant sets no
	// gpupack.io/checkpoint-timeout.
	DefaultTimeout = 5 * time.Minute
	// DefaultMax caps any victim no priority-class or ClusterQueue entry
	// names.
	DefaultMax = 5 * time.Minute
	// DefaultMargin is how long after the checkpoint deadline a victim's
	// pods get to leave (flush, interpreter finalization) before their
	// grace ends.
	DefaultMargin = 30 * time.Second
)

// AnnotationCheckpointDeadline is written by the coordinator (and the
// eviction webhook) in the same patch as gpupack.io/checkpoint-request: the
// absolute time (RFC 3339, UTC, second resolution) by which the checkpoint
// must be saved, computed from this policy. The agent stops waiting at the
// earlier of this and its own --checkpoint-timeout after the request.
const AnnotationCheckpointDeadline = "gpupack.io/checkpoint-deadline"

// Policy is the cluster's checkpoint-time policy. The zero value is the
// defaults.
type Policy struct {
	// Default is used when the tenant asks nothing (0: DefaultTimeout).
	Default time.Duration `json:"default,omitempty"`
	// Max caps every victim that no entry below names (0: DefaultMax).
	Max time.Duration `json:"max,omitempty"`
	// MaxByPriorityClass caps victims of a (Workload or pod) priority
	// class, by name; it replaces Max for them (it may be larger).
	MaxByPriorityClass map[string]time.Duration `json:"maxByPriorityClass,omitempty"`
	// MaxByClusterQueue caps victims admitted by a ClusterQueue. When both
	// a priority-class and a ClusterQueue entry match, the smaller wins.
	MaxByClusterQueue map[string]time.Duration `json:"maxByClusterQueue,omitempty"`
	// Margin is added to the effective timeout for the pods' grace
	// (0: DefaultMargin).
	Margin time.Duration `json:"margin,omitempty"`
}

// Victim is what the policy needs to know of a victim.
type Victim struct {
	PriorityClass string
	ClusterQueue  string
	// Requested is the tenant's gpupack.io/checkpoint-timeout (0: none).
	Requested time.Duration
}

// Source says which rule produced an effective timeout.
type Source string

// Sources.
const (
	SourceTenant  Source = "tenant annotation"
	SourceDefault Source = "cluster default"
	SourceCap     Source = "cluster cap"
)

// Decision is an effective timeout and why.
type Decision struct {
	Timeout time.Duration
	Cap     time.Duration
	Source  Source
	// Grace is Timeout + the margin: the longest the victim's pods may
	// hold their GPUs after the eviction.
	Grace time.Duration
}

// Effective applies the rule.
func (p Policy) Effective(v Victim) Decision {
	c := p.Cap(v.PriorityClass, v.ClusterQueue)
	want, src := p.def(), SourceDefault
	if v.Requested > 0 {
		want, src = v.Requested, SourceTenant
	}
	if want > c {
		want, src = c, SourceCap
	}
	return Decision{Timeout: want, Cap: c, Source: src, Grace: want + p.margin()}
}

// MaxGrace is the longest termination grace a pod of this priority class
// and ClusterQueue may have: its cap plus the margin (what the pod webhook
// allows; the coordinator's delete asks for Effective's Grace).
func (p Policy) MaxGrace(priorityClass, clusterQueue string) time.Duration {
	return p.Cap(priorityClass, clusterQueue) + p.margin()
}

// LongestGrace is MaxGrace for a pod whose class is unknown: the longest cap
// plus the margin.
func (p Policy) LongestGrace() time.Duration { return p.Longest() + p.margin() }

// CapOfClass is the longest cap a victim of priorityClass can get in any
// ClusterQueue: for a component that knows the class but not the queue
// (the pod webhook at a pod's creation). A class entry is only ever
// lowered by a queue entry; without one, the largest of Max and the queue
// entries.
func (p Policy) CapOfClass(priorityClass string) time.Duration {
	if d, ok := p.MaxByPriorityClass[priorityClass]; ok && priorityClass != "" && d > 0 {
		return d
	}
	c := p.max()
	for _, d := range p.MaxByClusterQueue {
		c = max(c, d)
	}
	return c
}

// Shortest is the smallest cap any victim can get: for a pod whose job (and
// so its class) the pod webhook cannot tell, which must not pick the
// longest.
func (p Policy) Shortest() time.Duration {
	s := p.max()
	for _, m := range []map[string]time.Duration{p.MaxByPriorityClass, p.MaxByClusterQueue} {
		for _, d := range m {
			if d > 0 {
				s = min(s, d)
			}
		}
	}
	return s
}

// ShortestGrace is Shortest plus the margin.
func (p Policy) ShortestGrace() time.Duration { return p.Shortest() + p.margin() }

// MaxGraceOfClass is CapOfClass plus the margin: the longest termination
// grace the pod webhook lets a GPU pod of that class keep.
func (p Policy) MaxGraceOfClass(priorityClass string) time.Duration {
	return p.CapOfClass(priorityClass) + p.margin()
}

func (p Policy) margin() time.Duration {
	if p.Margin > 0 {
		return p.Margin
	}
	return DefaultMargin
}

// Cap is the longest any victim of this priority class and ClusterQueue
// may take.
func (p Policy) Cap(priorityClass, clusterQueue string) time.Duration {
	c, matched := time.Duration(0), false
	if d, ok := p.MaxByPriorityClass[priorityClass]; ok && priorityClass != "" && d > 0 {
		c, matched = d, true
	}
	if d, ok := p.MaxByClusterQueue[clusterQueue]; ok && clusterQueue != "" && d > 0 && (!matched || d < c) {
		c, matched = d, true
	}
	if !matched {
		c = p.max()
	}
	return c
}

// Longest is the largest cap any victim can get (what a component that
// cannot tell the victim's class, like the pod webhook, may allow).
func (p Policy) Longest() time.Duration {
	l := p.max()
	for _, d := range p.MaxByPriorityClass {
		l = max(l, d)
	}
	for _, d := range p.MaxByClusterQueue {
		l = max(l, d)
	}
	return l
}

func (p Policy) def() time.Duration {
	if p.Default > 0 {
		return p.Default
	}
	return DefaultTimeout
}

func (p Policy) max() time.Duration {
	if p.Max > 0 {
		return p.Max
	}
	return DefaultMax
}

// Validate rejects negative or zero entries.
func (p Policy) Validate() error {
	if p.Default < 0 || p.Max < 0 || p.Margin < 0 {
		return fmt.Errorf("checkpoint policy: default, max and margin must be positive")
	}
	for _, m := range []map[string]time.Duration{p.MaxByPriorityClass, p.MaxByClusterQueue} {
		for k, d := range m {
			if k == "" || d <= 0 {
				return fmt.Errorf("checkpoint policy: entry %q=%v: want a name and a positive duration", k, d)
			}
		}
	}
	return nil
}

// ParseCaps parses "name=duration,name=duration" (the manager's flag
// format). Whitespace around items is ignored; an empty string is no
// entries.
func ParseCaps(s string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, dur, ok := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want name=duration", item)
		}
		d, err := time.ParseDuration(strings.TrimSpace(dur))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%q: %q is not a positive duration (e.g. 5m)", item, dur)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%q: %s named twice", item, name)
		}
		out[name] = d
	}
	return out, nil
}

// FormatCaps is ParseCaps' inverse (sorted by name).
func FormatCaps(m map[string]time.Duration) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k].String())
	}
	return strings.Join(parts, ",")
}

// FormatDeadline is the value of AnnotationCheckpointDeadline. It rounds
// down to the second, so the written deadline is never later than the
// policy allows.
func FormatDeadline(t time.Time) string {
	return t.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// ParseDeadline reads AnnotationCheckpointDeadline.
func ParseDeadline(v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(v))
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q is not an RFC 3339 time", AnnotationCheckpointDeadline, v)
	}
	return t, nil
}
