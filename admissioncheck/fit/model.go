package fit

import (
	"fmt"
	"math/bits"
	"strings"
)

// gpuState is the mutable part of one GPU.
type gpuState struct {
	node    int32
	phys    int64
	alloc   int64
	used    int64 // MiB held by all holders
	cores   int32 // SM percent held
	holders int32 // any usage: the GPU is no longer whole
	excl    int32 // exclusive holders: nothing else may share it
	share   int32 // most holders at once (0: no limit)
	healthy bool
}

// free is the MiB a fractional request may still take.
func (g *gpuState) free() int64 {
	if g.excl > 0 || g.used >= g.alloc {
		return 0
	}
	return g.alloc - g.used
}

func (g *gpuState) freeCores() int32 {
	if g.excl > 0 || g.cores >= 100 {
		return 0
	}
	return 100 - g.cores
}

func (g *gpuState) whole() bool { return g.holders == 0 }

type nodeInfo struct {
	n       *Node // immutable, shared between clones (GPUs not used)
	lo, hi  int32 // range of its GPUs in Model.gpus
	usable  bool  // Ready and schedulable
	hasRes  bool  // limits pods by its resources other than GPUs
	whole   int32 // healthy GPUs with no usage
	freeMiB int64 // free MiB of its healthy GPUs
}

// Histogram of free MiB per GPU: 4 buckets per power of two, so a bucket's
// upper bound is within 25 % of any member and slot bounds stay tight.
const (
	histMaxMiB  = 1<<24 - 1
	histBuckets = 4*24 + 4
)

func histBucket(f int64) int {
	if f > histMaxMiB {
		f = histMaxMiB
	}
	n := bits.Len64(uint64(f))
	if n <= 2 {
		return int(f)
	}
	top := int(f>>(n-3)) & 3
	return 4*(n-2) + top
}

// histUpper is the largest free MiB a GPU in bucket b may have.
func histUpper(b int) int64 {
	if b < 4 {
		return int64(b)
	}
	n := b/4 + 2
	top := int64(b % 4)
	return ((4+top+1)<<(n-3) - 1)
}

// domainAgg is what pruning needs to know about a domain without looking at
// its GPUs. It counts only healthy GPUs of Ready, schedulable nodes.
type domainAgg struct {
	name         string
	nodes        []int32 // shared between clones
	gpus         int32
	freeMiB      int64
	whole        int32
	nodesByWhole []int32 // [k] = nodes with exactly k whole GPUs
	hist         [histBuckets]int32
}

type levelIndex struct {
	nodeDomain []int32 // -1: node lacks the label
	domains    []*domainAgg
	missing    int // nodes without the label
}

// Model is the cluster as the engine sees it: nodes, GPUs with their current
// usage, and per-domain aggregates kept up to date by Use and Release. A
// Model is not safe for concurrent use; Clone it per goroutine.
type Model struct {
	nodes    []nodeInfo
	gpus     []gpuState
	info     []GPU            // immutable, shared between clones
	byUUID   map[string]int32 // immutable, shared between clones
	levels   map[string]*levelIndex
	maxGPUs  int
	warnings []string
	orders   map[string]*staticOrder // immutable values, shared between clones
	// Resources other than GPUs: the index and allocatable are immutable
	// and shared; resUsed (nodes × names) is copied by Clone.
	ri       *resIndex
	byNode   map[string]int32
	resAlloc []int64
	resUsed  []int64
	// Buffers reused by newScratch: one dry run at a time per model.
	eligBuf  []uint64
	keyBuf   []uint64
	tmpBuf   []uint64
	nodeBuf  []snode
	candBuf  []int32
	subsBuf  []int32
	subFree  []int64 // per sub-domain; zero between uses
	subWhole []int64
	subPos   []int32
	subSeen  []bool
}

// NewModel builds a model with no usage. A GPU UUID seen twice is kept on
// its first node only (see Warnings).
func NewModel(nodes []Node) *Model { return newModel(nodes, true) }

