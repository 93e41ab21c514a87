package inventory

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/flavors"
)

type nodeB struct{ n corev1.Node }

func mkNode(name string) *nodeB {
	return &nodeB{corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}}
}
func (b *nodeB) ann(k, v string) *nodeB   { b.n.Annotations[k] = v; return b }
func (b *nodeB) label(k, v string) *nodeB { b.n.Labels[k] = v; return b }
func (b *nodeB) notReady() *nodeB {
	b.n.Status.Conditions[0].Status = corev1.ConditionFalse
	return b
}
func (b *nodeB) capacity(n string, v int64) *nodeB {
	if b.n.Status.Capacity == nil {
		b.n.Status.Capacity = corev1.ResourceList{}
	}
	b.n.Status.Capacity[corev1.ResourceName(n)] = *resource.NewQuantity(v, resource.DecimalSI)
	return b
}
func (b *nodeB) obj() *corev1.Node { return &b.n }

func TestNodeFromObject(t *testing.T) {
	buf := flavors.DefaultBuffer()
	h100 := int64(81559)
	alloc := buf.Allocatable(h100)
	two := 2
	cases := []struct {
		name       string
		node       *corev1.Node
		flavor     string
		want       []fit.GPU
		wantSource string
		wantErr    string
		noInv      bool
		wantReady  bool
	}{
		{
			name: "gpupack annotation",
			node: mkNode("n").ann(v1alpha1.AnnotationGPUs, `[{"uuid":"GPU-a","index":0,"model":"NVIDIA H100 80GB HBM3","memoryMiB":81559,"health":"Healthy"},{"uuid":"GPU-b","index":1,"model":"NVIDIA H100 80GB HBM3","memoryMiB":81559,"health":"Unhealthy"}]`).obj(),
			want: []fit.GPU{
				{UUID: "GPU-a", Model: "NVIDIA H100 80GB HBM3", Index: 0, PhysicalMiB: h100, AllocatableMiB: alloc, Healthy: true},
				{UUID: "GPU-b", Model: "NVIDIA H100 80GB HBM3", Index: 1, PhysicalMiB: h100, AllocatableMiB: alloc, Healthy: false},
			},
			wantSource: SourceGPUPack, wantReady: true,
		},
		{
			name:    "bad gpupack annotation is an error, not a fallback",
			node:    mkNode("n").ann(v1alpha1.AnnotationGPUs, `[{"uuid":""}]`).ann(v1alpha1.AnnotationHAMiNodeRegister, "[]").obj(),
			wantErr: "node n: gpupack.io/gpus: GPU 0 has no uuid",
		},
		{
			name:       "HAMi JSON",
			node:       mkNode("n").ann(v1alpha1.AnnotationHAMiNodeRegister, `[{"id":"GPU-x","index":2,"count":10,"devmem":81559,"devcore":100,"type":"NVIDIA-H100","numa":0,"mode":"hami-core","health":true}]`).notReady().obj(),
			want:       []fit.GPU{{UUID: "GPU-x", Model: "NVIDIA-H100", Index: 2, PhysicalMiB: h100, AllocatableMiB: alloc, Healthy: true, MaxShare: 10}},
			wantSource: SourceHAMi,
		},
		{
			name: "HAMi legacy, 7 and 9 fields",
			node: mkNode("n").ann(v1alpha1.AnnotationHAMiNodeRegister, "GPU-0,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:GPU-1,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,1,false,5,hami-core:").obj(),
			want: []fit.GPU{
				{UUID: "GPU-0", Model: "NVIDIA-Tesla V100-PCIE-32GB", Index: 0, PhysicalMiB: 32768, AllocatableMiB: buf.Allocatable(32768), Healthy: true, MaxShare: 10},
				{UUID: "GPU-1", Model: "NVIDIA-Tesla V100-PCIE-32GB", Index: 5, PhysicalMiB: 32768, AllocatableMiB: buf.Allocatable(32768), Healthy: false, MaxShare: 10},
			},
			wantSource: SourceHAMi, wantReady: true,
		},
		{
			name:    "HAMi legacy with a bad field",
			node:    mkNode("n").ann(v1alpha1.AnnotationHAMiNodeRegister, "GPU-0,10,lots,100,x,0,true:").obj(),
			wantErr: `hami.io/node-nvidia-register: "GPU-0,10,lots,100,x,0,true"`,
		},
		{
			name: "flavor profile from the product label and count label",
			node: mkNode("n").label(flavors.LabelGPUProduct, "NVIDIA-H100-80GB-HBM3").label(flavors.LabelGPUCount, "2").obj(),
			want: []fit.GPU{
				{UUID: "n/gpu-0", Model: "NVIDIA H100 80GB HBM3", Index: 0, PhysicalMiB: h100, AllocatableMiB: alloc, Healthy: true},
				{UUID: "n/gpu-1", Model: "NVIDIA H100 80GB HBM3", Index: 1, PhysicalMiB: h100, AllocatableMiB: alloc, Healthy: true},
			},
			wantSource: SourceFlavor, wantReady: true,
		},
		{
			name:       "flavor model wins over the label; count from capacity",
			node:       mkNode("n").label(flavors.LabelGPUProduct, "Tesla-T4").capacity(v1alpha1.ResourceNvidiaGPU, 1).obj(),
			flavor:     "NVIDIA H200",
			want:       []fit.GPU{{UUID: "n/gpu-0", Model: "NVIDIA H200", Index: 0, PhysicalMiB: 143771, AllocatableMiB: buf.Allocatable(143771), Healthy: true}},
			wantSource: SourceFlavor, wantReady: true,
		},
		{
			name: "unknown model", node: mkNode("n").label(flavors.LabelGPUProduct, "Voodoo2").label(flavors.LabelGPUCount, "1").obj(),
			wantErr: `node n: GPU model "Voodoo2" has no flavor profile (known: `,
		},
		{
			name: "model but no count", node: mkNode("n").label(flavors.LabelGPUProduct, "NVIDIA-H200").obj(),
			wantErr: "no GPU count",
		},
		{
			name: "CPU node", node: mkNode("cpu").obj(), noInv: true,
			wantErr: "node cpu: no gpupack.io/gpus or hami.io/node-nvidia-register annotation and no GPU model label nvidia.com/gpu.product",
		},
		{
			name: "GPUs without any inventory", node: mkNode("g").capacity(v1alpha1.ResourceNvidiaGPU, 8).obj(), noInv: true,
			wantErr: "node g has 8 GPUs but no inventory",
		},
	}
	_ = two
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, src, err := NodeWithSource(tc.node, buf, tc.flavor)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				if errors.Is(err, ErrNoInventory) != tc.noInv {
					t.Errorf("errors.Is(ErrNoInventory) = %v, want %v", !tc.noInv, tc.noInv)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got.GPUs); d != "" {
				t.Errorf("GPUs (-want +got):\n%s", d)
			}
			if src != tc.wantSource || got.Ready != tc.wantReady || got.Name != tc.node.Name {
				t.Errorf("source %q ready %v name %q", src, got.Ready, got.Name)
			}
		})
	}
}

