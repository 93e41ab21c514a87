package inventory

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
	"github.com/gpupack/gpupack/flavors"
)

func countPatches(cs *fake.Clientset) (meta, status int) {
	for _, a := range cs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			if p.GetSubresource() == "status" {
				status++
			} else {
				meta++
			}
		}
	}
	return
}

// TestPublishOnChangeOnly: the first pass writes everything, a second pass
// with nothing changed writes nothing, a health change rewrites the
// annotation and capacity, and capacity zeroed by a kubelet restart is
// restored without touching the annotation.
func TestPublishOnChangeOnly(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	cs := fake.NewClientset(node)
	pub := &Publisher{Client: cs, NodeName: "n1", Buffer: flavors.DefaultBuffer(), SlotsPerGPU: 4}
	hw := nvmlfake.DGXH100()
	read := func() []GPU {
		g, err := Read(hw, ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	step := func(name string, wantMeta, wantStatus int) Result {
		t.Helper()
		cs.ClearActions()
		res, err := pub.Publish(ctx, read())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if m, s := countPatches(cs); m != wantMeta || s != wantStatus {
			t.Errorf("%s: %d metadata and %d status patches, want %d and %d", name, m, s, wantMeta, wantStatus)
		}
		return res
	}

	step("first publish", 1, 1)
	n, _ := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	gpus, err := v1alpha1.ParseGPUs(n.Annotations[v1alpha1.AnnotationGPUs])
	if err != nil || len(gpus) != 8 {
		t.Fatalf("annotation: %v, %d GPUs", err, len(gpus))
	}
	if got := n.Labels[v1alpha1.LabelNVLinkDomain]; got != "n1" {
		t.Errorf("label = %q, want the node", got)
	}
	alloc := flavors.DefaultBuffer().Allocatable(81920)
	wantCap := corev1.ResourceList{
		v1alpha1.ResourceGPUMemory: *resource.NewQuantity(8*alloc, resource.DecimalSI),
		v1alpha1.ResourceVGPU:      *resource.NewQuantity(32, resource.DecimalSI),
		v1alpha1.ResourceGPUCores:  *resource.NewQuantity(800, resource.DecimalSI),
	}
	for _, rl := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		for k, v := range wantCap {
			if q := rl[k]; q.Cmp(v) != 0 {
				t.Errorf("%s = %s, want %s", k, q.String(), v.String())
			}
		}
	}

	step("nothing changed", 0, 0)

	hw.GPUs[2].Set(func(g *nvmlfake.GPU) { g.RemapFail = true })
	res := step("GPU 2 unhealthy", 1, 1)
	want := []Transition{{UUID: hw.GPUs[2].UUID(), Index: 2, From: "Healthy", To: "Unhealthy", Reason: "row remapping failed"}}
	if d := cmp.Diff(want, res.Transitions); d != "" {
		t.Errorf("transitions (-want +got):\n%s", d)
	}
	if got := res.State.Capacity[v1alpha1.ResourceGPUCores]; got != 700 {
		t.Errorf("gpu-cores = %d, want 700", got)
	}

	// The kubelet zeroes extended resources when it restarts.
	n, _ = cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	for k := range wantCap {
		n.Status.Capacity[k] = resource.MustParse("0")
		n.Status.Allocatable[k] = resource.MustParse("0")
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	step("kubelet reset extended resources", 0, 1)

	// A GPU that falls off the bus stays in the annotation, Unhealthy.
	hw.Hide(6, true)
	res = step("GPU 6 vanished", 1, 1)
	if d := cmp.Diff([]Transition{{UUID: hw.GPUs[6].UUID(), Index: 6, From: "Healthy", To: "Unhealthy", Reason: "not found by NVML"}}, res.Transitions); d != "" {
		t.Errorf("transitions (-want +got):\n%s", d)
	}
	if len(res.State.GPUs) != 8 {
		t.Errorf("vanished GPU dropped: %d GPUs published", len(res.State.GPUs))
	}
	step("still vanished", 0, 0)
	hw.Hide(6, false)
	res = step("GPU 6 back", 1, 1)
	if len(res.Transitions) != 1 || res.Transitions[0].To != "Healthy" {
		t.Errorf("transitions = %+v, want GPU 6 back to Healthy", res.Transitions)
	}
}

// TestPublishTwoCliques: two NVL trays of one clique share a label; a tray
// of another clique gets another, and the annotation names each GPU's domain.
func TestPublishTwoCliques(t *testing.T) {
	ctx := context.Background()
	cluster := nvmlfake.ClusterUUID(0xc1)
	trays := map[string]*nvmlfake.Node{
		"tray-a": nvmlfake.NVLTray(4, cluster, 1),
		"tray-b": nvmlfake.NVLTray(4, cluster, 1),
		"tray-c": nvmlfake.NVLTray(4, cluster, 2),
	}
	cs := fake.NewClientset()
	labels := map[string]string{}
	for name, hw := range trays {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		now, err := Read(hw, ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pub := &Publisher{Client: cs, NodeName: name, Buffer: flavors.DefaultBuffer(), SlotsPerGPU: 1}
		res, err := pub.Publish(ctx, now)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range res.State.GPUs {
			if g.NVLinkDomain != res.State.Domain {
				t.Errorf("%s GPU %d domain %q != node label %q", name, g.Index, g.NVLinkDomain, res.State.Domain)
			}
		}
		n, _ := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		labels[name] = n.Labels[v1alpha1.LabelNVLinkDomain]
	}
	want := map[string]string{
		"tray-a": "c1c1c1c1-c1c1-c1c1-c1c1-c1c1c1c1c1c1-1",
		"tray-b": "c1c1c1c1-c1c1-c1c1-c1c1-c1c1c1c1c1c1-1",
		"tray-c": "c1c1c1c1-c1c1-c1c1-c1c1-c1c1c1c1c1c1-2",
	}
	if d := cmp.Diff(want, labels); d != "" {
		t.Errorf("labels (-want +got):\n%s", d)
	}
}

func TestPublishReplacesMalformedAnnotation(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{v1alpha1.AnnotationGPUs: "{not json"}}}
	cs := fake.NewClientset(node)
	pub := &Publisher{Client: cs, NodeName: "n1", Buffer: flavors.DefaultBuffer(), SlotsPerGPU: 1}
	now, _ := Read(nvmlfake.DGXH100(), ReadOptions{})
	res, err := pub.Publish(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if res.PreviousMalformed == nil || !res.MetadataPatched {
		t.Errorf("malformed=%v patched=%v; want the error reported and the annotation replaced", res.PreviousMalformed, res.MetadataPatched)
	}
}

// BenchmarkReadAndDiff: one inventory pass without the API round trip:
// NVML reads of an 8-GPU box, merge, capacity, and the change check.
func BenchmarkReadAndDiff(b *testing.B) {
	hw := nvmlfake.DGXH100()
	now, _ := Read(hw, ReadOptions{})
	st := Desired(now, nil, "n1", flavors.DefaultBuffer(), 10)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{v1alpha1.LabelNVLinkDomain: st.Domain}, Annotations: map[string]string{v1alpha1.AnnotationGPUs: v1alpha1.FormatGPUs(st.GPUs)}}}
	b.ReportAllocs()
	for b.Loop() {
		now, err := Read(hw, ReadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		prev, _ := v1alpha1.ParseGPUs(node.Annotations[v1alpha1.AnnotationGPUs])
		st := Desired(now, prev, "n1", flavors.DefaultBuffer(), 10)
		if m, _ := Diff(node, st); m != nil {
			b.Fatal("unexpected change")
		}
	}
}
