package preemption

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/policy"
)

func evictionRequest(pod string) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, SubResource: "eviction", Namespace: "ns", Name: pod,
	}}
}

func TestEvictionHandlerHoldsUntilCheckpointed(t *testing.T) {
	opted := rankPod("w0")
	opted.Annotations[v1alpha1.AnnotationCheckpointTimeout] = "30s"
	h := newHarness(t, opted, &corev1.Pod{ObjectMeta: rankPod("plain").ObjectMeta})
	plain := h.pod("plain")
	delete(plain.Annotations, v1alpha1.AnnotationCheckpoint)
	h.c.Update(context.Background(), plain)
	now := t0
	wh := &EvictionHandler{Reader: h.c, Client: h.c, Policy: policy.Policy{Default: time.Minute}, Now: func() time.Time { return now }}
	ctx := context.Background()

	type step struct {
		name      string
		at        time.Duration
		pod       string
		before    func()
		wantAllow bool
		wantRetry int32
	}
	steps := []step{
		{name: "not opted in", pod: "plain", wantAllow: true},
		{name: "first attempt: request, hold", pod: "w0", wantRetry: 5},
		{name: "retry while saving", at: 10 * time.Second, pod: "w0", wantRetry: 5},
		{name: "agent reported", at: 12 * time.Second, pod: "w0", before: func() { h.annotatePod("w0", v1alpha1.AnnotationCheckpointStep, "7") }, wantAllow: true},
	}
	for _, s := range steps {
		if s.before != nil {
			s.before()
		}
		now = t0.Add(s.at)
		resp := wh.Handle(ctx, evictionRequest(s.pod))
		if resp.Allowed != s.wantAllow {
			t.Fatalf("%s: allowed %v, want %v (%+v)", s.name, resp.Allowed, s.wantAllow, resp.Result)
		}
		if !s.wantAllow && (resp.Result.Code != http.StatusTooManyRequests || resp.Result.Details.RetryAfterSeconds != s.wantRetry) {
			t.Errorf("%s: result %+v, want 429 retry %d", s.name, resp.Result, s.wantRetry)
		}
	}
	if got := h.pod("w0").Annotations[v1alpha1.AnnotationCheckpointRequest]; got != t0.Format(time.RFC3339) {
		t.Errorf("request annotation %q, want the first attempt's time", got)
	}
}

func TestEvictionHandlerBudget(t *testing.T) {
	p := rankPod("w0")
	p.Annotations[v1alpha1.AnnotationCheckpointTimeout] = "30s"
	h := newHarness(t, p)
	now := t0
	wh := &EvictionHandler{Reader: h.c, Client: h.c, Policy: policy.Policy{Default: time.Minute}, Now: func() time.Time { return now }}
	if resp := wh.Handle(context.Background(), evictionRequest("w0")); resp.Allowed {
		t.Fatal("first attempt allowed")
	}
	now = t0.Add(29 * time.Second)
	if resp := wh.Handle(context.Background(), evictionRequest("w0")); resp.Allowed || resp.Result.Details.RetryAfterSeconds != 1 {
		t.Fatalf("just before the budget: %+v", resp.Result)
	}
	now = t0.Add(30 * time.Second)
	if resp := wh.Handle(context.Background(), evictionRequest("w0")); !resp.Allowed {
		t.Fatalf("budget spent but still held: %+v", resp.Result)
	}
	// Dry runs never annotate.
	q := rankPod("w1")
	h2 := newHarness(t, q)
	wh.Reader, wh.Client = h2.c, h2.c
	req := evictionRequest("w1")
	req.DryRun = new(bool)
	*req.DryRun = true
	wh.Handle(context.Background(), req)
	if h2.pod("w1").Annotations[v1alpha1.AnnotationCheckpointRequest] != "" {
		t.Error("dry-run eviction requested a checkpoint")
	}
}

