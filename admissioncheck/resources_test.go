package admissioncheck

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// withAllocatable publishes a node's allocatable cpu, memory and pods.
func withAllocatable(n *corev1.Node, cpu, mem, pods string) *corev1.Node {
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem),
		corev1.ResourcePods: resource.MustParse(pods)}
	return n
}

func askingCPU(wl *kueue.Workload, cpu, mem string) *kueue.Workload {
	c := &wl.Spec.PodSets[0].Template.Spec.Containers[0]
	c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	return wl
}

// cpuPod is a running pod without GPUs that requests cpu on node.
func cpuPod(name string, uid types.UID, node, cpu string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: uid}, Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

// Issue 17 item 5: the check plans against the nodes' cpu, memory and pods
// too. A gang whose pods fit the GPUs but not the CPU left on those nodes
// waits (Retry, saying which resource), and a plan's slots reserve their
// pods' CPU for the next decision before any pod exists.
func TestPlansAgainstNodeResources(t *testing.T) {
	for _, tc := range []struct {
		name    string
		objs    func() []client.Object
		want    kueue.CheckState
		wantMsg string
	}{
		{"GPUs and CPU free", func() []client.Object { return nil }, kueue.CheckStateReady, ""},
		{"CPU held by a pod without GPUs", func() []client.Object {
			return []client.Object{cpuPod("web", "web-uid", "n1", "10")}
		}, kueue.CheckStateRetry, "cpu on 1 node"},
		{"CPU reserved by another workload's plan, no pod yet", func() []client.Object {
			other := askingCPU(admittedWorkload("other", "other-uid", 1, 1).obj(), "10", "1Gi")
			p := planFor(other, "n1-g1")
			p.Annotations = map[string]string{v1alpha1.AnnotationPodRequests: `{"main":{"cpu":"10","memory":"1Gi"}}`}
			return []client.Object{p}
		}, kueue.CheckStateRetry, "fit the other resources"},
		{"pods allocatable used up", func() []client.Object {
			return []client.Object{cpuPod("a", "a-uid", "n1", "0"), cpuPod("b", "b-uid", "n1", "0"), cpuPod("c", "c-uid", "n1", "0")}
		}, kueue.CheckStateRetry, "pods on 1 node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl := askingCPU(admittedWorkload("wl", "wl-uid", 1, 1).obj(), "8", "1Gi")
			objs := []client.Object{withAllocatable(gpuNode("n1", 4, nil), "16", "64Gi", "3"), wl}
			for _, o := range tc.objs() {
				objs = append(objs, o)
			}
			e := newEnv(t, objs...)
			e.reconcile(wl)
			st := e.check(wl)
			if st.State != tc.want || !strings.Contains(st.Message, tc.wantMsg) {
				t.Fatalf("check %s (%q), want %s with %q", st.State, st.Message, tc.want, tc.wantMsg)
			}
			if tc.want == kueue.CheckStateReady {
				p := e.plan("wl")
				if p == nil || !strings.Contains(p.Annotations[v1alpha1.AnnotationPodRequests], `"cpu":"8"`) {
					t.Errorf("plan %+v does not record its pods' requests", p)
				}
			} else if e.plan("wl") != nil {
				t.Error("planned onto a node without the CPU for it")
			}
		})
	}
}
