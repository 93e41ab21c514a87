// Package deviceplugin serves the kubelet device-plugin API (v1beta1) for
// gpupack's GPU resources. Each GPU is advertised as N slots; Allocate hands
// a container exactly the GPUs of the GPUPlan slot bound to its pod's UID
// (the plan is the truth, not the slots the kubelet picked nor the pod's
// annotations) as CDI devices, plus the hook library and /etc/ld.so.preload
// read-only, the container's own accounting directory, and a trusted
// limits file the plugin writes and mounts read-only.
//
// The kubelet does not say which pod an Allocate is for. match.go finds it:
// the oldest planned, not yet allocated container whose planned GPUs are
// the GPUs of the slots the kubelet chose — and GetPreferredAllocation
// steers the kubelet to exactly those slots. Anything else fails loudly.
package deviceplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
)

// PodLister lists the pods bound to this node (an informer's lister in
// production, a slice in tests).
type PodLister interface {
	List() ([]*corev1.Pod, error)
}

// PodListerFunc adapts a function.
type PodListerFunc func() ([]*corev1.Pod, error)

// List calls f.
func (f PodListerFunc) List() ([]*corev1.Pod, error) { return f() }

// UnplannedPolicy says what Allocate does for a container no plan covers.
type UnplannedPolicy string

const (
	// UnplannedReject fails the allocation (right for fractional slots: a
	// shared GPU without a plan has no memory limit).
	UnplannedReject UnplannedPolicy = "reject"
	// UnplannedFreeGPUs hands out the kubelet's chosen GPUs only when no
	// live planned pod holds any of them (right for whole GPUs).
	UnplannedFreeGPUs UnplannedPolicy = "free-gpus"
)

// Config of one plugin (one resource).
type Config struct {
	ResourceName string // gpupack.io/vgpu or nvidia.com/gpu
	SlotsPerGPU  int
	NodeName     string
	// PluginDir holds kubelet.sock and our socket (pluginapi.DevicePluginPath).
	PluginDir  string
	SocketName string // e.g. "gpupack-vgpu.sock"
	// HookDir is the host folder holding libgpupack-hook.so (and
	// ld.so.preload); mounted read-only at the same path. "" mounts nothing
	// (tests; a cluster where something else delivers the hook).
	HookDir string
	// MountPreload also mounts HookDir/ld.so.preload at /etc/ld.so.preload,
	// so static-linked launchers and exec'd children load the hook.
	MountPreload bool
	// CacheHostDir is the host root of accounting dirs; each container gets
	// <CacheHostDir>/<pod-uid>/<container> (its own, nobody else's) at
	// CacheMountPath. "" mounts none.
	CacheHostDir string
	// AccountingRegionBytes > 0 mounts a tmpfs of about that size (the
	// hook's region) on each container's accounting dir before Allocate
	// answers, and fails the Allocate when it cannot; 0 leaves it an
	// unbounded host folder (accounting.go).
	AccountingRegionBytes int64
	// LimitsDir is the host root of the trusted limits files
	// (<LimitsDir>/<pod-uid>/<container>/limits, mounted read-only at
	// LimitsMountPath). "" writes none.
	LimitsDir string
	// MemoryLimits puts CUDA_DEVICE_MEMORY_LIMIT_<i> (the plan's MiB) and
	// CUDA_DEVICE_SM_LIMIT_<i> into the limits file (fractional slots; a
	// whole GPU is not limited).
	MemoryLimits bool
	// ContextReserve is the per-model GPUPACK_CONTEXT_RESERVE table.
	ContextReserve ContextReserve
	// VisibleDevicesEnv also sets NVIDIA_VISIBLE_DEVICES (only for a runtime
	// without CDI; any container can set that variable itself, so it is no
	// boundary — see the toolkit check).
	VisibleDevicesEnv bool
	Unplanned         UnplannedPolicy
	// AllocatableMiB turns a GPU's physical MiB into allocatable MiB (the
	// flavors buffer): an unplanned whole GPU is recorded with it.
	AllocatableMiB func(physicalMiB int64) int64
	Pods           PodLister
	Plans          PlanLister
	// Client records unplanned whole-GPU allocations on the pod; nil
	// refuses them (they could not be made durable).
	Client kubernetes.Interface
	// FreshPlans reads every GPUPlan from the API server itself (not from
	// the informer). An unplanned allocation, once recorded on its pod, is
	// refused if a plan the informer has not shown yet names one of its
	// GPUs on this node: the check may have planned that GPU before it saw
	// the record. nil skips that read (the Ledger still keeps a planned
	// pod off a GPU an unplanned one holds).
	FreshPlans func(ctx context.Context) ([]*v1alpha1.GPUPlan, error)
	// Ledger is shared by the node's device plugins (one per resource, the
	// same GPUs): it serialises their decisions and remembers the node's
	// unplanned allocations until the pod informer shows them. nil: a
	// ledger of this plugin's own.
	Ledger   *Ledger
	Recorder record.EventRecorder
	// AllocateWait bounds how long Allocate waits for the pod to show up in
	// the lister (the informer may lag the binding by a moment).
	AllocateWait time.Duration
	// PollInterval is how often the sockets are checked for a kubelet restart.
	PollInterval time.Duration
	Metrics      *metrics.Metrics
}

