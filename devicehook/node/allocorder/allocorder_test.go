package allocorder

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

type pb struct{ p *corev1.Pod }

func pod(name string) *pb {
	return &pb{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Status: corev1.PodStatus{Phase: corev1.PodPending}}}
}

func (b *pb) ctr(res corev1.ResourceName, n int64) *pb {
	c := corev1.Container{Name: "c" + string(rune('0'+len(b.p.Spec.Containers)))}
	c.Resources.Limits = corev1.ResourceList{res: *resource.NewQuantity(n, resource.DecimalSI)}
	b.p.Spec.Containers = append(b.p.Spec.Containers, c)
	return b
}
func (b *pb) init(res corev1.ResourceName, n int64) *pb {
	c := corev1.Container{Name: "i"}
	c.Resources.Requests = corev1.ResourceList{res: *resource.NewQuantity(n, resource.DecimalSI)}
	b.p.Spec.InitContainers = append(b.p.Spec.InitContainers, c)
	return b
}
func (b *pb) bound(n string) *pb { b.p.Spec.NodeName = n; return b }
func (b *pb) pinned(n string) *pb {
	b.p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}}}}}}
	return b
}
func (b *pb) gated() *pb {
	b.p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
	return b
}
func (b *pb) started() *pb                { t := metav1.Now(); b.p.Status.StartTime = &t; return b }
func (b *pb) phase(p corev1.PodPhase) *pb { b.p.Status.Phase = p; return b }
func (b *pb) deleting() *pb               { t := metav1.Now(); b.p.DeletionTimestamp = &t; return b }
func (b *pb) unschedulable() *pb {
	b.p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	return b
}
func (b *pb) ns(n string) *pb  { b.p.Namespace = n; return b }
func (b *pb) obj() *corev1.Pod { return b.p }

const gpu, vgpu = corev1.ResourceName(v1alpha1.ResourceNvidiaGPU), corev1.ResourceName(v1alpha1.ResourceVGPU)

func TestAwaiting(t *testing.T) {
	cases := []struct {
		name string
		pod  *corev1.Pod
		node string
		ok   bool
	}{
		{"bound, not admitted", pod("a").ctr(gpu, 1).bound("n1").obj(), "n1", true},
		{"pinned, ungated, not bound yet", pod("a").ctr(vgpu, 1).pinned("n1").obj(), "n1", true},
		{"still gated", pod("a").ctr(gpu, 1).pinned("n1").gated().obj(), "", false},
		{"admitted (status.startTime)", pod("a").ctr(gpu, 1).bound("n1").started().obj(), "", false},
		{"running", pod("a").ctr(gpu, 1).bound("n1").phase(corev1.PodRunning).obj(), "", false},
		{"rejected by the kubelet", pod("a").ctr(gpu, 1).bound("n1").phase(corev1.PodFailed).obj(), "", false},
		{"no GPU", pod("a").bound("n1").obj(), "", false},
		{"init container GPU", pod("a").init(gpu, 1).bound("n1").obj(), "n1", true},
		{"bound and terminating: the kubelet may still admit it", pod("a").ctr(gpu, 1).bound("n1").deleting().obj(), "n1", true},
		{"pinned and terminating: never scheduled", pod("a").ctr(gpu, 1).pinned("n1").deleting().obj(), "", false},
		{"pinned, unschedulable", pod("a").ctr(gpu, 1).pinned("n1").unschedulable().obj(), "", false},
		{"bound wins over an unschedulable condition", pod("a").ctr(gpu, 1).bound("n1").unschedulable().obj(), "n1", true},
		{"neither bound nor pinned", pod("a").ctr(gpu, 1).obj(), "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, ok := Awaiting(tc.pod)
			if n != tc.node || ok != tc.ok {
				t.Errorf("Awaiting = %q, %v; want %q, %v", n, ok, tc.node, tc.ok)
			}
		})
	}
}

func TestPinnedNode(t *testing.T) {
	p := pod("a").pinned("n1").obj()
	if got := PinnedNode(p); got != "n1" {
		t.Errorf("one term: %q", got)
	}
	terms := &p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	*terms = append(*terms, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}})
	if got := PinnedNode(p); got != "" {
		t.Errorf("a term that does not pin: %q, want none", got)
	}
	(*terms)[1].MatchFields = []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}}
	if got := PinnedNode(p); got != "" {
		t.Errorf("terms on two nodes: %q, want none", got)
	}
}

func TestBlocking(t *testing.T) {
	me := pod("me").ctr(gpu, 1).pinned("n1").gated().obj()
	cases := []struct {
		name   string
		others []*corev1.Pod
		want   []string
	}{
		{"same count, bound", []*corev1.Pod{pod("a").ctr(gpu, 1).bound("n1").obj()}, []string{"a"}},
		{"same count, pinned", []*corev1.Pod{pod("a").ctr(gpu, 1).pinned("n1").obj()}, []string{"a"}},
		{"another namespace counts too", []*corev1.Pod{pod("a").ns("team-b").ctr(gpu, 1).bound("n1").obj()}, []string{"a"}},
		{"a second container of that count", []*corev1.Pod{pod("a").ctr(gpu, 2).ctr(gpu, 1).bound("n1").obj()}, []string{"a"}},
		{"other count", []*corev1.Pod{pod("a").ctr(gpu, 2).bound("n1").obj()}, nil},
		{"other resource", []*corev1.Pod{pod("a").ctr(vgpu, 1).bound("n1").obj()}, nil},
		{"other node", []*corev1.Pod{pod("a").ctr(gpu, 1).bound("n2").obj()}, nil},
		{"admitted", []*corev1.Pod{pod("a").ctr(gpu, 1).bound("n1").started().obj()}, nil},
		{"gated", []*corev1.Pod{pod("a").ctr(gpu, 1).pinned("n1").gated().obj()}, nil},
		{"itself", []*corev1.Pod{pod("me").ctr(gpu, 1).pinned("n1").obj()}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range Blocking(me, "n1", tc.others) {
				got = append(got, p.Name)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
	if got := Blocking(pod("cpu").pinned("n1").obj(), "n1", []*corev1.Pod{pod("a").ctr(gpu, 1).bound("n1").obj()}); len(got) != 0 {
		t.Errorf("a pod without GPUs is held back by %v", got)
	}
}

func TestDescribeHidesOtherNamespaces(t *testing.T) {
	me := pod("me").obj()
	got := Describe(me, []*corev1.Pod{pod("a").obj(), pod("secret-job").ns("team-b").obj()})
	if want := "pod a and 1 pod(s) of other namespaces"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
}

func TestKeys(t *testing.T) {
	got := Keys(pod("a").init(gpu, 1).ctr(vgpu, 2).ctr(gpu, 1).ctr(gpu, 4).obj())
	want := []Key{{vgpu, 2}, {gpu, 1}, {gpu, 4}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}