// newModel without byUUID builds a model that cannot take usage: enough for
// Never, and much cheaper (no map of every UUID).
func newModel(nodes []Node, withUsage bool) *Model {
	total := 0
	for i := range nodes {
		total += len(nodes[i].GPUs)
	}
	var byUUID map[string]int32
	if withUsage {
		byUUID = make(map[string]int32, total)
	}
	m := &Model{byUUID: byUUID, levels: map[string]*levelIndex{}, orders: map[string]*staticOrder{},
		nodes: make([]nodeInfo, 0, len(nodes)), gpus: make([]gpuState, 0, total), info: make([]GPU, 0, total),
		ri: newResIndex(nodes), byNode: make(map[string]int32, len(nodes))}
	if k := len(m.ri.names); k > 0 {
		m.resAlloc, m.resUsed = make([]int64, k*len(nodes)), make([]int64, k*len(nodes))
	}
	nodes = append([]Node(nil), nodes...) // the model keeps pointers into it
	for i := range nodes {
		n := &nodes[i]
		ni := nodeInfo{n: n, lo: int32(len(m.gpus)), usable: n.Ready && !n.Unschedulable, hasRes: n.Resources != nil && len(m.ri.names) > 0}
		if _, dup := m.byNode[n.Name]; !dup {
			m.byNode[n.Name] = int32(i)
		}
		for name, v := range n.Resources {
			m.resAlloc[i*len(m.ri.names)+m.ri.idx[name]] = v
		}
		for _, g := range n.GPUs {
			if withUsage {
				if _, dup := m.byUUID[g.UUID]; dup {
					m.warnings = append(m.warnings, fmt.Sprintf("GPU %s listed again on node %s: ignored there", g.UUID, n.Name))
					continue
				}
				m.byUUID[g.UUID] = int32(len(m.gpus))
			}
			m.gpus = append(m.gpus, gpuState{node: int32(i), phys: g.PhysicalMiB, alloc: g.AllocatableMiB, share: max(0, g.MaxShare), healthy: g.Healthy})
			m.info = append(m.info, g)
			if g.Healthy {
				ni.whole++
				ni.freeMiB += max(0, g.AllocatableMiB)
			}
		}
		ni.hi = int32(len(m.gpus))
		if int(ni.hi-ni.lo) > m.maxGPUs {
			m.maxGPUs = int(ni.hi - ni.lo)
		}
		m.nodes = append(m.nodes, ni)
	}
	return m
}

// Warnings lists inconsistencies found while building the model.
func (m *Model) Warnings() []string { return m.warnings }

// Use adds one holder's usage of a GPU. Usage beyond a GPU's allocatable is
// recorded as it is (the GPU then has nothing free): the model reflects the
// cluster, it does not police it. The only error is an unknown GPU.
func (m *Model) Use(u Usage) error {
	gi, ok := m.byUUID[u.UUID]
	if !ok {
		return fmt.Errorf("GPU %q is not in the inventory of any node", u.UUID)
	}
	m.account(gi, -1)
	g := &m.gpus[gi]
	g.used += u.MemoryMiB
	g.cores += u.Cores
	g.holders++
	if u.Exclusive {
		g.excl++
	}
	m.account(gi, +1)
	return nil
}

// Release removes a usage added by Use. Releasing more than was used clamps
// at zero.
func (m *Model) Release(u Usage) {
	gi, ok := m.byUUID[u.UUID]
	if !ok {
		return
	}
	m.account(gi, -1)
	g := &m.gpus[gi]
	g.used = max(0, g.used-u.MemoryMiB)
	g.cores = max(0, g.cores-u.Cores)
	g.holders = max(0, g.holders-1)
	if u.Exclusive {
		g.excl = max(0, g.excl-1)
	}
	m.account(gi, +1)
}

// GPUShareLeft reports how many more holders a GPU may take under its
// sharing-slot count (MaxShare); limited is false when it has none.
func (m *Model) GPUShareLeft(uuid string) (left int, limited bool) {
	gi, ok := m.byUUID[uuid]
	if !ok || m.gpus[gi].share == 0 {
		return 0, false
	}
	return int(shareLeft(&m.gpus[gi])), true
}

// GPUState reports a GPU's free MiB, free SM percent and number of holders.
func (m *Model) GPUState(uuid string) (freeMiB int64, freeCores int32, holders int, ok bool) {
	gi, ok := m.byUUID[uuid]
	if !ok {
		return 0, 0, 0, false
	}
	g := &m.gpus[gi]
	return g.free(), g.freeCores(), int(g.holders), true
}