// Plugin is one device plugin.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	cfg Config

	mu        sync.Mutex
	gpus      []v1alpha1.GPUInfo
	index     map[string]int // uuid → NVML index
	info      map[string]v1alpha1.GPUInfo
	gen       uint64
	changed   chan struct{} // closed and replaced on every SetGPUs
	allocated map[types.UID]int
	// allocatedAt: when each pod of allocated last got a container's GPUs
	// (Forget keeps a pod this recent even when the pod list lags).
	allocatedAt map[types.UID]time.Time
	// refused remembers pods already told (an Event) why they are refused.
	refused map[types.UID]bool
	// toldUnsafe remembers "<uid>/<reason>" Events of unsafe requests.
	toldUnsafe map[string]bool
	// Registrations counts successful registrations (tests, metrics).
	registrations int
}

// New creates a plugin; call SetGPUs before or after Run.
func New(cfg Config) *Plugin {
	if cfg.SlotsPerGPU <= 0 {
		cfg.SlotsPerGPU = 1
	}
	if cfg.PluginDir == "" {
		cfg.PluginDir = pluginapi.DevicePluginPath
	}
	if cfg.AllocateWait <= 0 {
		cfg.AllocateWait = 5 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.Unplanned == "" {
		cfg.Unplanned = UnplannedReject
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(nil)
	}
	if cfg.ContextReserve == nil {
		cfg.ContextReserve = DefaultContextReserve()
	}
	if cfg.AllocatableMiB == nil {
		cfg.AllocatableMiB = func(m int64) int64 { return m }
	}
	if cfg.Ledger == nil {
		cfg.Ledger = NewLedger()
	}
	return &Plugin{cfg: cfg, changed: make(chan struct{}), allocated: map[types.UID]int{}, allocatedAt: map[types.UID]time.Time{}, index: map[string]int{},
		info: map[string]v1alpha1.GPUInfo{}, refused: map[types.UID]bool{}, toldUnsafe: map[string]bool{}}
}

// Ledger is what one node's device plugins share. Every Allocate decision
// of the node is made under its lock, from a fresh read of the listers, so
// a planned allocation and an unplanned one never both take a GPU: the
// kubelet keeps each resource's slots apart, but gpupack.io/vgpu and
// nvidia.com/gpu are two resources over the same GPUs.
type Ledger struct {
	mu sync.Mutex
	// recent are GPUs this process recorded for unplanned pods, held until
	// the pod lister shows the pod's annotation (or the pod is gone).
	recent map[string]types.UID
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{recent: map[string]types.UID{}} }

// unplannedHolder returns an error naming the unplanned allocation that
// holds one of c's GPUs: one this node recorded on another live pod
// (gpupack.io/allocated-by), or one this process made that the pod lister
// does not show yet. Call with l.mu held.
func (l *Ledger) unplannedHolder(c Chunk, st State) error {
	livePods := map[types.UID]*corev1.Pod{}
	for _, pod := range st.Pods {
		if live(pod, st.Node) {
			livePods[pod.UID] = pod
		}
	}
	for _, d := range c.Devices {
		if uid, ok := l.recent[d.UUID]; ok && uid != c.PodUID && livePods[uid] != nil {
			return fmt.Errorf("%w: GPU %s is held by pod %s, an unplanned whole-GPU allocation of this node; %s's plan names it (the check planned it before it counted that allocation): the GPU is not shared with it", ErrRefused, d.UUID, klog.KObj(livePods[uid]), c.Pod)
		}
		for uid, pod := range livePods {
			if uid == c.PodUID || pod.Annotations[AnnotationAllocatedBy] != AllocatedByValue(st.Node) {
				continue
			}
			devs, err := v1alpha1.ParseDevices(pod.Annotations[v1alpha1.AnnotationDevices])
			if err != nil {
				continue
			}
			for _, dev := range devs {
				if dev.UUID == d.UUID {
					return fmt.Errorf("%w: GPU %s is held by pod %s, an unplanned whole-GPU allocation of this node; %s's plan names it (the check planned it before it counted that allocation): the GPU is not shared with it", ErrRefused, d.UUID, klog.KObj(pod), c.Pod)
				}
			}
		}
	}
	return nil
}

// SetGPUs replaces the advertised GPUs (health included); ListAndWatch
// streams the change to the kubelet.
func (p *Plugin) SetGPUs(gpus []v1alpha1.GPUInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v1alpha1.FormatGPUs(gpus) == v1alpha1.FormatGPUs(p.gpus) {
		return
	}
	p.gpus = append([]v1alpha1.GPUInfo(nil), gpus...)
	p.index = make(map[string]int, len(gpus))
	p.info = make(map[string]v1alpha1.GPUInfo, len(gpus))
	for _, g := range gpus {
		p.index[g.UUID] = g.Index
		p.info[g.UUID] = g
	}
	p.gen++
	close(p.changed)
	p.changed = make(chan struct{})
}

// Registrations reports how many times the plugin registered with a kubelet.
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registrations
}

