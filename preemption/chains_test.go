package preemption

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/owners"
)

var gvkTrainJob = schema.GroupVersionKind{Group: "trainer.kubeflow.org", Version: "v1alpha1", Kind: "TrainJob"}

func controllerRef(gvk schema.GroupVersionKind, name string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Name: name, UID: types.UID("uid-" + name), Controller: ptr.To(true)}
}

func om(name string, owner *metav1.OwnerReference) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)}
	if owner != nil {
		m.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return m
}

// ckptPod is an opted-in rank controlled by owner (nil: none), with
// optional labels (k, v, …).
func ckptPod(name string, owner *metav1.OwnerReference, labels ...string) *corev1.Pod {
	p := rankPod(name)
	p.UID = types.UID("uid-" + name)
	p.OwnerReferences = nil
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	for i := 0; i+1 < len(labels); i += 2 {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[labels[i]] = labels[i+1]
	}
	return p
}

type chainCase struct {
	objs []client.Object
	wl   *kueue.Workload
	// ranks: the workload's pods; bystanders: pods that must not be touched.
	ranks, bystanders []string
	// stepOn: objects (kind/name) that must carry the consistent step.
	stepOn []schema.GroupVersionKind
	stepAt []string
}

func chainCases() map[string]chainCase {
	jsRef := controllerRef(owners.GVKJobSet, "js")
	tjRef := controllerRef(gvkTrainJob, "tj")
	tjSetRef := controllerRef(owners.GVKJobSet, "tj-set")
	lwsGVK := lws.GroupVersion.WithKind("LeaderWorkerSet")
	lwsRef := controllerRef(lwsGVK, "serve")
	lwsRef.Controller = nil
	leaderSts := controllerRef(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}, "serve")
	leaderSts.UID = "uid-sts-serve" // the LWS's name, its own UID
	worker0 := controllerRef(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}, "serve-0")
	worker1 := controllerRef(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}, "serve-1")
	jobRef := func(n string) *metav1.OwnerReference { r := controllerRef(owners.GVKJob, n); return &r }
	wl := func(name string, refs ...metav1.OwnerReference) *kueue.Workload {
		return &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", OwnerReferences: refs},
			Status: kueue.WorkloadStatus{Conditions: []metav1.Condition{preempted()}}}
	}
	pgA, pgB := controllerRef(owners.GVKPod, "pg-a"), controllerRef(owners.GVKPod, "pg-b")
	pgA.Controller, pgB.Controller = nil, nil
	return map[string]chainCase{
		"JobSet → Job → Pod": {
			objs: []client.Object{
				&jobset.JobSet{ObjectMeta: om("js", nil)},
				&batchv1.Job{ObjectMeta: om("js-workers-0", &jsRef)}, &batchv1.Job{ObjectMeta: om("js-driver-0", &jsRef)},
				ckptPod("js-workers-0-0", jobRef("js-workers-0")), ckptPod("js-workers-0-1", jobRef("js-workers-0")),
				ckptPod("js-driver-0-0", jobRef("js-driver-0")),
				&batchv1.Job{ObjectMeta: om("other-0", nil)}, ckptPod("other-0-0", jobRef("other-0")),
			},
			wl:         wl("jobset-js", jsRef),
			ranks:      []string{"js-driver-0-0", "js-workers-0-0", "js-workers-0-1"},
			bystanders: []string{"other-0-0"},
			stepOn:     []schema.GroupVersionKind{owners.GVKJobSet, owners.GVKJob, owners.GVKJob},
			stepAt:     []string{"js", "js-workers-0", "js-driver-0"},
		},
		"TrainJob → JobSet → Job → Pod": {
			objs: []client.Object{
				&metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: gvkTrainJob.GroupVersion().String(), Kind: "TrainJob"}, ObjectMeta: om("tj", nil)},
				&jobset.JobSet{ObjectMeta: om("tj-set", &tjRef)},
				&batchv1.Job{ObjectMeta: om("tj-node-0", &tjSetRef)},
				ckptPod("tj-node-0-0", jobRef("tj-node-0")), ckptPod("tj-node-0-1", jobRef("tj-node-0")),
			},
			wl:     wl("trainjob-tj", tjRef),
			ranks:  []string{"tj-node-0-0", "tj-node-0-1"},
			stepOn: []schema.GroupVersionKind{gvkTrainJob, owners.GVKJob},
			stepAt: []string{"tj", "tj-node-0"},
		},
		"LeaderWorkerSet group (pod-group label), not its other group": {
			objs: []client.Object{
				&lws.LeaderWorkerSet{ObjectMeta: om("serve", nil)},
				ckptPod("serve-0", &leaderSts, owners.LabelPodGroup, "serve-0-wl"), ckptPod("serve-0-1", &worker0, owners.LabelPodGroup, "serve-0-wl"),
				ckptPod("serve-1", &leaderSts, owners.LabelPodGroup, "serve-1-wl"), ckptPod("serve-1-1", &worker1, owners.LabelPodGroup, "serve-1-wl"),
			},
			wl:         wl("serve-0-wl", lwsRef),
			ranks:      []string{"serve-0", "serve-0-1"},
			bystanders: []string{"serve-1", "serve-1-1"},
			stepOn:     []schema.GroupVersionKind{lwsGVK},
			stepAt:     []string{"serve"},
		},
		"plain pod group": {
			objs: []client.Object{ckptPod("pg-a", nil, owners.LabelPodGroup, "pg"), ckptPod("pg-b", nil, owners.LabelPodGroup, "pg"), ckptPod("pg-other", nil, owners.LabelPodGroup, "pg2")},
			wl:   wl("pg", pgA, pgB), ranks: []string{"pg-a", "pg-b"}, bystanders: []string{"pg-other"},
		},
	}
}