func TestHAMiLegacyRoundTrip(t *testing.T) {
	idx := 3
	devs := []HAMiDevice{
		{ID: "GPU-a", Count: 10, DevMem: 40960, DevCore: 100, Type: "A100", Numa: 1, Health: true},
		{ID: "GPU-b", Count: 4, DevMem: 81920, DevCore: 100, Type: "H100", Health: false, Index: &idx, Mode: "mig"},
	}
	got, err := ParseHAMiRegister(FormatHAMiLegacy(devs))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(devs, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	for in, want := range map[string]string{
		"":                                   "no devices",
		"[]":                                 "no devices",
		"[{":                                 "not a JSON array",
		`[{"id":"a","devmem":0}]`:            "devmem 0",
		`[{"id":"","devmem":1}]`:             "has no id",
		"a,1,1,1,x,0,true:a,1,1,1,x,0,true:": "listed twice",
		"a,1,1,1,x,0":                        "has 6 fields",
	} {
		if _, err := ParseHAMiRegister(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseHAMiRegister(%q) = %v, want %q", in, err, want)
		}
	}
}

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

func TestPlanFromResult(t *testing.T) {
	r := fit.Result{Fits: true, Level: "rack", Domain: "r1", Assignments: []fit.Assignment{
		{PodSet: "w", Index: 0, Node: "n", GPUs: []fit.Usage{{UUID: "a", MemoryMiB: 5, Cores: 10}, {UUID: "b", MemoryMiB: 5, Cores: 10}}},
	}}
	spec := PlanFromResult(r)
	if spec.PodCount != 1 || spec.GPUCount != 2 || spec.Domain != "r1" || spec.Level != "rack" {
		t.Errorf("spec = %+v", spec)
	}
	var back []fit.Usage
	for _, g := range spec.Assignments[0].GPUs {
		back = append(back, fit.Usage{UUID: g.UUID, MemoryMiB: g.MemoryMiB, Cores: g.Cores, Exclusive: g.Exclusive})
	}
	if d := cmp.Diff(r.Assignments[0].GPUs, back); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
}
