package owners

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"
)

// TestGroupSlot: review 14 F3 — a tenant's own pod, labelled with another
// tenant's Kueue pod group, is made an owner of that group's Workload by
// Kueue; only the creator stamps tell the members apart.
func TestGroupSlot(t *testing.T) {
	obj := func(apiVersion, kind, name, uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid)}
	}
	pod := func(name string) metav1.OwnerReference { return obj("v1", "Pod", name, "uid-"+name) }
	wl := func(refs ...metav1.OwnerReference) *kueue.Workload {
		return &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "grp", Namespace: "ns", OwnerReferences: refs}}
	}
	by := func(name, user string) Member {
		return Member{Name: name, UID: types.UID("uid-" + name), Stamp: user, Stamped: true}
	}
	unstamped := func(name string) Member { return Member{Name: name, UID: types.UID("uid-" + name)} }
	skip := func(m Member) Member { m.Skip = true; return m }
	lwsRef := obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "train", "uid-lws")
	stsRef := obj("apps/v1", "StatefulSet", "train", "uid-sts")
	jobRef := obj("batch/v1", "Job", "j", "uid-job")
	plain := wl(pod("bob-0"), pod("bob-1"), pod("thief"))
	for _, tc := range []struct {
		name    string
		wl      *kueue.Workload
		lineage []metav1.OwnerReference
		self    Member
		members []Member
		ok      bool
		want    []string // in the reason
	}{
		{"all members bob's", plain, []metav1.OwnerReference{pod("bob-0")}, by("bob-0", "bob"),
			[]Member{by("bob-0", "bob"), by("bob-1", "bob")}, true, nil},
		{"alice's pod in bob's group (F3)", plain, []metav1.OwnerReference{pod("thief")}, by("thief", "alice"),
			[]Member{by("bob-0", "bob"), by("bob-1", "bob"), by("thief", "alice")}, false, []string{"grp", `thief (created by "alice")`, `bob-0 (created by "bob")`, `bob-1 (created by "bob")`}},
		{"bob's pod while alice's is a member: gated too", plain, []metav1.OwnerReference{pod("bob-0")}, by("bob-0", "bob"),
			[]Member{by("bob-0", "bob"), by("bob-1", "bob"), by("thief", "alice")}, false, []string{`bob-0 (created by "bob")`, `thief (created by "alice")`}},
		{"alice's pod gone: bob's placed again", plain, []metav1.OwnerReference{pod("bob-0")}, by("bob-0", "bob"),
			[]Member{by("bob-0", "bob"), by("bob-1", "bob"), skip(by("thief", "alice"))}, true, nil},
		{"alice's CPU-only pod takes no slot and is not compared", plain, []metav1.OwnerReference{pod("bob-0")}, by("bob-0", "bob"),
			[]Member{by("bob-1", "bob"), skip(unstamped("thief"))}, true, nil},
		{"a member without a stamp", plain, []metav1.OwnerReference{pod("bob-0")}, by("bob-0", "bob"),
			[]Member{by("bob-1", "bob"), unstamped("thief")}, false, []string{"thief (no creator stamp)"}},
		{"the pod itself without a stamp", plain, []metav1.OwnerReference{pod("thief")}, unstamped("thief"),
			[]Member{by("bob-0", "bob"), by("bob-1", "bob")}, false, []string{"no gpupack.io/created-by stamp"}},
		{"the pod without a stamp, alone in the group", plain, []metav1.OwnerReference{pod("thief")}, unstamped("thief"),
			nil, false, []string{"no gpupack.io/created-by stamp"}},
		{"a stamp that is empty still names someone else", plain, []metav1.OwnerReference{pod("bob-0")}, by("bob-0", "bob"),
			[]Member{by("bob-1", "")}, false, []string{`bob-1 (created by "")`}},
		{"a replacement pod by the same user (Kueue's failed member replaced)", plain, []metav1.OwnerReference{pod("bob-2")}, by("bob-2", "bob"),
			[]Member{by("bob-0", "bob"), by("bob-1", "bob")}, true, nil},
		{"a single pod's Workload", wl(pod("solo")), []metav1.OwnerReference{pod("solo")}, unstamped("solo"), nil, true, nil},
		{"a one-member group", wl(pod("solo")), []metav1.OwnerReference{pod("solo")}, by("solo", "bob"), nil, true, nil},
		// Through an ancestor: not a plain group's member, unaffected.
		{"an LWS group's pod (the LWS owns the Workload)", wl(lwsRef, pod("train-0"), pod("train-0-1")),
			[]metav1.OwnerReference{pod("train-0-1"), obj("apps/v1", "StatefulSet", "train-0", "uid-w"), pod("train-0"), stsRef, lwsRef}, unstamped("train-0-1"),
			[]Member{unstamped("train-0"), by("x", "system:serviceaccount:kube-system:statefulset-controller")}, true, nil},
		{"a StatefulSet group's pod", wl(stsRef, pod("train-0"), pod("train-1")), []metav1.OwnerReference{pod("train-1"), stsRef}, unstamped("train-1"),
			[]Member{unstamped("train-0")}, true, nil},
		{"a Job's pod", wl(jobRef, pod("a"), pod("b")), []metav1.OwnerReference{pod("a"), jobRef}, unstamped("a"), []Member{by("b", "alice")}, true, nil},
		// A link that is not the owner (another LWS, another UID) is no way round.
		{"alice's pod naming another LWS", wl(lwsRef, pod("train-0"), pod("thief")),
			[]metav1.OwnerReference{pod("thief"), stsRef, obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "train", "uid-other")}, by("thief", "alice"),
			[]Member{unstamped("train-0")}, false, []string{"train-0 (no creator stamp)"}},
		// alice's pod names bob's member pod as its controller: a Pod owner
		// up the lineage is no ancestor.
		{"another member forged as the pod's controller", wl(pod("a"), pod("b")), []metav1.OwnerReference{pod("a"), pod("b")}, by("a", "alice"),
			[]Member{by("b", "bob")}, false, []string{`b (created by "bob")`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := GroupSlot(tc.wl, tc.lineage, tc.self, tc.members)
			if (got == "") != tc.ok {
				t.Fatalf("GroupSlot = %q, want ok=%v", got, tc.ok)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("reason %q lacks %q", got, w)
				}
			}
		})
	}
}

