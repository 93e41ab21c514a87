// Package volcano keeps one Volcano PodGroup per Workload that the gang-fit
// check admitted for Volcano, so Volcano gang-schedules exactly the gang
// Kueue admitted (Volcano's own controller would make one PodGroup per
// controller owner and split multi-controller jobs), and turns a PodGroup
// that Volcano cannot schedule for too long into a Retry of the check, so
// Kueue releases the quota.
//
// Build, Wanted, GroupName, PodSetAnnotations and Observe are pure; the
// reconciler in controller.go reads the API and writes what they decide.
package volcano

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/utils/ptr"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanobatch "volcano.sh/apis/pkg/apis/batch/v1alpha1"
	volcanoscheduling "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/topology"
)

const (
	// SchedulerName is Volcano's scheduler name on a pod template.
	SchedulerName = "volcano"
	// DefaultQueue is the Volcano queue of PodGroups when the parameters name none.
	DefaultQueue = "default"
	// DefaultUnschedulablePatienceSeconds: how long a PodGroup may stay
	// Unschedulable before the check turns to Retry.
	DefaultUnschedulablePatienceSeconds int32 = 300

	// AnnotationGroupName is the pod annotation Volcano reads to find its
	// PodGroup (scheduling.k8s.io/group-name).
	AnnotationGroupName = volcanoscheduling.KubeGroupNameAnnotationKey
	// AnnotationTaskSpec is the pod annotation Volcano keys minTaskMember by
	// (volcano.sh/task-spec); without it a pod belongs to no task and
	// minTaskMember can never be met.
	AnnotationTaskSpec = volcanobatch.TaskSpecKey
	// AnnotationUnschedulableSince records on a PodGroup when gpupack first
	// saw Volcano call it Unschedulable: Volcano refreshes the condition's
	// lastTransitionTime every scheduling cycle, so the condition alone
	// cannot say how long it has been stuck.
	AnnotationUnschedulableSince = "gpupack.io/unschedulable-since"
	// LabelManagedBy / ManagedByValue mark PodGroups this package owns.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "gpupack-volcano"
)

// Wanted says whether the workload's pods run under Volcano: a pod set
// names schedulerName volcano, or the parameters turn the bridge on for
// every workload.
func Wanted(wl *kueue.Workload, params *v1alpha1.GangFitParameters) bool {
	if params != nil && params.Spec.Volcano != nil && params.Spec.Volcano.Enabled {
		return true
	}
	for i := range wl.Spec.PodSets {
		if wl.Spec.PodSets[i].Template.Spec.SchedulerName == SchedulerName {
			return true
		}
	}
	return false
}

// GroupName is the name of the workload's PodGroup (in its namespace).
func GroupName(wl *kueue.Workload) string { return wl.Name }

// PodSetAnnotations are the annotations one pod set's pods need to join the
// workload's PodGroup as task podSet.
func PodSetAnnotations(wl *kueue.Workload, podSet kueue.PodSetReference) map[string]string {
	return map[string]string{AnnotationGroupName: GroupName(wl), AnnotationTaskSpec: string(podSet)}
}

// AddPodSetUpdates returns updates with PodSetAnnotations merged in for
// every pod set of wl (adding an update for a pod set that has none), when
// Wanted; otherwise updates unchanged. The gang-fit check calls it when it
// turns Ready: Kueue applies podSetUpdates to the pods it starts.
func AddPodSetUpdates(wl *kueue.Workload, params *v1alpha1.GangFitParameters, updates []kueue.PodSetUpdate) []kueue.PodSetUpdate {
	if !Wanted(wl, params) {
		return updates
	}
	out := make([]kueue.PodSetUpdate, 0, len(wl.Spec.PodSets))
	idx := map[kueue.PodSetReference]int{}
	for _, u := range updates {
		idx[u.Name] = len(out)
		out = append(out, *u.DeepCopy())
	}
	for _, ps := range wl.Spec.PodSets {
		i, ok := idx[ps.Name]
		if !ok {
			i = len(out)
			idx[ps.Name] = i
			out = append(out, kueue.PodSetUpdate{Name: ps.Name})
		}
		if out[i].Annotations == nil {
			out[i].Annotations = map[string]string{}
		}
		for k, v := range PodSetAnnotations(wl, ps.Name) {
			out[i].Annotations[k] = v
		}
	}
	return out
}

// Counts are the admitted pod counts per pod set (Kueue may admit fewer
// than asked under partial admission).
func Counts(wl *kueue.Workload) map[kueue.PodSetReference]int32 {
	out := make(map[kueue.PodSetReference]int32, len(wl.Spec.PodSets))
	for _, ps := range wl.Spec.PodSets {
		out[ps.Name] = ps.Count
	}
	if adm := wl.Status.Admission; adm != nil {
		for _, psa := range adm.PodSetAssignments {
			if _, ok := out[psa.Name]; ok && psa.Count != nil {
				out[psa.Name] = *psa.Count
			}
		}
	}
	return out
}

