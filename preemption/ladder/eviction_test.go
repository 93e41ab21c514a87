package ladder

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestEvict(t *testing.T) {
	budget := 30 * time.Second
	cases := map[string]struct {
		pod  EvictionPod
		now  time.Time
		want EvictionVerdict
	}{
		"not opted in":      {pod: EvictionPod{Budget: budget}, now: t0, want: EvictionVerdict{Allow: true, Reason: "pod did not opt in to checkpointing"}},
		"already going":     {pod: EvictionPod{OptedIn: true, Terminating: true, Budget: budget}, now: t0, want: EvictionVerdict{Allow: true, Reason: "pod is already terminating or finished"}},
		"first attempt":     {pod: EvictionPod{OptedIn: true, Budget: budget}, now: t0, want: EvictionVerdict{Request: true, RetryAfter: MaxRetryAfter, Reason: "checkpoint requested; retry after it is saved"}},
		"small budget":      {pod: EvictionPod{OptedIn: true, Budget: 2 * time.Second}, now: t0, want: EvictionVerdict{Request: true, RetryAfter: 2 * time.Second, Reason: "checkpoint requested; retry after it is saved"}},
		"still saving":      {pod: EvictionPod{OptedIn: true, Budget: budget, RequestedAt: t0}, now: at(10 * time.Second), want: EvictionVerdict{RetryAfter: MaxRetryAfter, Reason: "waiting for the pod's checkpoint"}},
		"budget nearly out": {pod: EvictionPod{OptedIn: true, Budget: budget, RequestedAt: t0}, now: at(28 * time.Second), want: EvictionVerdict{RetryAfter: 2 * time.Second, Reason: "waiting for the pod's checkpoint"}},
		"budget spent":      {pod: EvictionPod{OptedIn: true, Budget: budget, RequestedAt: t0}, now: at(30 * time.Second), want: EvictionVerdict{Allow: true, Reason: "checkpoint budget spent"}},
		"checkpointed":      {pod: EvictionPod{OptedIn: true, Budget: budget, RequestedAt: t0, Reported: true}, now: at(3 * time.Second), want: EvictionVerdict{Allow: true, Reason: "pod has checkpointed"}},
	}
	for name, tc := range cases {
		if diff := cmp.Diff(tc.want, Evict(tc.pod, tc.now)); diff != "" {
			t.Errorf("%s: Evict (-want +got):\n%s", name, diff)
		}
	}
}

// Property: whatever the clock says, an eviction is never held back past
// the budget counted from the request.
func TestEvictNeverPastBudget(t *testing.T) {
	for req := time.Duration(0); req < 10*time.Second; req += time.Second {
		for now := req; now < req+2*time.Minute; now += 700 * time.Millisecond {
			p := EvictionPod{OptedIn: true, Budget: 45 * time.Second, RequestedAt: at(req)}
			v := Evict(p, at(now))
			if !v.Allow && at(now).Add(v.RetryAfter).After(at(req).Add(p.Budget)) {
				t.Fatalf("request at %v, now %v: told to retry after %v, past the budget", req, now, v.RetryAfter)
			}
			if now-req >= p.Budget && !v.Allow {
				t.Fatalf("request at %v, now %v: denied after the budget", req, now)
			}
		}
	}
}