func TestGroupLinks(t *testing.T) {
	lwsGVK := lws.GroupVersion.WithKind("LeaderWorkerSet")
	stsGVK := appsv1.SchemeGroupVersion.WithKind("StatefulSet")
	lwsRef := ctrlRef(lwsGVK, "train", "uid-lws")
	leaderSTS := &appsv1.StatefulSet{ObjectMeta: meta("train", "uid-lsts", &lwsRef)}
	leaderSTSRef := ctrlRef(stsGVK, "train", "uid-lsts")
	leader := pod("train-0", &leaderSTSRef)
	leaderRef := ctrlRef(GVKPod, "train-0", "uid-train-0")
	workerSTS := &appsv1.StatefulSet{ObjectMeta: meta("train-0", "uid-wsts", &leaderRef)}
	workerSTSRef := ctrlRef(stsGVK, "train-0", "uid-wsts")
	worker := pod("train-0-1", &workerSTSRef)
	plainSTS := &appsv1.StatefulSet{ObjectMeta: meta("web", "uid-web", nil)}
	webRef := ctrlRef(stsGVK, "web", "uid-web")
	staleRef := ctrlRef(stsGVK, "train-0", "uid-old")
	jobRef := ctrlRef(GVKJob, "j", "uid-j")
	r := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(leaderSTS, leader, workerSTS, worker, plainSTS).Build()
	f := Finder{Reader: r}
	names := func(refs []metav1.OwnerReference) []string {
		var out []string
		for _, r := range refs {
			out = append(out, r.Kind+"/"+r.Name+"/"+string(r.UID))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		obj  client.Object
		want []string
	}{
		{"the leader pod", leader, []string{"StatefulSet/train/uid-lsts", "LeaderWorkerSet/train/uid-lws"}},
		{"a worker pod", worker, []string{"StatefulSet/train-0/uid-wsts", "Pod/train-0/uid-train-0", "StatefulSet/train/uid-lsts", "LeaderWorkerSet/train/uid-lws"}},
		{"a plain StatefulSet's pod", pod("web-0", &webRef), nil},
		{"a pod naming a StatefulSet by a stale UID", pod("x", &staleRef), nil},
		{"a Job's pod", pod("j-0", &jobRef), nil},
		{"a pod with no controller", pod("lone", nil), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, names(f.GroupLinks(context.Background(), tc.obj))); d != "" {
				t.Errorf("GroupLinks (-want +got):\n%s", d)
			}
		})
	}
}
