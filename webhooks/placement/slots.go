// Package placement pins the pods of a planned workload to the node and
// GPUs of their GPUPlan slot. slots.go is the pure decision (which slot does
// this pod get); reconciler.go is the controller that applies it.
package placement

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/types"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Kueue's pod-group role annotation: the name of the pod set a pod of a
// pod group (plain pods, LeaderWorkerSet groups) belongs to.
const kueueRoleHash = "kueue.x-k8s.io/role-hash"

// lwsWorkerPodSet is the pod set Kueue gives the workers of a
// LeaderWorkerSet with a leader template (workers 1..size-1; the leader,
// worker index 0, is pod set "leader"). Without a leader template every pod
// of a group is pod set "main", by worker index.
const lwsWorkerPodSet = "worker"

// The labels the MPI operator (v2beta1) and KubeRay put on the pods they
// create. Kueue names an MPIJob's pod sets after the replica types
// ("launcher", "worker") and a RayJob's / RayCluster's "head" and after
// each worker group's name (lowercase); neither operator sets the
// replica-type label PyTorchJob pods carry.
const (
	mpiOperatorNameLabel = "training.kubeflow.org/operator-name"
	mpiOperatorName      = "mpi-operator"
	mpiJobRoleLabel      = "training.kubeflow.org/job-role"
	rayNodeTypeLabel     = "ray.io/node-type"
	rayNodeGroupLabel    = "ray.io/group"
	rayHeadPodSet        = "head"
)

// PodInfo is what slot assignment needs to know about a pod.
type PodInfo struct {
	Name string
	UID  types.UID
	// ReplicaType names the pod set (PyTorchJob: training.kubeflow.org/replica-type); "" if unknown.
	ReplicaType string
	// Index is the replica / completion index; nil if unknown.
	Index *int32
	// Group is, for a JobSet pod, the index of its Job within the
	// replicated Job (jobset.sigs.k8s.io/job-index), and Groups that
	// replicated Job's replicas: Index is then the completion index within
	// the Job, which the other Jobs' pods share. Nil for other pods.
	Group  *int32
	Groups int32
}

// PodInfoFromLabels reads the pod set and index of a pod:
//   - a PyTorchJob pod: training.kubeflow.org/replica-type, replica-index;
//   - an MPIJob pod (MPI operator v2beta1): its job role (launcher,
//     worker) and a worker's replica-index;
//   - a Ray pod (KubeRay): "head", or a worker's group name (no index:
//     a worker takes the first free slot of its group's pod set);
//   - a JobSet pod (also a TrainJob's): the replicated Job
//     (jobset.sigs.k8s.io/replicatedjob-name, which Kueue names the pod set
//     after), its Job's index and replicas, and the completion index;
//   - an Indexed Job pod: batch.kubernetes.io/job-completion-index (label
//     or annotation);
//   - a pod of a Kueue pod group (a LeaderWorkerSet group): the pod set
//     Kueue's role annotation names, and for an LWS pod its worker index
//     (minus the leader for Kueue's "worker" pod set).
func PodInfoFromLabels(name string, uid types.UID, labels, annotations map[string]string) PodInfo {
	pi := PodInfo{Name: name, UID: uid, ReplicaType: labels[kftraining.ReplicaTypeLabel]}
	num := func(s string) *int32 {
		if n, err := strconv.ParseInt(s, 10, 32); err == nil && n >= 0 {
			i := int32(n)
			return &i
		}
		return nil
	}
	if rj, ok := labels[jobset.ReplicatedJobNameKey]; ok && pi.ReplicaType == "" {
		pi.ReplicaType = rj
		// A pod without its Job's index or replicas (made by hand) gets
		// Group -1 or Groups 0: slotIndex then gives it no index rather
		// than its bare completion index.
		pi.Group = ptrOr(num(labels[jobset.JobIndexKey]), -1)
		if n := num(labels[jobset.ReplicatedJobReplicas]); n != nil {
			pi.Groups = *n
		}
	}
	if pi.ReplicaType == "" && labels[mpiOperatorNameLabel] == mpiOperatorName {
		pi.ReplicaType = labels[mpiJobRoleLabel]
	}
	if pi.ReplicaType == "" {
		switch labels[rayNodeTypeLabel] {
		case "head":
			pi.ReplicaType = rayHeadPodSet
		case "worker":
			pi.ReplicaType = labels[rayNodeGroupLabel]
		}
	}
	if pi.ReplicaType == "" {
		pi.ReplicaType = annotations[kueueRoleHash]
	}
	idx, ok := labels[kftraining.ReplicaIndexLabel]
	if !ok {
		idx, ok = labels[batchv1.JobCompletionIndexAnnotation]
	}
	if !ok {
		idx, ok = annotations[batchv1.JobCompletionIndexAnnotation]
	}
	if ok {
		pi.Index = num(idx)
	} else if w, ok := labels[lws.WorkerIndexLabelKey]; ok && annotations[kueueRoleHash] != "" {
		pi.Index = num(w)
		if pi.Index != nil && annotations[kueueRoleHash] == lwsWorkerPodSet {
			if *pi.Index == 0 {
				pi.Index = nil
			} else {
				*pi.Index--
			}
		}
	}
	return pi
}

func ptrOr(p *int32, v int32) *int32 {
	if p == nil {
		return &v
	}
	return p
}

