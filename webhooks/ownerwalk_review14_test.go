package webhooks

import (
	"context"
	"strings"
	"testing"

	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// Review 14, F2 (and the pod side of F1): Kueue takes an object whose
// controller chain reaches a job it manages as that job's child, whatever
// its own queue label (FindAncestorJobManagedByKueue), so the owner walk
// may not count such an owner as managed by its own label; and it walks
// a RayCluster up to its RayJob (a JobSet up to its TrainJob) only where
// gpupack checks that kind at its creation (the creator of the middle link).
func TestOwnerWalkReview14(t *testing.T) {
	const kuberay = "system:serviceaccount:ray-system:kuberay-operator"
	queue := map[string]string{mutation.LabelQueueName: "q"}
	ctl := func(apiVersion, kind, name, uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}}
	}
	rayJob := func(name string, labels map[string]string, owners []metav1.OwnerReference) *ray.RayJob {
		return &ray.RayJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("u-" + name), Labels: labels, OwnerReferences: owners}}
	}
	rayCluster := func(name string, labels map[string]string, owners []metav1.OwnerReference) *ray.RayCluster {
		return &ray.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("u-" + name), Labels: labels, OwnerReferences: owners}}
	}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: "ns", UID: "u-victim", Labels: queue}},
		rayJob("decoy", queue, nil), // alice's queued (admitted) CPU RayJob
		rayJob("plain", nil, nil),   // a RayJob Kueue does not manage
		rayJob("under-job", queue, ctl("batch/v1", "Job", "victim", "u-victim")),     // a queued RayJob under a queued Job
		rayCluster("forged", queue, ctl("ray.io/v1", "RayJob", "decoy", "u-victim")), // F1: names RayJob decoy with the victim Job's UID
		rayCluster("labelled-under-decoy", queue, ctl("ray.io/v1", "RayJob", "decoy", "u-decoy")),
		rayCluster("under-decoy", nil, ctl("ray.io/v1", "RayJob", "decoy", "u-decoy")), // F2
		rayCluster("labelled-under-plain", queue, ctl("ray.io/v1", "RayJob", "plain", "u-plain")),
		rayCluster("standalone", queue, nil),
		rayCluster("of-under-job", nil, ctl("ray.io/v1", "RayJob", "under-job", "u-under-job")),
	}
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = ray.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	frameworks := []string{"batch/job", "ray.io/rayjob", "ray.io/raycluster"}
	withEntry := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: frameworks}, JobKinds: []string{KindRayJob, KindRayCluster}}
	noEntry := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: frameworks}}
	for _, tc := range []struct {
		name    string
		cfg     mutation.Config
		cluster string // the worker pod's controller, made by KubeRay
		deny    string // "" admitted; else a part of the denial
	}{
		{"F1: queue-labelled RayCluster naming RayJob decoy with another UID", withEntry, "forged", "RayJob decoy, which cannot be read or is not that object"},
		{"F1, no RayCluster entry", noEntry, "forged", "RayJob decoy, which cannot be read or is not that object"},
		{"F2: RayCluster under an admitted RayJob, no RayCluster entry", noEntry, "under-decoy", "RayClusters have no gpupack webhook entry"},
		{"queue-labelled RayCluster under an admitted RayJob, no RayCluster entry", noEntry, "labelled-under-decoy", "RayClusters have no gpupack webhook entry"},
		{"KubeRay's RayCluster of a queued RayJob (its creation checked)", withEntry, "under-decoy", ""},
		{"KubeRay's queue-labelled RayCluster of a queued RayJob", withEntry, "labelled-under-decoy", ""},
		{"queue-labelled RayCluster under a RayJob Kueue does not manage (Kueue takes it by its label)", noEntry, "labelled-under-plain", ""},
		{"standalone queue-labelled RayCluster", noEntry, "standalone", ""},
		{"queue-labelled RayJob under a queued batch Job (Kueue's child of the Job, never suspended)", withEntry, "of-under-job", "gpupack does not walk through a RayJob controlled by that owner"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := mutation.New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			pod := wholeGPUPod("ns", "4")
			pod.OwnerReferences = ctl("ray.io/v1", "RayCluster", tc.cluster, "u-"+tc.cluster)
			req := request(t, admissionv1.Create, pod, nil)
			req.UserInfo = authenticationv1.UserInfo{Username: kuberay}
			resp := Handlers(m, c)[PathMutatePod].Handle(context.Background(), req)
			switch {
			case tc.deny == "" && !resp.Allowed:
				t.Errorf("denied: %v", resp.Result.Message)
			case tc.deny != "" && resp.Allowed:
				t.Errorf("admitted; want a denial saying %q", tc.deny)
			case tc.deny != "" && !strings.Contains(resp.Result.Message, tc.deny):
				t.Errorf("denial %q does not say %q", resp.Result.Message, tc.deny)
			}
		})
	}

	// At creation: a RayCluster (RayJob, MPIJob) is checked as a JobSet is.
	// alice's own GPU RayCluster under her admitted RayJob is refused;
	// KubeRay's is not.
	m, err := mutation.New(withEntry)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user string
		deny bool
	}{{"alice", true}, {kuberay, false}} {
		rc := testRayCluster(nil, gpuTemplate(nil, "4"))
		rc.OwnerReferences = ctl("ray.io/v1", "RayJob", "decoy", "u-decoy")
		req := request(t, admissionv1.Create, rc, nil)
		req.UserInfo = authenticationv1.UserInfo{Username: tc.user}
		resp := Handlers(m, c)[PathMutateRayCluster].Handle(context.Background(), req)
		if resp.Allowed == tc.deny {
			t.Errorf("GPU RayCluster under RayJob decoy created by %s: allowed=%v %v", tc.user, resp.Allowed, resp.Result)
		}
		if tc.deny && !strings.Contains(resp.Result.Message, "not by a controller gpupack trusts") {
			t.Errorf("denial names no creator: %v", resp.Result.Message)
		}
	}
}

