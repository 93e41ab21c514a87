package topology

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanotopology "volcano.sh/apis/pkg/apis/topology/v1alpha1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

func newReconciler(t *testing.T, opts Options, objs ...client.Object) (*reconciler, client.Client) {
	t.Helper()
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(kueue.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	utilruntime.Must(volcanotopology.AddToScheme(s))
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	if opts.TopologyName == "" {
		opts.TopologyName = DefaultTopologyName
	}
	return &reconciler{client: c, opts: opts, hyperNodes: true, kueueTopology: true}, c
}

func gfp(name string, levels ...string) *v1alpha1.GangFitParameters {
	return &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.GangFitParametersSpec{TopologyLevels: levels}}
}

func k8sNode(name, s, l string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{spine: s, leaf: l}}}
}

func run(t *testing.T, r *reconciler) reconcile.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), reconcile.Request{})
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return res
}

func state(t *testing.T, c client.Client) (hyperNodes []string, levels []string, topoExists bool) {
	t.Helper()
	var hns volcanotopology.HyperNodeList
	if err := c.List(context.Background(), &hns); err != nil {
		t.Fatal(err)
	}
	for _, h := range hns.Items {
		hyperNodes = append(hyperNodes, h.Name)
	}
	var tp kueue.Topology
	if err := c.Get(context.Background(), client.ObjectKey{Name: DefaultTopologyName}, &tp); err == nil {
		topoExists = true
		for _, l := range tp.Spec.Levels {
			levels = append(levels, l.NodeLabel)
		}
	}
	return
}

func TestReconcileFollowsParameters(t *testing.T) {
	nodes := []client.Object{k8sNode("n1", "s1", "l1"), k8sNode("n2", "s1", "l2")}
	r, c := newReconciler(t, Options{}, append(nodes, gfp("b", spine, leaf), gfp("a"))...)
	run(t, r)
	hns, levels, ok := state(t, c)
	want := []string{HyperNodeName(1, leaf, "l1"), HyperNodeName(1, leaf, "l2"), HyperNodeName(2, spine, "s1")}
	if d := cmp.Diff(want, hns); d != "" {
		t.Fatalf("HyperNodes from the first parameters with levels (-want +got):\n%s", d)
	}
	if !ok || !cmp.Equal(levels, []string{spine, leaf}) {
		t.Fatalf("Kueue Topology levels %v (exists %v)", levels, ok)
	}

	// The levels change: Kueue Topology levels are immutable, so it is
	// deleted and, on the requeue, created again.
	var p v1alpha1.GangFitParameters
	if err := c.Get(context.Background(), client.ObjectKey{Name: "b"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.TopologyLevels = []string{leaf}
	if err := c.Update(context.Background(), &p); err != nil {
		t.Fatal(err)
	}
	if res := run(t, r); res.RequeueAfter == 0 {
		t.Fatal("no requeue while the old Topology goes")
	}
	if _, _, ok := state(t, c); ok {
		t.Fatal("old Topology not deleted")
	}
	run(t, r)
	hns, levels, _ = state(t, c)
	if d := cmp.Diff([]string{HyperNodeName(1, leaf, "l1"), HyperNodeName(1, leaf, "l2")}, hns); d != "" {
		t.Fatalf("HyperNodes after the change (-want +got):\n%s", d)
	}
	if !cmp.Equal(levels, []string{leaf}) {
		t.Fatalf("Topology levels %v", levels)
	}

	// No parameters with levels: gpupack's objects go, foreign ones stay.
	foreign := &volcanotopology.HyperNode{ObjectMeta: metav1.ObjectMeta{Name: "hand-made"}, Spec: volcanotopology.HyperNodeSpec{Tier: 1}}
	if err := c.Create(context.Background(), foreign); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(context.Background(), &p); err != nil {
		t.Fatal(err)
	}
	run(t, r)
	hns, _, ok = state(t, c)
	if ok || !cmp.Equal(hns, []string{"hand-made"}) {
		t.Fatalf("after the parameters went: HyperNodes %v, Topology exists %v", hns, ok)
	}
}

func TestReconcileLeavesForeignTopology(t *testing.T) {
	mine := &kueue.Topology{ObjectMeta: metav1.ObjectMeta{Name: DefaultTopologyName},
		Spec: kueue.TopologySpec{Levels: []kueue.TopologyLevel{{NodeLabel: "rack"}}}}
	r, c := newReconciler(t, Options{Parameters: "gf"}, gfp("gf", spine, leaf), gfp("other", leaf), mine)
	run(t, r)
	_, levels, ok := state(t, c)
	if !ok || !cmp.Equal(levels, []string{"rack"}) {
		t.Fatalf("a Topology gpupack did not make was changed: %v", levels)
	}
}
