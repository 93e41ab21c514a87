// Package gpucache is the gang-fit check's long-lived model of GPU
// capacity, in the shape of Kueue's scheduler cache and kube-scheduler's
// AssumePod/ForgetPod: informer events for nodes, GPU-holding pods and
// GPUPlans update it incrementally; a plan is assumed in memory before it
// is written to the API and forgotten if the write fails; a decision reads
// it under the cache's lock, with no LIST and no copy of the cluster. Its
// state is rebuilt from the API on start (durable state stays in GPUPlans
// and pods), so nothing lives only in memory.
//
// What a pod or a plan holds is package usage's rule, applied
// incrementally: a pod counts its own devices; a plan slot counts unless
// the pod bound to it by UID is counted.
package gpucache

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/admissioncheck/usage"
	"github.com/gpupack/gpupack/flavors"
)

// GhostTTL is how long the slots of a released plan stay held after the
// plan is gone. The cache cannot tell, at that moment, whether a pod holds
// a slot: its pod, its binding, or a replacement pod that took the slot
// after the bound one finished may still be on their way through the
// informers. So every slot stays held GhostTTL (on top of any pod the
// cache counts), and is then released; pods that really hold the GPUs
// count themselves by then. The assumption, as in kube-scheduler's
// assumed-pod expiry: informer lag stays below GhostTTL. The cost: GPUs of
// a released plan become plannable GhostTTL after the release (a
// preemptor waits that long at least; victims' pods usually take longer to
// terminate anyway). A restart starts from a fresh list, without ghosts.
const GhostTTL = 15 * time.Second

// Cache is safe for concurrent use.
type Cache struct {
	mu    sync.Mutex
	now   func() time.Time
	nodes map[string]*nodeEntry
	pods  map[types.UID]*podEntry
	// terminating: the pods of pods that are terminating.
	terminating map[types.UID]*podEntry
	// nodeUse: what every pod bound to a node holds there besides GPUs
	// (usage.PodNodeUsage); termNode the terminating ones.
	nodeUse  map[types.UID]*usage.NodeUsage
	termNode map[types.UID]*usage.NodeUsage
	// plans holds what the informer showed; assumed, plans written (or
	// being written) by this process and not yet seen back. Both count.
	plans   map[types.NamespacedName]*planEntry
	assumed map[types.NamespacedName]*planEntry
	// bound: pod UID → the slots naming it.
	bound map[types.UID][]slotRef
	// ghosts: GPUs of released plans' slots, held until GhostTTL passes.
	ghosts []ghost
	views  map[flavors.Buffer]*view
	// onFree is called (without the lock) when capacity may have been
	// freed: a holder pod gone, a plan released, a node changed.
	onFree func()
	// bound pods as pod anti-affinity sees them (usage.PodNodeUsage's
	// pods: on a node, not Succeeded/Failed, terminating until gone), by
	// namespace; anti: those with required anti-affinity terms of their own.
	meta   map[types.UID]*podMeta
	podsNS map[string]map[types.UID]*podMeta
	anti   map[types.UID]*podMeta
	// antiPlans counts the plans (stored or assumed) whose pods have
	// anti-affinity terms.
	antiPlans int
	// onLost is called (without the lock) with the plans that have a slot
	// no pod is bound to on a node that just became unusable (NotReady,
	// cordoned, deleted).
	onLost func([]types.NamespacedName)
}

type nodeEntry struct {
	obj *corev1.Node // informer object, read only
}

// podMeta is a bound pod for pod anti-affinity: its labels and terms are
// the informer object's (read only, shared, not copied).
type podMeta struct {
	uid         types.UID
	terminating bool
	inventory.Running
}

type podEntry struct {
	key         types.NamespacedName
	gpus        []fit.Usage
	terminating bool
}

type planEntry struct {
	key         types.NamespacedName
	objUID      types.UID
	workloadUID types.UID
	plan        *v1alpha1.GPUPlan // read only
	slots       []usage.Slot
	counted     []bool
	// pods: its pod sets' labels and anti-affinity terms
	// (AnnotationPodAffinity); anti: some pod set has terms.
	pods map[string]inventory.PlanPods
	anti bool
}

type slotRef struct {
	e *planEntry
	i int
}

type ghost struct {
	gpus    []fit.Usage
	node    string
	req     map[corev1.ResourceName]int64 // nil: holds nothing besides the GPUs
	expires time.Time
	// heldFor: the plan of an ambiguous write (ForgetHeld) this ghost
	// stands in for; when the informer shows a plan of that key and
	// workload, the ghost goes (the plan counts its slots). Zero for the
	// ghosts of released plans.
	heldFor heldKey
}

type heldKey struct {
	key         types.NamespacedName
	workloadUID types.UID
}

// view is the model for one driver buffer (allocatable depends on it).
type view struct {
	buf      flavors.Buffer
	dirty    bool
	nodes    []fit.Node
	unread   []string
	warnings []string
	model    *fit.Model
}

// New returns an empty cache; onFree may be nil.
func New(onFree func()) *Cache {
	return &Cache{
		now: time.Now, onFree: onFree,
		nodes: map[string]*nodeEntry{}, pods: map[types.UID]*podEntry{}, terminating: map[types.UID]*podEntry{},
		nodeUse: map[types.UID]*usage.NodeUsage{}, termNode: map[types.UID]*usage.NodeUsage{},
		plans: map[types.NamespacedName]*planEntry{}, assumed: map[types.NamespacedName]*planEntry{},
		bound: map[types.UID][]slotRef{}, views: map[flavors.Buffer]*view{},
		meta: map[types.UID]*podMeta{}, podsNS: map[string]map[types.UID]*podMeta{}, anti: map[types.UID]*podMeta{},
	}
}

