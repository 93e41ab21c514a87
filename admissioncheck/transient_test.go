package admissioncheck

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

type flakyFlavors struct{ client.Client }

func (f *flakyFlavors) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*kueue.ResourceFlavor); ok {
		return errors.New("etcdserver: request timed out")
	}
	return f.Client.Get(ctx, key, obj, opts...)
}

// Outside review: a transient error reading the assigned ResourceFlavor
// rejected the workload (deactivating it) and deleted its stored plan first.
func TestTransientFlavorReadErrorNeverRejects(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
	wl.Status.Admission.PodSetAssignments[0].Flavors = map[corev1.ResourceName]kueue.ResourceFlavorReference{"nvidia.com/gpu": "h100"}
	e := newEnv(t, gpuNode("n1", 1, nil), wl, planFor(wl, "n1-g0"))
	e.r.client = &flakyFlavors{e.c}
	e.r.cache = listCache(t, e.c)
	if _, err := e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(wl)}); err == nil {
		t.Errorf("a transient read error was not returned (the reconcile must be retried)")
	}
	st := e.check(wl)
	t.Logf("state %s: %s; plan present: %v", st.State, st.Message, e.plan("wl") != nil)
	if st.State == kueue.CheckStateRejected {
		t.Errorf("transient flavor read error gave Rejected")
	}
	if e.plan("wl") == nil {
		t.Errorf("valid stored plan deleted on a transient error")
	}
}
