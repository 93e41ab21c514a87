// Package allocorder is gpupack's one rule for "may the kubelet still ask a
// device plugin for this pod's GPUs, and could such a request be told from
// another pod's": the placement ungater (webhooks/placement) releases pods
// by it, and gpupack-node's device plugin finds the pods an Allocate could
// be for by it, so the two cannot disagree.
//
// The kubelet's Allocate names device IDs, never the pod. Two pods bound
// to one node whose next containers ask for the same number of one GPU
// resource are indistinguishable to the plugin: whichever the kubelet
// admits first could be either. So the ungater lets at most one such pod
// per (node, resource, count) be awaiting its allocation at a time
// (Blocking); the plugin refuses a request that could still be for two
// planned pods (deviceplugin.Match) instead of guessing.
//
// A pod is awaiting its allocation (Awaiting) from the moment gpupack's
// gate is lifted and it is pinned or bound to a node until the kubelet has
// admitted it. The kubelet allocates the devices of every container (init
// containers included) during admission, before it first writes the pod's
// status, and that write sets status.startTime (Admitted); a pod the
// kubelet rejects is Failed. Tenants cannot write a pod's status (pods/status
// is not in `edit`, and a create resets it).
//
// Pure functions; no client calls.
package allocorder

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Resources are the GPU resources gpupack-node's device plugins serve.
var Resources = []corev1.ResourceName{v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU}

// Key is what an Allocate request shows of the pod it is for: the resource
// and how many devices one container asks for.
type Key struct {
	Resource corev1.ResourceName
	Count    int
}

func (k Key) String() string { return fmt.Sprintf("%d %s", k.Count, k.Resource) }

// Requests lists the containers of pod that request resource, init
// containers (sidecars included) first, each with its count (the limit,
// else the request) — the order the kubelet allocates them in.
func Requests(pod *corev1.Pod, resource corev1.ResourceName) (names []string, counts []int) {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			c := &list[i]
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
	}
	return names, counts
}

// Keys lists the distinct keys of pod's GPU containers, sorted.
func Keys(pod *corev1.Pod) []Key {
	seen := map[Key]bool{}
	var out []Key
	for _, r := range Resources {
		_, counts := Requests(pod, r)
		for _, n := range counts {
			k := Key{Resource: r, Count: n}
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Resource != out[j].Resource {
			return out[i].Resource < out[j].Resource
		}
		return out[i].Count < out[j].Count
	})
	return out
}

// Admitted reports whether the kubelet has admitted pod (and so allocated
// every device it asked for): status.startTime is set, or the pod is past
// Pending (a rejected pod is Failed).
func Admitted(pod *corev1.Pod) bool {
	return pod.Status.StartTime != nil || (pod.Status.Phase != "" && pod.Status.Phase != corev1.PodPending)
}

// PinnedNode is the node a pod's required node affinity pins it to
// (matchFields metadata.name In [node] in every term, as the ungater's
// Pin writes it); "" when it is not pinned to one node.
func PinnedNode(pod *corev1.Pod) string {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	node := ""
	for _, t := range terms {
		found := ""
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				found = f.Values[0]
			}
		}
		if found == "" || (node != "" && found != node) {
			return ""
		}
		node = found
	}
	return node
}

// unschedulable reports whether the scheduler said it cannot place pod.
func unschedulable(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// Awaiting returns the node where pod still waits for the kubelet to
// allocate its GPUs, if it does: it asks for a GPU resource, is not
// admitted, not Succeeded or Failed, has no scheduling gate left, and is
// bound to the node — or pinned to it and not (yet) found unschedulable
// by the scheduler, so it may be bound any moment. A terminating pod that
// was never admitted still counts: the kubelet may admit it before it
// sees the deletion.
//
// A pinned pod the scheduler cannot place stops counting (so a tenant's
// unschedulable pod holds nobody back); if it is bound later while
// another pod of its key awaits, the plugin refuses the ambiguous request.
func Awaiting(pod *corev1.Pod) (string, bool) {
	if Admitted(pod) || len(pod.Spec.SchedulingGates) > 0 || len(Keys(pod)) == 0 {
		return "", false
	}
	if pod.Spec.NodeName != "" {
		return pod.Spec.NodeName, true
	}
	if n := PinnedNode(pod); n != "" && !unschedulable(pod) && pod.DeletionTimestamp == nil {
		return n, true
	}
	return "", false
}

// Blocking returns the pods of others that keep pod from being released
// to node now: each awaits its allocation on node and shares a key with
// pod, so the kubelet's request for one could be for the other. pod
// itself (by UID) is never among them.
func Blocking(pod *corev1.Pod, node string, others []*corev1.Pod) []*corev1.Pod {
	mine := map[Key]bool{}
	for _, k := range Keys(pod) {
		mine[k] = true
	}
	if len(mine) == 0 {
		return nil
	}
	var out []*corev1.Pod
	for _, o := range others {
		if o.UID == pod.UID {
			continue
		}
		if n, ok := Awaiting(o); !ok || n != node {
			continue
		}
		for _, k := range Keys(o) {
			if mine[k] {
				out = append(out, o)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// Describe names blockers for pod's Event: pods of pod's own namespace by
// name, others only by count (a tenant is not told another's pod names).
func Describe(pod *corev1.Pod, blockers []*corev1.Pod) string {
	var own []string
	other := 0
	for _, b := range blockers {
		if b.Namespace == pod.Namespace {
			own = append(own, b.Name)
		} else {
			other++
		}
	}
	var parts []string
	if len(own) > 0 {
		parts = append(parts, "pod "+strings.Join(own, ", "))
	}
	if other > 0 {
		parts = append(parts, fmt.Sprintf("%d pod(s) of other namespaces", other))
	}
	return strings.Join(parts, " and ")
}
