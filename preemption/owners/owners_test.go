package owners

import (
	"context"
	"errors"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"
)

const idxController, idxGroup = "ctrl", "group"

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(kueue.AddToScheme(s))
	utilruntime.Must(jobset.AddToScheme(s))
	utilruntime.Must(lws.AddToScheme(s))
	return s
}

// noMatch answers like a cluster that does not serve a kind (no CRD):
// the fake client would say "not registered" instead.
type noMatch struct {
	client.Reader
	kinds map[string]bool
}

func (r noMatch) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	if pl, ok := l.(*metav1.PartialObjectMetadataList); ok && r.kinds[pl.GetObjectKind().GroupVersionKind().Group] {
		return &apimeta.NoKindMatchError{GroupKind: pl.GroupVersionKind().GroupKind()}
	}
	return r.Reader.List(ctx, l, opts...)
}

func (r noMatch) Get(ctx context.Context, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
	if pm, ok := o.(*metav1.PartialObjectMetadata); ok && r.kinds[pm.GroupVersionKind().Group] {
		return &apimeta.NoKindMatchError{GroupKind: pm.GroupVersionKind().GroupKind()}
	}
	return r.Reader.Get(ctx, k, o, opts...)
}

func ctrlRef(gvk schema.GroupVersionKind, name string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Name: name, UID: uid, Controller: ptr.To(true)}
}

func meta(name string, uid types.UID, owner *metav1.OwnerReference) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: name, Namespace: "ns", UID: uid}
	if owner != nil {
		m.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return m
}

func pod(name string, owner *metav1.OwnerReference, labels ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: meta(name, types.UID("uid-"+name), owner)}
	for i := 0; i+1 < len(labels); i += 2 {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[labels[i]] = labels[i+1]
	}
	return p
}

func job(name string, owner *metav1.OwnerReference) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: meta(name, types.UID("uid-"+name), owner)}
}

func ref(gvk schema.GroupVersionKind, name string) *metav1.OwnerReference {
	r := ctrlRef(gvk, name, types.UID("uid-"+name))
	return &r
}

var (
	gvkPyTorchJob = schema.GroupVersionKind{Group: "kubeflow.org", Version: "v1", Kind: "PyTorchJob"}
	gvkTrainJob   = schema.GroupVersionKind{Group: "trainer.kubeflow.org", Version: "v1alpha1", Kind: "TrainJob"}
	gvkRayJob     = schema.GroupVersionKind{Group: "ray.io", Version: "v1", Kind: "RayJob"}
	gvkLWS        = schema.GroupVersionKind{Group: "leaderworkerset.x-k8s.io", Version: "v1", Kind: "LeaderWorkerSet"}
	gvkSts        = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}
)

// workload: owned by the controller ref ctl, or (pod groups) by the plain
// references others.
func workload(name string, ctl *metav1.OwnerReference, others ...metav1.OwnerReference) *kueue.Workload {
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	if ctl != nil {
		wl.OwnerReferences = append(wl.OwnerReferences, *ctl)
	}
	for _, o := range others {
		o.Controller = nil
		wl.OwnerReferences = append(wl.OwnerReferences, o)
	}
	return wl
}

func names[T any](items []T, name func(*T) string) []string {
	out := []string{}
	for i := range items {
		out = append(out, name(&items[i]))
	}
	sort.Strings(out)
	return out
}

