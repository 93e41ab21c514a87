package preemption

import (
	"context"
	"testing"
	"time"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/policy"
)

// TestEvictionHoldCapIsTheWorkloads (outside review 2026-12-02, finding
// 5): the cap on how long a drain is held comes from the pod's Workload,
// never from the pod's own labels (a tenant relabels its pod with
// `kubectl label`): a Workload with no class gets Max, a pod whose
// Workload cannot be found the shortest cap, and a Workload of the long
// class that class's cap.
func TestEvictionHoldCapIsTheWorkloads(t *testing.T) {
	pol := policy.Policy{Max: 5 * time.Minute, MaxByPriorityClass: map[string]time.Duration{"critical": 2 * time.Hour, "batch": 2 * time.Minute}}
	critical := workload()
	critical.Spec.PriorityClassRef = &kueue.PriorityClassRef{Name: "critical"}
	cases := []struct {
		name string
		wl   *kueue.Workload // nil: none
		want time.Duration
	}{
		{"tenant relabels its pod; the Workload names no class", workload(), 5 * time.Minute},
		{"no Workload found: the shortest cap", nil, 2 * time.Minute},
		{"the Workload's own long class", critical, 2 * time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := rankPod("w0")
			p.Annotations[v1alpha1.AnnotationCheckpointTimeout] = "3h"
			p.Labels = map[string]string{"kueue.x-k8s.io/priority-class": "critical"}
			p.Spec.PriorityClassName = "critical"
			h := newHarness(t, p)
			if tc.wl != nil {
				h = newHarness(t, p, tc.wl)
			}
			now := t0
			wh := &EvictionHandler{Reader: h.c, Client: h.c, Now: func() time.Time { return now }, Policy: pol}
			if resp := wh.Handle(context.Background(), evictionRequest("w0")); resp.Allowed {
				t.Fatal("first attempt allowed")
			}
			if got, want := h.pod("w0").Annotations[policy.AnnotationCheckpointDeadline], t0.Add(tc.want).Format(time.RFC3339); got != want {
				t.Errorf("deadline written %q, want %q", got, want)
			}
			now = t0.Add(tc.want + time.Second)
			if resp := wh.Handle(context.Background(), evictionRequest("w0")); !resp.Allowed {
				t.Errorf("drain still held past the cap: %s", resp.Result.Message)
			}
		})
	}
}
