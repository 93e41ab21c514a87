package deviceplugin

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// A slot is one schedulable unit of a GPU: "<uuid>::<n>". With one slot per
// GPU the resource is exclusive; with N, up to N pods share the GPU.
const slotSep = "::"

// SlotID names slot n of a GPU.
func SlotID(uuid string, n int) string { return uuid + slotSep + strconv.Itoa(n) }

// SlotGPU returns the GPU UUID of a slot ID.
func SlotGPU(id string) (string, error) {
	i := strings.LastIndex(id, slotSep)
	if i <= 0 {
		return "", fmt.Errorf("device ID %q is not <gpu-uuid>%s<slot>", id, slotSep)
	}
	if _, err := strconv.Atoi(id[i+len(slotSep):]); err != nil {
		return "", fmt.Errorf("device ID %q: slot is not a number", id)
	}
	return id[:i], nil
}

// slotGPUs maps slot IDs to their distinct GPUs.
func slotGPUs(ids []string) (map[string]bool, error) {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		g, err := SlotGPU(id)
		if err != nil {
			return nil, err
		}
		out[g] = true
	}
	return out, nil
}

// Chunk is the share of a pod's planned GPUs one container receives.
type Chunk struct {
	Pod       types.NamespacedName
	PodUID    types.UID
	Container string
	Ordinal   int // position among the pod's containers that request the resource
	Devices   []v1alpha1.GPUAssignment
}

// State is what a decision reads: the pods bound to this node, every
// GPUPlan, and how many chunks this process already handed out per pod.
type State struct {
	Node      string
	Pods      []*corev1.Pod
	Plans     []*v1alpha1.GPUPlan
	Allocated map[types.UID]int
}

// gpuContainers lists the containers of pod that request resource, init
// containers (sidecars included) first, each with its count.
func gpuContainers(pod *corev1.Pod, resource corev1.ResourceName) (names []string, counts []int) {
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		q, ok := c.Resources.Limits[resource]
		if !ok {
			q, ok = c.Resources.Requests[resource]
		}
		n := int(q.Value())
		if !ok || n <= 0 {
			continue
		}
		names, counts = append(names, c.Name), append(counts, n)
	}
	return names, counts
}

// ContainerChunks splits a pod's planned GPUs among its containers that
// request resource, in spec order, each taking as many GPUs as it requests.
// The counts must add up to the planned GPUs.
func ContainerChunks(pod *corev1.Pod, resource corev1.ResourceName, gpus []v1alpha1.GPUAssignment) ([]Chunk, error) {
	names, counts := gpuContainers(pod, resource)
	var chunks []Chunk
	next := 0
	for i, name := range names {
		n := counts[i]
		if next+n > len(gpus) {
			return nil, fmt.Errorf("pod %s/%s: containers request %s: %d+ but the plan gives %d GPUs", pod.Namespace, pod.Name, resource, next+n, len(gpus))
		}
		chunks = append(chunks, Chunk{
			Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, PodUID: pod.UID,
			Container: name, Ordinal: len(chunks), Devices: gpus[next : next+n],
		})
		next += n
	}
	if len(chunks) > 0 && next != len(gpus) {
		return nil, fmt.Errorf("pod %s/%s: containers request %d %s but the plan gives %d GPUs", pod.Namespace, pod.Name, next, resource, len(gpus))
	}
	return chunks, nil
}

// live reports whether a pod on the node still holds or will hold GPUs.
func live(pod *corev1.Pod, node string) bool {
	return pod.Spec.NodeName == node && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// started reports whether container name of pod already has a container ID:
// the kubelet allocated it before (e.g. before this agent restarted).
func started(pod *corev1.Pod, name string) bool {
	for _, ss := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range ss {
			if s.Name == name && s.ContainerID != "" {
				return true
			}
		}
	}
	return false
}

// allStarted reports whether every container of pod that requests resource
// already runs: such a pod needs no allocation, and on a busy node this
// check saves parsing every running pod's plan on each Allocate.
func allStarted(pod *corev1.Pod, resource corev1.ResourceName) bool {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			c := &list[i]
			_, lim := c.Resources.Limits[resource]
			_, req := c.Resources.Requests[resource]
			if (lim || req) && !started(pod, c.Name) {
				return false
			}
		}
	}
	return true
}

// Refusal is a pod the node will not serve, with why.
type Refusal struct {
	Pod *corev1.Pod
	Err error
}

