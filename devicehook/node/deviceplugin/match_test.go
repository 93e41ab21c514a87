package deviceplugin

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

const vgpu = corev1.ResourceName(v1alpha1.ResourceVGPU)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// podBuilder builds test pods that read like the situation they set up.
type podBuilder struct{ p *corev1.Pod }

func makePod(name string) *podBuilder {
	return &podBuilder{p: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "ns", UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(t0),
		Annotations: map[string]string{},
	}, Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}}
}

func (b *podBuilder) Node(n string) *podBuilder { b.p.Spec.NodeName = n; return b }
func (b *podBuilder) Devices(s string) *podBuilder {
	b.p.Annotations[v1alpha1.AnnotationDevices] = s
	return b
}

// Forged: the annotation is there but no plan binds the pod (a tenant wrote it).
func (b *podBuilder) Forged(s string) *podBuilder {
	b.p.Annotations[v1alpha1.AnnotationDevices] = s
	b.p.Annotations[testNoPlan] = "true"
	return b
}

// PlanSays makes the bound plan slot differ from the annotation.
func (b *podBuilder) PlanSays(s string) *podBuilder { b.p.Annotations[testPlanSays] = s; return b }

// PlanNode puts the bound plan slot on another node.
func (b *podBuilder) PlanNode(n string) *podBuilder { b.p.Annotations[testPlanNode] = n; return b }

// Test-only annotations: planFor reads them to build the GPUPlans; the code
// under test never looks at them.
const (
	testNoPlan   = "test.gpupack.io/no-plan"
	testPlanSays = "test.gpupack.io/plan-says"
	testPlanNode = "test.gpupack.io/plan-node"
)

// planFor builds one GPUPlan per pod that has gpupack.io/devices (and no
// testNoPlan), with slot "main"[0] bound to the pod's UID.
func planFor(pods ...*corev1.Pod) []*v1alpha1.GPUPlan {
	var out []*v1alpha1.GPUPlan
	for _, p := range pods {
		s, ok := p.Annotations[v1alpha1.AnnotationDevices]
		if v, says := p.Annotations[testPlanSays]; says {
			s, ok = v, true
		}
		if !ok || p.Annotations[testNoPlan] != "" {
			continue
		}
		devs, err := v1alpha1.ParseDevices(s)
		if err != nil {
			continue
		}
		node := p.Spec.NodeName
		if n := p.Annotations[testPlanNode]; n != "" {
			node = n
		}
		a := v1alpha1.PodAssignment{PodSet: "main", Index: 0, Node: node}
		for _, d := range devs {
			a.GPUs = append(a.GPUs, v1alpha1.GPUAssignment{UUID: d.UUID, MemoryMiB: d.MemoryMiB, Cores: 30})
		}
		out = append(out, &v1alpha1.GPUPlan{
			ObjectMeta: metav1.ObjectMeta{Name: "plan-" + p.Name, Namespace: p.Namespace},
			Spec:       v1alpha1.GPUPlanSpec{Assignments: []v1alpha1.PodAssignment{a}},
			Status:     v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlaced, Bindings: []v1alpha1.SlotBinding{{PodSet: "main", Index: 0, PodName: p.Name, PodUID: p.UID}}},
		})
	}
	return out
}

func stateOf(allocated map[types.UID]int, pods ...*corev1.Pod) State {
	if allocated == nil {
		allocated = map[types.UID]int{}
	}
	return State{Node: "n1", Pods: pods, Plans: planFor(pods...), Allocated: allocated}
}

func ga(uuid string, mib int64) v1alpha1.GPUAssignment {
	return v1alpha1.GPUAssignment{UUID: uuid, MemoryMiB: mib, Cores: 30}
}

