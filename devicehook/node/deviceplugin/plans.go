package deviceplugin

import (
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// The node trusts plans, not annotations. A pod's GPUs, MiB and SM share
// come from the GPUPlan slot bound to its UID (status.bindings, written by
// the manager's ungater); a tenant can read GPUPlans but not write them.
// The pod's gpupack.io/devices annotation must agree with that slot: a pod
// whose annotation names other GPUs or other MiB is refused, never served.

// PlanLister lists GPUPlans ("" = every namespace); an informer's lister in
// production, a slice in tests.
type PlanLister interface {
	Plans(namespace string) ([]*v1alpha1.GPUPlan, error)
}

// PlanListerFunc adapts a function.
type PlanListerFunc func(namespace string) ([]*v1alpha1.GPUPlan, error)

// Plans calls f.
func (f PlanListerFunc) Plans(namespace string) ([]*v1alpha1.GPUPlan, error) { return f(namespace) }

// Binding is the plan slot a pod is bound to.
type Binding struct {
	Plan   string
	PodSet string
	Index  int32
	Node   string
	GPUs   []v1alpha1.GPUAssignment
}

// Slot names the binding for messages: "<plan> slot <podset>[<i>]".
func (b Binding) Slot() string {
	return fmt.Sprintf("GPUPlan %s slot %s[%d]", b.Plan, b.PodSet, b.Index)
}

// BindingOf finds the slot bound to pod's UID among plans (any namespace:
// only the pod's own is used). A Released plan binds nothing. A binding
// without a UID does not count: a name alone could be a recreated pod.
func BindingOf(pod *corev1.Pod, plans []*v1alpha1.GPUPlan) (Binding, bool) {
	if pod.UID == "" {
		return Binding{}, false
	}
	// The named plan first (the usual case), then any other of the namespace.
	named := pod.Annotations[v1alpha1.AnnotationPlan]
	ordered := make([]*v1alpha1.GPUPlan, 0, len(plans))
	for _, pl := range plans {
		if pl.Namespace == pod.Namespace && pl.Name == named {
			ordered = append(ordered, pl)
		}
	}
	for _, pl := range plans {
		if pl.Namespace == pod.Namespace && pl.Name != named {
			ordered = append(ordered, pl)
		}
	}
	for _, pl := range ordered {
		if pl.Status.Phase == v1alpha1.PlanReleased {
			continue
		}
		for _, b := range pl.Status.Bindings {
			if b.PodUID != pod.UID {
				continue
			}
			for _, a := range pl.Spec.Assignments {
				if a.PodSet == b.PodSet && a.Index == b.Index {
					return Binding{Plan: pl.Name, PodSet: a.PodSet, Index: a.Index, Node: a.Node, GPUs: append([]v1alpha1.GPUAssignment(nil), a.GPUs...)}, true
				}
			}
		}
	}
	return Binding{}, false
}

// Planned returns the GPUs the plan gives pod on node, checked against the
// pod's gpupack.io/devices annotation. ok is false for a pod no plan binds
// and that carries no annotation (an unplanned pod). err is set when the
// pod cannot be served: annotation without a binding, a binding on another
// node, or an annotation that disagrees with the binding.
// ErrBindingNotSeen marks a pod that names its GPUPlan (gpupack.io/plan,
// which only Kueue writes, from the check's podSetUpdates) and carries
// devices, but whose binding this node's informer does not show yet: a
// moment's wait may cure it, unlike a pod no plan names.
var ErrBindingNotSeen = errors.New("plan binding not seen yet")

func Planned(pod *corev1.Pod, plans []*v1alpha1.GPUPlan, node string) ([]v1alpha1.GPUAssignment, bool, error) {
	s, annotated := pod.Annotations[v1alpha1.AnnotationDevices]
	b, bound := BindingOf(pod, plans)
	key := pod.Namespace + "/" + pod.Name
	switch {
	case !bound && !annotated:
		return nil, false, nil
	case !bound:
		if pod.Annotations[AnnotationAllocatedBy] == AllocatedByValue(node) {
			return nil, false, nil // an unplanned whole-GPU pod this node recorded
		}
		if pod.Annotations[v1alpha1.AnnotationPlan] != "" {
			// Placed by the ungater, which binds the slot in the plan's
			// status first: the plan informer may lag the pod informer.
			return nil, true, fmt.Errorf("%w: pod %s: %s=%q but no GPUPlan (it names %s) binds pod UID %s yet (the annotation alone is not trusted)", ErrBindingNotSeen, key, v1alpha1.AnnotationDevices, s, pod.Annotations[v1alpha1.AnnotationPlan], pod.UID)
		}
		return nil, true, fmt.Errorf("pod %s: %s=%q but no GPUPlan binds pod UID %s (the annotation alone is not trusted)", key, v1alpha1.AnnotationDevices, s, pod.UID)
	case b.Node != node:
		return nil, true, fmt.Errorf("pod %s: %s places it on node %s, not %s", key, b.Slot(), b.Node, node)
	case !annotated:
		return nil, true, fmt.Errorf("pod %s: bound to %s but has no %s (placement not finished or annotation removed)", key, b.Slot(), v1alpha1.AnnotationDevices)
	}
	devs, err := v1alpha1.ParseDevices(s)
	if err != nil {
		return nil, true, fmt.Errorf("pod %s: %w", key, err)
	}
	if !sameDevices(devs, b.GPUs) {
		return nil, true, fmt.Errorf("pod %s: %s=%q disagrees with %s (%s)", key, v1alpha1.AnnotationDevices, s, b.Slot(), formatGPUs(b.GPUs))
	}
	return b.GPUs, true, nil
}

func sameDevices(devs []v1alpha1.DeviceAssignment, gpus []v1alpha1.GPUAssignment) bool {
	if len(devs) != len(gpus) {
		return false
	}
	a := make([]string, len(devs))
	b := make([]string, len(gpus))
	for i := range devs {
		a[i] = fmt.Sprintf("%s:%d", devs[i].UUID, devs[i].MemoryMiB)
		b[i] = fmt.Sprintf("%s:%d", gpus[i].UUID, gpus[i].MemoryMiB)
	}
	sort.Strings(a)
	sort.Strings(b)
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func formatGPUs(gpus []v1alpha1.GPUAssignment) string {
	ds := make([]v1alpha1.DeviceAssignment, len(gpus))
	for i, g := range gpus {
		ds[i] = v1alpha1.DeviceAssignment{UUID: g.UUID, MemoryMiB: g.MemoryMiB}
	}
	return v1alpha1.FormatDevices(ds)
}

// AnnotationAllocatedBy marks a gpupack.io/devices annotation that a node
// wrote for an unplanned whole-GPU pod (value "gpupack-node/<node>"), so
// the check counts those GPUs and a restarted agent remembers them.
const AnnotationAllocatedBy = "gpupack.io/allocated-by"

// AllocatedByValue is the AnnotationAllocatedBy value of node.
func AllocatedByValue(node string) string { return "gpupack-node/" + node }