// Devices renders the slots of gpus.
func Devices(gpus []v1alpha1.GPUInfo, slots int) []*pluginapi.Device {
	sorted := append([]v1alpha1.GPUInfo(nil), gpus...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	var out []*pluginapi.Device
	for _, g := range sorted {
		health := pluginapi.Healthy
		if !g.Healthy() {
			health = pluginapi.Unhealthy
		}
		var topo *pluginapi.TopologyInfo
		if g.NUMA >= 0 {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMA)}}}
		}
		for n := 0; n < slots; n++ {
			out = append(out, &pluginapi.Device{ID: SlotID(g.UUID, n), Health: health, Topology: topo})
		}
	}
	return out
}

// GetDevicePluginOptions asks the kubelet for GetPreferredAllocation.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the slots now and on every change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		devs := Devices(p.gpus, p.cfg.SlotsPerGPU)
		changed := p.changed
		p.mu.Unlock()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-s.Context().Done():
			return nil
		}
	}
}

// state reads the pods and plans a decision needs.
func (p *Plugin) state() (State, error) {
	pods, err := p.cfg.Pods.List()
	if err != nil {
		return State{}, fmt.Errorf("gpupack-node: list pods on %s: %w", p.cfg.NodeName, err)
	}
	var plans []*v1alpha1.GPUPlan
	if p.cfg.Plans != nil {
		if plans, err = p.cfg.Plans.Plans(""); err != nil {
			return State{}, fmt.Errorf("gpupack-node: list GPUPlans: %w", err)
		}
	}
	return State{Node: p.cfg.NodeName, Pods: pods, Plans: plans}, nil
}