// The coordinator runs the protocol on the pods of each kind's Workload,
// found through its ownership chain or pod group: every rank is asked,
// none of another job's, the consistent step lands on the job and on the
// Jobs the pod webhook reads GPUPACK_RESUME_STEP from, and Done comes only
// when the ranks are gone.
func TestReconcileFindsPodsThroughOwnershipChains(t *testing.T) {
	for name, tc := range chainCases() {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, append(tc.objs, tc.wl)...)
			h.wlName = tc.wl.Name
			h.reconcile()
			st := h.state()
			if st.Phase != ladder.PhaseCheckpointing || len(st.Ranks) != len(tc.ranks) {
				t.Fatalf("state %+v, want Checkpointing with %d ranks", st, len(tc.ranks))
			}
			for _, n := range tc.ranks {
				if h.pod(n).Annotations[v1alpha1.AnnotationCheckpointRequest] == "" {
					t.Errorf("rank %s not asked to checkpoint", n)
				}
			}
			for _, n := range tc.bystanders {
				if h.pod(n).Annotations[v1alpha1.AnnotationCheckpointRequest] != "" {
					t.Errorf("pod %s of another job asked to checkpoint", n)
				}
			}
			for _, n := range tc.ranks {
				h.annotatePod(n, v1alpha1.AnnotationCheckpointStep, "70")
			}
			h.clock = t0.Add(time.Second)
			h.reconcile() // Terminating: deleted
			if st := h.state(); st.Phase != ladder.PhaseTerminating || st.LastConsistentStep == nil || *st.LastConsistentStep != 70 {
				t.Fatalf("state %+v, want Terminating at step 70", st)
			}
			var gone []string
			for _, n := range tc.ranks {
				if h.pod(n) == nil {
					gone = append(gone, n)
				}
			}
			sort.Strings(gone)
			if diff := cmp.Diff(tc.ranks, gone); diff != "" {
				t.Errorf("ranks deleted (-want +got):\n%s", diff)
			}
			for _, n := range tc.bystanders {
				if h.pod(n) == nil {
					t.Errorf("pod %s of another job deleted", n)
				}
			}
			for i, gvk := range tc.stepOn {
				m := &metav1.PartialObjectMetadata{}
				m.SetGroupVersionKind(gvk)
				if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: tc.stepAt[i]}, m); err != nil {
					t.Fatal(err)
				}
				if got := m.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != "70" {
					t.Errorf("%s %s: %s = %q, want 70", gvk.Kind, tc.stepAt[i], v1alpha1.AnnotationLastConsistentCheckpoint, got)
				}
			}
			h.clock = t0.Add(2 * time.Second)
			h.reconcile()
			if st := h.state(); st.Phase != ladder.PhaseDone {
				t.Fatalf("phase %s, want Done once the ranks are gone", st.Phase)
			}
		})
	}
}