// TestOwnerWalkLWSPairs (review 9): the two pairs commit 2dae57d lets the
// walk pass — an LWS group's leader Pod under its StatefulSet, a
// StatefulSet under its LWS — for the objects of a real LWS chain (worker
// pod → worker StatefulSet → leader Pod → leader StatefulSet → LWS) made by
// their controllers, and the same links forged. The walk cannot tell who
// made a CPU Pod (no webhook sees one), so the last row — a trusted
// controller's StatefulSet under a tenant's CPU pod that names bob's
// leader StatefulSet as its controller — fails today (review 9, F2).
func TestOwnerWalkLWSPairs(t *testing.T) {
	const (
		lwsCtl = "system:serviceaccount:lws-system:lws-controller-manager"
		stsCtl = "system:serviceaccount:kube-system:statefulset-controller"
	)
	queue := map[string]string{mutation.LabelQueueName: "q"}
	ctl := func(apiVersion, kind, name, uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}}
	}
	sts := func(name string, owners []metav1.OwnerReference) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("u-" + name), OwnerReferences: owners}}
	}
	pod := func(name string, owners []metav1.OwnerReference) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("u-" + name), OwnerReferences: owners}}
	}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		&lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "bob", Namespace: "ns", UID: "u-bob", Labels: queue}},
		sts("bob", ctl("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "bob", "u-bob")), // leader StatefulSet
		pod("bob-0", ctl("apps/v1", "StatefulSet", "bob", "u-bob")),                       // leader Pod
		sts("bob-0", ctl("v1", "Pod", "bob-0", "u-bob-0")),                                // worker StatefulSet
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "queued", Namespace: "ns", UID: "u-queued", Labels: queue}},
		pod("queued-x", ctl("batch/v1", "Job", "queued", "u-queued")),    // a pod of a queued Job, not an LWS leader
		pod("alice-fake", ctl("apps/v1", "StatefulSet", "bob", "u-bob")), // alice's CPU pod posing as a leader Pod of bob's
		pod("bob-9", ctl("apps/v1", "StatefulSet", "bob", "u-bob")),      // … named as the StatefulSet's, past its one replica
	}
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = appsv1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = lws.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	withPod := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "leaderworkerset.x-k8s.io/leaderworkerset", "pod"}},
		JobKinds: []string{KindStatefulSet, KindLeaderWorkerSet}}
	// Kueue's statefulset integration on as well (as the fast-path tests
	// run it), and the LWS integration without the pod integration (the
	// configuration 2dae57d names): the worker StatefulSet is then a
	// "statefulset" link under a Pod, and the real worker pod was refused
	// before intermediateOK listed that pair (review 9, F3).
	withSTS := withPod
	withSTS.Kueue.Frameworks = append([]string{"statefulset"}, withPod.Kueue.Frameworks...)
	noPod := withPod
	noPod.Kueue.Frameworks = []string{"batch/job", "leaderworkerset.x-k8s.io/leaderworkerset"}
	for _, tc := range []struct {
		name    string
		sts     bool // the object is a StatefulSet (else a pod)
		owner   []metav1.OwnerReference
		creator string
		deny    string // "" admitted; else a part of the denial
		cfg     *mutation.Config
	}{
		{"real chain, statefulset integration on: the StatefulSet controller's worker pod", false, ctl("apps/v1", "StatefulSet", "bob-0", "u-bob-0"), stsCtl, "", &withSTS},
		{"real chain, LWS without the pod integration: the StatefulSet controller's worker pod", false, ctl("apps/v1", "StatefulSet", "bob-0", "u-bob-0"), stsCtl, "", &noPod},
		{"real chain: the StatefulSet controller's worker pod", false, ctl("apps/v1", "StatefulSet", "bob-0", "u-bob-0"), stsCtl, "", nil},
		{"real chain: the LWS controller's worker StatefulSet under the leader Pod", true, ctl("v1", "Pod", "bob-0", "u-bob-0"), lwsCtl, "", nil},
		{"real chain: the StatefulSet controller's leader pod", false, ctl("apps/v1", "StatefulSet", "bob", "u-bob"), stsCtl, "", nil},
		{"alice's worker pod under bob's worker StatefulSet", false, ctl("apps/v1", "StatefulSet", "bob-0", "u-bob-0"), "alice", "not by a controller gpupack trusts", nil},
		{"alice's StatefulSet under bob's leader Pod", true, ctl("v1", "Pod", "bob-0", "u-bob-0"), "alice", "not by a controller gpupack trusts", nil},
		{"alice's StatefulSet under bob's LWS", true, ctl("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "bob", "u-bob"), "alice", "not by a controller gpupack trusts", nil},
		{"forged: leader Pod named with another UID", true, ctl("v1", "Pod", "bob-0", "u-other"), lwsCtl, "is not that object", nil},
		{"forged: a StatefulSet under a queued Job's pod (not an LWS leader)", true, ctl("v1", "Pod", "queued-x", "u-queued-x"), lwsCtl, "only an LWS group's leader Pod", nil},
		{"forged (review 9, F2): a trusted StatefulSet under alice's CPU pod posing as bob's leader Pod", true, ctl("v1", "Pod", "alice-fake", "u-alice-fake"), lwsCtl, "bob-<ordinal>", nil},
		{"forged (review 9, F2): a trusted StatefulSet under alice's CPU pod named past bob's leader StatefulSet's replicas", true, ctl("v1", "Pod", "bob-9", "u-bob-9"), lwsCtl, "outside the ordinals 0–0", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := withPod
			if tc.cfg != nil {
				cfg = *tc.cfg
			}
			m, err := mutation.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			tmpl := gpuTemplate(map[string]string{placement.KueueSuspendingParent: "leaderworkerset.x-k8s.io/leaderworkerset"}, "1")
			var req admission.Request
			path := PathMutatePod
			if tc.sts {
				o := &appsv1.StatefulSet{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
					ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "ns", OwnerReferences: tc.owner}, Spec: appsv1.StatefulSetSpec{Template: tmpl}}
				req = request(t, admissionv1.Create, o, nil)
				path = PathMutateStatefulSet
			} else {
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "ns", Annotations: tmpl.Annotations, OwnerReferences: tc.owner}, Spec: tmpl.Spec}
				req = request(t, admissionv1.Create, p, nil)
			}
			req.UserInfo = authenticationv1.UserInfo{Username: tc.creator}
			resp := Handlers(m, c)[path].Handle(context.Background(), req)
			switch {
			case tc.deny == "" && !resp.Allowed:
				t.Errorf("denied: %v", resp.Result.Message)
			case tc.deny != "" && resp.Allowed:
				t.Errorf("BROKEN: admitted as managed by bob's LWS; want a denial saying %q", tc.deny)
			case tc.deny != "" && !strings.Contains(resp.Result.Message, tc.deny):
				t.Errorf("denial %q does not say %q", resp.Result.Message, tc.deny)
			}
		})
	}
}