// GetPreferredAllocation steers the kubelet to the planned GPUs.
func (p *Plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	st, err := p.state()
	if err != nil {
		return nil, err
	}
	res := corev1.ResourceName(p.cfg.ResourceName)
	// The kubelet asks right after binding; the informer may not have the
	// pod yet. Give it a moment to show up rather than steer the kubelet to
	// slots that Allocate will then refuse.
	deadline := time.Now().Add(p.cfg.AllocateWait / 2)
	for p.waitForPlan(st, req) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if st, err = p.state(); err != nil {
			return nil, err
		}
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	p.mu.Lock()
	defer p.mu.Unlock()
	st.Allocated = p.allocated
	for _, cr := range req.ContainerRequests {
		ids := Preferred(cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize), st, res)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// waitForPlan reports whether some container request has no waiting pod
// of its size yet, or one that names a plan (gpupack.io/plan) the informer
// does not show bound to it yet: the informers may lag the binding. A pod
// that names no plan counts as answered: its request is answered at once,
// not after a wait.
func (p *Plugin) waitForPlan(st State, req *pluginapi.PreferredAllocationRequest) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st.Allocated = p.allocated
	for _, cr := range req.ContainerRequests {
		cs := Candidates(st, corev1.ResourceName(p.cfg.ResourceName), int(cr.AllocationSize))
		if len(cs) == 0 {
			return true
		}
		for _, c := range cs {
			if c.Chunk == nil && (c.Err == nil || errors.Is(c.Err, ErrBindingNotSeen)) && c.Pod.Annotations[v1alpha1.AnnotationPlan] != "" {
				return true
			}
		}
	}
	return false
}

