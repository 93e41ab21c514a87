package inventory

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
)

func podSet(name string, count int32, ann map[string]string, containers ...corev1.ResourceList) kueue.PodSet {
	ps := kueue.PodSet{Name: kueue.PodSetReference(name), Count: count,
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: ann}}}
	for i, c := range containers {
		ps.Template.Spec.Containers = append(ps.Template.Spec.Containers, corev1.Container{Name: "c" + string(rune('0'+i)),
			Resources: corev1.ResourceRequirements{Limits: c, Requests: c}})
	}
	return ps
}

func TestGangFromPodSets(t *testing.T) {
	sel := podSet("w", 2, nil, rl(v1alpha1.ResourceNvidiaGPU, 1))
	sel.Template.Spec.NodeSelector = map[string]string{"pool": "a"}
	sel.Template.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
	required := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "nvidia.com/gpu.product", Operator: corev1.NodeSelectorOpIn, Values: []string{"H100"}}}},
		{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"bad-node"}}}},
	}}
	affine := podSet("a", 2, nil, rl(v1alpha1.ResourceNvidiaGPU, 1))
	affine.Template.Spec.NodeSelector = map[string]string{"pool": "a"}
	affine.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: required,
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z1"}}}}}},
	}}
	preferredOnly := podSet("p", 1, nil, rl(v1alpha1.ResourceNvidiaGPU, 1))
	preferredOnly.Template.Spec.Affinity = &corev1.Affinity{
		NodeAffinity:    &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: affine.Template.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution},
		PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname}}},
	}
	sidecar := podSet("s", 1, nil, rl(v1alpha1.ResourceNvidiaGPU, 1))
	always := corev1.ContainerRestartPolicyAlways
	sidecar.Template.Spec.InitContainers = []corev1.Container{
		{Name: "side", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, 1)}},
		{Name: "init", Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, 4)}},
	}
	hamiRes := podSet("h", 1, map[string]string{v1alpha1.AnnotationGPUMemory: "10Gi"}, corev1.ResourceList{
		v1alpha1.ResourceNvidiaGPU:      *resource.NewQuantity(1, resource.DecimalSI),
		v1alpha1.AnnotationHAMiGPUMem:   *resource.NewQuantity(3000, resource.DecimalSI),
		v1alpha1.AnnotationHAMiGPUCores: *resource.NewQuantity(25, resource.DecimalSI),
	})
	cases := []struct {
		name    string
		in      []kueue.PodSet
		want    []fit.PodSet
		wantErr string
	}{
		{
			name: "converted shared request, summed over containers",
			in: []kueue.PodSet{podSet("worker", 8, nil,
				rl(v1alpha1.ResourceVGPU, 1, v1alpha1.ResourceGPUMemory, 20480, v1alpha1.ResourceGPUCores, 30),
				rl(v1alpha1.ResourceVGPU, 1, v1alpha1.ResourceGPUMemory, 20480, v1alpha1.ResourceGPUCores, 30))},
			want: []fit.PodSet{{Name: "worker", Count: 8, GPUsPerPod: 2, MemoryMiB: 20480, Cores: 30}},
		},
		{
			name: "whole GPUs; CPU-only pod sets skipped",
			in:   []kueue.PodSet{podSet("launcher", 1, nil, rl("cpu", 1)), podSet("worker", 4, nil, rl(v1alpha1.ResourceNvidiaGPU, 8))},
			want: []fit.PodSet{{Name: "worker", Count: 4, GPUsPerPod: 8}},
		},
		{
			name: "selector and tolerations carried",
			in:   []kueue.PodSet{sel},
			want: []fit.PodSet{{Name: "w", Count: 2, GPUsPerPod: 1, NodeSelector: map[string]string{"pool": "a"}, Tolerations: sel.Template.Spec.Tolerations}},
		},
		{
			name: "required node affinity carried with the selector; preferred terms left out",
			in:   []kueue.PodSet{affine},
			want: []fit.PodSet{{Name: "a", Count: 2, GPUsPerPod: 1, NodeSelector: map[string]string{"pool": "a"}, NodeAffinity: required}},
		},
		{
			name: "preferred node affinity and pod anti-affinity are not read",
			in:   []kueue.PodSet{preferredOnly},
			want: []fit.PodSet{{Name: "p", Count: 1, GPUsPerPod: 1}},
		},
		{
			name: "sidecars add, plain init containers only raise the peak",
			in:   []kueue.PodSet{sidecar},
			want: []fit.PodSet{{Name: "s", Count: 1, GPUsPerPod: 4}},
		},
		{
			name: "unmutated template read from annotations",
			in:   []kueue.PodSet{podSet("w", 3, map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "40"}, rl(v1alpha1.ResourceNvidiaGPU, 1))},
			want: []fit.PodSet{{Name: "w", Count: 3, GPUsPerPod: 1, MemoryMiB: 20480, Cores: 40}},
		},
		{
			name: "HAMi container resources override annotations",
			in:   []kueue.PodSet{hamiRes},
			want: []fit.PodSet{{Name: "h", Count: 1, GPUsPerPod: 1, MemoryMiB: 3000, Cores: 25}},
		},
		{
			name: "memory percentage stays a percentage",
			in:   []kueue.PodSet{podSet("w", 1, map[string]string{v1alpha1.AnnotationHAMiGPUMemPercentage: "25", v1alpha1.AnnotationGPUCores: "20"}, rl(v1alpha1.ResourceNvidiaGPU, 2))},
			want: []fit.PodSet{{Name: "w", Count: 1, GPUsPerPod: 2, MemoryPercent: 25, Cores: 20}},
		},
		{
			name:    "both whole and shared",
			in:      []kueue.PodSet{podSet("w", 1, nil, rl(v1alpha1.ResourceNvidiaGPU, 1, v1alpha1.ResourceVGPU, 1, v1alpha1.ResourceGPUMemory, 5))},
			wantErr: `pod set w: container "c0" asks for both nvidia.com/gpu and gpupack.io/vgpu`,
		},
		{
			name: "containers that disagree on the share",
			in: []kueue.PodSet{podSet("w", 1, nil,
				rl(v1alpha1.ResourceVGPU, 1, v1alpha1.ResourceGPUMemory, 1000),
				rl(v1alpha1.ResourceVGPU, 1, v1alpha1.ResourceGPUMemory, 2000))},
			wantErr: "containers c0 and c1 ask for different kinds of GPU share",
		},
		{
			name:    "vgpu without memory",
			in:      []kueue.PodSet{podSet("w", 1, nil, rl(v1alpha1.ResourceVGPU, 1))},
			wantErr: "without gpupack.io/gpu-memory",
		},
		{
			name:    "memory not divisible by vgpu",
			in:      []kueue.PodSet{podSet("w", 1, nil, rl(v1alpha1.ResourceVGPU, 3, v1alpha1.ResourceGPUMemory, 1000))},
			wantErr: "must be multiples of gpupack.io/vgpu (3)",
		},
		{
			name:    "memory without vgpu",
			in:      []kueue.PodSet{podSet("w", 1, nil, rl(v1alpha1.ResourceGPUMemory, 1000))},
			wantErr: "without gpupack.io/vgpu",
		},
		{
			name:    "cores without memory on a whole GPU",
			in:      []kueue.PodSet{podSet("w", 1, map[string]string{v1alpha1.AnnotationGPUCores: "30"}, rl(v1alpha1.ResourceNvidiaGPU, 1))},
			wantErr: "a GPU without a memory request is exclusive",
		},
		{
			name:    "conflicting memory annotations",
			in:      []kueue.PodSet{podSet("w", 1, map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationHAMiGPUMem: "1000"}, rl(v1alpha1.ResourceNvidiaGPU, 1))},
			wantErr: "gpupack.io/gpu-memory is 20480 MiB but nvidia.com/gpumem is 1000 MiB",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, _, err := GangFromPodSets("ns", tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, g.PodSets); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}