// MinResources is the exact total the gang requests: per pod as the
// kubelet and schedulers count it (containers, init containers, sidecars,
// overhead; a limit stands in for a missing request, as the API server
// defaults it), times the admitted count, summed over pod sets.
func MinResources(wl *kueue.Workload) corev1.ResourceList {
	counts := Counts(wl)
	total := corev1.ResourceList{}
	for _, ps := range wl.Spec.PodSets {
		n := int64(counts[ps.Name])
		if n <= 0 {
			continue
		}
		spec := ps.Template.Spec.DeepCopy()
		limitsAsRequests(spec.InitContainers)
		limitsAsRequests(spec.Containers)
		for name, q := range resourcehelper.PodRequests(&corev1.Pod{Spec: *spec}, resourcehelper.PodResourcesOptions{}) {
			q.Mul(n)
			if cur, ok := total[name]; ok {
				cur.Add(q)
				total[name] = cur
			} else {
				total[name] = q
			}
		}
	}
	return total
}

func limitsAsRequests(cs []corev1.Container) {
	for i := range cs {
		for name, q := range cs[i].Resources.Limits {
			if _, ok := cs[i].Resources.Requests[name]; ok {
				continue
			}
			if cs[i].Resources.Requests == nil {
				cs[i].Resources.Requests = corev1.ResourceList{}
			}
			cs[i].Resources.Requests[name] = q.DeepCopy()
		}
	}
}

// PriorityClassName is the workload's pod priority class: the Workload's
// own when it is a core PriorityClass (a Kueue WorkloadPriorityClass means
// nothing to Volcano), else the first pod set template's.
func PriorityClassName(wl *kueue.Workload) string {
	if ref := wl.Spec.PriorityClassRef; ref != nil && ref.Group == kueue.PodPriorityClassGroup {
		return ref.Name
	}
	for _, ps := range wl.Spec.PodSets {
		if n := ps.Template.Spec.PriorityClassName; n != "" {
			return n
		}
	}
	return ""
}

// Build is the PodGroup of an admitted workload. planLevel is the node
// label key of the domain the gang-fit check chose (the GPUPlan's level;
// empty when the whole cluster was one domain). The network topology is
// hard with the level's tier as highestTierAllowed (Volcano ignores hard
// without a tier); it is left out when the level has no HyperNode tier (no
// level, kubernetes.io/hostname, or a label outside topologyLevels) — the
// check's nodeSelector already pins the gang there.
func Build(wl *kueue.Workload, params *v1alpha1.GangFitParameters, planLevel string) *volcanoscheduling.PodGroup {
	counts := Counts(wl)
	var minMember int32
	minTask := map[string]int32{}
	names := make([]string, 0, len(wl.Spec.PodSets))
	for _, ps := range wl.Spec.PodSets {
		names = append(names, string(ps.Name))
	}
	sort.Strings(names)
	for _, n := range names {
		c := counts[kueue.PodSetReference(n)]
		if c <= 0 {
			continue
		}
		minMember += c
		minTask[n] = c
	}
	queue := DefaultQueue
	var levels []string
	if params != nil {
		levels = params.Spec.TopologyLevels
		if v := params.Spec.Volcano; v != nil && v.Queue != "" {
			queue = v.Queue
		}
	}
	pg := &volcanoscheduling.PodGroup{
		TypeMeta: metav1.TypeMeta{APIVersion: volcanoscheduling.SchemeGroupVersion.String(), Kind: "PodGroup"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      GroupName(wl),
			Namespace: wl.Namespace,
			Labels:    map[string]string{LabelManagedBy: ManagedByValue},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(wl,
				kueue.GroupVersion.WithKind("Workload"))},
		},
		Spec: volcanoscheduling.PodGroupSpec{
			MinMember:         minMember,
			MinTaskMember:     minTask,
			Queue:             queue,
			PriorityClassName: PriorityClassName(wl),
		},
	}
	if len(minTask) == 0 {
		pg.Spec.MinTaskMember = nil
	}
	if res := MinResources(wl); len(res) > 0 {
		pg.Spec.MinResources = &res
	}
	if tier, ok := topology.TierOf(levels, planLevel); ok {
		pg.Spec.NetworkTopology = &volcanoscheduling.NetworkTopologySpec{
			Mode:               volcanoscheduling.HardNetworkTopologyMode,
			HighestTierAllowed: ptr.To(tier),
		}
	}
	return pg
}