// Allocate answers each container with its planned GPUs.
func (p *Plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		r, err := p.allocateOne(ctx, cr.DevicesIds)
		if err != nil {
			p.cfg.Metrics.PluginAllocations.WithLabelValues(p.cfg.ResourceName, "error").Inc()
			klog.ErrorS(err, "Allocate refused", "resource", p.cfg.ResourceName, "devices", cr.DevicesIds)
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

// Event reasons (stable, CamelCase).
const (
	ReasonPlanMismatch = "GPUPlanMismatch"
	ReasonUnplanned    = "UnplannedGPUAllocated"
	// ReasonNoPlan: a pod no GPUPlan covers asked for GPUs the node serves
	// only by plan (it was refused at once).
	ReasonNoPlan = "NoGPUPlan"
	// ReasonAmbiguous: the kubelet's request could have been for this pod
	// or for another one, and the node does not guess.
	ReasonAmbiguous = "AmbiguousAllocation"
	// ReasonHeldUnplanned: the pod's plan names a GPU an unplanned
	// whole-GPU allocation of the node holds (the check planned it before
	// it counted that allocation); the GPU is not shared.
	ReasonHeldUnplanned = "GPUHeldUnplanned"
)

func (p *Plugin) allocateOne(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	deadline := time.Now().Add(p.cfg.AllocateWait)
	res := corev1.ResourceName(p.cfg.ResourceName)
	for {
		// One decision at a time on the node, from a read made under the
		// lock: what an earlier decision saw, this one sees too.
		p.cfg.Ledger.mu.Lock()
		st, err := p.state()
		if err != nil {
			p.cfg.Ledger.mu.Unlock()
			return nil, err
		}
		p.mu.Lock()
		st.Allocated = p.allocated
		chunk, dec, err := Match(ids, st, res)
		if err == nil {
			if herr := p.cfg.Ledger.unplannedHolder(chunk, st); herr != nil {
				p.mu.Unlock()
				p.cfg.Ledger.mu.Unlock()
				p.tellHeld(chunk, herr)
				return nil, fmt.Errorf("gpupack-node %s: %w", p.cfg.ResourceName, herr)
			}
			p.allocated[chunk.PodUID]++
			p.allocatedAt[chunk.PodUID] = now()
			p.mu.Unlock()
			p.cfg.Ledger.mu.Unlock()
			r, err := p.response(chunk)
			if err != nil {
				p.mu.Lock()
				p.allocated[chunk.PodUID]--
				p.mu.Unlock()
				return nil, err
			}
			p.cfg.Metrics.PluginAllocations.WithLabelValues(p.cfg.ResourceName, "planned").Inc()
			klog.InfoS("Allocated planned GPUs", "pod", chunk.Pod, "container", chunk.Container, "devices", formatGPUs(chunk.Devices))
			return r, nil
		}
		p.mu.Unlock()
		var (
			r    *pluginapi.ContainerAllocateResponse
			ok   bool
			uerr error
		)
		if p.cfg.Unplanned == UnplannedFreeGPUs && dec.Unplanned != nil {
			r, ok, uerr = p.unplanned(ctx, ids, st, dec.Unplanned)
		}
		p.cfg.Ledger.mu.Unlock()
		p.tellRefused(dec.Bad)
		if p.cfg.Unplanned == UnplannedFreeGPUs && dec.Unplanned != nil {
			if ok {
				p.cfg.Metrics.PluginAllocations.WithLabelValues(p.cfg.ResourceName, "unplanned").Inc()
				return r, nil
			}
			err = fmt.Errorf("%w; unplanned: %v", err, uerr)
		} else {
			p.tellUnsafe(dec, err)
		}
		// A refusal is final: the pods that make it are there, and the
		// kubelet, which allocates one pod at a time, will not change them
		// while it waits for this answer. Only "nobody waits" may be an
		// informer that has not seen the pod yet.
		if errors.Is(err, ErrRefused) || time.Now().After(deadline) {
			return nil, fmt.Errorf("gpupack-node %s: %w", p.cfg.ResourceName, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("gpupack-node %s: %w (gave up: %v)", p.cfg.ResourceName, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tellUnsafe raises one Warning Event per pod a refused request could have
// been for: the unplanned pod (NoGPUPlan), or every candidate of an
// ambiguous request (AmbiguousAllocation), naming the others.
func (p *Plugin) tellUnsafe(dec Decision, err error) {
	var pods []*corev1.Pod
	reason := ReasonAmbiguous
	switch {
	case dec.Unplanned != nil:
		pods, reason = []*corev1.Pod{dec.Unplanned}, ReasonNoPlan
	case len(dec.Ambiguous) > 0:
		for _, c := range dec.Ambiguous {
			pods = append(pods, c.Pod)
		}
	}
	for _, pod := range pods {
		key := string(pod.UID) + "/" + reason
		p.mu.Lock()
		told := p.toldUnsafe[key]
		p.toldUnsafe[key] = true
		p.mu.Unlock()
		if told {
			continue
		}
		klog.ErrorS(err, "refusing an Allocate", "pod", klog.KObj(pod), "reason", reason)
		if p.cfg.Recorder != nil {
			p.cfg.Recorder.Eventf(pod, corev1.EventTypeWarning, reason, "gpupack-node %s refuses %s: %v", p.cfg.NodeName, p.cfg.ResourceName, err)
		}
	}
}

// tellRefused raises one Warning Event per refused pod.
func (p *Plugin) tellRefused(bad []Refusal) {
	for _, r := range bad {
		p.mu.Lock()
		told := p.refused[r.Pod.UID]
		p.refused[r.Pod.UID] = true
		p.mu.Unlock()
		if told {
			continue
		}
		klog.ErrorS(r.Err, "refusing GPUs to a pod", "pod", klog.KObj(r.Pod))
		if p.cfg.Recorder != nil {
			p.cfg.Recorder.Eventf(r.Pod, corev1.EventTypeWarning, ReasonPlanMismatch, "gpupack-node %s refuses %s: %v", p.cfg.NodeName, p.cfg.ResourceName, r.Err)
		}
	}
}

// unplanned serves a whole-GPU request no plan covers for pod (Match found
// it the only pod the request can be for), when none of the chosen GPUs is
// held by a plan, a pod, or an earlier unplanned allocation, and records it
// durably first: the pod gets gpupack.io/devices with each GPU's whole
// allocatable MiB and gpupack.io/allocated-by, so the check counts the
// GPUs and a restarted agent still sees them held. ok is false with a
// reason when it cannot.
func (p *Plugin) unplanned(ctx context.Context, ids []string, st State, pod *corev1.Pod) (*pluginapi.ContainerAllocateResponse, bool, error) {
	gpus, err := slotGPUs(ids)
	if err != nil || len(gpus) != len(ids) {
		return nil, false, err
	}
	// The caller holds p.cfg.Ledger.mu.
	held := Held(st)
	livePods := map[types.UID]bool{}
	for _, pod := range st.Pods {
		if live(pod, st.Node) {
			livePods[pod.UID] = true
		}
	}
	recent := p.cfg.Ledger.recent
	for g, uid := range recent {
		if !livePods[uid] {
			delete(recent, g)
			continue
		}
		held[g] = true
	}
	p.mu.Lock()
	index, info := p.index, p.info
	container, n, found := nextRequest(pod, corev1.ResourceName(p.cfg.ResourceName), p.allocated[pod.UID])
	p.mu.Unlock()
	for g := range gpus {
		if held[g] {
			return nil, false, fmt.Errorf("GPU %s is held by a plan or a pod", g)
		}
		if _, ok := info[g]; !ok {
			return nil, false, fmt.Errorf("GPU %s is not on this node", g)
		}
	}
	if !found || n != len(ids) {
		return nil, false, fmt.Errorf("pod %s does not wait for %d %s", klog.KObj(pod), len(ids), p.cfg.ResourceName)
	}
	if p.cfg.Client == nil {
		return nil, false, fmt.Errorf("cannot record the allocation (no API client)")
	}
	uuids := sortedKeys(gpus)
	sort.SliceStable(uuids, func(i, j int) bool { return index[uuids[i]] < index[uuids[j]] })
	var devs []v1alpha1.DeviceAssignment
	if pod.Annotations[AnnotationAllocatedBy] == AllocatedByValue(st.Node) {
		if prev, err := v1alpha1.ParseDevices(pod.Annotations[v1alpha1.AnnotationDevices]); err == nil {
			devs = prev
		}
	}
	chunk := Chunk{Pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, PodUID: pod.UID, Container: container}
	for _, u := range uuids {
		mib := p.cfg.AllocatableMiB(info[u].MemoryMiB)
		devs = append(devs, v1alpha1.DeviceAssignment{UUID: u, MemoryMiB: mib})
		chunk.Devices = append(chunk.Devices, v1alpha1.GPUAssignment{UUID: u, MemoryMiB: mib, Cores: 100, Exclusive: true})
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": pod.ResourceVersion, // a stale view fails here and is retried
		"annotations": map[string]string{
			v1alpha1.AnnotationDevices: v1alpha1.FormatDevices(devs),
			AnnotationAllocatedBy:      AllocatedByValue(st.Node),
		},
	}})
	if _, err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "gpupack-node"}); err != nil {
		return nil, false, fmt.Errorf("record unplanned GPUs on pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	// Recorded first, then read the plans from the API server itself: a
	// plan written before the record is in this read, whatever the
	// informer shows, and is not given away. (The pod is refused; its
	// record stays, and stops counting once the kubelet fails the pod.) A
	// plan the check decided before it saw the record but wrote after this
	// read can still name the GPU: the Ledger then refuses the plan's pod
	// (unplannedHolder), so the GPU is never shared either way.
	if p.cfg.FreshPlans != nil {
		plans, err := p.cfg.FreshPlans(ctx)
		if err != nil {
			return nil, false, fmt.Errorf("cannot confirm that no GPUPlan names GPUs %v: %w", uuids, err)
		}
		if pl, g := planNaming(plans, st.Node, gpus); pl != nil {
			return nil, false, fmt.Errorf("GPU %s is named by GPUPlan %s/%s, which this node's informer did not show yet", g, pl.Namespace, pl.Name)
		}
	}
	for _, u := range uuids {
		recent[u] = pod.UID
	}
	p.mu.Lock()
	p.allocated[pod.UID]++
	p.allocatedAt[pod.UID] = now()
	p.mu.Unlock()
	r, err := p.response(chunk)
	if err != nil {
		return nil, false, err
	}
	klog.InfoS("Allocated unplanned free GPUs", "resource", p.cfg.ResourceName, "pod", klog.KObj(pod), "container", container, "gpus", uuids)
	if p.cfg.Recorder != nil {
		p.cfg.Recorder.Eventf(pod, corev1.EventTypeNormal, ReasonUnplanned, "gpupack-node %s gave container %s GPUs %s (no plan covers this pod; recorded in %s)", st.Node, container, strings.Join(uuids, ","), v1alpha1.AnnotationDevices)
	}
	return r, true, nil
}

// planNaming returns a plan that is not Released and names one of gpus on
// node, and that GPU.
func planNaming(plans []*v1alpha1.GPUPlan, node string, gpus map[string]bool) (*v1alpha1.GPUPlan, string) {
	for _, pl := range plans {
		if pl.Status.Phase == v1alpha1.PlanReleased {
			continue
		}
		for _, a := range pl.Spec.Assignments {
			if a.Node != node {
				continue
			}
			for _, g := range a.GPUs {
				if gpus[g.UUID] {
					return pl, g.UUID
				}
			}
		}
	}
	return nil, ""
}

// tellHeld raises one Warning Event on a planned pod refused because an
// unplanned allocation holds one of its GPUs.
func (p *Plugin) tellHeld(c Chunk, err error) {
	key := string(c.PodUID) + "/" + ReasonHeldUnplanned
	p.mu.Lock()
	told := p.toldUnsafe[key]
	p.toldUnsafe[key] = true
	p.mu.Unlock()
	klog.ErrorS(err, "refusing a planned allocation", "pod", c.Pod)
	if told || p.cfg.Recorder == nil {
		return
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: c.Pod.Name, Namespace: c.Pod.Namespace, UID: c.PodUID}}
	p.cfg.Recorder.Eventf(pod, corev1.EventTypeWarning, ReasonHeldUnplanned, "gpupack-node %s refuses %s: %v", p.cfg.NodeName, p.cfg.ResourceName, err)
}

// response builds what the container gets: CDI devices for exactly its
// GPUs, the hook mounts, its own accounting dir and its limits file. GPUs
// are listed in NVML index (PCI) order, the order CUDA enumerates them in
// by default; each limits index also names its GPU by UUID
// (GPUPACK_DEVICE_UUID_<i>), which is what the hook goes by, since the
// tenant's CUDA_VISIBLE_DEVICES can change CUDA's order.
func (p *Plugin) response(c Chunk) (*pluginapi.ContainerAllocateResponse, error) {
	p.mu.Lock()
	index, info := p.index, p.info
	p.mu.Unlock()
	devs := append([]v1alpha1.GPUAssignment(nil), c.Devices...)
	sort.SliceStable(devs, func(i, j int) bool { return index[devs[i].UUID] < index[devs[j].UUID] })
	r := &pluginapi.ContainerAllocateResponse{}
	uuids := make([]string, len(devs))
	limits := make([]LimitsGPU, len(devs))
	reserve := ""
	for i, d := range devs {
		uuids[i] = d.UUID
		r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: CDIDeviceName(d.UUID)})
		limits[i].UUID = d.UUID
		if p.cfg.MemoryLimits && !d.Exclusive {
			limits[i].MemoryMiB, limits[i].Cores = d.MemoryMiB, d.Cores
		}
		if v := p.cfg.ContextReserve.For(info[d.UUID].Model); reserve == "" || sizeBytes(v) > sizeBytes(reserve) {
			reserve = v
		}
	}
	if p.cfg.VisibleDevicesEnv {
		r.Envs = map[string]string{v1alpha1.EnvVisibleDevices: strings.Join(uuids, ",")}
	}
	if p.cfg.HookDir != "" {
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: p.cfg.HookDir, HostPath: p.cfg.HookDir, ReadOnly: true})
		if p.cfg.MountPreload {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: "/etc/ld.so.preload", HostPath: filepath.Join(p.cfg.HookDir, "ld.so.preload"), ReadOnly: true})
		}
	}
	if p.cfg.CacheHostDir != "" {
		if err := safeName(string(c.PodUID)); err != nil {
			return nil, err
		}
		if err := safeName(c.Container); err != nil {
			return nil, err
		}
		dir := ContainerCacheDir(p.cfg.CacheHostDir, c.PodUID, c.Container)
		if p.cfg.AccountingRegionBytes > 0 {
			// The folder is the tenant's: bounded, or no GPU (accounting.go).
			if err := BoundAccountingDir(dir, p.cfg.AccountingRegionBytes); err != nil {
				return nil, fmt.Errorf("gpupack-node: bound the accounting dir of pod %s container %s: %w", c.Pod, c.Container, err)
			}
		} else {
			// 0o777: the container may run as any user; the dir is its own.
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return nil, fmt.Errorf("gpupack-node: create accounting dir for pod %s: %w", c.Pod, err)
			}
			_ = os.Chmod(dir, 0o777)
		}
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: CacheMountPath, HostPath: dir})
	}
	if p.cfg.LimitsDir != "" {
		path, err := WriteLimits(p.cfg.LimitsDir, c.PodUID, c.Container, RenderLimits(limits, reserve))
		if err != nil {
			return nil, fmt.Errorf("gpupack-node: pod %s container %s: %w", c.Pod, c.Container, err)
		}
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: LimitsMountPath, HostPath: path, ReadOnly: true})
	}
	return r, nil
}

