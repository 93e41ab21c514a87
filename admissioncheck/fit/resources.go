package fit

import (
	"fmt"
	"math"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Node resources other than GPUs. A model indexes every resource name any
// node lists; a node with Resources keeps, per name, its allocatable and
// what its holders request. A pod placed by the engine takes its pod set's
// Requests and one of the node's pods; a node without Resources is not
// limited by them.

// podsMilli is what one pod takes of the "pods" resource.
const podsMilli = 1000

// unlimited is the pod capacity of a node that does not limit by resources.
const unlimited = math.MaxInt64 / 4

type resIndex struct {
	names []corev1.ResourceName
	idx   map[corev1.ResourceName]int
	pods  int // index of "pods", -1 if no node lists it
}

func newResIndex(nodes []Node) *resIndex {
	ri := &resIndex{idx: map[corev1.ResourceName]int{}, pods: -1}
	for i := range nodes {
		for n := range nodes[i].Resources {
			if _, ok := ri.idx[n]; !ok {
				ri.idx[n] = len(ri.names)
				ri.names = append(ri.names, n)
			}
		}
	}
	if i, ok := ri.idx[corev1.ResourcePods]; ok {
		ri.pods = i
	}
	return ri
}

// resOf returns node ni's allocatable and used vectors (nil if it does not
// limit by resources).
func (m *Model) resOf(ni int32) (alloc, used []int64) {
	if !m.nodes[ni].hasRes {
		return nil, nil
	}
	k := len(m.ri.names)
	return m.resAlloc[int(ni)*k : int(ni+1)*k], m.resUsed[int(ni)*k : int(ni+1)*k]
}

// UseNode adds a holder's requests of resources other than GPUs (a pod
// bound to the node, or a plan's slot whose pod is not there yet) to node;
// pods counts that many of the node's pods. Unknown nodes and resources the
// node does not list are ignored: the model reflects the cluster, it does
// not police it.
func (m *Model) UseNode(node string, req map[corev1.ResourceName]int64, pods int64) {
	m.useNode(node, req, pods, +1)
}

// ReleaseNode removes what UseNode added (clamped at zero).
func (m *Model) ReleaseNode(node string, req map[corev1.ResourceName]int64, pods int64) {
	m.useNode(node, req, pods, -1)
}

func (m *Model) useNode(node string, req map[corev1.ResourceName]int64, pods int64, sign int64) {
	ni, ok := m.byNode[node]
	if !ok {
		return
	}
	_, used := m.resOf(ni)
	if used == nil {
		return
	}
	add := func(i int, v int64) {
		used[i] = max(0, used[i]+sign*v)
	}
	for n, v := range req {
		if i, ok := m.ri.idx[n]; ok && n != corev1.ResourcePods {
			add(i, v)
		}
	}
	if m.ri.pods >= 0 {
		add(m.ri.pods, pods*podsMilli)
	}
}

// NodeFree reports a node's free amount of a resource other than GPUs
// (milli-units); ok is false when the node does not limit by resources.
func (m *Model) NodeFree(node string, name corev1.ResourceName) (int64, bool) {
	ni, found := m.byNode[node]
	if !found {
		return 0, false
	}
	alloc, used := m.resOf(ni)
	if alloc == nil {
		return 0, false
	}
	i, ok := m.ri.idx[name]
	if !ok {
		return 0, true
	}
	return alloc[i] - used[i], true
}

// bindRes compiles each request's Requests against the model's index.
func (m *Model) bindRes(reqs []*req) {
	k := len(m.ri.names)
	for _, r := range reqs {
		r.res, r.resMiss = nil, false
		if k == 0 {
			continue
		}
		r.res = make([]int64, k)
		for n, v := range r.requests {
			if v <= 0 || n == corev1.ResourcePods {
				continue
			}
			i, ok := m.ri.idx[n]
			if !ok {
				r.resMiss = true // no node lists it: none that limits can host the pod
				continue
			}
			r.res[i] = v
		}
		if m.ri.pods >= 0 {
			r.res[m.ri.pods] = podsMilli
		}
	}
}

// nodeCap is how many more pods of r node ni's resources other than GPUs
// can take.
func (s *scratch) nodeCap(r *req, ni int32) int64 {
	alloc, used := s.m.resOf(ni)
	if alloc == nil || s.ignoreRes {
		return unlimited
	}
	if r.resMiss {
		return 0
	}
	c := int64(unlimited)
	for i, v := range r.res {
		if v > 0 {
			c = min(c, max(0, alloc[i]-used[i])/v)
		}
	}
	return c
}

// takeRes applies (sign +1) or undoes (-1) one pod of r on node ni.
func (s *scratch) takeRes(r *req, ni int32, sign int64) {
	_, used := s.m.resOf(ni)
	if used == nil {
		return
	}
	for i, v := range r.res {
		used[i] += sign * v
	}
}

// resConstraint explains a pod set that fits the GPUs but not the other
// resources of their nodes ("" when those do not bind).
func (s *scratch) resConstraint(j int) string {
	r := s.reqs[j]
	if len(s.m.ri.names) == 0 {
		return ""
	}
	s.ignoreRes = true
	gpuOnly := s.capacity(j, int64(r.count))
	s.ignoreRes = false
	if int(gpuOnly) < r.count {
		return ""
	}
	withRes := s.capacity(j, int64(r.count))
	// Which resource binds on the nodes whose GPUs could take a pod.
	binding := map[corev1.ResourceName]int{}
	var buf [16]int64
	for i := range s.nodes {
		n := &s.nodes[i]
		if n.elig&(1<<r.bitIdx) == 0 || podCap(s.nodeSlots(r, n, buf[:0]), r.g, 1) == 0 {
			continue
		}
		alloc, used := s.m.resOf(n.ni)
		if alloc == nil {
			continue
		}
		if r.resMiss {
			binding["a resource no node lists"]++
			continue
		}
		best, bi := int64(unlimited), -1
		for k, v := range r.res {
			if v > 0 {
				if c := max(0, alloc[k]-used[k]) / v; c < best {
					best, bi = c, k
				}
			}
		}
		if bi >= 0 && best < int64(r.count) {
			binding[s.m.ri.names[bi]]++
		}
	}
	names := make([]string, 0, len(binding))
	for n := range binding {
		names = append(names, string(n))
	}
	slices.SortFunc(names, func(a, b string) int {
		return cmpInt(binding[corev1.ResourceName(b)], binding[corev1.ResourceName(a)], a, b)
	})
	var by []string
	for _, n := range names {
		by = append(by, fmt.Sprintf("%s on %s", n, plural(binding[corev1.ResourceName(n)], "node", "nodes")))
	}
	return fmt.Sprintf("pod set %s: its GPUs are free but only %d of %d pods fit the other resources of those nodes (each pod asks %s; binding: %s)",
		r.label, withRes, r.count, describeRequests(r.requests), strings.Join(by, ", "))
}

func cmpInt(a, b int, x, y string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return strings.Compare(x, y)
}

// describeRequests prints requests as quantities, names sorted.
func describeRequests(req map[corev1.ResourceName]int64) string {
	names := make([]string, 0, len(req)+1)
	for n := range req {
		if n != corev1.ResourcePods {
			names = append(names, string(n))
		}
	}
	slices.Sort(names)
	parts := make([]string, 0, len(names)+1)
	for _, n := range names {
		f := resource.DecimalSI
		if n == string(corev1.ResourceMemory) || n == string(corev1.ResourceEphemeralStorage) || strings.HasPrefix(n, "hugepages-") {
			f = resource.BinarySI
		}
		q := resource.NewMilliQuantity(req[corev1.ResourceName(n)], f)
		parts = append(parts, n+" "+q.String())
	}
	parts = append(parts, "1 of the node's pods")
	return strings.Join(parts, ", ")
}