// SetOnNodeLost sets the callback for plans hit by a lost node.
func (c *Cache) SetOnNodeLost(f func([]types.NamespacedName)) {
	c.mu.Lock()
	c.onLost = f
	c.mu.Unlock()
}

// LostNodeGrace is how long a NotReady node keeps the plan slots no pod is
// bound to yet before they count as lost (a kubelet restart or a network
// blip is not a lost node). A deleted or cordoned node is lost at once.
const LostNodeGrace = 30 * time.Second

// NodeLost reports whether the slots planned on a node are lost: the node
// is deleted or cordoned, or NotReady for LostNodeGrace. wait > 0: NotReady
// for less than that, look again after wait.
func (c *Cache) NodeLost(name string) (lost bool, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.nodes[name]
	if !ok || e.obj.Spec.Unschedulable {
		return true, 0
	}
	if ready(e.obj) {
		return false, 0
	}
	since := time.Time{}
	for _, cd := range e.obj.Status.Conditions {
		if cd.Type == corev1.NodeReady {
			since = cd.LastTransitionTime.Time
		}
	}
	if left := LostNodeGrace - c.now().Sub(since); !since.IsZero() && left > 0 {
		return false, left
	}
	return true, 0
}

// plansOnNode lists the plans with a slot on node that no pod is bound to.
func (c *Cache) plansOnNode(node string) []types.NamespacedName {
	var out []types.NamespacedName
	for _, m := range []map[types.NamespacedName]*planEntry{c.plans, c.assumed} {
		for k, e := range m {
			for _, s := range e.slots {
				if s.Node == node && s.PodUID == "" {
					out = append(out, k)
					break
				}
			}
		}
	}
	return out
}

func (c *Cache) lost(keys []types.NamespacedName, f func([]types.NamespacedName)) {
	if len(keys) > 0 && f != nil {
		f(keys)
	}
}

func usableNode(n *corev1.Node) bool { return ready(n) && !n.Spec.Unschedulable }

// SetClock is for tests.
func (c *Cache) SetClock(now func() time.Time) { c.mu.Lock(); c.now = now; c.mu.Unlock() }

func (c *Cache) freed() {
	if c.onFree != nil {
		c.onFree()
	}
}

// apply adds (sign > 0) or removes usage in every built view.
func (c *Cache) apply(gpus []fit.Usage, sign int) {
	for _, v := range c.views {
		if v.dirty {
			continue
		}
		for _, u := range gpus {
			if sign > 0 {
				_ = v.model.Use(u) // unknown GPUs are reported at rebuild
			} else {
				v.model.Release(u)
			}
		}
	}
}

// applyNode adds (sign > 0) or removes what a holder requests on node
// besides GPUs (req nil: nothing, not even a pod) in every built view.
func (c *Cache) applyNode(node string, req map[corev1.ResourceName]int64, sign int) {
	if req == nil || node == "" {
		return
	}
	for _, v := range c.views {
		if v.dirty {
			continue
		}
		if sign > 0 {
			v.model.UseNode(node, req, 1)
		} else {
			v.model.ReleaseNode(node, req, 1)
		}
	}
}

// applySlot adds or removes a plan slot's GPUs and node requests.
func (c *Cache) applySlot(s usage.Slot, sign int) {
	c.apply(s.GPUs, sign)
	c.applyNode(s.Node, slotReq(s), sign)
}

// slotReq: a slot of a plan that names its pods' requests holds them and
// one pod on its node; one that does not (written before) holds GPUs only.
func slotReq(s usage.Slot) map[corev1.ResourceName]int64 {
	if s.Requests == nil {
		return nil
	}
	return s.Requests
}

// nodeReqOf is what a pod bound to a node holds there (never nil: a pod
// always takes one of the node's pods).
func nodeReqOf(u *usage.NodeUsage) map[corev1.ResourceName]int64 {
	if u.Requests == nil {
		return map[corev1.ResourceName]int64{}
	}
	return u.Requests
}

// --- nodes ---

// gpuNode: nodes with no GPU source at all are not GPU nodes; nodes that
// advertise nvidia.com/gpu without inventory are kept, to say the inventory
// is incomplete.
func gpuNode(n *corev1.Node) bool {
	if _, ok := n.Annotations[v1alpha1.AnnotationGPUs]; ok {
		return true
	}
	if _, ok := n.Annotations[v1alpha1.AnnotationHAMiNodeRegister]; ok {
		return true
	}
	if _, ok := n.Labels[flavors.LabelGPUProduct]; ok {
		return true
	}
	q, ok := n.Status.Capacity[v1alpha1.ResourceNvidiaGPU]
	return ok && !q.IsZero()
}

// sameForGPUs: does the change touch anything the model reads?
func sameForGPUs(a, b *corev1.Node) bool {
	return a.Annotations[v1alpha1.AnnotationGPUs] == b.Annotations[v1alpha1.AnnotationGPUs] &&
		a.Annotations[v1alpha1.AnnotationHAMiNodeRegister] == b.Annotations[v1alpha1.AnnotationHAMiNodeRegister] &&
		equality.Semantic.DeepEqual(a.Labels, b.Labels) && equality.Semantic.DeepEqual(a.Spec.Taints, b.Spec.Taints) &&
		a.Spec.Unschedulable == b.Spec.Unschedulable && ready(a) == ready(b) &&
		equality.Semantic.DeepEqual(a.Status.Allocatable, b.Status.Allocatable) &&
		a.Status.Capacity[v1alpha1.ResourceNvidiaGPU].Equal(b.Status.Capacity[v1alpha1.ResourceNvidiaGPU])
}

