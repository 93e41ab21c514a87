package usage

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
)

func pod(phase corev1.PodPhase, node string, ann map[string]string, res corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: ann},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c",
			Resources: corev1.ResourceRequirements{Limits: res}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func rl(kv ...any) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i].(string))] = *resource.NewQuantity(int64(kv[i+1].(int)), resource.DecimalSI)
	}
	return out
}

func TestPodUsage(t *testing.T) {
	dev := map[string]string{v1alpha1.AnnotationDevices: "GPU-a:20480,GPU-b:20480"}
	whole := map[string]string{v1alpha1.AnnotationDevices: "GPU-a:72227"}
	shared := rl(v1alpha1.ResourceVGPU, 2, v1alpha1.ResourceGPUMemory, 40960, v1alpha1.ResourceGPUCores, 60)
	terminating := pod(corev1.PodRunning, "n", dev, shared)
	now := metav1.Now()
	terminating.DeletionTimestamp = &now
	pinned := pod(corev1.PodPending, "", map[string]string{v1alpha1.AnnotationDevices: "GPU-a:1", v1alpha1.AnnotationPlan: "wl-plan"}, shared)
	initOnly := pod(corev1.PodRunning, "n", map[string]string{v1alpha1.AnnotationDevices: "GPU-a:1"}, nil)
	initOnly.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Requests: rl(v1alpha1.ResourceNvidiaGPU, 1)}}}
	cases := []struct {
		name      string
		pod       *corev1.Pod
		want      []fit.Usage
		wantTerm  bool
		wantHolds bool
		wantErr   string
	}{
		{"running shared pod", pod(corev1.PodRunning, "n", dev, shared),
			[]fit.Usage{{UUID: "GPU-a", MemoryMiB: 20480, Cores: 30}, {UUID: "GPU-b", MemoryMiB: 20480, Cores: 30}}, false, true, ""},
		{"whole GPU pod is exclusive", pod(corev1.PodRunning, "n", whole, rl(v1alpha1.ResourceNvidiaGPU, 1)),
			[]fit.Usage{{UUID: "GPU-a", MemoryMiB: 72227, Cores: 100, Exclusive: true}}, false, true, ""},
		{"terminating pods still hold", terminating,
			[]fit.Usage{{UUID: "GPU-a", MemoryMiB: 20480, Cores: 30}, {UUID: "GPU-b", MemoryMiB: 20480, Cores: 30}}, true, true, ""},
		{"pinned by a plan before binding", pinned, []fit.Usage{{UUID: "GPU-a", MemoryMiB: 1, Cores: 30}}, false, true, ""},
		{"unconverted shared pod (memory annotation) is not exclusive",
			pod(corev1.PodRunning, "n", map[string]string{v1alpha1.AnnotationDevices: "GPU-a:20480", v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "25"}, rl(v1alpha1.ResourceNvidiaGPU, 1)),
			[]fit.Usage{{UUID: "GPU-a", MemoryMiB: 20480, Cores: 25}}, false, true, ""},
		{"an init container's whole GPU", initOnly, []fit.Usage{{UUID: "GPU-a", MemoryMiB: 1, Cores: 100, Exclusive: true}}, false, true, ""},
		{"succeeded holds nothing", pod(corev1.PodSucceeded, "n", dev, shared), nil, false, false, ""},
		{"failed holds nothing", pod(corev1.PodFailed, "n", dev, shared), nil, false, false, ""},
		{"no devices annotation", pod(corev1.PodRunning, "n", nil, shared), nil, false, false, ""},
		{"neither bound nor planned", pod(corev1.PodPending, "", dev, shared), nil, false, false, ""},
		{"malformed devices", pod(corev1.PodRunning, "n", map[string]string{v1alpha1.AnnotationDevices: "GPU-a"}, shared), nil, false, false, "pod ns/p: gpupack.io/devices"},
	}
	for _, tc := range cases {
		got, holds, err := PodUsage(tc.pod)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || holds != tc.wantHolds {
			t.Errorf("%s: holds=%v err=%v", tc.name, holds, err)
		}
		if holds && got.Terminating != tc.wantTerm {
			t.Errorf("%s: terminating=%v", tc.name, got.Terminating)
		}
		if d := cmp.Diff(tc.want, got.GPUs); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}

func TestPlanSlots(t *testing.T) {
	plan := &v1alpha1.GPUPlan{
		Spec: v1alpha1.GPUPlanSpec{Assignments: []v1alpha1.PodAssignment{
			{PodSet: "worker", Index: 0, Node: "n1", GPUs: []v1alpha1.GPUAssignment{{UUID: "a", MemoryMiB: 72227, Exclusive: true}}},
			{PodSet: "worker", Index: 1, Node: "n1", GPUs: []v1alpha1.GPUAssignment{{UUID: "b", MemoryMiB: 1000, Cores: 20}}},
		}},
		Status: v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlanned, Bindings: []v1alpha1.SlotBinding{{PodSet: "worker", Index: 1, PodName: "w-1", PodUID: "u1"}}},
	}
	want := []Slot{
		{PodSet: "worker", Index: 0, Node: "n1", GPUs: []fit.Usage{{UUID: "a", MemoryMiB: 72227, Cores: 100, Exclusive: true}}},
		{PodSet: "worker", Index: 1, Node: "n1", PodName: "w-1", PodUID: "u1", GPUs: []fit.Usage{{UUID: "b", MemoryMiB: 1000, Cores: 20}}},
	}
	if d := cmp.Diff(want, PlanSlots(plan)); d != "" {
		t.Errorf("PlanSlots (-want +got):\n%s", d)
	}
	plan.Status.Phase = v1alpha1.PlanReleased
	if s := PlanSlots(plan); s != nil {
		t.Errorf("released plan still reserves %v", s)
	}
}

