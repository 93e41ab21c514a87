package owners

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

func TestBelongs(t *testing.T) {
	owned := func(name string, refs ...metav1.OwnerReference) *kueue.Workload {
		return &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", OwnerReferences: refs}}
	}
	obj := func(apiVersion, kind, name, uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid)}
	}
	ctrl := func(apiVersion, kind, name, uid string) metav1.OwnerReference {
		r := obj(apiVersion, kind, name, uid)
		r.Controller = ptr.To(true)
		return r
	}
	job := func(name, uid string) metav1.OwnerReference { return obj("batch/v1", "Job", name, uid) }
	pod := func(name, uid string) metav1.OwnerReference { return obj("v1", "Pod", name, uid) }
	victim := owned("job-victim", ctrl("batch/v1", "Job", "victim", "job-v"))
	for _, tc := range []struct {
		name    string
		wl      *kueue.Workload
		lineage []metav1.OwnerReference
		want    bool
	}{
		{"the pod of the Workload's Job", victim, []metav1.OwnerReference{pod("p1", "pod-1"), job("victim", "job-v")}, true},
		{"a pod of another Job (finding 6)", victim, []metav1.OwnerReference{pod("p2", "pod-2"), job("a", "job-a")}, false},
		{"a hand-made pod with no controller", victim, []metav1.OwnerReference{pod("p3", "pod-3")}, false},
		{"a JobSet pod, two links up", owned("jobset-js", ctrl("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "js-1")),
			[]metav1.OwnerReference{pod("p4", "pod-4"), job("js-0", "job-1"), obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "js-1")}, true},
		{"another API version of the same group", owned("jobset-js", ctrl("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "js-1")),
			[]metav1.OwnerReference{pod("p4", "pod-4"), obj("jobset.x-k8s.io/v1", "JobSet", "js", "js-1")}, true},
		{"a single pod's Workload (the pod is its controller)", owned("pod-p", ctrl("v1", "Pod", "p", "pod-5")), []metav1.OwnerReference{pod("p", "pod-5")}, true},
		{"another single pod's Workload", owned("pod-p", ctrl("v1", "Pod", "p", "pod-5")), []metav1.OwnerReference{pod("q", "pod-6")}, false},
		{"a pod group member Kueue has made an owner", owned("grp", pod("a", "pod-7"), pod("b", "pod-8")), []metav1.OwnerReference{pod("b", "pod-8")}, true},
		// The group label alone is no proof: a tenant labels her pod with the
		// victim group's name (round 2, finding 2). A member Kueue has not
		// made an owner yet waits (the ungater retries).
		{"a pod labelled with the group but not an owner of its Workload", owned("grp", pod("a", "pod-7")), []metav1.OwnerReference{pod("c", "pod-9")}, false},
		{"a pod group member owned under its Job", owned("grp", pod("a", "pod-7")), []metav1.OwnerReference{pod("c", "pod-9"), job("a", "job-a")}, false},
		{"an empty UID matches nothing", owned("x", pod("p", "")), []metav1.OwnerReference{pod("p", "")}, false},
		// The top of a chain is a reference its maker wrote (review 14, F1):
		// alice's RayCluster names "RayJob decoy" with the victim Job's UID.
		// Only the same object — group, kind, name and UID — is the owner.
		{"the victim Job's UID under another kind and name (review 14 F1)", victim,
			[]metav1.OwnerReference{pod("w", "pod-w"), obj("ray.io/v1", "RayCluster", "alices-rc", "rc-a"), obj("ray.io/v1", "RayJob", "decoy", "job-v")}, false},
		{"the victim Job's UID under another name", victim, []metav1.OwnerReference{pod("w", "pod-w"), job("decoy", "job-v")}, false},
		{"the victim Job's UID and name, another kind", victim, []metav1.OwnerReference{pod("w", "pod-w"), obj("batch/v1", "CronJob", "victim", "job-v")}, false},
		{"the victim Job's UID, kind and name, another group", victim, []metav1.OwnerReference{pod("w", "pod-w"), obj("evil.example/v1", "Job", "victim", "job-v")}, false},
		{"the victim pod's UID under another pod's name", owned("pod-p", ctrl("v1", "Pod", "p", "pod-5")), []metav1.OwnerReference{pod("mine", "pod-5")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Belongs(tc.wl, tc.lineage); got != tc.want {
				t.Errorf("Belongs = %v, want %v", got, tc.want)
			}
		})
	}
}
