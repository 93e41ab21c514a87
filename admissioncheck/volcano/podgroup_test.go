package volcano

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanoscheduling "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

var quantityEq = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

const (
	spine = "network.topology.nvidia.com/spine"
	leaf  = "network.topology.nvidia.com/leaf"
	gpu   = v1alpha1.ResourceNvidiaGPU
	gmem  = v1alpha1.ResourceGPUMemory
)

func params(mut func(*v1alpha1.GangFitParametersSpec)) *v1alpha1.GangFitParameters {
	p := &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"}}
	if mut != nil {
		mut(&p.Spec)
	}
	return p
}

func withVolcano(v v1alpha1.VolcanoSettings) func(*v1alpha1.GangFitParametersSpec) {
	return func(s *v1alpha1.GangFitParametersSpec) { s.Volcano = &v }
}

func TestWanted(t *testing.T) {
	twoSets := func() *wlWrapper {
		return makeWL("wl").podSet("master", 1, rl("cpu", "1")).podSet("worker", 2, rl("cpu", "1"))
	}
	for _, tc := range []struct {
		name   string
		wl     *kueue.Workload
		params *v1alpha1.GangFitParameters
		want   bool
	}{
		{"default scheduler", twoSets().obj(), nil, false},
		{"one pod set names volcano", twoSets().scheduler(SchedulerName).obj(), nil, true},
		{"another scheduler", twoSets().scheduler("kai-scheduler").obj(), params(nil), false},
		{"parameters switch", twoSets().obj(), params(withVolcano(v1alpha1.VolcanoSettings{Enabled: true})), true},
		{"parameters without the switch", twoSets().obj(), params(withVolcano(v1alpha1.VolcanoSettings{Queue: "q"})), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Wanted(tc.wl, tc.params); got != tc.want {
				t.Fatalf("Wanted = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAddPodSetUpdates(t *testing.T) {
	wl := makeWL("pytorchjob-train-1a2b3").podSet("master", 1, rl("cpu", "1")).podSet("worker", 3, rl(gpu, "8")).scheduler(SchedulerName).obj()
	check := []kueue.PodSetUpdate{{
		Name:         "worker",
		Annotations:  map[string]string{v1alpha1.AnnotationPlan: "pytorchjob-train-1a2b3"},
		NodeSelector: map[string]string{leaf: "l1"},
	}}
	orig := []kueue.PodSetUpdate{*check[0].DeepCopy()}
	for _, tc := range []struct {
		name   string
		wl     *kueue.Workload
		params *v1alpha1.GangFitParameters
		want   []kueue.PodSetUpdate
	}{
		{
			name: "not under Volcano: unchanged",
			wl:   makeWL("plain").podSet("main", 2, rl(gpu, "1")).obj(),
			want: check,
		},
		{
			name: "every pod set joins the group as its own task",
			wl:   wl,
			want: []kueue.PodSetUpdate{
				{
					Name: "worker",
					Annotations: map[string]string{
						v1alpha1.AnnotationPlan: "pytorchjob-train-1a2b3",
						AnnotationGroupName:     "pytorchjob-train-1a2b3",
						AnnotationTaskSpec:      "worker",
					},
					NodeSelector: map[string]string{leaf: "l1"},
				},
				{
					Name:        "master",
					Annotations: map[string]string{AnnotationGroupName: "pytorchjob-train-1a2b3", AnnotationTaskSpec: "master"},
				},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := AddPodSetUpdates(tc.wl, tc.params, check)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("AddPodSetUpdates (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(orig, check); diff != "" {
				t.Fatalf("input modified:\n%s", diff)
			}
		})
	}
	if got := PodSetAnnotations(wl, "worker"); got["scheduling.k8s.io/group-name"] != GroupName(wl) || got["volcano.sh/task-spec"] != "worker" {
		t.Fatalf("PodSetAnnotations = %v: Volcano reads scheduling.k8s.io/group-name and volcano.sh/task-spec", got)
	}
}

func TestMinResources(t *testing.T) {
	sidecar := corev1.ContainerRestartPolicyAlways
	for _, tc := range []struct {
		name string
		wl   *kueue.Workload
		want corev1.ResourceList
	}{
		{
			name: "sum over pod sets times counts",
			wl: makeWL("wl").
				podSet("master", 1, rl("cpu", "1", "memory", "1Gi", gpu, "8")).
				podSet("worker", 3, rl("cpu", "2", gpu, "8", gmem, "20480")).obj(),
			want: rl("cpu", "7", "memory", "1Gi", gpu, "32", gmem, "61440"),
		},
		{
			name: "partial admission counts what Kueue admitted",
			wl: makeWL("wl").
				podSet("master", 1, rl("cpu", "1")).
				podSet("worker", 8, rl(gpu, "1")).admitted(map[string]int32{"worker": 2}).obj(),
			want: rl("cpu", "1", gpu, "2"),
		},
		{
			name: "a limit stands in for a missing request",
			wl: func() *kueue.Workload {
				w := makeWL("wl").podSet("worker", 2, rl("cpu", "1"))
				w.last().Containers[0].Resources.Limits = rl(gpu, "4", "cpu", "3")
				return w.obj()
			}(),
			want: rl("cpu", "2", gpu, "8"),
		},
		{
			name: "init containers, sidecars and overhead",
			wl: func() *kueue.Workload {
				w := makeWL("wl").podSet("worker", 2, rl("cpu", "1", gpu, "1"))
				w.last().InitContainers = []corev1.Container{
					{Name: "big-init", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "4")}},
					{Name: "sidecar", RestartPolicy: &sidecar, Resources: corev1.ResourceRequirements{Requests: rl("cpu", "500m")}},
				}
				w.last().Overhead = rl("cpu", "100m")
				return w.obj()
			}(),
			// per pod: max(init 4, sidecar 0.5 + main 1) + overhead 0.1 = 4.1
			want: rl("cpu", "8200m", gpu, "2"),
		},
		{
			name: "a pod set admitted with zero pods adds nothing",
			wl: makeWL("wl").podSet("a", 1, rl("cpu", "1")).podSet("b", 4, rl("cpu", "1")).
				admitted(map[string]int32{"b": 0}).obj(),
			want: rl("cpu", "1"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, MinResources(tc.wl), quantityEq); diff != "" {
				t.Fatalf("MinResources (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuild(t *testing.T) {
	levels := []string{spine, leaf, v1alpha1.LabelNVLinkDomain}
	gangWL := func() *wlWrapper {
		w := makeWL("pytorchjob-train-1a2b3").
			podSet("master", 1, rl("cpu", "1", gpu, "8")).scheduler(SchedulerName).
			podSet("worker", 3, rl("cpu", "1", gpu, "8")).scheduler(SchedulerName)
		for i := range w.Spec.PodSets {
			w.Spec.PodSets[i].Template.Spec.PriorityClassName = "training"
		}
		return w
	}
	owner := []metav1.OwnerReference{{
		APIVersion: kueue.GroupVersion.String(), Kind: "Workload", Name: "pytorchjob-train-1a2b3",
		UID: "uid-pytorchjob-train-1a2b3", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	pg := func(mut func(*volcanoscheduling.PodGroup)) *volcanoscheduling.PodGroup {
		p := &volcanoscheduling.PodGroup{
			TypeMeta: metav1.TypeMeta{APIVersion: "scheduling.volcano.sh/v1beta1", Kind: "PodGroup"},
			ObjectMeta: metav1.ObjectMeta{Name: "pytorchjob-train-1a2b3", Namespace: "team",
				Labels: map[string]string{LabelManagedBy: ManagedByValue}, OwnerReferences: owner},
			Spec: volcanoscheduling.PodGroupSpec{
				MinMember:         4,
				MinTaskMember:     map[string]int32{"master": 1, "worker": 3},
				Queue:             "gpu-jobs",
				PriorityClassName: "training",
				MinResources:      ptr.To(rl("cpu", "4", gpu, "32")),
				NetworkTopology:   &volcanoscheduling.NetworkTopologySpec{Mode: volcanoscheduling.HardNetworkTopologyMode, HighestTierAllowed: ptr.To(2)},
			},
		}
		if mut != nil {
			mut(p)
		}
		return p
	}
	gpuQueue := func(s *v1alpha1.GangFitParametersSpec) {
		s.TopologyLevels = levels
		s.Volcano = &v1alpha1.VolcanoSettings{Queue: "gpu-jobs"}
	}
	for _, tc := range []struct {
		name   string
		wl     *kueue.Workload
		params *v1alpha1.GangFitParameters
		level  string
		want   *volcanoscheduling.PodGroup
	}{
		{
			name: "leaf domain is tier 2", wl: gangWL().obj(), params: params(gpuQueue), level: leaf,
			want: pg(nil),
		},
		{
			name: "NVLink domain is tier 1", wl: gangWL().obj(), params: params(gpuQueue), level: v1alpha1.LabelNVLinkDomain,
			want: pg(func(p *volcanoscheduling.PodGroup) { p.Spec.NetworkTopology.HighestTierAllowed = ptr.To(1) }),
		},
		{
			name: "whole cluster: no network constraint", wl: gangWL().obj(), params: params(gpuQueue), level: "",
			want: pg(func(p *volcanoscheduling.PodGroup) { p.Spec.NetworkTopology = nil }),
		},
		{
			name: "one node: no network constraint", wl: gangWL().obj(), params: params(gpuQueue), level: corev1.LabelHostname,
			want: pg(func(p *volcanoscheduling.PodGroup) { p.Spec.NetworkTopology = nil }),
		},
		{
			name: "no parameters: default queue", wl: gangWL().obj(), params: nil, level: leaf,
			want: pg(func(p *volcanoscheduling.PodGroup) { p.Spec.Queue = DefaultQueue; p.Spec.NetworkTopology = nil }),
		},
		{
			name: "partial admission",
			wl:   gangWL().admitted(map[string]int32{"worker": 1}).obj(), params: params(gpuQueue), level: leaf,
			want: pg(func(p *volcanoscheduling.PodGroup) {
				p.Spec.MinMember = 2
				p.Spec.MinTaskMember = map[string]int32{"master": 1, "worker": 1}
				p.Spec.MinResources = ptr.To(rl("cpu", "2", gpu, "16"))
			}),
		},
		{
			name: "core PriorityClass of the workload wins",
			wl: func() *kueue.Workload {
				w := gangWL()
				w.Spec.PriorityClassRef = kueue.NewPodPriorityClassRef("urgent")
				return w.obj()
			}(),
			params: params(gpuQueue), level: leaf,
			want: pg(func(p *volcanoscheduling.PodGroup) { p.Spec.PriorityClassName = "urgent" }),
		},
		{
			name: "a WorkloadPriorityClass means nothing to Volcano",
			wl: func() *kueue.Workload {
				w := gangWL()
				w.Spec.PriorityClassRef = kueue.NewWorkloadPriorityClassRef("kueue-high")
				return w.obj()
			}(),
			params: params(gpuQueue), level: leaf,
			want: pg(nil),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Build(tc.wl, tc.params, tc.level), quantityEq); diff != "" {
				t.Fatalf("Build (-want +got):\n%s", diff)
			}
		})
	}
}

func TestObserve(t *testing.T) {
	now := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	unsched := func(at time.Time, status corev1.ConditionStatus) volcanoscheduling.PodGroupCondition {
		return volcanoscheduling.PodGroupCondition{Type: volcanoscheduling.PodGroupUnschedulableType, Status: status,
			LastTransitionTime: metav1.NewTime(at), Reason: "NotEnoughResources", Message: "4/4 tasks in gang unschedulable: 4 Insufficient nvidia.com/gpu"}
	}
	pg := func(phase volcanoscheduling.PodGroupPhase, conds ...volcanoscheduling.PodGroupCondition) *volcanoscheduling.PodGroup {
		return &volcanoscheduling.PodGroup{Status: volcanoscheduling.PodGroupStatus{Phase: phase, Conditions: conds}}
	}
	const patience = 5 * time.Minute
	volcanoMsg := "NotEnoughResources: 4/4 tasks in gang unschedulable: 4 Insufficient nvidia.com/gpu"
	for _, tc := range []struct {
		name            string
		pg              *volcanoscheduling.PodGroup
		recorded, ready time.Time
		want            Observation
	}{
		{name: "no condition", pg: pg(volcanoscheduling.PodGroupPending), ready: ago(time.Hour)},
		{name: "condition false", pg: pg(volcanoscheduling.PodGroupInqueue, unsched(ago(time.Hour), corev1.ConditionFalse)), ready: ago(time.Hour)},
		{
			name: "running gang is not stuck, whatever a later cycle said",
			pg:   pg(volcanoscheduling.PodGroupRunning, unsched(ago(time.Hour), corev1.ConditionTrue)), ready: ago(time.Hour),
		},
		{
			name: "long unschedulable", pg: pg(volcanoscheduling.PodGroupPending, unsched(ago(10*time.Minute), corev1.ConditionTrue)),
			ready: ago(time.Hour),
			want:  Observation{Since: ago(10 * time.Minute), Stuck: true, Message: volcanoMsg},
		},
		{
			name:     "Volcano refreshes the condition every cycle: the recorded start counts",
			pg:       pg(volcanoscheduling.PodGroupInqueue, unsched(ago(time.Second), corev1.ConditionTrue)),
			recorded: ago(6 * time.Minute), ready: ago(time.Hour),
			want: Observation{Since: ago(6 * time.Minute), Stuck: true, Message: volcanoMsg},
		},
		{
			name: "first seen: not yet stuck", pg: pg(volcanoscheduling.PodGroupPending, unsched(ago(time.Second), corev1.ConditionTrue)),
			ready: ago(time.Hour),
			want:  Observation{Since: ago(time.Second), Wait: patience - time.Second, Message: volcanoMsg},
		},
		{
			name:     "a condition from before the check turned Ready counts from Ready",
			pg:       pg(volcanoscheduling.PodGroupPending, unsched(ago(time.Hour), corev1.ConditionTrue)),
			recorded: ago(time.Hour), ready: ago(time.Minute),
			want: Observation{Since: ago(time.Minute), Wait: 4 * time.Minute, Message: volcanoMsg},
		},
		{
			name:  "a condition time in the future counts from now",
			pg:    pg(volcanoscheduling.PodGroupPending, unsched(now.Add(time.Hour), corev1.ConditionTrue)),
			ready: ago(time.Hour),
			want:  Observation{Since: now, Wait: patience, Message: volcanoMsg},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Observe(tc.pg, tc.recorded, tc.ready, now, patience)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("Observe (-want +got):\n%s", diff)
			}
		})
	}
	o := Observation{Since: ago(6 * time.Minute), Stuck: true, Message: volcanoMsg}
	if got, want := RetryMessage(o, now), "Volcano could not schedule the gang for 6m0s: "+volcanoMsg; got != want {
		t.Fatalf("RetryMessage = %q, want %q", got, want)
	}
}