func holderPod(name string, uid types.UID, plan, devices string, terminating bool) corev1.Pod {
	p := pod(corev1.PodRunning, "n1", map[string]string{v1alpha1.AnnotationDevices: devices, v1alpha1.AnnotationPlan: plan}, rl(v1alpha1.ResourceNvidiaGPU, 1))
	p.Name, p.UID = name, uid
	if terminating {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	return *p
}

func onePodPlan(name string, wl types.UID, uuid string, bound ...v1alpha1.SlotBinding) v1alpha1.GPUPlan {
	return v1alpha1.GPUPlan{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Spec: v1alpha1.GPUPlanSpec{WorkloadName: name, WorkloadUID: wl, Assignments: []v1alpha1.PodAssignment{
			{PodSet: "main", Index: 0, Node: "n1", GPUs: []v1alpha1.GPUAssignment{{UUID: uuid, MemoryMiB: 80000, Exclusive: true}}},
		}},
		Status: v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlanned, Bindings: bound},
	}
}

// held lists the GPUs the ledger counts, one entry per holder.
func held(pods []corev1.Pod, plans []v1alpha1.GPUPlan) []string {
	hs, _ := Ledger(pods, plans)
	var out []string
	for _, h := range hs {
		for _, g := range h.GPUs {
			who := h.Pod
			if who == "" {
				who = h.Plan + "#" + h.Slot.PodSet
			}
			out = append(out, who+"="+g.UUID)
		}
	}
	return out
}

// The attack of issue 17 item 2: a workload is evicted and re-admitted
// while its previous pods still terminate (checkpointing). The new plan has
// the same name as the old one; the old pods name it in gpupack.io/plan.
// Their GPUs must stay counted next to the new plan's.
func TestLedgerReadmitWhileOldPodsTerminate(t *testing.T) {
	cases := []struct {
		name  string
		pods  []corev1.Pod
		plans []v1alpha1.GPUPlan
		want  []string
	}{
		{
			name:  "old pod of the same plan name, terminating, not bound to the new plan",
			pods:  []corev1.Pod{holderPod("wl-0", "old-pod", "wl", "GPU-a:80000", true)},
			plans: []v1alpha1.GPUPlan{onePodPlan("wl", "wl-uid-2", "GPU-b")},
			want:  []string{"ns/wl-0=GPU-a", "ns/wl#main=GPU-b"},
		},
		{
			name: "old pod's binding survives in the plan status by name only: still no match without the UID",
			pods: []corev1.Pod{holderPod("wl-0", "old-pod", "wl", "GPU-a:80000", true)},
			plans: []v1alpha1.GPUPlan{onePodPlan("wl", "wl-uid-2", "GPU-b",
				v1alpha1.SlotBinding{PodSet: "main", Index: 0, PodName: "wl-0", PodUID: "new-pod"})},
			want: []string{"ns/wl-0=GPU-a", "ns/wl#main=GPU-b"},
		},
		{
			name: "the new pod bound by UID is counted once, through itself",
			pods: []corev1.Pod{holderPod("wl-0", "new-pod", "wl", "GPU-b:80000", false)},
			plans: []v1alpha1.GPUPlan{onePodPlan("wl", "wl-uid-2", "GPU-b",
				v1alpha1.SlotBinding{PodSet: "main", Index: 0, PodName: "wl-0", PodUID: "new-pod"})},
			want: []string{"ns/wl-0=GPU-b"},
		},
		{
			name: "a bound pod that finished gives its slot back to the plan",
			pods: func() []corev1.Pod {
				p := holderPod("wl-0", "new-pod", "wl", "GPU-b:80000", false)
				p.Status.Phase = corev1.PodFailed
				return []corev1.Pod{p}
			}(),
			plans: []v1alpha1.GPUPlan{onePodPlan("wl", "wl-uid-2", "GPU-b",
				v1alpha1.SlotBinding{PodSet: "main", Index: 0, PodName: "wl-0", PodUID: "new-pod"})},
			want: []string{"ns/wl#main=GPU-b"},
		},
		{
			name:  "a pod created before its binding is written counts twice, never zero times",
			pods:  []corev1.Pod{holderPod("wl-0", "new-pod", "wl", "GPU-b:80000", false)},
			plans: []v1alpha1.GPUPlan{onePodPlan("wl", "wl-uid-2", "GPU-b")},
			want:  []string{"ns/wl-0=GPU-b", "ns/wl#main=GPU-b"},
		},
	}
	for _, tc := range cases {
		if d := cmp.Diff(tc.want, held(tc.pods, tc.plans)); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}

func TestLedgerWarnsOnUnreadablePods(t *testing.T) {
	bad := holderPod("bad", "u", "", "GPU-a", false)
	hs, warns := Ledger([]corev1.Pod{bad}, nil)
	if len(hs) != 0 || len(warns) != 1 || !strings.Contains(warns[0], "ns/bad") {
		t.Errorf("holders %v warnings %v", hs, warns)
	}
}
