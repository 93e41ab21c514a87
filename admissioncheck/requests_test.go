package admissioncheck

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// writeCounter records every write the reconciler sends to the API server
// ("create GPUPlan", "update Workload/status", …). Reads are the informer
// cache's in the manager, so only writes are requests per decision.
type writeCounter struct{ writes []string }

func (w *writeCounter) add(verb string, obj client.Object, sub string) {
	kind := fmt.Sprintf("%T", obj)
	kind = kind[strings.LastIndex(kind, ".")+1:]
	if sub != "" {
		kind += "/" + sub
	}
	w.writes = append(w.writes, verb+" "+kind)
}

func (w *writeCounter) funcs() interceptor.Funcs {
	return interceptor.Funcs{
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			w.add("create", obj, "")
			return cl.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			w.add("update", obj, "")
			return cl.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			w.add("patch", obj, "")
			return cl.Patch(ctx, obj, p, opts...)
		},
		Delete: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			w.add("delete", obj, "")
			return cl.Delete(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			w.add("update", obj, sub)
			return cl.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			w.add("patch", obj, sub)
			return cl.SubResource(sub).Patch(ctx, obj, p, opts...)
		},
	}
}

// Issue 17 (cost): an admitted Workload costs the manager two API requests
// — the GPUPlan create and the check's Ready on the Workload's status — and
// no Event; what the plan status write and the GangFits Event said is in
// the Ready message (the plan's name) and in the plan itself. Reconciling
// the Ready Workload again (Kueue's Admitted write wakes it) writes nothing.
func TestAdmittedWorkloadCostsTwoWrites(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 2, 1).obj()
	w := &writeCounter{}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(gangFitCheck(), gpuNode("n1", 2, nil), wl).
		WithStatusSubresource(&kueue.Workload{}, &v1alpha1.GPUPlan{}, &kueue.AdmissionCheck{}).
		WithInterceptorFuncs(w.funcs()).Build()
	rec := record.NewFakeRecorder(100)
	e := &env{t: t, c: c, rec: rec}
	e.r = &workloadReconciler{client: c, planReader: c, recorder: rec, clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))}
	e.reconcile(wl)
	st := e.check(wl)
	if st.State != kueue.CheckStateReady {
		t.Fatalf("check %s (%q), want Ready", st.State, st.Message)
	}
	if !strings.Contains(st.Message, "GPUPlan wl") {
		t.Errorf("check %s (%q), want Ready naming GPUPlan wl", st.State, st.Message)
	}
	want := []string{"create GPUPlan", "update Workload/status"}
	if fmt.Sprint(w.writes) != fmt.Sprint(want) {
		t.Errorf("writes %v, want %v", w.writes, want)
	}
	if n := len(rec.Events); n != 0 {
		t.Errorf("%d Event(s) for a fit (%s), want none", n, <-rec.Events)
	}
	if p := e.plan("wl"); p == nil || len(p.Spec.Assignments) != 2 || p.Status.Phase == v1alpha1.PlanReleased {
		t.Errorf("plan %+v, want 2 slots reserving", p)
	}

	// Kueue admits: the reconcile that follows writes nothing.
	w.writes = nil
	cur := &kueue.Workload{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(wl), cur); err != nil {
		t.Fatal(err)
	}
	e.reconcile(cur)
	if len(w.writes) != 0 {
		t.Errorf("reconciling a Ready Workload wrote %v", w.writes)
	}
}
