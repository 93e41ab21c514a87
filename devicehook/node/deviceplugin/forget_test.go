package deviceplugin

import (
	"errors"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// TestForgetGonePods: the Events a plugin already told pods (refusals,
// unsafe requests) are remembered only while the pods are on the node;
// a pod still there is not told again.
func TestForgetGonePods(t *testing.T) {
	rec := record.NewFakeRecorder(100)
	p := New(Config{ResourceName: v1alpha1.ResourceVGPU, NodeName: "n1", Recorder: rec})
	pod := func(uid string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + uid, Namespace: "ns", UID: types.UID(uid)}}
	}
	keep := pod("keep")
	for _, uid := range []string{"a", "b", "c", "keep"} {
		p.tellRefused([]Refusal{{Pod: pod(uid), Err: errors.New("no")}})
		p.tellUnsafe(Decision{Unplanned: pod(uid)}, errors.New("no plan"))
	}
	if n := p.remembered(); n != 8 {
		t.Fatalf("%d entries remembered, want 8", n)
	}
	p.Forget(map[types.UID]bool{keep.UID: true})
	if n := p.remembered(); n != 2 {
		t.Errorf("%d entries after the others left, want keep's 2", n)
	}
	for len(rec.Events) > 0 {
		<-rec.Events
	}
	p.tellRefused([]Refusal{{Pod: keep, Err: errors.New("no")}})
	p.tellUnsafe(Decision{Unplanned: keep}, errors.New("no plan"))
	if len(rec.Events) != 0 {
		t.Errorf("a pod still on the node was told again: %d events", len(rec.Events))
	}
}

// TestForgetAllocationsOfGonePods: the per-pod count of allocated
// containers goes once the pod has left the node and its last allocation
// is allocatedGrace old — not sooner: a pod the kubelet just allocated may
// not be in the pod list yet, and forgetting its count would give its next
// container the first container's GPUs again.
func TestForgetAllocationsOfGonePods(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clock := t0
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = time.Now })
	p := New(Config{ResourceName: v1alpha1.ResourceVGPU, NodeName: "n1"})
	allocate := func(uid types.UID, at time.Time) {
		clock = at
		p.mu.Lock()
		p.allocated[uid]++
		p.allocatedAt[uid] = now()
		p.mu.Unlock()
	}
	allocate("gone-long-ago", t0)
	allocate("live", t0)
	allocate("just-allocated-not-listed-yet", t0.Add(allocatedGrace))
	clock = t0.Add(allocatedGrace + time.Minute)
	p.Forget(map[types.UID]bool{"live": true})
	p.mu.Lock()
	defer p.mu.Unlock()
	want := map[types.UID]int{"live": 1, "just-allocated-not-listed-yet": 1}
	if !maps.Equal(p.allocated, want) {
		t.Errorf("allocated = %v, want %v", p.allocated, want)
	}
	if len(p.allocatedAt) != len(p.allocated) {
		t.Errorf("allocatedAt has %d entries, allocated %d", len(p.allocatedAt), len(p.allocated))
	}
}