// labelsOnly: the change is to labels the model reads as labels only (not
// the GPU product or count labels, which decide the node's GPUs).
func labelsOnly(a, b *corev1.Node) bool {
	if a.Labels[flavors.LabelGPUProduct] != b.Labels[flavors.LabelGPUProduct] || a.Labels[flavors.LabelGPUCount] != b.Labels[flavors.LabelGPUCount] {
		return false
	}
	_, pa := a.Labels[flavors.LabelGPUProduct]
	_, pb := b.Labels[flavors.LabelGPUProduct]
	_, ca := a.Labels[flavors.LabelGPUCount]
	_, cb := b.Labels[flavors.LabelGPUCount]
	if pa != pb || ca != cb {
		return false
	}
	x := *a
	x.Labels = b.Labels
	return sameForGPUs(&x, b)
}

// setLabels gives node n's new labels to a built view: its model and its
// node list (read by Never and the fragmentation gauges).
func (v *view) setLabels(n *corev1.Node) {
	if !v.model.SetNodeLabels(n.Name, n.Labels) {
		v.dirty = true // not in the model (unreadable inventory): rebuild
		return
	}
	i, ok := slices.BinarySearchFunc(v.nodes, n.Name, func(fn fit.Node, name string) int { return strings.Compare(fn.Name, name) })
	if !ok {
		v.dirty = true
		return
	}
	v.nodes[i].Labels = n.Labels
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// UpsertNode records a node's add or update.
func (c *Cache) UpsertNode(n *corev1.Node) {
	c.mu.Lock()
	old, had := c.nodes[n.Name]
	if !gpuNode(n) {
		var hit []types.NamespacedName
		if had {
			delete(c.nodes, n.Name)
			c.dirty()
			hit = c.plansOnNode(n.Name)
		}
		onLost := c.onLost
		c.mu.Unlock()
		c.lost(hit, onLost)
		return
	}
	if had && sameForGPUs(old.obj, n) {
		old.obj = n
		c.mu.Unlock()
		return
	}
	if had && labelsOnly(old.obj, n) {
		// A label change (a rack, a pool, a drain label) updates every
		// built view in place instead of rebuilding it under the lock.
		old.obj = n
		for _, v := range c.views {
			if !v.dirty {
				v.setLabels(n)
			}
		}
		c.mu.Unlock()
		c.freed() // the node may now match a waiting pod set's selector
		return
	}
	var hit []types.NamespacedName
	if had && usableNode(old.obj) && !usableNode(n) {
		hit = c.plansOnNode(n.Name)
	}
	c.nodes[n.Name] = &nodeEntry{obj: n}
	c.dirty()
	onLost := c.onLost
	c.mu.Unlock()
	c.lost(hit, onLost)
	c.freed() // a node Ready, schedulable, or with GPUs again
}

// DeleteNode records a node's deletion.
func (c *Cache) DeleteNode(name string) {
	c.mu.Lock()
	var hit []types.NamespacedName
	if _, ok := c.nodes[name]; ok {
		delete(c.nodes, name)
		c.dirty()
		hit = c.plansOnNode(name)
	}
	onLost := c.onLost
	c.mu.Unlock()
	c.lost(hit, onLost)
}

func (c *Cache) dirty() {
	for _, v := range c.views {
		v.dirty = true
	}
}

// --- pods ---

// UpsertPod records a pod's add or update.
func (c *Cache) UpsertPod(p *corev1.Pod) {
	u, holds, err := usage.PodUsage(p)
	if err != nil {
		holds = false // unreadable devices: not counted (as Ledger does)
	}
	nu, onNode := usage.PodNodeUsage(p)
	c.mu.Lock()
	freed := c.setPod(p.UID, types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, u, holds)
	if c.setNodeUse(p.UID, nu, onNode) {
		freed = true
	}
	c.setMeta(p, onNode)
	c.mu.Unlock()
	if freed {
		c.freed()
	}
}

// DeletePod records that a pod is gone.
func (c *Cache) DeletePod(uid types.UID) {
	c.mu.Lock()
	freed := c.setPod(uid, types.NamespacedName{}, usage.Pod{}, false)
	if c.setNodeUse(uid, usage.NodeUsage{}, false) {
		freed = true
	}
	c.dropMeta(uid)
	c.mu.Unlock()
	if freed {
		c.freed()
	}
}

// setMeta records (or drops) a pod for pod anti-affinity.
func (c *Cache) setMeta(p *corev1.Pod, onNode bool) {
	c.dropMeta(p.UID)
	if !onNode {
		return
	}
	m := &podMeta{uid: p.UID, terminating: p.DeletionTimestamp != nil,
		Running: inventory.Running{Namespace: p.Namespace, Labels: p.Labels, Node: p.Spec.NodeName}}
	if a := p.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		m.Anti = a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	ns := c.podsNS[p.Namespace]
	if ns == nil {
		ns = map[types.UID]*podMeta{}
		c.podsNS[p.Namespace] = ns
	}
	ns[p.UID] = m
	c.meta[p.UID] = m
	if len(m.Anti) > 0 {
		c.anti[p.UID] = m
	}
}

func (c *Cache) dropMeta(uid types.UID) {
	m, ok := c.meta[uid]
	if !ok {
		return
	}
	delete(c.meta, uid)
	delete(c.anti, uid)
	if pods := c.podsNS[m.Namespace]; pods != nil {
		delete(pods, uid)
		if len(pods) == 0 {
			delete(c.podsNS, m.Namespace)
		}
	}
}

// setPod moves a pod to its new state; it reports whether GPUs were freed.
func (c *Cache) setPod(uid types.UID, key types.NamespacedName, u usage.Pod, holds bool) bool {
	old, had := c.pods[uid]
	if had {
		c.apply(old.gpus, -1)
		delete(c.pods, uid)
		delete(c.terminating, uid)
	}
	if holds {
		e := &podEntry{key: key, gpus: u.GPUs, terminating: u.Terminating}
		c.pods[uid] = e
		if e.terminating {
			c.terminating[uid] = e
		}
		c.apply(u.GPUs, +1)
	}
	if had != holds {
		c.recount(uid)
	}
	return had && !holds
}

// setNodeUse moves what a pod holds on its node besides GPUs to its new
// state; it reports whether anything was freed.
func (c *Cache) setNodeUse(uid types.UID, nu usage.NodeUsage, holds bool) bool {
	old, had := c.nodeUse[uid]
	if had && holds && old.Node == nu.Node && old.Terminating == nu.Terminating && equality.Semantic.DeepEqual(old.Requests, nu.Requests) {
		return false
	}
	if had {
		c.applyNode(old.Node, nodeReqOf(old), -1)
		delete(c.nodeUse, uid)
		delete(c.termNode, uid)
	}
	if holds {
		e := nu
		c.nodeUse[uid] = &e
		if e.Terminating {
			c.termNode[uid] = &e
		}
		c.applyNode(e.Node, nodeReqOf(&e), +1)
	}
	return had && !holds
}

// recount re-applies the rule to the slots bound to one pod UID.
func (c *Cache) recount(uid types.UID) {
	_, counted := c.pods[uid]
	for _, r := range c.bound[uid] {
		want := !counted
		if r.e.counted[r.i] != want {
			r.e.counted[r.i] = want
			if want {
				c.applySlot(r.e.slots[r.i], +1)
			} else {
				c.applySlot(r.e.slots[r.i], -1)
			}
		}
	}
}

// --- plans ---

func (c *Cache) newEntry(p *v1alpha1.GPUPlan) *planEntry {
	e := &planEntry{key: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, objUID: p.UID, workloadUID: p.Spec.WorkloadUID, plan: p, slots: usage.PlanSlots(p)}
	e.counted = make([]bool, len(e.slots))
	// Unreadable: its slots stand for no pod in pod anti-affinity (its pods
	// count once they are bound).
	e.pods, _ = inventory.ParsePodAffinity(p.Annotations[v1alpha1.AnnotationPodAffinity])
	for _, pp := range e.pods {
		e.anti = e.anti || len(pp.Anti) > 0
	}
	return e
}

func (c *Cache) addEntry(e *planEntry) {
	if e.anti {
		c.antiPlans++
	}
	for i, s := range e.slots {
		if s.PodUID != "" {
			c.bound[s.PodUID] = append(c.bound[s.PodUID], slotRef{e, i})
		}
		_, podCounted := c.pods[s.PodUID]
		if usage.SlotHolds(s, func(types.UID) bool { return podCounted }) {
			e.counted[i] = true
			c.applySlot(s, +1)
		}
	}
}

// removeEntry takes a plan's reservation away. With release set (the plan
// is gone, not replaced by a newer version of itself), every slot stays
// held as a ghost for GhostTTL.
func (c *Cache) removeEntry(e *planEntry, release bool) {
	if e.anti {
		c.antiPlans--
	}
	if release {
		// Ghosts also expire here, not only in Read: a standby replica
		// never decides, and would keep every ghost for its lifetime.
		c.expireGhosts()
	}
	for i, s := range e.slots {
		if s.PodUID != "" {
			refs := c.bound[s.PodUID]
			for j := range refs {
				if refs[j].e == e && refs[j].i == i {
					refs = append(refs[:j], refs[j+1:]...)
					break
				}
			}
			if len(refs) == 0 {
				delete(c.bound, s.PodUID)
			} else {
				c.bound[s.PodUID] = refs
			}
		}
		g := ghost{gpus: s.GPUs, node: s.Node, req: slotReq(s), expires: c.now().Add(GhostTTL)}
		switch {
		case release && e.counted[i]:
			// The slot's usage now belongs to the ghost.
			c.ghosts = append(c.ghosts, g)
		case release:
			c.ghosts = append(c.ghosts, g)
			c.applySlot(s, +1)
		case e.counted[i]:
			c.applySlot(s, -1)
		}
	}
}

// UpsertPlan records a GPUPlan seen by the informer. It replaces an
// assumed plan of the same workload.
func (c *Cache) UpsertPlan(p *v1alpha1.GPUPlan) {
	c.mu.Lock()
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	freed := false
	old, hadOld := c.plans[key]
	if hadOld {
		// A newer version of the same object carries its reservation on;
		// another object of the same name means the old one is gone.
		c.removeEntry(old, old.objUID != p.UID)
		delete(c.plans, key)
	}
	e := c.newEntry(p)
	c.addEntry(e)
	if hadOld {
		// Waiters are woken only when this update can have freed capacity:
		// fewer slots held (a binding to a pod counted already, Released)
		// or other slots. A status write that changes nothing the model
		// counts (a phase, a binding to a pod not counted yet) wakes none.
		freed = old.objUID != p.UID || heldSlots(e) < heldSlots(old) ||
			!equality.Semantic.DeepEqual(old.plan.Spec.Assignments, p.Spec.Assignments)
	}
	c.plans[key] = e
	if a, ok := c.assumed[key]; ok && a.workloadUID == p.Spec.WorkloadUID {
		c.removeEntry(a, false)
		delete(c.assumed, key)
	}
	c.dropHeld(heldKey{key, p.Spec.WorkloadUID})
	c.mu.Unlock()
	if freed || (!hadOld && p.Status.Phase == v1alpha1.PlanReleased) {
		c.freed()
	}
}

func heldSlots(e *planEntry) int {
	n := 0
	for _, b := range e.counted {
		if b {
			n++
		}
	}
	return n
}

// DeletePlan records that a plan is gone (informer delete, or this
// process's own successful Delete). objUID, when set, must match the stored
// object, so a late event of an earlier plan of the same name cannot drop
// a newer one; an assumed plan of the same workload not yet seen back is
// dropped too. Its slots stay held for GhostTTL.
func (c *Cache) DeletePlan(key types.NamespacedName, objUID, workloadUID types.UID) {
	c.deletePlan(key, objUID, workloadUID, true)
}

// ReplacePlan is DeletePlan for a plan whose slots no pod can hold: the
// decision replaces a stored plan of the same Workload while its check is
// Pending (Kueue has not admitted it, so its pods are not created or are
// gated). Its slots are free at once.
func (c *Cache) ReplacePlan(key types.NamespacedName, objUID, workloadUID types.UID) {
	c.deletePlan(key, objUID, workloadUID, false)
}

func (c *Cache) deletePlan(key types.NamespacedName, objUID, workloadUID types.UID, hold bool) {
	c.mu.Lock()
	e, ok := c.plans[key]
	ok = ok && (objUID == "" || e.objUID == objUID)
	if ok {
		c.removeEntry(e, hold)
		delete(c.plans, key)
	}
	a, aok := c.assumed[key]
	// An assumed plan goes only with its own object (or when no object is
	// named): a late delete of an earlier plan of the same name must not.
	aok = aok && a.workloadUID == workloadUID && (objUID == "" || a.objUID == objUID)
	if aok {
		c.removeEntry(a, hold)
		delete(c.assumed, key)
	}
	c.mu.Unlock()
	if ok || aok {
		c.freed()
	}
}

// Assume counts a plan about to be written, so the next decision sees it
// before the informer does. Forget undoes it if the write fails.
func (c *Cache) Assume(p *v1alpha1.GPUPlan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.assume(p)
}

// Assume is Cache.Assume from inside Read: the plan counts before the lock
// is released, so no event or decision sees the model without it.
func (s *Snapshot) Assume(p *v1alpha1.GPUPlan) { s.c.assume(p) }

func (c *Cache) assume(p *v1alpha1.GPUPlan) {
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	if old, ok := c.assumed[key]; ok {
		c.removeEntry(old, true) // written, perhaps: its slots may be taken
	}
	e := c.newEntry(p)
	c.addEntry(e)
	c.assumed[key] = e
}

// Created records the object UID the API server gave an assumed plan.
func (c *Cache) Created(key types.NamespacedName, workloadUID, objUID types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a, ok := c.assumed[key]; ok && a.workloadUID == workloadUID {
		a.objUID = objUID
	}
}

// Forget drops an assumed plan of workloadUID (its write failed).
func (c *Cache) Forget(key types.NamespacedName, workloadUID types.UID) {
	c.mu.Lock()
	e, ok := c.assumed[key]
	if ok && e.workloadUID == workloadUID {
		c.removeEntry(e, false) // never written: nobody can hold its slots
		delete(c.assumed, key)
	}
	c.mu.Unlock()
	if ok {
		c.freed()
	}
}

// ForgetHeld drops an assumed plan whose write may have reached the API
// after all (a timeout, a reset connection, AlreadyExists): its slots stay
// held for GhostTTL, within which the informer delivers the stored plan if
// there is one, instead of being free at once.
func (c *Cache) ForgetHeld(key types.NamespacedName, workloadUID types.UID) {
	c.mu.Lock()
	e, ok := c.assumed[key]
	if ok && e.workloadUID == workloadUID {
		from := len(c.ghosts)
		c.removeEntry(e, true)
		delete(c.assumed, key)
		for i := from; i < len(c.ghosts); i++ {
			c.ghosts[i].heldFor = heldKey{key, workloadUID}
		}
	}
	c.mu.Unlock()
}

// dropHeld removes the ghosts standing in for an ambiguous write of h,
// once a plan of h is shown: either that is the write (its slots now
// count as the plan's), or the write found the name taken and stored
// nothing. Without this the plan would count twice until GhostTTL, and
// look overbooked by its own ghost.
func (c *Cache) dropHeld(h heldKey) {
	keep := c.ghosts[:0]
	for _, g := range c.ghosts {
		if g.heldFor == h {
			c.apply(g.gpus, -1)
			c.applyNode(g.node, g.req, -1)
			continue
		}
		keep = append(keep, g)
	}
	c.ghosts = keep
}

// NodeUsable reports whether a node is known to the model, Ready and
// schedulable.
func (c *Cache) NodeUsable(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.nodes[name]
	return ok && ready(e.obj) && !e.obj.Spec.Unschedulable
}

// Synced is for callers that feed the cache from informers.
type Synced func() bool

// Plan returns the stored (or assumed) plan of key: the informer's object
// (read only) when there is one.
func (c *Cache) Plan(key types.NamespacedName) (*v1alpha1.GPUPlan, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.plans[key]; ok {
		return e.plan, true
	}
	if e, ok := c.assumed[key]; ok {
		return e.plan, true
	}
	return nil, false
}

// --- decisions ---

// Snapshot is what a decision reads, valid only inside Read.
type Snapshot struct {
	c *Cache
	v *view
	// Nodes are the GPU nodes read (the model's input).
	Nodes []fit.Node
	// Model counts every holder; Fit on it is a dry run.
	Model *fit.Model
	// Unread names GPU nodes whose inventory is missing or unreadable.
	Unread []string
	// Warnings: unreadable nodes, GPUs held but unknown to any node.
	Warnings []string
	// Terminating is the number of terminating pods holding GPUs.
	Terminating int
	// Plans is the number of plans that reserve capacity.
	Plans int
}

// Settled returns a copy of the model without terminating pods and without
// the ghosts of released plans: what is free once they are gone (a ghost
// is settling too — it outlives its plan only to cover informer lag).
// Release clamps at zero, so a pod and the ghost over it are not freed twice.
func (s *Snapshot) Settled() *fit.Model {
	m := s.Model.Clone()
	for _, p := range s.c.terminating {
		for _, u := range p.gpus {
			m.Release(u)
		}
	}
	for _, g := range s.c.ghosts {
		for _, u := range g.gpus {
			m.Release(u)
		}
		if g.req != nil {
			m.ReleaseNode(g.node, g.req, 1)
		}
	}
	for _, u := range s.c.termNode {
		m.ReleaseNode(u.Node, nodeReqOf(u), 1)
	}
	return m
}

// Read runs f on the model for buf under the cache's lock (events wait;
// decisions are short). The model is rebuilt first if nodes changed.
func (c *Cache) Read(buf flavors.Buffer, f func(*Snapshot)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireGhosts()
	v, ok := c.views[buf]
	if !ok {
		v = &view{buf: buf, dirty: true}
		c.views[buf] = v
	}
	if v.dirty {
		c.rebuild(v)
	}
	f(&Snapshot{c: c, v: v, Nodes: v.nodes, Model: v.model, Unread: v.unread, Warnings: v.warnings,
		Plans: len(c.plans) + len(c.assumed), Terminating: len(c.terminating)})
}

func (c *Cache) expireGhosts() {
	now := c.now()
	keep := c.ghosts[:0]
	for _, g := range c.ghosts {
		if now.After(g.expires) {
			c.apply(g.gpus, -1)
			c.applyNode(g.node, g.req, -1)
			continue
		}
		keep = append(keep, g)
	}
	c.ghosts = keep
}

// rebuild parses the nodes and re-applies every holder.
func (c *Cache) rebuild(v *view) {
	names := make([]string, 0, len(c.nodes))
	for n := range c.nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	v.nodes, v.unread, v.warnings = v.nodes[:0], nil, nil
	for _, name := range names {
		n := c.nodes[name].obj
		fn, err := inventory.NodeFromObject(n, v.buf, "")
		if err != nil {
			w := fmt.Sprintf("node %s ignored: %v", n.Name, err)
			if q := n.Status.Capacity[v1alpha1.ResourceNvidiaGPU]; !hasSource(n) && !q.IsZero() {
				w = fmt.Sprintf("node %s has %s %s but no inventory yet", n.Name, q.String(), v1alpha1.ResourceNvidiaGPU)
			} else {
				v.warnings = append(v.warnings, w)
			}
			v.unread = append(v.unread, w)
			continue
		}
		v.nodes = append(v.nodes, fn)
	}
	v.model = fit.NewModel(v.nodes)
	v.warnings = append(v.warnings, v.model.Warnings()...)
	unknown := 0
	use := func(gpus []fit.Usage) {
		for _, u := range gpus {
			if err := v.model.Use(u); err != nil {
				unknown++
				if unknown <= 3 {
					v.warnings = append(v.warnings, err.Error())
				}
			}
		}
	}
	for _, p := range c.pods {
		use(p.gpus)
	}
	for _, u := range c.nodeUse {
		v.model.UseNode(u.Node, nodeReqOf(u), 1)
	}
	for _, m := range []map[types.NamespacedName]*planEntry{c.plans, c.assumed} {
		for _, e := range m {
			for i, s := range e.slots {
				if e.counted[i] {
					use(s.GPUs)
					if r := slotReq(s); r != nil {
						v.model.UseNode(s.Node, r, 1)
					}
				}
			}
		}
	}
	for _, g := range c.ghosts {
		use(g.gpus)
		if g.req != nil {
			v.model.UseNode(g.node, g.req, 1)
		}
	}
	if unknown > 3 {
		v.warnings = append(v.warnings, fmt.Sprintf("%d more held GPUs are not in any node's inventory", unknown-3))
	}
	v.dirty = false
}

func hasSource(n *corev1.Node) bool {
	_, a := n.Annotations[v1alpha1.AnnotationGPUs]
	_, b := n.Annotations[v1alpha1.AnnotationHAMiNodeRegister]
	_, l := n.Labels[flavors.LabelGPUProduct]
	return a || b || l
}

// Verdict is the check's decision on a snapshot, before anything is
// written: the controller and `gpupack fit` both take it from here.
type Verdict struct {
	Result fit.Result
	// SettledFits: it does not fit now but fits once the terminating pods
	// are gone (Pending).
	SettledFits bool
	// Never: no state of the nodes read could hold it (NeverWhy says why);
	// Rejected only when Incomplete is "" too.
	Never    bool
	NeverWhy string
	// Incomplete says why the inventory cannot prove Never ("" if it can).
	Incomplete string
}

// Decide fits the gang now, then once terminating pods are gone, then
// asks whether it could ever fit. aff is the pod sets' pod affinity
// (inventory.GangFromPodSets): each pod set avoids the nodes where a bound
// pod conflicts with it.
func (s *Snapshot) Decide(g fit.Gang, aff []inventory.PodAffinity, o fit.Options) Verdict {
	now, byTerminating := s.avoid(g, aff, false, nil)
	v := Verdict{Result: s.Model.Fit(now, o)}
	if v.Result.Fits {
		return v
	}
	if s.Terminating > 0 || len(s.c.ghosts) > 0 || byTerminating {
		settled, _ := s.avoid(g, aff, true, nil)
		v.SettledFits = s.Settled().Fit(settled, o).Fits
	}
	if !v.SettledFits {
		v.Never, v.NeverWhy = fit.Never(s.Nodes, g, o)
		v.Incomplete = s.incomplete()
	}
	return v
}

// avoid returns g with each pod set's AvoidNodes: the nodes where a bound
// pod is selected by the pod set's required anti-affinity (topologyKey
// kubernetes.io/hostname: that pod's node), or has required anti-affinity
// of its own that may select the pod set's pods (every node sharing that
// pod's node's value of the term's topologyKey) — the two directions the
// scheduler's InterPodAffinity filter checks. settled leaves terminating
// pods out; byTerminating reports whether one of them kept a node off.
// skip, when set, is the plan g is checked for (Overbooked): its own slots,
// and the pods bound to them, are not others that g must avoid.
func (s *Snapshot) avoid(g fit.Gang, aff []inventory.PodAffinity, settled bool, skip *planEntry) (fit.Gang, bool) {
	// The common case costs nothing: no pod set has terms of its own and no
	// bound pod has any.
	if len(s.c.anti) == 0 && s.c.antiPlans == 0 && !slices.ContainsFunc(aff, func(a inventory.PodAffinity) bool { return len(a.Anti) > 0 }) {
		return g, false
	}
	var own map[types.UID]bool
	if skip != nil {
		own = map[types.UID]bool{}
		for _, sl := range skip.slots {
			if sl.PodUID != "" {
				own[sl.PodUID] = true
			}
		}
	}
	byTerminating := false
	out := g
	out.PodSets = slices.Clone(g.PodSets)
	for i := range out.PodSets {
		ps := &out.PodSets[i]
		idx := slices.IndexFunc(aff, func(a inventory.PodAffinity) bool { return a.PodSet == ps.Name })
		if idx < 0 {
			continue
		}
		a := aff[idx]
		set := map[string]bool{}
		// Terms over a wider key (zone, rack) name a domain: collected as
		// key → values and expanded to nodes in one pass at the end, so many
		// pods with such terms cost one scan of the nodes, not one each.
		domains := map[string]map[string]bool{}
		add := func(terminating bool, nodes ...string) {
			if terminating {
				if settled {
					return
				}
				byTerminating = true
			}
			for _, n := range nodes {
				set[n] = true
			}
		}
		if len(a.Anti) > 0 {
			scan := func(pods map[types.UID]*podMeta) {
				for _, m := range pods {
					if !set[m.Node] && !own[m.uid] && inventory.AntiMayMatch(a.Anti, a.Namespace, a.Labels, m.Namespace, m.Labels, true) {
						add(m.terminating, m.Node)
					}
				}
			}
			if anyNamespace(a.Anti) {
				for _, pods := range s.c.podsNS {
					scan(pods)
				}
			} else {
				for _, ns := range termNamespaces(a.Anti, a.Namespace) {
					scan(s.c.podsNS[ns])
				}
			}
		}
		// A running pod's own terms (any topologyKey) selecting this pod set.
		theirs := func(terms []corev1.PodAffinityTerm, ns string, labels map[string]string, node string, terminating bool) {
			for k := range terms {
				t := &terms[k]
				if !inventory.AntiMayMatch(terms[k:k+1], ns, labels, a.Namespace, a.Labels, false) {
					continue
				}
				if t.TopologyKey == corev1.LabelHostname {
					add(terminating, node)
					continue
				}
				ne, ok := s.c.nodes[node]
				if !ok {
					continue
				}
				v, ok := ne.obj.Labels[t.TopologyKey]
				if !ok {
					continue // the scheduler ignores a term whose key its pod's node lacks
				}
				if terminating {
					if settled {
						continue // gone once it has terminated
					}
					byTerminating = true
				}
				if domains[t.TopologyKey] == nil {
					domains[t.TopologyKey] = map[string]bool{}
				}
				domains[t.TopologyKey][v] = true
			}
		}
		for _, m := range s.c.anti {
			if !own[m.uid] {
				theirs(m.Anti, m.Namespace, m.Labels, m.Node, m.terminating)
			}
		}
		// Plan slots whose pods are not bound yet stand for them on their
		// nodes (the pods may not exist yet, or be pinned but not bound):
		// their labels and terms are the plan's record of the templates.
		for _, plans := range []map[types.NamespacedName]*planEntry{s.c.plans, s.c.assumed} {
			for _, e := range plans {
				if e.pods == nil || (!e.anti && len(a.Anti) == 0) || (skip != nil && e.key == skip.key) {
					continue
				}
				for _, sl := range e.slots {
					if _, bound := s.c.meta[sl.PodUID]; bound && sl.PodUID != "" {
						continue // the pod itself counts, above
					}
					pp, ok := e.pods[sl.PodSet]
					if !ok {
						continue
					}
					if len(a.Anti) > 0 && !set[sl.Node] && inventory.AntiMayMatch(a.Anti, a.Namespace, a.Labels, e.key.Namespace, pp.Labels, false) {
						add(false, sl.Node)
					}
					theirs(pp.Anti, e.key.Namespace, pp.Labels, sl.Node, false)
				}
			}
		}
		if len(domains) > 0 {
			for name, ne := range s.c.nodes {
				for key, values := range domains {
					if v, ok := ne.obj.Labels[key]; ok && values[v] {
						set[name] = true
						break
					}
				}
			}
		}
		if len(set) == 0 {
			continue
		}
		ps.AvoidNodes = make([]string, 0, len(set))
		for n := range set {
			ps.AvoidNodes = append(ps.AvoidNodes, n)
		}
		slices.Sort(ps.AvoidNodes)
	}
	return out, byTerminating
}

// anyNamespace: some term may select pods of any namespace.
func anyNamespace(terms []corev1.PodAffinityTerm) bool {
	return slices.ContainsFunc(terms, func(t corev1.PodAffinityTerm) bool { return t.NamespaceSelector != nil })
}

// termNamespaces: the namespaces the terms (without namespaceSelector) name.
func termNamespaces(terms []corev1.PodAffinityTerm, own string) []string {
	var out []string
	for _, t := range terms {
		if len(t.Namespaces) == 0 {
			out = append(out, own)
		}
		out = append(out, t.Namespaces...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (s *Snapshot) incomplete() string {
	switch {
	case len(s.Nodes) == 0 && len(s.Unread) == 0:
		return "no node has published a GPU inventory yet"
	case len(s.Unread) > 0:
		ws, more := s.Unread, ""
		if len(ws) > 3 {
			ws, more = ws[:3], fmt.Sprintf(" (and %d more)", len(ws)-3)
		}
		return fmt.Sprintf("%d GPU node(s) are not read (%s%s)", len(s.Unread), strings.Join(ws, "; "), more)
	}
	return ""
}

// Overbooked says why the plan stored (or assumed) under key could not be
// assumed on the model as it is now ("" when every slot it counts still
// fits beside everything else). A plan this process assumed was placed on
// free capacity under the lock and never is; one it learned from the API
// may be: a write of an earlier leader that landed after this process
// listed the plans and gave the same GPUs to another Workload, or a pod
// that took them outside the check. Checked as the model knows capacity:
// per GPU its MiB, SM percent, exclusivity and sharing slots; per node,
// for a slot that records its pod's requests, cpu, memory, pods and the
// other resources the node publishes (a pod pinned beyond them never
// schedules). The model is left as it was.
func (s *Snapshot) Overbooked(key types.NamespacedName) string {
	e, ok := s.c.plans[key]
	if !ok {
		if e, ok = s.c.assumed[key]; !ok {
			return ""
		}
	}
	m := s.Model
	for i, sl := range e.slots {
		if e.counted[i] {
			for _, u := range sl.GPUs {
				m.Release(u)
			}
			if r := slotReq(sl); r != nil {
				m.ReleaseNode(sl.Node, r, 1)
			}
		}
	}
	why := ""
	for i, sl := range e.slots {
		if !e.counted[i] {
			continue
		}
		for _, u := range sl.GPUs {
			free, freeCores, holders, known := m.GPUState(u.UUID)
			left, limited := m.GPUShareLeft(u.UUID)
			switch {
			case !known:
			case why != "":
			case u.Exclusive && holders > 0:
				why = fmt.Sprintf("GPU %s of slot %s/%d on node %s is held by %d other holder(s)", u.UUID, sl.PodSet, sl.Index, sl.Node, holders)
			case !u.Exclusive && (free < u.MemoryMiB || (u.Cores > 0 && freeCores < u.Cores)):
				why = fmt.Sprintf("GPU %s of slot %s/%d on node %s has %d MiB / %d%% SM free, the slot takes %d MiB / %d%%", u.UUID, sl.PodSet, sl.Index, sl.Node, free, freeCores, u.MemoryMiB, u.Cores)
			case limited && left < 1:
				why = fmt.Sprintf("GPU %s of slot %s/%d on node %s has no sharing slot left (%d holders)", u.UUID, sl.PodSet, sl.Index, sl.Node, holders)
			}
			_ = m.Use(u) // restores what was released, in any case
		}
		if r := slotReq(sl); r != nil {
			if why == "" {
				why = nodeShort(m, sl.Node, r, sl.PodSet, sl.Index)
			}
			m.UseNode(sl.Node, r, 1)
		}
	}
	if why == "" {
		why = s.antiConflict(e)
	}
	return why
}

// antiConflict says which counted slot of e sits on a node its pod set's
// required anti-affinity (or another pod's, or another plan's slot's)
// keeps it off, as Decide would have planned it now ("" if none). e's own
// slots were kept apart when it was planned and are not checked against
// each other.
func (s *Snapshot) antiConflict(e *planEntry) string {
	if e.pods == nil && len(s.c.anti) == 0 && s.c.antiPlans == 0 {
		return ""
	}
	var g fit.Gang
	var aff []inventory.PodAffinity
	for i, sl := range e.slots {
		if !e.counted[i] || slices.ContainsFunc(g.PodSets, func(ps fit.PodSet) bool { return ps.Name == sl.PodSet }) {
			continue
		}
		g.PodSets = append(g.PodSets, fit.PodSet{Name: sl.PodSet})
		pp := e.pods[sl.PodSet] // zero without a record: only others' terms then
		aff = append(aff, inventory.PodAffinity{PodSet: sl.PodSet, Namespace: e.key.Namespace, Labels: pp.Labels, Anti: pp.Anti})
	}
	out, _ := s.avoid(g, aff, false, e)
	for i, sl := range e.slots {
		if !e.counted[i] {
			continue
		}
		for _, ps := range out.PodSets {
			if ps.Name == sl.PodSet {
				if _, found := slices.BinarySearch(ps.AvoidNodes, sl.Node); found {
					return fmt.Sprintf("slot %s/%d on node %s conflicts with a required pod anti-affinity there", sl.PodSet, sl.Index, sl.Node)
				}
			}
		}
	}
	return ""
}

// nodeShort says which of a slot's requests its node cannot take now ("" if
// it can, or if the node does not publish allocatable).
func nodeShort(m *fit.Model, node string, req map[corev1.ResourceName]int64, podSet string, index int32) string {
	names := make([]corev1.ResourceName, 0, len(req)+1)
	for n := range req {
		if n != corev1.ResourcePods {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = append(names, corev1.ResourcePods)
	for _, n := range names {
		want := req[n]
		if n == corev1.ResourcePods {
			want = 1000 // one pod, in milli-units
		}
		if want <= 0 {
			continue
		}
		free, limits := m.NodeFree(node, n)
		if !limits {
			return ""
		}
		if free < want {
			return fmt.Sprintf("node %s of slot %s/%d has %s %dm free, the slot's pod asks %dm", node, podSet, index, n, max(0, free), want)
		}
	}
	return ""
}
