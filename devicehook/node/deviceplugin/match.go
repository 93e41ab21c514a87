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
	Devices   []v1alpha1.DeviceAssignment
}

// ContainerChunks splits a pod's gpupack.io/devices among its containers
// that request resource, in spec order, each taking as many GPUs as it
// requests. The counts must add up to the planned GPUs.
func ContainerChunks(pod *corev1.Pod, resource corev1.ResourceName) ([]Chunk, error) {
	devs, err := v1alpha1.ParseDevices(pod.Annotations[v1alpha1.AnnotationDevices])
	if err != nil {
		return nil, err
	}
	var chunks []Chunk
	next := 0
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		q, ok := c.Resources.Limits[resource]
		if !ok {
			q, ok = c.Resources.Requests[resource]
		}
		n := int(q.Value())
		if !ok || n <= 0 {
			continue
		}
		if next+n > len(devs) {
			return nil, fmt.Errorf("pod %s/%s: containers request %s: %d+ but %s plans %d GPUs", pod.Namespace, pod.Name, resource, next+n, v1alpha1.AnnotationDevices, len(devs))
		}
		chunks = append(chunks, Chunk{
			Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, PodUID: pod.UID,
			Container: c.Name, Ordinal: len(chunks), Devices: devs[next : next+n],
		})
		next += n
	}
	if len(chunks) > 0 && next != len(devs) {
		return nil, fmt.Errorf("pod %s/%s: containers request %d %s but %s plans %d GPUs", pod.Namespace, pod.Name, next, resource, v1alpha1.AnnotationDevices, len(devs))
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

// pending lists, oldest pod first, the next not-yet-allocated chunk of every
// live planned pod on node. allocated counts chunks already handed out per
// pod UID by this process. Pods whose annotation cannot be split are
// returned in bad (so errors can name them).
func pending(pods []*corev1.Pod, node string, resource corev1.ResourceName, allocated map[types.UID]int) (next []Chunk, bad []error) {
	// Filter first: on a busy node almost every pod is running already, and
	// only the few waiting ones need sorting and parsing.
	var waiting []*corev1.Pod
	for _, p := range pods {
		if !live(p, node) || p.DeletionTimestamp != nil {
			continue
		}
		if _, ok := p.Annotations[v1alpha1.AnnotationDevices]; !ok || allStarted(p, resource) {
			continue
		}
		waiting = append(waiting, p)
	}
	sort.SliceStable(waiting, func(i, j int) bool {
		ti, tj := waiting[i].CreationTimestamp, waiting[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return waiting[i].Namespace+"/"+waiting[i].Name < waiting[j].Namespace+"/"+waiting[j].Name
	})
	for _, p := range waiting {
		chunks, err := ContainerChunks(p, resource)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		for i, c := range chunks {
			if i < allocated[p.UID] || started(p, c.Container) {
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
// saw instead of guessing.
func Match(slotIDs []string, pods []*corev1.Pod, node string, resource corev1.ResourceName, allocated map[types.UID]int) (Chunk, error) {
	gpus, err := slotGPUs(slotIDs)
	if err != nil {
		return Chunk{}, err
	}
	next, bad := pending(pods, node, resource, allocated)
	for _, c := range next {
		if len(c.Devices) != len(slotIDs) || len(c.Devices) != len(gpus) {
			continue
		}
		ok := true
		for _, d := range c.Devices {
			ok = ok && gpus[d.UUID]
		}
		if ok {
			return c, nil
		}
	}
	var waiting []string
	for _, c := range next {
		waiting = append(waiting, fmt.Sprintf("%s container %s → %s", c.Pod, c.Container, v1alpha1.FormatDevices(c.Devices)))
	}
	msg := fmt.Sprintf("no pod planned on node %s has %s %v for a container requesting %d %s", node, v1alpha1.AnnotationDevices, sortedKeys(gpus), len(slotIDs), resource)
	if len(waiting) == 0 {
		msg += "; no planned pod is waiting for GPUs here (the pod was not placed by gpupack's admission check: give it a plan, or request GPUs without gpupack)"
	} else {
		msg += "; waiting: " + strings.Join(waiting, "; ")
	}
	for _, e := range bad {
		msg += "; unusable plan: " + e.Error()
	}
	return Chunk{}, fmt.Errorf("%s", msg)
}

// Held returns the GPUs that live pods on node hold through their
// gpupack.io/devices annotation (running or about to run).
func Held(pods []*corev1.Pod, node string) map[string]bool {
	out := map[string]bool{}
	for _, p := range pods {
		if !live(p, node) {
			continue // terminating pods (DeletionTimestamp set) still hold
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
func Preferred(available, mustInclude []string, size int, pods []*corev1.Pod, node string, resource corev1.ResourceName, allocated map[types.UID]int) []string {
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
	next, _ := pending(pods, node, resource, allocated)
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
	held := Held(pods, node)
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