// account adds (sign=+1) or removes (sign=-1) a GPU's contribution to its
// node's whole count and to every built level index.
func (m *Model) account(gi int32, sign int32) {
	g := &m.gpus[gi]
	n := &m.nodes[g.node]
	if !g.healthy {
		return
	}
	whole := g.whole()
	n.freeMiB += int64(sign) * g.free()
	if n.usable {
		for _, li := range m.levels {
			di := li.nodeDomain[g.node]
			if di < 0 {
				continue
			}
			d := li.domains[di]
			f := g.free()
			d.gpus += sign
			d.freeMiB += int64(sign) * f
			d.hist[histBucket(f)] += sign
			if whole {
				d.whole += sign
				// The node moves between nodesByWhole buckets; n.whole is
				// updated below, after every index saw the old value.
				if sign < 0 {
					d.nodesByWhole[n.whole]--
					d.nodesByWhole[n.whole-1]++
				} else {
					d.nodesByWhole[n.whole]--
					d.nodesByWhole[n.whole+1]++
				}
			}
		}
	}
	if whole {
		n.whole += sign
	}
}

// level returns the index for a label key, building it on first use.
func (m *Model) level(key string) *levelIndex {
	if li, ok := m.levels[key]; ok {
		return li
	}
	li := &levelIndex{nodeDomain: make([]int32, len(m.nodes))}
	byName := map[string]int32{}
	for i := range m.nodes {
		name := ""
		if key != "" {
			v, ok := m.nodes[i].n.Labels[key]
			if !ok {
				li.nodeDomain[i] = -1
				li.missing++
				continue
			}
			name = v
		}
		di, ok := byName[name]
		if !ok {
			di = int32(len(li.domains))
			byName[name] = di
			li.domains = append(li.domains, &domainAgg{name: name, nodesByWhole: make([]int32, m.maxGPUs+1)})
		}
		li.nodeDomain[i] = di
		d := li.domains[di]
		d.nodes = append(d.nodes, int32(i))
		n := &m.nodes[i]
		if !n.usable {
			continue
		}
		d.nodesByWhole[n.whole]++
		for gi := n.lo; gi < n.hi; gi++ {
			g := &m.gpus[gi]
			if !g.healthy {
				continue
			}
			f := g.free()
			d.gpus++
			d.freeMiB += f
			d.hist[histBucket(f)]++
			if g.whole() {
				d.whole++
			}
		}
	}
	m.levels[key] = li
	return li
}

// Clone returns an independent copy (immutable parts are shared).
func (m *Model) Clone() *Model {
	c := &Model{
		nodes:    append([]nodeInfo(nil), m.nodes...),
		gpus:     append([]gpuState(nil), m.gpus...),
		info:     m.info,
		byUUID:   m.byUUID,
		levels:   make(map[string]*levelIndex, len(m.levels)),
		maxGPUs:  m.maxGPUs,
		warnings: m.warnings,
		orders:   make(map[string]*staticOrder, len(m.orders)),
		ri:       m.ri,
		byNode:   m.byNode,
		resAlloc: m.resAlloc,
		resUsed:  append([]int64(nil), m.resUsed...),
	}
	for k, v := range m.orders {
		c.orders[k] = v
	}
	for k, li := range m.levels {
		nl := &levelIndex{nodeDomain: li.nodeDomain, missing: li.missing, domains: make([]*domainAgg, len(li.domains))}
		for i, d := range li.domains {
			nd := *d
			nd.nodesByWhole = append([]int32(nil), d.nodesByWhole...)
			nl.domains[i] = &nd
		}
		c.levels[k] = nl
	}
	return c
}

// SetNodeLabels gives a node new labels without rebuilding the model: the
// level indexes and node orders that read a changed label are dropped and
// rebuilt on next use (O(nodes) each, against parsing every node's
// inventory again). Labels that decide a node's GPUs (its product and
// count) are the caller's to exclude: they need a rebuild. It reports
// whether the node is in the model.
func (m *Model) SetNodeLabels(name string, labels map[string]string) bool {
	ni, ok := m.byNode[name]
	if !ok {
		return false
	}
	old := m.nodes[ni].n
	cp := *old // clones keep the old node
	cp.Labels = labels
	m.nodes[ni].n = &cp
	changed := func(key string) bool {
		a, okA := old.Labels[key]
		b, okB := labels[key]
		return okA != okB || a != b
	}
	for key := range m.levels {
		if key != "" && changed(key) {
			delete(m.levels, key)
		}
	}
	for key := range m.orders {
		if key == "" {
			continue
		}
		for _, l := range strings.Split(key, "\x00") {
			if changed(l) {
				delete(m.orders, key)
				break
			}
		}
	}
	return true
}