func (b *podBuilder) Created(d time.Duration) *podBuilder {
	b.p.CreationTimestamp = metav1.NewTime(t0.Add(d))
	return b
}
func (b *podBuilder) Phase(ph corev1.PodPhase) *podBuilder { b.p.Status.Phase = ph; return b }
func (b *podBuilder) Container(name string, gpus int64) *podBuilder {
	c := corev1.Container{Name: name}
	if gpus > 0 {
		c.Resources.Limits = corev1.ResourceList{vgpu: *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	b.p.Spec.Containers = append(b.p.Spec.Containers, c)
	return b
}
func (b *podBuilder) WholeGPU(name string, gpus int64) *podBuilder {
	c := corev1.Container{Name: name}
	c.Resources.Limits = corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}
	b.p.Spec.Containers = append(b.p.Spec.Containers, c)
	return b
}
func (b *podBuilder) Started(container string) *podBuilder {
	b.p.Status.ContainerStatuses = append(b.p.Status.ContainerStatuses, corev1.ContainerStatus{Name: container, ContainerID: "containerd://x"})
	return b
}
func (b *podBuilder) Obj() *corev1.Pod { return b.p }

// Admitted: the kubelet admitted the pod (and so allocated its devices).
func (b *podBuilder) Admitted() *podBuilder {
	st := metav1.NewTime(t0)
	b.p.Status.StartTime = &st
	return b
}

// Deleting: deletionTimestamp set.
func (b *podBuilder) Deleting() *podBuilder {
	d := metav1.NewTime(t0)
	b.p.DeletionTimestamp = &d
	return b
}

func slots(ids ...string) []string { return ids }

func inNS(b *podBuilder, ns string) *corev1.Pod { b.p.Namespace = ns; return b.p }

func TestSlotGPU(t *testing.T) {
	cases := []struct {
		in, want string
		err      bool
	}{
		{"GPU-a::0", "GPU-a", false},
		{"GPU-a::b::12", "GPU-a::b", false},
		{"GPU-a", "", true},
		{"::3", "", true},
		{"GPU-a::x", "", true},
	}
	for _, tc := range cases {
		got, err := SlotGPU(tc.in)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("SlotGPU(%q) = %q, %v", tc.in, got, err)
		}
	}
	if g, _ := SlotGPU(SlotID("GPU-z", 7)); g != "GPU-z" {
		t.Errorf("round trip = %q", g)
	}
}