// A pod event reaches its Workload through the chain (a JobSet pod's Job,
// the JobSet), the pod group label, or the pod itself.
func TestPodToWorkloadsThroughOwnershipChains(t *testing.T) {
	for name, tc := range chainCases() {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, append(tc.objs, tc.wl)...)
			r := &Reconciler{client: h.c}
			want := []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: "ns", Name: tc.wl.Name}}}
			for _, n := range tc.ranks {
				if diff := cmp.Diff(want, r.podToWorkloads(context.Background(), h.pod(n))); diff != "" {
					t.Errorf("pod %s maps to (-want +got):\n%s", n, diff)
				}
			}
			for _, n := range tc.bystanders {
				for _, got := range r.podToWorkloads(context.Background(), h.pod(n)) {
					if got == want[0] {
						t.Errorf("pod %s of another job maps to %s", n, tc.wl.Name)
					}
				}
			}
		})
	}
	// A single pod's Workload (Kueue's pod integration) is owned by the pod.
	p := ckptPod("solo", nil)
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "pod-solo", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{controllerRef(owners.GVKPod, "solo")}}}
	h := newHarness(t, p, wl)
	r := &Reconciler{client: h.c}
	if got := r.podToWorkloads(context.Background(), h.pod("solo")); len(got) != 1 || got[0].Name != "pod-solo" {
		t.Errorf("single pod maps to %v", got)
	}
}

// blocking stands for a cache whose informer for a kind never syncs (the
// manager may not list it): reads of that kind's metadata wait for ctx.
type blocking struct {
	client.Client
	group string
}

func (b blocking) Get(ctx context.Context, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
	if pm, ok := o.(*metav1.PartialObjectMetadata); ok && pm.GroupVersionKind().Group == b.group {
		<-ctx.Done()
		return ctx.Err()
	}
	return b.Client.Get(ctx, k, o, opts...)
}

func (b blocking) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	if pl, ok := l.(*metav1.PartialObjectMetadataList); ok && pl.GroupVersionKind().Group == b.group {
		<-ctx.Done()
		return ctx.Err()
	}
	return b.Client.List(ctx, l, opts...)
}

// A kind the coordinator cannot read never blocks a worker: the job read
// gives up after owners.LookupTimeout (the reconcile retries), and a pod
// event of a chain through it maps to fewer workloads.
func TestUnreadableKindDoesNotBlock(t *testing.T) {
	defer func(d time.Duration) { owners.LookupTimeout = d }(owners.LookupTimeout)
	owners.LookupTimeout = 200 * time.Millisecond
	tc := chainCases()["JobSet → Job → Pod"]
	h := newHarness(t, append(tc.objs, tc.wl)...)
	r := &Reconciler{client: blocking{Client: h.c, group: "jobset.x-k8s.io"}, recorder: h.rec, now: func() time.Time { return t0 },
		cfg: ladder.Config{DefaultCheckpointTimeout: time.Minute, DefaultGrace: 30 * time.Second, Slack: 10 * time.Second, MaxStepsPerRank: 8}}
	done := make(chan error, 1)
	go func() {
		_, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: tc.wl.Name}})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Reconcile succeeded without reading the JobSet")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Reconcile blocked on an unreadable kind")
	}
	r.client = blocking{Client: h.c, group: "batch"}
	got := make(chan []reconcile.Request, 1)
	go func() { got <- r.podToWorkloads(context.Background(), h.pod("js-workers-0-0")) }()
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("podToWorkloads blocked on an unreadable kind")
	}
}
