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

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// PodInfo is what slot assignment needs to know about a pod.
type PodInfo struct {
	Name string
	UID  types.UID
	// ReplicaType names the pod set (PyTorchJob: training.kubeflow.org/replica-type); "" if unknown.
	ReplicaType string
	// Index is the replica / completion index; nil if unknown.
	Index *int32
}

// PodInfoFromLabels reads the replica type and index of a PyTorchJob pod
// (training.kubeflow.org/replica-type, replica-index) or an Indexed Job pod
// (batch.kubernetes.io/job-completion-index, label or annotation).
func PodInfoFromLabels(name string, uid types.UID, labels, annotations map[string]string) PodInfo {
	pi := PodInfo{Name: name, UID: uid, ReplicaType: labels[kftraining.ReplicaTypeLabel]}
	idx, ok := labels[kftraining.ReplicaIndexLabel]
	if !ok {
		idx, ok = labels[batchv1.JobCompletionIndexAnnotation]
	}
	if !ok {
		idx, ok = annotations[batchv1.JobCompletionIndexAnnotation]
	}
	if ok {
		if n, err := strconv.ParseInt(idx, 10, 32); err == nil && n >= 0 {
			i := int32(n)
			pi.Index = &i
		}
	}
	return pi
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
//     set, also when an earlier pod of that replica was bound to it and is
//     gone (a recreated pod gets its slot back); while that earlier pod is
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
	if pod.Index != nil {
		for _, a := range assignments {
			if sets[a.PodSet] && a.Index == *pod.Index {
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