func TestMatch(t *testing.T) {
	planned := makePod("a").Devices("G1:20000,G2:20000").Container("main", 2).Obj()
	older := makePod("old").Devices("G1:10000").Container("main", 1).Created(-time.Minute).Obj()
	newer := makePod("new").Devices("G1:30000").Container("main", 1).Created(time.Minute).Obj()
	twoCtr := makePod("two").Devices("G3:1000,G4:2000,G5:3000").Container("a", 1).Container("side", 0).Container("b", 2).Obj()
	cases := []struct {
		name      string
		ids       []string
		pods      []*corev1.Pod
		allocated map[types.UID]int
		want      Chunk
		wantErr   string
	}{
		{"planned GPUs", slots("G2::3", "G1::0"), []*corev1.Pod{planned}, nil,
			Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "a"}, PodUID: "uid-a", Container: "main",
				Devices: []v1alpha1.GPUAssignment{ga("G1", 20000), ga("G2", 20000)}}, ""},
		{"slots on other GPUs", slots("G1::0", "G3::0"), []*corev1.Pod{planned}, nil, Chunk{},
			"no pod planned on node n1 has GPUs [G1 G3] for a container requesting 2 gpupack.io/vgpu; waiting: ns/a container main → G1:20000,G2:20000"},
		{"two slots of one GPU do not make two GPUs", slots("G1::0", "G1::1"), []*corev1.Pod{planned}, nil, Chunk{}, "no pod planned"},
		{"unplanned pod", slots("G7::0"), []*corev1.Pod{makePod("plain").Container("main", 1).Obj()}, nil, Chunk{},
			"refused: the only pod on node n1 waiting for 1 gpupack.io/vgpu is ns/plain, which no GPUPlan covers"},
		// Finding 1: an unplanned pod scheduled next to a planned one must
		// not be handed the planned pod's slot (GetPreferredAllocation
		// steers every request of that size to the planned GPUs).
		{"unplanned pod next to a planned one, older", slots("G1::0"), []*corev1.Pod{older, makePod("plain").Container("main", 1).Created(-time.Hour).Obj()}, nil, Chunk{},
			"refused: 1 gpupack.io/vgpu could be for any of ns/plain (no plan), ns/old (planned G1:10000)"},
		{"unplanned pod next to a planned one, newer", slots("G1::0"), []*corev1.Pod{older, makePod("plain").Container("main", 1).Created(time.Hour).Obj()}, nil, Chunk{},
			"refused: 1 gpupack.io/vgpu could be for any of ns/old (planned G1:10000), ns/plain (no plan)"},
		{"refused pod next to a planned one", slots("G1::0"), []*corev1.Pod{older, makePod("forged").Forged("G1:70000").Container("main", 1).Obj()}, nil, Chunk{},
			"could be for any of ns/old (planned G1:10000), ns/forged (plan not confirmed)"},
		{"unplanned pod of another size does not block", slots("G1::0"), []*corev1.Pod{older, makePod("plain").Container("main", 2).Obj()}, nil,
			Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "old"}, PodUID: "uid-old", Container: "main",
				Devices: []v1alpha1.GPUAssignment{ga("G1", 10000)}}, ""},
		{"unplanned pod that already runs does not block", slots("G1::0"), []*corev1.Pod{older, makePod("plain").Container("main", 1).Started("main").Obj()}, nil,
			Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "old"}, PodUID: "uid-old", Container: "main",
				Devices: []v1alpha1.GPUAssignment{ga("G1", 10000)}}, ""},
		{"planned pods of two namespaces", slots("G1::0"), []*corev1.Pod{older, inNS(makePod("other").Devices("G2:5000").Container("main", 1), "team-b")}, nil, Chunk{},
			"refused: 1 gpupack.io/vgpu could be for any of ns/old (planned G1:10000), team-b/other (planned G2:5000)"},
		{"two namespaces, other sizes", slots("G1::0"), []*corev1.Pod{older, inNS(makePod("other").Devices("G2:5000,G3:5000").Container("main", 2), "team-b")}, nil,
			Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "old"}, PodUID: "uid-old", Container: "main",
				Devices: []v1alpha1.GPUAssignment{ga("G1", 10000)}}, ""},
		{"already allocated", slots("G1::0", "G2::0"), []*corev1.Pod{planned}, map[types.UID]int{"uid-a": 1}, Chunk{}, "no planned pod is waiting"},
		{"started before agent restart", slots("G1::0", "G2::0"), []*corev1.Pod{makePod("a").Devices("G1:1,G2:1").Container("main", 2).Started("main").Obj()}, nil, Chunk{}, "no planned pod is waiting"},
		{"other node", slots("G1::0", "G2::0"), []*corev1.Pod{makePod("a").Devices("G1:1,G2:1").Container("main", 2).Node("n2").Obj()}, nil, Chunk{}, "no planned pod is waiting"},
		{"finished pod", slots("G1::0", "G2::0"), []*corev1.Pod{makePod("a").Devices("G1:1,G2:1").Container("main", 2).Phase(corev1.PodSucceeded).Obj()}, nil, Chunk{}, "no planned pod is waiting"},
		// Finding 2: two planned pods of one namespace with the same request
		// size cannot be told apart; served oldest-first they swapped slots
		// when the kubelet admitted the newer one first.
		{"two planned pods of one namespace, one GPU", slots("G1::4"), []*corev1.Pod{newer, older}, nil, Chunk{},
			"refused: 1 gpupack.io/vgpu could be for any of ns/old (planned G1:10000), ns/new (planned G1:30000)"},
		{"two planned pods of one namespace, other GPUs", slots("G2::0"), []*corev1.Pod{older, makePod("o2").Devices("G2:5000").Container("main", 1).Obj()}, nil, Chunk{},
			"refused: 1 gpupack.io/vgpu could be for any of ns/old (planned G1:10000), ns/o2 (planned G2:5000)"},
		{"a pod the kubelet admitted does not count (agent restarted while it pulls its image)", slots("G1::4"), []*corev1.Pod{makePod("new").Devices("G1:30000").Container("main", 1).Admitted().Obj(), older}, nil,
			Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "old"}, PodUID: "uid-old", Container: "main",
				Devices: []v1alpha1.GPUAssignment{ga("G1", 10000)}}, ""},
		{"a terminating pod the kubelet has not admitted still could be the one", slots("G1::4"), []*corev1.Pod{makePod("new").Devices("G1:30000").Container("main", 1).Deleting().Obj(), older}, nil, Chunk{},
			"refused: 1 gpupack.io/vgpu could be for any of ns/old (planned G1:10000), ns/new (planned G1:30000)"},
		{"then the newer", slots("G1::5"), []*corev1.Pod{newer, older}, map[types.UID]int{"uid-old": 1},
			Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "new"}, PodUID: "uid-new", Container: "main",
				Devices: []v1alpha1.GPUAssignment{ga("G1", 30000)}}, ""},
		{"second container gets the rest", slots("G4::0", "G5::1"), []*corev1.Pod{twoCtr}, map[types.UID]int{"uid-two": 1},
			Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "two"}, PodUID: "uid-two", Container: "b", Ordinal: 1,
				Devices: []v1alpha1.GPUAssignment{ga("G4", 2000), ga("G5", 3000)}}, ""},
		{"plan that does not add up is named", slots("G1::0"), []*corev1.Pod{makePod("bad").Devices("G1:1,G2:1").Container("main", 1).Obj()}, nil, Chunk{},
			"refused: pod ns/bad: containers request 1 gpupack.io/vgpu but the plan gives 2 GPUs"},
		{"annotation without a plan is refused", slots("G1::0"), []*corev1.Pod{makePod("forged").Forged("G1:70000").Container("main", 1).Obj()}, nil, Chunk{},
			`refused: pod ns/forged: gpupack.io/devices="G1:70000" but no GPUPlan binds pod UID uid-forged`},
		{"annotation that disagrees with the plan is refused", slots("G1::0"), []*corev1.Pod{makePod("liar").Devices("G1:70000").PlanSays("G1:1").Container("main", 1).Obj()}, nil, Chunk{},
			`refused: pod ns/liar: gpupack.io/devices="G1:70000" disagrees with GPUPlan plan-liar slot main[0] (G1:1)`},
		{"annotation naming another GPU is refused", slots("G2::0"), []*corev1.Pod{makePod("liar").Devices("G2:1").PlanSays("G1:1").Container("main", 1).Obj()}, nil, Chunk{},
			`disagrees with GPUPlan plan-liar slot main[0] (G1:1)`},
		{"plan on another node is refused", slots("G1::0"), []*corev1.Pod{makePod("moved").Devices("G1:1").PlanNode("n2").Container("main", 1).Obj()}, nil, Chunk{},
			`refused: pod ns/moved: GPUPlan plan-moved slot main[0] places it on node n2, not n1`},
		{"bad slot id", slots("nonsense"), nil, nil, Chunk{}, `device ID "nonsense" is not <gpu-uuid>::<slot>`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			alloc := tc.allocated
			if alloc == nil {
				alloc = map[types.UID]int{}
			}
			got, _, err := Match(tc.ids, stateOf(alloc, tc.pods...), vgpu)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestMatchDecision: what the plugin is told besides the error — the one
// unplanned pod (served or refused by policy, told by an Event), or every
// candidate of an ambiguous request.
func TestMatchDecision(t *testing.T) {
	planned := makePod("a").Devices("G1:1000").Container("main", 1).Obj()
	plain := makePod("plain").Container("main", 1).Created(time.Minute).Obj()
	_, d, err := Match(slots("G1::0"), stateOf(nil, plain), vgpu)
	if !errors.Is(err, ErrRefused) || d.Unplanned != plain || len(d.Ambiguous) != 0 {
		t.Errorf("only an unplanned pod: err = %v, decision = %+v; want ErrRefused naming it", err, d)
	}
	_, d, err = Match(slots("G1::0"), stateOf(nil, planned, plain), vgpu)
	if !errors.Is(err, ErrRefused) || d.Unplanned != nil || len(d.Ambiguous) != 2 {
		t.Errorf("planned + unplanned: err = %v, decision = %+v; want ErrRefused with both candidates", err, d)
	}
	_, _, err = Match(slots("G1::0"), stateOf(nil), vgpu)
	if err == nil || errors.Is(err, ErrRefused) {
		t.Errorf("nobody waiting: err = %v; want a retriable error (the informer may lag)", err)
	}
}

func TestPreferred(t *testing.T) {
	avail := slots("G1::0", "G1::1", "G2::0", "G2::1", "G3::0", "G3::1")
	planned := makePod("a").Devices("G2:1,G3:1").Container("main", 2).Obj()
	holder := makePod("h").Devices("G1:1").Container("main", 1).Started("main").Obj()
	cases := []struct {
		name  string
		avail []string
		must  []string
		size  int
		pods  []*corev1.Pod
		want  []string
	}{
		{"planned GPUs", avail, nil, 2, []*corev1.Pod{planned}, slots("G2::0", "G3::0")},
		{"planned GPUs keep must-include", avail, slots("G3::1"), 2, []*corev1.Pod{planned}, slots("G2::0", "G3::1")},
		{"unplanned avoids held GPUs", avail, nil, 1, []*corev1.Pod{holder}, slots("G2::0")},
		{"unplanned spreads over GPUs", avail, nil, 2, nil, slots("G1::0", "G2::0")},
		{"more slots than GPUs", slots("G1::0", "G1::1", "G2::0"), nil, 3, nil, slots("G1::0", "G2::0", "G1::1")},
	}
	for _, tc := range cases {
		got := Preferred(tc.avail, tc.must, tc.size, stateOf(nil, tc.pods...), vgpu)
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}

func FuzzSlotGPU(f *testing.F) {
	for _, s := range []string{"GPU-a::0", "::", "a::-1", "a::b::c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := SlotGPU(s)
		if err != nil {
			return
		}
		if g == "" || !strings.HasPrefix(s, g+slotSep) {
			t.Fatalf("SlotGPU(%q) = %q", s, g)
		}
	})
}

// BenchmarkMatch: one Allocate decision on a busy node (500 pods, 8 GPUs,
// the planned pod is the newest).
func BenchmarkMatch(b *testing.B) {
	var pods []*corev1.Pod
	for i := range 500 {
		g := "G" + strconv.Itoa(i%8)
		pods = append(pods, makePod("p"+strconv.Itoa(i)).Devices(g+":1000").Container("main", 1).Started("main").Created(time.Duration(i)*time.Second).Obj())
	}
	pods = append(pods, makePod("new").Devices("G3:1000,G5:1000").Container("main", 2).Created(time.Hour).Obj())
	st := stateOf(nil, pods...)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Match([]string{"G3::1", "G5::2"}, st, vgpu); err != nil {
			b.Fatal(err)
		}
	}
}