// waiting lists the live, not yet terminating pods on the node that still
// have a container of resource to start, oldest first.
func waiting(st State, resource corev1.ResourceName) []*corev1.Pod {
	// Filter first: on a busy node almost every pod is running already, and
	// only the few waiting ones need sorting and parsing.
	var out []*corev1.Pod
	for _, p := range st.Pods {
		if !live(p, st.Node) || p.DeletionTimestamp != nil || allStarted(p, resource) {
			continue
		}
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool {
		ti, tj := out[i].CreationTimestamp, out[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// pending lists, oldest pod first, the next not-yet-allocated chunk of every
// live planned pod on the node. Pods that claim a plan the node cannot
// confirm (annotation without binding, annotation that disagrees with the
// binding, counts that do not add up) are returned in bad.
func pending(st State, resource corev1.ResourceName) (next []Chunk, bad []Refusal) {
	for _, p := range waiting(st, resource) {
		gpus, planned, err := Planned(p, st.Plans, st.Node)
		if err != nil {
			bad = append(bad, Refusal{p, err})
			continue
		}
		if !planned {
			continue
		}
		chunks, err := ContainerChunks(p, resource, gpus)
		if err != nil {
			bad = append(bad, Refusal{p, err})
			continue
		}
		for i, c := range chunks {
			if i < st.Allocated[p.UID] || started(p, c.Container) {
				continue
			}
			next = append(next, c)
			break
		}
	}
	return next, bad
}

// Match finds the container an Allocate request is for: the oldest pending
// chunk whose planned GPUs are exactly the GPUs of the slots the kubelet
// picked. GetPreferredAllocation steers the kubelet to those slots; when it
// did not (or no plan exists), Match fails with a message naming what it
// saw instead of guessing. The refusals are returned too, so the caller
// can tell the refused pods (an Event) why.
func Match(slotIDs []string, st State, resource corev1.ResourceName) (Chunk, []Refusal, error) {
	gpus, err := slotGPUs(slotIDs)
	if err != nil {
		return Chunk{}, nil, err
	}
	next, bad := pending(st, resource)
	for _, c := range next {
		if len(c.Devices) != len(slotIDs) || len(c.Devices) != len(gpus) {
			continue
		}
		ok := true
		for _, d := range c.Devices {
			ok = ok && gpus[d.UUID]
		}
		if ok {
			return c, bad, nil
		}
	}
	var names []string
	for _, c := range next {
		names = append(names, fmt.Sprintf("%s container %s → %s", c.Pod, c.Container, formatGPUs(c.Devices)))
	}
	msg := fmt.Sprintf("no pod planned on node %s has GPUs %v for a container requesting %d %s", st.Node, sortedKeys(gpus), len(slotIDs), resource)
	if len(names) == 0 {
		msg += "; no planned pod is waiting for GPUs here (the pod was not placed by gpupack's admission check: give it a plan, or request GPUs without gpupack)"
	} else {
		msg += "; waiting: " + strings.Join(names, "; ")
	}
	for _, r := range bad {
		msg += "; refused: " + r.Err.Error()
	}
	return Chunk{}, bad, fmt.Errorf("%s", msg)
}

// Held returns the GPUs of the node that someone holds: every slot on the
// node of a plan that is not Released, and every live pod's
// gpupack.io/devices (the check's usage rule: running or about to run,
// terminating pods still hold).
func Held(st State) map[string]bool {
	out := map[string]bool{}
	for _, pl := range st.Plans {
		if pl.Status.Phase == v1alpha1.PlanReleased {
			continue
		}
		for _, a := range pl.Spec.Assignments {
			if a.Node != st.Node {
				continue
			}
			for _, g := range a.GPUs {
				out[g.UUID] = true
			}
		}
	}
	for _, p := range st.Pods {
		if !live(p, st.Node) {
			continue
		}
		devs, err := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices])
		if err != nil {
			continue
		}
		for _, d := range devs {
			out[d.UUID] = true
		}
	}
	return out
}

// Preferred picks size slots from available for the oldest pending planned
// chunk of that size, one slot per planned GPU, keeping mustInclude. With no
// such chunk it prefers slots on GPUs no plan holds, then the rest, so an
// unplanned request does not take a slot on a planned GPU when it can avoid it.
func Preferred(available, mustInclude []string, size int, st State, resource corev1.ResourceName) []string {
	bySlotGPU := map[string][]string{}
	for _, id := range available {
		g, err := SlotGPU(id)
		if err != nil {
			continue
		}
		bySlotGPU[g] = append(bySlotGPU[g], id)
	}
	for g := range bySlotGPU {
		sort.Strings(bySlotGPU[g])
	}
	must := map[string]bool{}
	for _, id := range mustInclude {
		must[id] = true
	}
	next, _ := pending(st, resource)
	for _, c := range next {
		if len(c.Devices) != size {
			continue
		}
		var pick []string
		for _, d := range c.Devices {
			ids := bySlotGPU[d.UUID]
			if len(ids) == 0 {
				pick = nil
				break
			}
			id := ids[0]
			for _, m := range ids { // a must-include slot on this GPU serves it
				if must[m] {
					id = m
					break
				}
			}
			pick = append(pick, id)
		}
		if pick != nil && containsAll(pick, mustInclude) {
			return pick
		}
	}
	// Fallback: mustInclude, then one slot per free GPU, then anything.
	held := Held(st)
	out := append([]string(nil), mustInclude...)
	used := map[string]bool{}
	for _, id := range mustInclude {
		if g, err := SlotGPU(id); err == nil {
			used[g] = true
		}
	}
	passes := []struct {
		ok      func(g string) bool
		onePerG bool
	}{
		{func(g string) bool { return !held[g] && !used[g] }, true},
		{func(g string) bool { return !used[g] }, true},
		{func(string) bool { return true }, false},
	}
	for _, pass := range passes {
		for _, g := range sortedKeys(bySlotGPU) {
			if !pass.ok(g) {
				continue
			}
			for _, id := range bySlotGPU[g] {
				if len(out) >= size {
					return out
				}
				if must[id] || contains(out, id) {
					continue
				}
				out = append(out, id)
				used[g] = true
				if pass.onePerG {
					break
				}
			}
		}
	}
	if len(out) > size {
		out = out[:size]
	}
	return out
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func containsAll(s, sub []string) bool {
	for _, x := range sub {
		if !contains(s, x) {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
