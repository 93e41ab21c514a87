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
	ctrl := func(kind, name, uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "batch/v1", Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}
	}
	podOwner := func(name, uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: name, UID: types.UID(uid)}
	}
	for _, tc := range []struct {
		name      string
		wl        *kueue.Workload
		ancestors []types.UID
		want      bool
	}{
		{"the pod of the Workload's Job", owned("job-victim", ctrl("Job", "victim", "job-v")), []types.UID{"pod-1", "job-v"}, true},
		{"a pod of another Job (finding 6)", owned("job-victim", ctrl("Job", "victim", "job-v")), []types.UID{"pod-2", "job-a"}, false},
		{"a hand-made pod with no controller", owned("job-victim", ctrl("Job", "victim", "job-v")), []types.UID{"pod-3"}, false},
		{"a JobSet pod, two links up", owned("jobset-js", ctrl("JobSet", "js", "js-1")), []types.UID{"pod-4", "job-1", "js-1"}, true},
		{"a single pod's Workload (the pod is its controller)", owned("pod-p", metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "pod-5", Controller: ptr.To(true)}), []types.UID{"pod-5"}, true},
		{"another single pod's Workload", owned("pod-p", metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "pod-5", Controller: ptr.To(true)}), []types.UID{"pod-6"}, false},
		{"a pod group member Kueue has made an owner", owned("grp", podOwner("a", "pod-7"), podOwner("b", "pod-8")), []types.UID{"pod-8"}, true},
		// The group label alone is no proof: a tenant labels her pod with the
		// victim group's name (round 2, finding 2). A member Kueue has not
		// made an owner yet waits (the ungater retries).
		{"a pod labelled with the group but not an owner of its Workload", owned("grp", podOwner("a", "pod-7")), []types.UID{"pod-9"}, false},
		{"a pod group member owned under its Job", owned("grp", podOwner("a", "pod-7")), []types.UID{"pod-9", "job-a"}, false},
		{"an empty UID matches nothing", owned("x", metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "p"}), []types.UID{""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Belongs(tc.wl, tc.ancestors); got != tc.want {
				t.Errorf("Belongs = %v, want %v", got, tc.want)
			}
		})
	}
}