// A pod that names its plan (Kueue wrote gpupack.io/plan) and carries the
// ungater's devices, but whose binding the plan informer does not show
// yet, is not refused for good: Allocate waits for the informer. The same
// annotation without a plan name is refused at once (a tenant cannot make
// the kubelet wait), and neither is ever served without the binding.
func TestBindingNotSeenYetIsNotFinal(t *testing.T) {
	lagging := makePod("lagging").Forged("G1:20000").Container("main", 1).Obj()
	lagging.Annotations[v1alpha1.AnnotationPlan] = "plan-lagging"
	forged := makePod("forged").Forged("G1:20000").Container("main", 1).Obj()
	for _, tc := range []struct {
		pod     *corev1.Pod
		refused bool
	}{{lagging, false}, {forged, true}} {
		st := State{Node: "n1", Pods: []*corev1.Pod{tc.pod}, Plans: planFor(tc.pod)}
		_, _, err := Match(slots("G1::0"), st, v1alpha1.ResourceVGPU)
		if err == nil {
			t.Fatalf("%s: served without a binding", tc.pod.Name)
		}
		if errors.Is(err, ErrRefused) != tc.refused {
			t.Errorf("%s: err %v, refused (final) = %v, want %v", tc.pod.Name, err, errors.Is(err, ErrRefused), tc.refused)
		}
	}
}