func TestPodsThroughTheOwnershipChains(t *testing.T) {
	js := ref(GVKJobSet, "js")
	tj := ref(gvkTrainJob, "tj")
	tjSet := &jobset.JobSet{ObjectMeta: meta("tj", "uid-tjset", tj)} // TrainJob's JobSet, same name
	tjSetRef := ctrlRef(GVKJobSet, "tj", "uid-tjset")
	lwsRef := ref(gvkLWS, "serve")
	leaderSts := ref(gvkSts, "serve")
	worker0Sts, worker1Sts := ref(gvkSts, "serve-0"), ref(gvkSts, "serve-1")
	group0 := GetGroupName("serve-0")
	group1 := GetGroupName("serve-1")
	objects := []client.Object{
		// PyTorchJob → pods, next to a stranger.
		pod("pt-master-0", ref(gvkPyTorchJob, "pt")), pod("pt-worker-0", ref(gvkPyTorchJob, "pt")),
		pod("other-0", ref(gvkPyTorchJob, "other")),
		// JobSet → Jobs → pods; another JobSet's Job and pod.
		job("js-driver-0", js), job("js-workers-0", js), job("js2-workers-0", ref(GVKJobSet, "js2")),
		pod("js-driver-0-a", ref(GVKJob, "js-driver-0")), pod("js-workers-0-a", ref(GVKJob, "js-workers-0")),
		pod("js-workers-0-b", ref(GVKJob, "js-workers-0")), pod("js2-workers-0-a", ref(GVKJob, "js2-workers-0")),
		// TrainJob → JobSet → Job → pods.
		tjSet, job("tj-node-0", &tjSetRef), pod("tj-node-0-0", ref(GVKJob, "tj-node-0")), pod("tj-node-0-1", ref(GVKJob, "tj-node-0")),
		// LeaderWorkerSet with two replica groups: LWS → leader sts →
		// leader pods → worker sts → worker pods, each group labelled.
		pod("serve-0", leaderSts, LabelPodGroup, group0), pod("serve-0-1", worker0Sts, LabelPodGroup, group0),
		pod("serve-1", leaderSts, LabelPodGroup, group1), pod("serve-1-1", worker1Sts, LabelPodGroup, group1),
		// A plain pod group and a single pod.
		pod("pg-a", nil, LabelPodGroup, "pg"), pod("pg-b", nil, LabelPodGroup, "pg"),
		pod("solo", nil),
	}
	cases := map[string]struct {
		wl        *kueue.Workload
		wantPods  []string
		wantChain []string
		wantOwner string
	}{
		"PyTorchJob": {wl: workload("pytorchjob-pt", ref(gvkPyTorchJob, "pt")),
			wantPods: []string{"pt-master-0", "pt-worker-0"}, wantOwner: "pt"},
		"JobSet → Job → Pod": {wl: workload("jobset-js", js),
			wantPods: []string{"js-driver-0-a", "js-workers-0-a", "js-workers-0-b"}, wantChain: []string{"js-driver-0", "js-workers-0"}, wantOwner: "js"},
		"TrainJob → JobSet → Job → Pod": {wl: workload("trainjob-tj", tj),
			wantPods: []string{"tj-node-0-0", "tj-node-0-1"}, wantChain: []string{"tj", "tj-node-0"}, wantOwner: "tj"},
		"LWS group 0 only": {wl: workload(group0, nil, *lwsRef),
			wantPods: []string{"serve-0", "serve-0-1"}, wantOwner: "serve"},
		"LWS group 1 only": {wl: workload(group1, nil, *lwsRef),
			wantPods: []string{"serve-1", "serve-1-1"}, wantOwner: "serve"},
		"plain pod group": {wl: workload("pg", nil, *ref(GVKPod, "pg-a"), *ref(GVKPod, "pg-b")),
			wantPods: []string{"pg-a", "pg-b"}},
		"single pod": {wl: workload("pod-solo", ref(GVKPod, "solo")), wantPods: []string{"solo"}, wantOwner: "solo"},
		"single pod recreated under the same name": {wl: workload("pod-solo", &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "solo", UID: "old", Controller: ptr.To(true)}),
			wantPods: []string{}, wantOwner: "solo"},
		"nobody's":                         {wl: workload("jobset-gone", ref(GVKJobSet, "gone")), wantPods: []string{}, wantOwner: "gone"},
		"RayJob without RayCluster served": {wl: workload("rayjob-r", ref(gvkRayJob, "r")), wantPods: []string{}, wantOwner: "r"},
	}
	c := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(objects...).
		WithIndex(&corev1.Pod{}, idxController, func(o client.Object) []string {
			if r := metav1.GetControllerOf(o); r != nil {
				return []string{string(r.UID)}
			}
			return nil
		}).
		WithIndex(&corev1.Pod{}, idxGroup, func(o client.Object) []string {
			if g := o.GetLabels()[LabelPodGroup]; g != "" {
				return []string{g}
			}
			return nil
		}).Build()
	reader := noMatch{Reader: c, kinds: map[string]bool{"ray.io": true, "trainer.kubeflow.org": true}}
	for _, useIndex := range []bool{true, false} {
		f := Finder{Reader: reader, PodControllerIndex: idxController}
		if useIndex {
			f.PodGroupIndex = idxGroup
		}
		for name, tc := range cases {
			src, ok := SourceOf(tc.wl)
			if !ok {
				t.Fatalf("%s: no source", name)
			}
			if src.Owner.Name != tc.wantOwner {
				t.Errorf("%s: owner %q, want %q", name, src.Owner.Name, tc.wantOwner)
			}
			found, err := f.Pods(context.Background(), "ns", src)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if diff := cmp.Diff(tc.wantPods, names(found.Pods, func(p *corev1.Pod) string { return p.Name })); diff != "" {
				t.Errorf("%s (group index %v): pods (-want +got):\n%s", name, useIndex, diff)
			}
			if tc.wantChain == nil {
				tc.wantChain = []string{}
			}
			if diff := cmp.Diff(tc.wantChain, names(found.Chain, func(o *metav1.PartialObjectMetadata) string { return o.Name })); diff != "" {
				t.Errorf("%s: chain (-want +got):\n%s", name, diff)
			}
		}
	}
	if _, ok := SourceOf(workload("by-hand", nil)); ok {
		t.Error("a Workload without owners has a source")
	}
}

