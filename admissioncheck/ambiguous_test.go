package admissioncheck

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Outside review: the plan Create reaches etcd but the client sees a timeout.
// Forgetting the assumption freed the GPUs; before the informer delivered
// the plan, the next decision planned the same GPU for another workload.
func TestAmbiguousPlanCreateNeverDoubleBooks(t *testing.T) {
	a := admittedWorkload("a", "a-uid", 1, 1).obj()
	b := admittedWorkload("b", "b-uid", 1, 1).obj()
	failOnce := true
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(gangFitCheck(), gpuNode("n1", 1, nil), a, b).
		WithStatusSubresource(&kueue.Workload{}, &v1alpha1.GPUPlan{}, &kueue.AdmissionCheck{}).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*v1alpha1.GPUPlan); ok && failOnce {
				failOnce = false
				if err := cl.Create(ctx, obj, opts...); err != nil {
					return err
				}
				return apierrors.NewTimeoutError("request did not complete within requested timeout", 1)
			}
			return cl.Create(ctx, obj, opts...)
		}}).Build()
	r := &workloadReconciler{client: c, planReader: c, recorder: record.NewFakeRecorder(100), clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))}
	r.cache = listCache(t, c) // informers: no plan events delivered during the test (lag)
	ctx := context.Background()
	_, errA := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(a)})
	t.Logf("a: %v", errA)
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(b)}); err != nil {
		t.Fatal(err)
	}
	var plans v1alpha1.GPUPlanList
	_ = c.List(ctx, &plans)
	for _, p := range plans.Items {
		t.Logf("plan %s: %s %v", p.Name, p.Spec.Assignments[0].Node, p.Spec.Assignments[0].GPUs[0].UUID)
	}
	if len(plans.Items) == 2 {
		t.Errorf("two plans hold the one GPU n1-g0")
	}
}

// The ambiguous create did store the plan, and the informer shows it: the
// Workload's next reconcile reuses that plan (Ready on the one GPU). The
// GPUs held for the ambiguous write must not count beside the plan they
// stood in for, or the plan would look overbooked by itself and be
// replaced, the GPU held by nothing for GhostTTL.
func TestAmbiguousPlanCreateThenShownIsReused(t *testing.T) {
	a := admittedWorkload("a", "a-uid", 1, 1).obj()
	failOnce := true
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(gangFitCheck(), gpuNode("n1", 1, nil), a).
		WithStatusSubresource(&kueue.Workload{}, &v1alpha1.GPUPlan{}, &kueue.AdmissionCheck{}).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*v1alpha1.GPUPlan); ok && failOnce {
				failOnce = false
				if err := cl.Create(ctx, obj, opts...); err != nil {
					return err
				}
				return apierrors.NewTimeoutError("request did not complete within requested timeout", 1)
			}
			return cl.Create(ctx, obj, opts...)
		}}).Build()
	r := &workloadReconciler{client: c, planReader: c, recorder: record.NewFakeRecorder(100), clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))}
	r.cache = listCache(t, c)
	ctx := context.Background()
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(a)}); err == nil {
		t.Fatal("the ambiguous create was not reported")
	}
	stored := &v1alpha1.GPUPlan{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(a), stored); err != nil {
		t.Fatal(err)
	}
	r.cache.UpsertPlan(stored) // the informer delivers it
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(a)}); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, c: c}
	if st := e.check(a); st.State != kueue.CheckStateReady {
		t.Errorf("check %s (%q), want Ready on the stored plan", st.State, st.Message)
	}
	if p := e.plan("a"); p == nil || p.UID != stored.UID {
		t.Errorf("plan %v replaced, want the stored one (%s) reused", p, stored.UID)
	}
}
