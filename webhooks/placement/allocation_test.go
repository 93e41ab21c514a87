package placement

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Finding 2 (same-namespace swaps): the kubelet's Allocate does not name
// the pod, so two pods awaiting their allocation on one node with the same
// GPU count are released one at a time.

// gpuGated is gatedPod with one container asking for n of resource.
func gpuGated(name, uid, index string, res corev1.ResourceName, n int64) *corev1.Pod {
	p := gatedPod(name, uid, "wl", index)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: *resource.NewQuantity(n, resource.DecimalSI)}
	return p
}

// oneNodePlan is a plan of pods slots, each one GPU (gpus[i]) on node n1.
func oneNodePlan(gpus ...string) *v1alpha1.GPUPlan {
	pl := testPlan()
	pl.Spec.Assignments = nil
	for i, g := range gpus {
		pl.Spec.Assignments = append(pl.Spec.Assignments, v1alpha1.PodAssignment{PodSet: "worker", Index: int32(i), Node: "n1",
			GPUs: []v1alpha1.GPUAssignment{{UUID: g, MemoryMiB: 20480}}})
	}
	return pl
}

func admit(t *testing.T, c client.Client, name string) {
	t.Helper()
	p := getPod(t, c, name)
	now := metav1.Now()
	p.Spec.NodeName = "n1"
	if err := c.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	p.Status.StartTime = &now
	if err := c.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

func gated(t *testing.T, c client.Client, name string) bool {
	return hasGate(getPod(t, c, name), v1alpha1.SchedulingGatePlacement)
}

func TestReleasesOnePodPerNodeAndCountAtATime(t *testing.T) {
	r, c, rec := setup(t, oneNodePlan("GPU-a", "GPU-b", "GPU-c"),
		gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), gpuGated("w1", "u1", "1", v1alpha1.ResourceNvidiaGPU, 1),
		gpuGated("w2", "u2", "2", v1alpha1.ResourceNvidiaGPU, 1))
	reconcilePod(t, r, "w1")
	if gated(t, c, "w1") {
		t.Fatal("the first pod was not released")
	}
	<-rec.Events // Placed
	for _, name := range []string{"w0", "w2"} {
		if res := reconcilePod(t, r, name); res.RequeueAfter != AllocationRetry {
			t.Errorf("%s: requeue %v, want %v", name, res.RequeueAfter, AllocationRetry)
		}
		if !gated(t, c, name) {
			t.Errorf("%s released while w1 (same node, same count) awaits its allocation", name)
		}
	}
	for i := 0; i < 2; i++ {
		ev := <-rec.Events
		if !strings.Contains(ev, EventWaitingForAllocation) || !strings.Contains(ev, "pod w1") {
			t.Errorf("event %q, want %s naming w1", ev, EventWaitingForAllocation)
		}
	}
	reconcilePod(t, r, "w0") // again: no second Event
	if n := len(rec.Events); n != 0 {
		t.Errorf("%d more events while still held back, want 0", n)
	}
	if got := r.heldBehind(context.Background(), getPod(t, c, "w1")); len(got) != 2 {
		t.Errorf("w1's admission wakes %v, want w0 and w2", got)
	}

	// The kubelet admits w1 (status.startTime): the next one goes.
	admit(t, c, "w1")
	reconcilePod(t, r, "w2")
	reconcilePod(t, r, "w0")
	if gated(t, c, "w2") == gated(t, c, "w0") {
		t.Errorf("after w1's admission: w0 gated %v, w2 gated %v; want exactly one released", gated(t, c, "w0"), gated(t, c, "w2"))
	}
	admit(t, c, "w2")
	reconcilePod(t, r, "w0")
	if gated(t, c, "w0") {
		t.Error("w0 still gated after w1 and w2 were admitted")
	}
}