// GetGroupName stands for Kueue's LWS workload name of a replica group.
func GetGroupName(group string) string { return "leaderworkerset-" + group + "-1a2b3" }

func TestAncestors(t *testing.T) {
	js := ref(GVKJobSet, "js")
	tj := ref(gvkTrainJob, "tj")
	tjSet := &jobset.JobSet{ObjectMeta: meta("tj", "uid-tjset", tj)}
	tjSetRef := ctrlRef(GVKJobSet, "tj", "uid-tjset")
	recreated := job("re", js)
	recreated.UID = "uid-re-new"
	c := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(
		job("js-w", js), tjSet, job("tj-w", &tjSetRef), recreated,
		job("forged", ref(GVKJob, "victim")), job("victim", nil), job("mpi-launcher", ref(schema.GroupVersionKind{Group: "kubeflow.org", Version: "v2beta1", Kind: "MPIJob"}, "mpi")),
		&jobset.JobSet{ObjectMeta: meta("forged-js", "uid-forged-js", ref(GVKJob, "victim"))}, job("under-forged-js", ref(GVKJobSet, "forged-js")),
	).Build()
	f := Finder{Reader: noMatch{Reader: c, kinds: map[string]bool{"trainer.kubeflow.org": true}}}
	cases := map[string]struct {
		pod  *corev1.Pod
		want []types.UID
	}{
		"bare pod":             {pod: pod("p", nil), want: []types.UID{"uid-p"}},
		"PyTorchJob pod":       {pod: pod("p", ref(gvkPyTorchJob, "pt")), want: []types.UID{"uid-p", "uid-pt"}},
		"JobSet pod":           {pod: pod("p", ref(GVKJob, "js-w")), want: []types.UID{"uid-p", "uid-js-w", "uid-js"}},
		"TrainJob pod":         {pod: pod("p", ref(GVKJob, "tj-w")), want: []types.UID{"uid-p", "uid-tj-w", "uid-tjset", "uid-tj"}},
		"Job gone":             {pod: pod("p", ref(GVKJob, "gone")), want: []types.UID{"uid-p", "uid-gone"}},
		"Job recreated":        {pod: pod("p", ref(GVKJob, "re")), want: []types.UID{"uid-p", "uid-re"}},
		"StatefulSet pod stop": {pod: pod("p", ref(gvkSts, "s")), want: []types.UID{"uid-p", "uid-s"}},
		"MPIJob launcher pod":  {pod: pod("p", ref(GVKJob, "mpi-launcher")), want: []types.UID{"uid-p", "uid-mpi-launcher", "uid-mpi"}},
		// Anyone can write a controller reference: a tenant's Job naming
		// the victim's Job as its controller is not the victim's (round
		// 2, finding 4), nor a JobSet naming a Job.
		"Job under a Job stops":    {pod: pod("p", ref(GVKJob, "forged")), want: []types.UID{"uid-p", "uid-forged"}},
		"JobSet under a Job stops": {pod: pod("p", ref(GVKJob, "under-forged-js")), want: []types.UID{"uid-p", "uid-under-forged-js", "uid-forged-js"}},
	}
	for name, tc := range cases {
		if diff := cmp.Diff(tc.want, f.Ancestors(context.Background(), tc.pod)); diff != "" {
			t.Errorf("%s: (-want +got):\n%s", name, diff)
		}
	}
	// Lineage names each link as an object (group, kind, name, UID) for
	// Belongs, the typed pod's own (empty TypeMeta) as a Pod's.
	want := []metav1.OwnerReference{
		{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "uid-p"},
		ctrlRef(GVKJob, "js-w", "uid-js-w"),
		ctrlRef(GVKJobSet, "js", "uid-js"),
	}
	if diff := cmp.Diff(want, f.Lineage(context.Background(), pod("p", ref(GVKJob, "js-w")))); diff != "" {
		t.Errorf("Lineage of a JobSet pod: (-want +got):\n%s", diff)
	}
	// The top of the chain is as its child names it: a tenant's RayCluster
	// (the walk reads it) naming "RayJob decoy" with another object's UID
	// gives that reference, which Belongs matches as RayJob decoy only.
	forged := metav1.OwnerReference{APIVersion: "ray.io/v1", Kind: "RayJob", Name: "decoy", UID: "uid-victim", Controller: ptr.To(true)}
	rc := &metav1.PartialObjectMetadata{ObjectMeta: meta("alices-rc", "uid-alices-rc", &forged)}
	rc.SetGroupVersionKind(GVKRayCluster)
	rcl := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(rc).Build()
	lin := Finder{Reader: rcl}.Lineage(context.Background(), pod("w", ref(GVKRayCluster, "alices-rc")))
	if diff := cmp.Diff([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "w", UID: "uid-w"}, ctrlRef(GVKRayCluster, "alices-rc", "uid-alices-rc"), forged}, lin); diff != "" {
		t.Errorf("Lineage of a forged RayCluster's pod: (-want +got):\n%s", diff)
	}
	if Belongs(workload("job-victim", ref(GVKJob, "victim")), lin) {
		t.Error("the forged RayJob reference, with the victim Job's UID, belongs to the victim Job's Workload")
	}
	// A hostile cycle (a Job and a JobSet controlling each other) ends at
	// the first step no chain makes (JobSet under a Job).
	c = fake.NewClientBuilder().WithScheme(scheme()).WithObjects(job("loop-a", ref(GVKJobSet, "loop-b")), &jobset.JobSet{ObjectMeta: meta("loop-b", "uid-loop-b", ref(GVKJob, "loop-a"))}).Build()
	got := Finder{Reader: c}.Ancestors(context.Background(), pod("p", ref(GVKJob, "loop-a")))
	if diff := cmp.Diff([]types.UID{"uid-p", "uid-loop-a", "uid-loop-b"}, got); diff != "" {
		t.Errorf("cycle: (-want +got):\n%s", diff)
	}
}

