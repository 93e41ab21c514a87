package mutation

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// A GPU pod of Kueue's pod integration (plain pod or a Deployment's) gets
// gpupack's placement gate at creation: its plan arrives later, by Kueue's
// update at admission, and it must not reach the scheduler before the
// ungater pins it. A Job's pod with a queue label does not (its plan comes
// through the Job's template); a pod without a queue name does not.
func TestPodOfKueuePodIntegrationGated(t *testing.T) {
	m := mustNew(t, Config{})
	mk := func(labels map[string]string, owner *metav1.OwnerReference) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: labels,
			Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return p
	}
	yes := true
	q := map[string]string{"kueue.x-k8s.io/queue-name": "lq"}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"plain pod with a queue name", mk(q, nil), true},
		{"Deployment's pod", mk(q, &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u", Controller: &yes}), true},
		{"Job's pod", mk(q, &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: "j", UID: "u", Controller: &yes}), false},
		{"no queue name", mk(nil, nil), false},
	} {
		if _, err := m.Pod(tc.pod, PodContext{}); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := len(tc.pod.Spec.SchedulingGates) == 1 && tc.pod.Spec.SchedulingGates[0].Name == v1alpha1.SchedulingGatePlacement
		if got != tc.want || (!tc.want && len(tc.pod.Spec.SchedulingGates) != 0) {
			t.Errorf("%s: gates %v, want placement gate %v", tc.name, tc.pod.Spec.SchedulingGates, tc.want)
		}
		again := tc.pod.DeepCopy()
		if _, err := m.Pod(again, PodContext{}); err != nil || !equality.Semantic.DeepEqual(tc.pod, again) {
			t.Errorf("%s: second pass changed the pod: %s", tc.name, cmp.Diff(tc.pod, again))
		}
	}
}

// A pod of a Kueue pod group is stamped with its creator (review 14 F3):
// the stamp replaces a tenant's value, other pods are left alone, and with
// no creator known (a template's fixed point) a value is removed.
func TestPodGroupCreatorStamp(t *testing.T) {
	m := mustNew(t, Config{})
	mk := func(labels, ann map[string]string) *corev1.Pod {
		a := map[string]string{}
		for k, v := range ann {
			a[k] = v
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: labels, Annotations: a},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
	}
	group := map[string]string{"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": "g"}
	forged := map[string]string{v1alpha1.AnnotationCreatedBy: "bob"}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		creator string
		want    string // "" = no stamp
	}{
		{"a pod-group pod", mk(group, nil), "alice", "alice"},
		{"a forged stamp replaced", mk(group, forged), "alice", "alice"},
		{"a forged stamp removed with no creator known", mk(group, forged), "", ""},
		{"a pod of no group keeps what it has (the policy judges it)", mk(map[string]string{"kueue.x-k8s.io/queue-name": "lq"}, forged), "alice", "bob"},
		{"a pod of no group gets none", mk(nil, nil), "alice", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := m.AdmitPod(tc.pod, PodContext{Creator: tc.creator}); err != nil {
				t.Fatal(err)
			}
			if got := tc.pod.Annotations[v1alpha1.AnnotationCreatedBy]; got != tc.want {
				t.Errorf("%s = %q, want %q", v1alpha1.AnnotationCreatedBy, got, tc.want)
			}
			again := tc.pod.DeepCopy()
			if _, err := m.AdmitPod(again, PodContext{Creator: tc.creator}); err != nil || !equality.Semantic.DeepEqual(tc.pod, again) {
				t.Errorf("second pass changed the pod: %s", cmp.Diff(tc.pod, again))
			}
		})
	}
}