// CDIDeviceName is the NVIDIA container toolkit's CDI name of a GPU under
// `nvidia-ctk cdi generate --device-name-strategy=uuid`.
func CDIDeviceName(uuid string) string { return "nvidia.com/gpu=" + uuid }

// sizeBytes reads a k/m/g size (0 when malformed; the table is validated).
func sizeBytes(s string) int64 {
	mul := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mul, s = 1<<10, strings.TrimSuffix(s, "k")
	case strings.HasSuffix(s, "m"):
		mul, s = 1<<20, strings.TrimSuffix(s, "m")
	case strings.HasSuffix(s, "g"):
		mul, s = 1<<30, strings.TrimSuffix(s, "g")
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n * mul
}

// The accounting layout, shared with the webhook (webhooks/mutation:
// SharedCacheMountPath default and SharedCacheFileName): on the host
// <root>/<pod-uid>/<container>/vgpu.cache, in the container
// /var/run/gpupack/vgpu.cache.
const (
	CacheMountPath = "/var/run/gpupack"
	CacheFileName  = "vgpu.cache"
)

// ContainerCacheDir is the host folder of one container's accounting file.
func ContainerCacheDir(root string, uid types.UID, container string) string {
	return filepath.Join(root, string(uid), container)
}

// HostCacheFile is the host path of one container's accounting file.
func HostCacheFile(root string, uid types.UID, container string) string {
	return filepath.Join(ContainerCacheDir(root, uid, container), CacheFileName)
}
