package deviceplugin

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/allocorder"
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
	return allocorder.Requests(pod, resource)
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

// waiting lists the pods bound to the node that still await the kubelet's
// allocation of resource (allocorder.Awaiting: not admitted yet — a
// terminating one too, the kubelet may admit it before it sees the
// deletion), oldest first.
func waiting(st State, resource corev1.ResourceName) []*corev1.Pod {
	// Filter first: on a busy node almost every pod is running already, and
	// only the few waiting ones need sorting and parsing.
	var out []*corev1.Pod
	for _, p := range st.Pods {
		if n, ok := allocorder.Awaiting(p); !ok || n != st.Node || p.Spec.NodeName != st.Node || allStarted(p, resource) {
			continue
		}
		if names, _ := gpuContainers(p, resource); len(names) == 0 {
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
		if errors.Is(err, ErrBindingNotSeen) {
			continue // not refused (yet): no Warning while the informer catches up
		}
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

// nextRequest returns the name and count of pod's next container that
// requests resource and that neither this process allocated (allocated
// counts them, in spec order) nor the kubelet started before.
func nextRequest(pod *corev1.Pod, resource corev1.ResourceName, allocated int) (string, int, bool) {
	names, counts := gpuContainers(pod, resource)
	n := 0
	for i, name := range names {
		if started(pod, name) {
			continue
		}
		if n == allocated {
			return name, counts[i], true
		}
		n++
	}
	return "", 0, false
}

// Candidate is a waiting pod an Allocate request could be for: its next
// container asks for as many devices as the request holds. Chunk is set
// for a planned pod; Err for a pod the node refuses (a plan it cannot
// confirm); neither for a pod no plan covers.
type Candidate struct {
	Pod   *corev1.Pod
	Chunk *Chunk
	Err   error
}

// Candidates lists, oldest first, every waiting pod whose next container
// asks for size devices of resource. The kubelet does not say which pod an
// Allocate is for, so each of them could be the one.
func Candidates(st State, resource corev1.ResourceName, size int) []Candidate {
	next, bad := pending(st, resource)
	chunks := map[types.UID]Chunk{}
	for _, c := range next {
		chunks[c.PodUID] = c
	}
	refused := map[types.UID]error{}
	for _, r := range bad {
		refused[r.Pod.UID] = r.Err
	}
	var out []Candidate
	for _, p := range waiting(st, resource) {
		if c, ok := chunks[p.UID]; ok {
			if len(c.Devices) == size {
				out = append(out, Candidate{Pod: p, Chunk: &c})
			}
			continue
		}
		_, n, ok := nextRequest(p, resource, st.Allocated[p.UID])
		if !ok || n != size {
			continue
		}
		if err, isBad := refused[p.UID]; isBad {
			out = append(out, Candidate{Pod: p, Err: err})
			continue
		}
		if _, planned, _ := Planned(p, st.Plans, st.Node); planned {
			continue // planned, but nothing left to allocate
		}
		out = append(out, Candidate{Pod: p})
	}
	return out
}

// ErrRefused marks a Match failure that waiting cannot cure: the request
// could be for a pod that has no plan, or for pods of more than one
// namespace. Allocate answers it at once.
var ErrRefused = errors.New("refused")

// Decision is what Match decided besides the chunk: the pods to tell why
// they were refused (an Event each), and the one unplanned pod an
// unplanned allocation may be for.
type Decision struct {
	Bad []Refusal
	// Ambiguous are the candidates of a request Match would not guess between.
	Ambiguous []Candidate
	// Unplanned is the only candidate, a pod no plan covers (nil otherwise).
	Unplanned *corev1.Pod
}

// Match finds the container an Allocate request is for. The kubelet does
// not name the pod, so Match never guesses where a wrong guess would
// hand one pod's slot to another:
//
//   - when the request could be for a pod no plan covers (or whose plan
//     the node cannot confirm) and for any other pod, it refuses;
//   - when it could be for two or more planned pods — of one namespace or
//     of several — it refuses: served in the other order they would swap
//     slots (GPUs, limits file, accounting folder), and the plan bindings
//     the check and the watcher count would then be wrong. The placement
//     ungater keeps this from happening (allocorder.Blocking: one pod per
//     node and request size awaits its allocation at a time); a refusal
//     here is the backstop;
//   - otherwise it takes the one planned candidate, if its planned GPUs
//     are exactly the GPUs of the slots the kubelet picked
//     (GetPreferredAllocation steers the kubelet there).
//
// A request whose only candidate has no plan fails with ErrRefused (no
// wait) and names the pod in the Decision, for the unplanned policy.
func Match(slotIDs []string, st State, resource corev1.ResourceName) (Chunk, Decision, error) {
	gpus, err := slotGPUs(slotIDs)
	if err != nil {
		return Chunk{}, Decision{}, err
	}
	_, bad := pending(st, resource)
	d := Decision{Bad: bad}
	cands := Candidates(st, resource, len(slotIDs))
	var planned, other []Candidate
	for _, c := range cands {
		if c.Chunk != nil {
			planned = append(planned, c)
		} else {
			other = append(other, c)
		}
	}
	switch {
	case len(other) > 0 && len(cands) > 1, len(planned) > 1:
		d.Ambiguous = cands
		msg := fmt.Sprintf("%d %s could be for any of %s (the kubelet does not say which pod it allocates for, and handing one pod's slot to another is not safe); refusing rather than guessing", len(slotIDs), resource, describe(cands))
		for _, c := range cands {
			if c.Err != nil {
				msg += "; refused: " + c.Err.Error()
			}
		}
		return Chunk{}, d, fmt.Errorf("%w: %s", ErrRefused, msg)
	case len(other) == 1:
		c := other[0]
		if c.Err == nil {
			d.Unplanned = c.Pod
			return Chunk{}, d, fmt.Errorf("%w: the only pod on node %s waiting for %d %s is %s, which no GPUPlan covers (the pod was not placed by gpupack's admission check: give it a plan, or request GPUs without gpupack)", ErrRefused, st.Node, len(slotIDs), resource, klog.KObj(c.Pod))
		}
		if errors.Is(c.Err, ErrBindingNotSeen) {
			return Chunk{}, d, c.Err // not final: Allocate waits for the informer
		}
		return Chunk{}, d, fmt.Errorf("%w: %s", ErrRefused, c.Err)
	}
	for _, c := range planned {
		ok := len(c.Chunk.Devices) == len(gpus)
		for _, dev := range c.Chunk.Devices {
			ok = ok && gpus[dev.UUID]
		}
		if ok {
			return *c.Chunk, d, nil
		}
	}
	var names []string
	for _, c := range planned {
		names = append(names, fmt.Sprintf("%s container %s → %s", c.Chunk.Pod, c.Chunk.Container, formatGPUs(c.Chunk.Devices)))
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
	return Chunk{}, d, fmt.Errorf("%s", msg)
}

// describe names candidates for messages: "ns/a (GPUPlan …), ns/b (no plan)".
func describe(cands []Candidate) string {
	parts := make([]string, 0, len(cands))
	for _, c := range cands {
		what := "no plan"
		switch {
		case c.Chunk != nil:
			what = "planned " + formatGPUs(c.Chunk.Devices)
		case c.Err != nil:
			what = "plan not confirmed"
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", klog.KObj(c.Pod), what))
	}
	return strings.Join(parts, ", ")
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