// A tenant's deep nest of chain kinds below a TrainJob is walked to
// MaxDepth only.
func TestPodsDepthBound(t *testing.T) {
	tj := ref(gvkTrainJob, "tj")
	s1 := &jobset.JobSet{ObjectMeta: meta("s1", "uid-s1", tj)}
	j1 := job("j1", ref(GVKJobSet, "s1"))
	s2 := &jobset.JobSet{ObjectMeta: meta("s2", "uid-s2", ref(GVKJob, "j1"))}
	j2 := job("j2", ref(GVKJobSet, "s2"))
	c := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(s1, j1, s2, j2,
		pod("near", ref(GVKJob, "j1")), pod("deep", ref(GVKJob, "j2"))).
		WithIndex(&corev1.Pod{}, idxController, func(o client.Object) []string {
			if r := metav1.GetControllerOf(o); r != nil {
				return []string{string(r.UID)}
			}
			return nil
		}).Build()
	src, _ := SourceOf(workload("trainjob-tj", tj))
	found, err := Finder{Reader: c, PodControllerIndex: idxController}.Pods(context.Background(), "ns", src)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"near"}, names(found.Pods, func(p *corev1.Pod) string { return p.Name })); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
}

// A read error that is not "kind not served" is an error, not "no pods":
// a coordinator that took it for "all pods gone" would end a preemption
// early.
func TestPodsReadErrorIsAnError(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(scheme()).WithIndex(&corev1.Pod{}, idxController, func(client.Object) []string { return nil }).Build()
	f := Finder{Reader: failing{c}, PodControllerIndex: idxController}
	src, _ := SourceOf(workload("jobset-js", ref(GVKJobSet, "js")))
	if _, err := f.Pods(context.Background(), "ns", src); err == nil {
		t.Fatal("a failing Job list read as no pods")
	}
}

type failing struct{ client.Reader }

func (f failing) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	if _, ok := l.(*metav1.PartialObjectMetadataList); ok {
		return errors.New("etcd on fire")
	}
	return f.Reader.List(ctx, l, opts...)
}
