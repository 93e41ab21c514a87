package inventory

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// hamiPodSet is a Workload pod set as Kueue builds it from a job template
// the webhook's hami mode wrote: nvidia.com/gpu N with nvidia.com/gpumem
// (and gpucores) per GPU, in limits and requests.
func hamiPodSet(t *testing.T, name string, count int32, gpus, mem, cores string) kueue.PodSet {
	t.Helper()
	m, err := mutation.New(mutation.Config{Resources: mutation.ResourcesHAMi})
	if err != nil {
		t.Fatal(err)
	}
	ann := map[string]string{v1alpha1.AnnotationGPUMemory: mem}
	if cores != "" {
		ann[v1alpha1.AnnotationGPUCores] = cores
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Annotations: ann}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse(gpus)}},
	}}}}
	if _, err := m.Pod(p, mutation.PodContext{}); err != nil {
		t.Fatal(err)
	}
	// Kueue copies the template; the annotations are gone in a pod set built
	// from resources alone, so only the HAMi resources are read.
	return kueue.PodSet{Name: kueue.PodSetReference(name), Count: count, Template: corev1.PodTemplateSpec{Spec: p.Spec}}
}

// A pod set in HAMi form is N shared GPUs with that memory (and cores) per
// GPU — HAMi's resources are per GPU, not × N — never N exclusive GPUs.
func TestGangFromPodSetsHAMiForm(t *testing.T) {
	ps := hamiPodSet(t, "worker", 2, "2", "20Gi", "30")
	lim := ps.Template.Spec.Containers[0].Resources.Limits
	if q := lim[v1alpha1.AnnotationHAMiGPUMem]; q.Value() != 20480 {
		t.Fatalf("template is not in HAMi form: %v", lim)
	}
	pct := podSet("pct", 1, nil, rl(v1alpha1.ResourceNvidiaGPU, 1, v1alpha1.AnnotationHAMiGPUMemPercentage, 25))
	g, _, err := GangFromPodSets("ns", []kueue.PodSet{ps, pct})
	if err != nil {
		t.Fatal(err)
	}
	want := []fit.PodSet{
		{Name: "worker", Count: 2, GPUsPerPod: 2, MemoryMiB: 20480, Cores: 30},
		{Name: "pct", Count: 1, GPUsPerPod: 1, MemoryPercent: 25},
	}
	if d := cmp.Diff(want, g.PodSets); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}

	// Planned as shared GPUs: two pods × 2 GPUs × 20 GiB fit on one node
	// with two H100s (71903 MiB allocatable each); read as exclusive GPUs
	// they would need four.
	node := fit.Node{Name: "n1", Ready: true}
	for i, uuid := range []string{"GPU-0", "GPU-1"} {
		node.GPUs = append(node.GPUs, fit.GPU{UUID: uuid, Index: i, Model: "NVIDIA-H100-80GB-HBM3", PhysicalMiB: 81559, AllocatableMiB: 71903, Healthy: true})
	}
	model := fit.NewModel([]fit.Node{node})
	shared := fit.Gang{PodSets: g.PodSets[:1]}
	r := model.Fit(shared, fit.Options{})
	if !r.Fits || len(r.Assignments) != 2 {
		t.Fatalf("HAMi-form gang does not fit on 2 GPUs: %+v", r.Reasons)
	}
	perGPU := map[string]int64{}
	for _, a := range r.Assignments {
		if len(a.GPUs) != 2 {
			t.Errorf("pod %s/%d got %d GPUs, want 2", a.PodSet, a.Index, len(a.GPUs))
		}
		for _, u := range a.GPUs {
			if u.Exclusive || u.MemoryMiB != 20480 || u.Cores != 30 {
				t.Errorf("pod %s/%d: usage %+v, want shared 20480 MiB / 30 %%", a.PodSet, a.Index, u)
			}
			perGPU[u.UUID] += u.MemoryMiB
		}
	}
	if d := cmp.Diff(map[string]int64{"GPU-0": 40960, "GPU-1": 40960}, perGPU); d != "" {
		t.Errorf("MiB per GPU (-want +got):\n%s", d)
	}
	exclusive := fit.Gang{PodSets: []fit.PodSet{{Name: "worker", Count: 2, GPUsPerPod: 2}}}
	if r := model.Fit(exclusive, fit.Options{}); r.Fits {
		t.Errorf("the same gang as whole GPUs fits on 2 GPUs: the test proves nothing")
	}
}