// slotIndex is the index of the slot that is pod's own in sets, if it has
// one: its replica / completion index, or for a JobSet pod its Job's index
// × pods per Job + its completion index (the pods of one Job take
// consecutive slots). Pods per Job is the pod set's slot count over the
// replicated Job's replicas (Kueue counts replicas × parallelism); a plan
// it does not divide, an index out of range or several candidate sets give
// no index (the pod takes the first free slot), never the bare completion
// index, which every Job of the replicated Job has.
func slotIndex(assignments []v1alpha1.PodAssignment, sets map[string]bool, pod PodInfo) *int32 {
	if pod.Index == nil || pod.Group == nil {
		return pod.Index
	}
	if len(sets) != 1 || pod.Groups <= 0 || *pod.Group < 0 || *pod.Group >= pod.Groups {
		return nil
	}
	var n int32
	for _, a := range assignments {
		if sets[a.PodSet] {
			n++
		}
	}
	if n%pod.Groups != 0 || *pod.Index >= n/pod.Groups {
		return nil
	}
	i := *pod.Group*(n/pod.Groups) + *pod.Index
	return &i
}

// Errors of Assign.
var (
	// ErrNoSlot: every slot the pod could take is held by a live pod.
	ErrNoSlot = errors.New("no free slot in the plan")
	// ErrSlotBusy: the pod's own replica slot is still held by another live
	// pod (a predecessor still terminating); retry once it is gone.
	ErrSlotBusy = errors.New("slot still held by another pod")
)

// Assign returns the plan slot for pod and the bindings to record.
//
//   - A pod already bound keeps its slot (idempotent).
//   - A pod with a replica index takes the slot of that index in its pod
//     set (a JobSet pod: of its Job's index and completion index,
//     slotIndex), also when an earlier pod of that replica was bound to it
//     and is gone (a recreated pod gets its slot back); while that earlier pod is
//     still live the answer is ErrSlotBusy, so two pods never share GPUs.
//   - Otherwise the first slot (plan order) whose binding is empty or dead.
//
// live reports whether the pod of a binding still exists and holds its GPUs
// (terminating pods do). It is never asked about pod itself.
func Assign(assignments []v1alpha1.PodAssignment, bindings []v1alpha1.SlotBinding, pod PodInfo, live func(v1alpha1.SlotBinding) bool) (v1alpha1.PodAssignment, []v1alpha1.SlotBinding, error) {
	self := func(b v1alpha1.SlotBinding) bool {
		if pod.UID != "" && b.PodUID != "" {
			return b.PodUID == pod.UID
		}
		return b.PodName == pod.Name
	}
	key := func(ps string, i int32) string { return ps + "\x00" + strconv.Itoa(int(i)) }
	bound := make(map[string]v1alpha1.SlotBinding, len(bindings))
	for _, b := range bindings {
		bound[key(b.PodSet, b.Index)] = b
	}
	for _, a := range assignments {
		if b, ok := bound[key(a.PodSet, a.Index)]; ok && self(b) {
			return a, bindings, nil
		}
	}

	sets := candidateSets(assignments, pod.ReplicaType)
	if len(sets) == 0 {
		return v1alpha1.PodAssignment{}, nil, fmt.Errorf("%w: the plan has no pod set for replica type %q", ErrNoSlot, pod.ReplicaType)
	}
	free := func(a v1alpha1.PodAssignment) bool {
		b, ok := bound[key(a.PodSet, a.Index)]
		return !ok || !live(b)
	}
	take := func(a v1alpha1.PodAssignment) (v1alpha1.PodAssignment, []v1alpha1.SlotBinding, error) {
		nb := v1alpha1.SlotBinding{PodSet: a.PodSet, Index: a.Index, PodName: pod.Name, PodUID: pod.UID}
		out := make([]v1alpha1.SlotBinding, 0, len(bindings)+1)
		replaced := false
		for _, b := range bindings {
			if b.PodSet == a.PodSet && b.Index == a.Index {
				out = append(out, nb)
				replaced = true
				continue
			}
			if self(b) {
				continue // a stale binding of this pod elsewhere
			}
			out = append(out, b)
		}
		if !replaced {
			out = append(out, nb)
		}
		return a, out, nil
	}
	if index := slotIndex(assignments, sets, pod); index != nil {
		for _, a := range assignments {
			if sets[a.PodSet] && a.Index == *index {
				if !free(a) {
					b := bound[key(a.PodSet, a.Index)]
					return v1alpha1.PodAssignment{}, nil, fmt.Errorf("%w: %s[%d] is bound to pod %s", ErrSlotBusy, a.PodSet, a.Index, b.PodName)
				}
				return take(a)
			}
		}
		// No slot with that index (a plan for fewer replicas): fall through
		// to the first free one rather than leave the pod stuck.
	}
	for _, a := range assignments {
		if !sets[a.PodSet] {
			continue
		}
		if free(a) {
			return take(a)
		}
	}
	return v1alpha1.PodAssignment{}, nil, ErrNoSlot
}

// candidateSets are the pod sets a pod may take a slot of: the one named
// like its replica type (Kueue names PyTorchJob pod sets after the lowercase
// replica type), else every pod set.
func candidateSets(assignments []v1alpha1.PodAssignment, replicaType string) map[string]bool {
	all := map[string]bool{}
	match := map[string]bool{}
	for _, a := range assignments {
		all[a.PodSet] = true
		if replicaType != "" && strings.EqualFold(a.PodSet, replicaType) {
			match[a.PodSet] = true
		}
	}
	if len(match) > 0 {
		return match
	}
	if replicaType != "" && len(all) > 1 {
		return nil // ambiguous: never put a master on a worker's GPUs
	}
	return all
}

// Devices renders a slot's GPUs as the gpupack.io/devices annotation.
func Devices(a v1alpha1.PodAssignment) string {
	ds := make([]v1alpha1.DeviceAssignment, 0, len(a.GPUs))
	for _, g := range a.GPUs {
		ds = append(ds, v1alpha1.DeviceAssignment{UUID: g.UUID, MemoryMiB: g.MemoryMiB})
	}
	return v1alpha1.FormatDevices(ds)
}
