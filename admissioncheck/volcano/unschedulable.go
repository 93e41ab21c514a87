package volcano

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	volcanoscheduling "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
)

// Observation is what a PodGroup's status says about the gang.
type Observation struct {
	// Since is when the gang became unschedulable (zero: it is not).
	Since time.Time
	// Stuck: unschedulable for at least the patience.
	Stuck bool
	// Wait is how long until it would be stuck (0 when stuck or schedulable).
	Wait time.Duration
	// Message is Volcano's reason and message, for people.
	Message string
}

// Unschedulable returns Volcano's Unschedulable condition when it holds and
// the gang has not started (phase Running or Completed means minMember pods
// ran, whatever a later cycle said about a replacement pod).
func Unschedulable(pg *volcanoscheduling.PodGroup) *volcanoscheduling.PodGroupCondition {
	switch pg.Status.Phase {
	case volcanoscheduling.PodGroupRunning, volcanoscheduling.PodGroupCompleted:
		return nil
	}
	for i := range pg.Status.Conditions {
		c := &pg.Status.Conditions[i]
		if c.Type == volcanoscheduling.PodGroupUnschedulableType && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// Observe decides whether the gang has been unschedulable for patience.
// recorded is when gpupack first saw it unschedulable (the PodGroup's
// AnnotationUnschedulableSince; zero if never), readySince when the check
// last turned Ready: nothing before that counts, so a PodGroup left from
// an earlier admission cannot send a fresh one back at once.
func Observe(pg *volcanoscheduling.PodGroup, recorded, readySince, now time.Time, patience time.Duration) Observation {
	c := Unschedulable(pg)
	if c == nil {
		return Observation{}
	}
	since := c.LastTransitionTime.Time
	if since.IsZero() || !recorded.IsZero() && recorded.Before(since) {
		since = recorded
	}
	if since.IsZero() || since.After(now) {
		since = now
	}
	if since.Before(readySince) {
		since = readySince
	}
	msg := c.Message
	if c.Reason != "" {
		msg = c.Reason + ": " + c.Message
	}
	o := Observation{Since: since, Message: msg}
	if stuck := now.Sub(since); stuck >= patience {
		o.Stuck = true
	} else {
		o.Wait = patience - stuck
	}
	return o
}

// RetryMessage is the check's message when Volcano could not place the gang.
func RetryMessage(o Observation, now time.Time) string {
	return fmt.Sprintf("Volcano could not schedule the gang for %s: %s", now.Sub(o.Since).Round(time.Second), o.Message)
}