// The cluster's cap wins over a tenant's longer annotation: a drain is held
// no longer than the policy allows for the pod's class, and the deadline
// the agent works to is written with the request.
func TestEvictionHandlerPolicyCapWins(t *testing.T) {
	p := rankPod("w0")
	p.Annotations[v1alpha1.AnnotationCheckpointTimeout] = "2h"
	p.Labels = map[string]string{"kueue.x-k8s.io/priority-class": "batch-low"}
	h := newHarness(t, p)
	now := t0
	wh := &EvictionHandler{Reader: h.c, Client: h.c, Now: func() time.Time { return now },
		Policy: policy.Policy{Max: 10 * time.Minute, MaxByPriorityClass: map[string]time.Duration{"batch-low": 40 * time.Second}}}
	if resp := wh.Handle(context.Background(), evictionRequest("w0")); resp.Allowed {
		t.Fatal("first attempt allowed")
	}
	if got := h.pod("w0").Annotations[policy.AnnotationCheckpointDeadline]; got != t0.Add(40*time.Second).Format(time.RFC3339) {
		t.Errorf("deadline written %q, want the request + the class cap 40s", got)
	}
	now = t0.Add(39 * time.Second)
	if resp := wh.Handle(context.Background(), evictionRequest("w0")); resp.Allowed {
		t.Fatal("allowed before the cap")
	}
	now = t0.Add(40 * time.Second)
	if resp := wh.Handle(context.Background(), evictionRequest("w0")); !resp.Allowed {
		t.Fatalf("held past the policy cap on the tenant's 2h: %+v", resp.Result)
	}
}

// An eviction aimed at an earlier pod of the same name (UID precondition)
// is not held and requests no checkpoint of the pod now carrying the name.
func TestEvictionHandlerIgnoresOtherIncarnation(t *testing.T) {
	h := newHarness(t, rankPod("w0"))
	wh := &EvictionHandler{Reader: h.c, Client: h.c, Now: func() time.Time { return t0 }}
	req := evictionRequest("w0")
	old := types.UID("uid-of-the-pod-before")
	raw, _ := json.Marshal(policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "w0", Namespace: "ns"},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &old}}})
	req.Object.Raw = raw
	if resp := wh.Handle(context.Background(), req); !resp.Allowed {
		t.Fatalf("held: %+v", resp.Result)
	}
	if v := h.pod("w0").Annotations[v1alpha1.AnnotationCheckpointRequest]; v != "" {
		t.Errorf("checkpoint requested of the replacement: %q", v)
	}
	// The same eviction naming this pod's UID is held as usual.
	cur := h.pod("w0").UID
	raw, _ = json.Marshal(policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "w0", Namespace: "ns"},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur}}})
	req.Object.Raw = raw
	if resp := wh.Handle(context.Background(), req); resp.Allowed {
		t.Fatal("eviction of this pod not held")
	}
}

// A checkpoint request dated in the future is none the coordinator wrote (a
// policy keeps tenants from writing it): it must not hold a drain until
// then. It counts from the pod's creation instead.
func TestEvictionHandlerFutureRequestDoesNotHoldTheDrain(t *testing.T) {
	p := rankPod("w0")
	p.CreationTimestamp = metav1.NewTime(t0.Add(-time.Hour))
	p.Annotations[v1alpha1.AnnotationCheckpointRequest] = "2099-01-01T00:00:00Z"
	h := newHarness(t, p)
	now := t0
	wh := &EvictionHandler{Reader: h.c, Client: h.c, Policy: policy.Policy{Default: time.Minute}, Now: func() time.Time { return now }}
	if resp := wh.Handle(context.Background(), evictionRequest("w0")); !resp.Allowed {
		t.Fatalf("a far-future request held the drain: %+v", resp.Result)
	}
	// Within the clock-skew allowance it is still the coordinator's.
	q := rankPod("w1")
	q.CreationTimestamp = metav1.NewTime(t0.Add(-time.Hour))
	q.Annotations[v1alpha1.AnnotationCheckpointRequest] = t0.Add(30 * time.Second).Format(time.RFC3339)
	h2 := newHarness(t, q)
	wh.Reader, wh.Client = h2.c, h2.c
	if resp := wh.Handle(context.Background(), evictionRequest("w1")); resp.Allowed {
		t.Fatal("a request 30 s ahead (clock skew) was not held")
	}
}
