package ladder

import "time"

// EvictionPod is what the pods/eviction webhook knows of the pod a drain
// wants to evict.
type EvictionPod struct {
	OptedIn     bool
	Terminating bool
	Finished    bool
	// RequestedAt is when gpupack.io/checkpoint-request was set (zero: not
	// set, or not a time).
	RequestedAt time.Time
	// Reported: the agent answered with a verified checkpoint.
	Reported bool
	// Budget is how long the eviction may be held back (the pod's
	// checkpoint timeout).
	Budget time.Duration
}

// EvictionVerdict answers one eviction request.
type EvictionVerdict struct {
	Allow bool
	// Request: set gpupack.io/checkpoint-request on the pod now.
	Request bool
	// RetryAfter is what a denied caller is told (429 + Retry-After).
	RetryAfter time.Duration
	// Reason is for the denial message and the allow log.
	Reason string
}

// MaxRetryAfter caps the Retry-After a drain is told, so it comes back
// soon after the pod has checkpointed.
const MaxRetryAfter = 5 * time.Second

// Evict decides whether a drain may evict a pod now: never hold an
// eviction back longer than the pod's budget, counted from the first
// attempt (which is also when the checkpoint is requested).
func Evict(p EvictionPod, now time.Time) EvictionVerdict {
	switch {
	case !p.OptedIn:
		return EvictionVerdict{Allow: true, Reason: "pod did not opt in to checkpointing"}
	case p.Terminating || p.Finished:
		return EvictionVerdict{Allow: true, Reason: "pod is already terminating or finished"}
	case p.Reported:
		return EvictionVerdict{Allow: true, Reason: "pod has checkpointed"}
	case p.Budget <= 0:
		return EvictionVerdict{Allow: true, Reason: "no checkpoint budget"}
	case p.RequestedAt.IsZero():
		return EvictionVerdict{Request: true, RetryAfter: min(p.Budget, MaxRetryAfter),
			Reason: "checkpoint requested; retry after it is saved"}
	}
	left := p.RequestedAt.Add(p.Budget).Sub(now)
	if left <= 0 {
		return EvictionVerdict{Allow: true, Reason: "checkpoint budget spent"}
	}
	return EvictionVerdict{RetryAfter: min(left, MaxRetryAfter), Reason: "waiting for the pod's checkpoint"}
}
