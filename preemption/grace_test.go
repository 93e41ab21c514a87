package preemption

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/policy"
)

// deletes records the grace each pod delete asked for (-1: none given).
type deletes struct {
	mu    sync.Mutex
	grace map[string][]int64
}

func (d *deletes) wrap(c client.WithWatch) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
		if _, ok := obj.(*corev1.Pod); ok {
			o := &client.DeleteOptions{}
			o.ApplyOptions(opts)
			g := int64(-1)
			if o.GracePeriodSeconds != nil {
				g = *o.GracePeriodSeconds
			}
			d.mu.Lock()
			d.grace[obj.GetName()] = append(d.grace[obj.GetName()], g)
			d.mu.Unlock()
		}
		return c.Delete(ctx, obj, opts...)
	}})
}

// A tenant's terminationGracePeriodSeconds of an hour and a checkpoint
// timeout of 2 h against a 3 m cap: every delete the coordinator makes asks
// for no more than the checkpoint deadline + margin − now — the rank it
// deletes after the deadline, the pod that never opted in, and the pod the
// job controller had already deleted with its hour — and the force delete
// comes at deadline + margin + slack, not an hour later.
func TestDeleteGraceFollowsThePolicyNotThePod(t *testing.T) {
	const hour = int64(3600)
	tenant := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.TerminationGracePeriodSeconds = ptr.To(hour)
		p.Finalizers = []string{"test/container-running"} // the kubelet has not confirmed
		return p
	}
	j := job()
	j.Annotations[v1alpha1.AnnotationCheckpointTimeout] = "2h"
	rank := tenant(rankPod("w0"))
	helper := tenant(rankPod("launcher"))
	delete(helper.Annotations, v1alpha1.AnnotationCheckpoint) // not opted in
	stopped := tenant(rankPod("w1"))
	// Deleted by the job controller (Kueue suspended the job) with the
	// pod's own hour, a second before the coordinator first looks.
	stopped.DeletionTimestamp = &metav1.Time{Time: t0.Add(-time.Second).Add(time.Hour)}
	stopped.DeletionGracePeriodSeconds = ptr.To(hour)
	h := newHarness(t, j, workload(preempted()), rank, helper, stopped)
	d := &deletes{grace: map[string][]int64{}}
	h.c = d.wrap(h.c.(client.WithWatch))
	h.policy = policy.Policy{Max: 3 * time.Minute, Margin: 20 * time.Second}

	h.reconcile() // Checkpointing until t0+3m
	st := h.state()
	if st.Phase != ladder.PhaseCheckpointing || !st.CheckpointDeadline.Equal(t0.Add(3*time.Minute)) ||
		st.GraceDeadline == nil || !st.GraceDeadline.Equal(t0.Add(3*time.Minute+20*time.Second)) {
		t.Fatalf("state %+v, want Checkpointing until t0+3m and the pods gone by t0+3m20s", st)
	}
	h.clock = t0.Add(3 * time.Minute)
	h.reconcile() // deadline: Terminating
	if st := h.state(); st.Phase != ladder.PhaseTerminating || !st.KillDeadline.Equal(t0.Add(3*time.Minute+20*time.Second+10*time.Second)) {
		t.Fatalf("state %+v, want Terminating with the force delete at deadline + margin + slack", st)
	}
	want := map[string][]int64{
		"w0":       {20},            // deadline + margin − now
		"launcher": {20},            // not opted in: bounded all the same
		"w1":       {3*60 + 20 + 1}, // the API server counts it from the job controller's delete at t0−1s
	}
	for name, g := range want {
		if got := d.grace[name]; len(got) != 1 || got[0] != g[0] {
			t.Errorf("pod %s deleted with grace %v, want %v (never the pod's own %d s)", name, got, g, hour)
		}
	}
	h.clock = t0.Add(3*time.Minute + 30*time.Second)
	h.reconcile()
	if st := h.state(); st.Phase != ladder.PhaseKilling {
		t.Fatalf("phase %q at deadline + margin + slack, want Killing", st.Phase)
	}
	for _, name := range []string{"w0", "launcher", "w1"} {
		if got := d.grace[name]; len(got) == 0 || got[len(got)-1] != 0 {
			t.Errorf("pod %s: deletes %v, want a force delete (0) last", name, got)
		}
	}
}