func TestReleaseOrderingOnlyForIndistinguishablePods(t *testing.T) {
	cases := []struct {
		name  string
		first *corev1.Pod
		// mutate the first pod after its release (as the world would).
		after func(p *corev1.Pod)
		plan  *v1alpha1.GPUPlan
		held  bool
		// del deletes the first pod after that (it has a finalizer).
		del bool
	}{
		{name: "same resource and count, same node", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), plan: oneNodePlan("GPU-a", "GPU-b"), held: true},
		{name: "bound but not admitted", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), plan: oneNodePlan("GPU-a", "GPU-b"), held: true,
			after: func(p *corev1.Pod) { p.Spec.NodeName = "n1" }},
		{name: "terminating, bound, not admitted", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), plan: oneNodePlan("GPU-a", "GPU-b"), held: true,
			after: func(p *corev1.Pod) { p.Spec.NodeName = "n1"; p.Finalizers = []string{"x"} }, del: true},
		{name: "terminating, pinned, not bound (never scheduled)", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), plan: oneNodePlan("GPU-a", "GPU-b"),
			after: func(p *corev1.Pod) { p.Finalizers = []string{"x"} }, del: true},
		{name: "other count", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 2), plan: func() *v1alpha1.GPUPlan {
			pl := oneNodePlan("GPU-a", "GPU-b")
			pl.Spec.Assignments[0].GPUs = append(pl.Spec.Assignments[0].GPUs, v1alpha1.GPUAssignment{UUID: "GPU-c", MemoryMiB: 20480})
			return pl
		}()},
		{name: "other resource", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceVGPU, 1), plan: oneNodePlan("GPU-a", "GPU-b")},
		{name: "other node", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), plan: func() *v1alpha1.GPUPlan {
			pl := oneNodePlan("GPU-a", "GPU-b")
			pl.Spec.Assignments[0].Node = "n2"
			return pl
		}()},
		{name: "admitted", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), plan: oneNodePlan("GPU-a", "GPU-b"),
			after: func(p *corev1.Pod) { p.Spec.NodeName = "n1"; now := metav1.Now(); p.Status.StartTime = &now }},
		{name: "rejected by the kubelet", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), plan: oneNodePlan("GPU-a", "GPU-b"),
			after: func(p *corev1.Pod) { p.Spec.NodeName = "n1"; p.Status.Phase = corev1.PodFailed }},
		// A pod the scheduler cannot place holds nobody back (a tenant's
		// unschedulable pod must not stall the node for others).
		{name: "pinned but unschedulable", first: gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), plan: oneNodePlan("GPU-a", "GPU-b"),
			after: func(p *corev1.Pod) {
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			second := gpuGated("w1", "u1", "1", v1alpha1.ResourceNvidiaGPU, 1)
			r, c, _ := setup(t, tc.plan, tc.first, second)
			reconcilePod(t, r, "w0")
			if gated(t, c, "w0") {
				t.Fatal("the first pod was not released")
			}
			if tc.after != nil {
				p := getPod(t, c, "w0")
				tc.after(p)
				st := p.Status
				if err := c.Update(context.Background(), p); err != nil {
					t.Fatal(err)
				}
				p.Status = st
				if err := c.Status().Update(context.Background(), p); err != nil {
					t.Fatal(err)
				}
			}
			if tc.del {
				if err := c.Delete(context.Background(), getPod(t, c, "w0")); err != nil {
					t.Fatal(err)
				}
			}
			reconcilePod(t, r, "w1")
			if got := gated(t, c, "w1"); got != tc.held {
				t.Errorf("second pod held back = %v, want %v", got, tc.held)
			}
		})
	}
}

// A release this process made counts even while the cache still shows the
// pod gated (the informer lags its own write).
func TestReleaseCountsOwnWritesTheCacheLags(t *testing.T) {
	r, c, _ := setup(t, oneNodePlan("GPU-a", "GPU-b"), gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1), gpuGated("w1", "u1", "1", v1alpha1.ResourceNvidiaGPU, 1))
	// w0 as this process released it, while the store still has it gated.
	w0 := getPod(t, c, "w0")
	Pin(w0, "n1", "GPU-a:20480")
	r.released = map[types.UID]*corev1.Pod{w0.UID: w0}
	reconcilePod(t, r, "w1")
	if !gated(t, c, "w1") {
		t.Error("w1 released although this process had just released w0 (same node and count) and the cache did not show it yet")
	}
	// The cache catches up and the kubelet admits w0: the assumption goes.
	reconcilePod(t, r, "w0")
	admit(t, c, "w0")
	reconcilePod(t, r, "w1")
	if gated(t, c, "w1") {
		t.Error("w1 still gated after w0 was admitted")
	}
	if len(r.released) != 1 { // w1's own release
		t.Errorf("released = %v, want only w1 left", r.released)
	}
}

// A released pod no scheduler binds (spec.schedulerName naming a scheduler
// nobody runs: never bound, never marked unschedulable) holds the others
// back for UnboundGrace, not for ever.
func TestUnboundPodHoldsBackForAGraceOnly(t *testing.T) {
	now := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	stuck := gpuGated("w0", "u0", "0", v1alpha1.ResourceNvidiaGPU, 1)
	stuck.Spec.SchedulerName = "nobody-runs-this"
	r, c, _ := setup(t, oneNodePlan("GPU-a", "GPU-b"), stuck, gpuGated("w1", "u1", "1", v1alpha1.ResourceNvidiaGPU, 1))
	r.Now = func() time.Time { return now }
	reconcilePod(t, r, "w0")
	reconcilePod(t, r, "w1")
	if !gated(t, c, "w1") {
		t.Fatal("w1 released at once next to an unbound w0 (it may be bound any moment)")
	}
	now = now.Add(UnboundGrace / 2)
	reconcilePod(t, r, "w1")
	if !gated(t, c, "w1") {
		t.Fatal("w1 released within the grace")
	}
	now = now.Add(UnboundGrace)
	reconcilePod(t, r, "w1")
	if gated(t, c, "w1") {
		t.Errorf("w1 still held back %v after w0's release, by a pod no scheduler binds", 3*UnboundGrace/2)
	}
}
