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
}

type nodeEntry struct {
	obj *corev1.Node // informer object, read only
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
}

type slotRef struct {
	e *planEntry
	i int
}

type ghost struct {
	gpus    []fit.Usage
	expires time.Time
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
		plans: map[types.NamespacedName]*planEntry{}, assumed: map[types.NamespacedName]*planEntry{},
		bound: map[types.UID][]slotRef{}, views: map[flavors.Buffer]*view{},
	}
}

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
		a.Status.Capacity[v1alpha1.ResourceNvidiaGPU].Equal(b.Status.Capacity[v1alpha1.ResourceNvidiaGPU])
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
		if had {
			delete(c.nodes, n.Name)
			c.dirty()
		}
		c.mu.Unlock()
		return
	}
	if had && sameForGPUs(old.obj, n) {
		old.obj = n
		c.mu.Unlock()
		return
	}
	c.nodes[n.Name] = &nodeEntry{obj: n}
	c.dirty()
	c.mu.Unlock()
	c.freed() // a node Ready, schedulable, or with GPUs again
}

// DeleteNode records a node's deletion.
func (c *Cache) DeleteNode(name string) {
	c.mu.Lock()
	if _, ok := c.nodes[name]; ok {
		delete(c.nodes, name)
		c.dirty()
	}
	c.mu.Unlock()
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
	c.mu.Lock()
	freed := c.setPod(p.UID, types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, u, holds)
	c.mu.Unlock()
	if freed {
		c.freed()
	}
}

// DeletePod records that a pod is gone.
func (c *Cache) DeletePod(uid types.UID) {
	c.mu.Lock()
	freed := c.setPod(uid, types.NamespacedName{}, usage.Pod{}, false)
	c.mu.Unlock()
	if freed {
		c.freed()
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

// recount re-applies the rule to the slots bound to one pod UID.
func (c *Cache) recount(uid types.UID) {
	_, counted := c.pods[uid]
	for _, r := range c.bound[uid] {
		want := !counted
		if r.e.counted[r.i] != want {
			r.e.counted[r.i] = want
			if want {
				c.apply(r.e.slots[r.i].GPUs, +1)
			} else {
				c.apply(r.e.slots[r.i].GPUs, -1)
			}
		}
	}
}

// --- plans ---

func (c *Cache) newEntry(p *v1alpha1.GPUPlan) *planEntry {
	e := &planEntry{key: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, objUID: p.UID, workloadUID: p.Spec.WorkloadUID, plan: p, slots: usage.PlanSlots(p)}
	e.counted = make([]bool, len(e.slots))
	return e
}

func (c *Cache) addEntry(e *planEntry) {
	for i, s := range e.slots {
		if s.PodUID != "" {
			c.bound[s.PodUID] = append(c.bound[s.PodUID], slotRef{e, i})
		}
		_, podCounted := c.pods[s.PodUID]
		if usage.SlotHolds(s, func(types.UID) bool { return podCounted }) {
			e.counted[i] = true
			c.apply(s.GPUs, +1)
		}
	}
}

// removeEntry takes a plan's reservation away. With release set (the plan
// is gone, not replaced by a newer version of itself), every slot stays
// held as a ghost for GhostTTL.
func (c *Cache) removeEntry(e *planEntry, release bool) {
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
		switch {
		case release && e.counted[i]:
			// The slot's usage now belongs to the ghost.
			c.ghosts = append(c.ghosts, ghost{gpus: s.GPUs, expires: c.now().Add(GhostTTL)})
		case release:
			c.ghosts = append(c.ghosts, ghost{gpus: s.GPUs, expires: c.now().Add(GhostTTL)})
			c.apply(s.GPUs, +1)
		case e.counted[i]:
			c.apply(s.GPUs, -1)
		}
	}
}

// UpsertPlan records a GPUPlan seen by the informer. It replaces an
// assumed plan of the same workload.
func (c *Cache) UpsertPlan(p *v1alpha1.GPUPlan) {
	c.mu.Lock()
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	freed := false
	if old, ok := c.plans[key]; ok {
		// A newer version of the same object carries its reservation on;
		// another object of the same name means the old one is gone.
		c.removeEntry(old, old.objUID != p.UID)
		delete(c.plans, key)
		freed = true
	}
	e := c.newEntry(p)
	c.addEntry(e)
	c.plans[key] = e
	if a, ok := c.assumed[key]; ok && a.workloadUID == p.Spec.WorkloadUID {
		c.removeEntry(a, false)
		delete(c.assumed, key)
	}
	c.mu.Unlock()
	if freed || p.Status.Phase == v1alpha1.PlanReleased {
		c.freed()
	}
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
		c.removeEntry(e, true)
		delete(c.assumed, key)
	}
	c.mu.Unlock()
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
	for _, m := range []map[types.NamespacedName]*planEntry{c.plans, c.assumed} {
		for _, e := range m {
			for i, s := range e.slots {
				if e.counted[i] {
					use(s.GPUs)
				}
			}
		}
	}
	for _, g := range c.ghosts {
		use(g.gpus)
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
// asks whether it could ever fit.
func (s *Snapshot) Decide(g fit.Gang, o fit.Options) Verdict {
	v := Verdict{Result: s.Model.Fit(g, o)}
	if v.Result.Fits {
		return v
	}
	if s.Terminating > 0 || len(s.c.ghosts) > 0 {
		v.SettledFits = s.Settled().Fit(g, o).Fits
	}
	if !v.SettledFits {
		v.Never, v.NeverWhy = fit.Never(s.Nodes, g, o)
		v.Incomplete = s.incomplete()
	}
	return v
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
