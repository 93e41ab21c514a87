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
	Client   kubernetes.Interface
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
	// refused remembers pods already told (an Event) why they are refused.
	refused map[types.UID]bool
	// recent are GPUs this process recorded for unplanned pods, held until
	// the pod lister shows the pod's annotation (or the pod is gone).
	recent      map[string]types.UID
	unplannedMu sync.Mutex
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
	return &Plugin{cfg: cfg, changed: make(chan struct{}), allocated: map[types.UID]int{}, index: map[string]int{},
		info: map[string]v1alpha1.GPUInfo{}, refused: map[types.UID]bool{}, recent: map[string]types.UID{}}
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

// waitForPlan reports whether some container request has no pending planned
// chunk of its size yet.
func (p *Plugin) waitForPlan(st State, req *pluginapi.PreferredAllocationRequest) bool {
	p.mu.Lock()
	st.Allocated = p.allocated
	next, _ := pending(st, corev1.ResourceName(p.cfg.ResourceName))
	p.mu.Unlock()
	for _, cr := range req.ContainerRequests {
		found := false
		for _, c := range next {
			found = found || len(c.Devices) == int(cr.AllocationSize)
		}
		if !found {
			return true
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
)

func (p *Plugin) allocateOne(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	deadline := time.Now().Add(p.cfg.AllocateWait)
	res := corev1.ResourceName(p.cfg.ResourceName)
	for {
		st, err := p.state()
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		st.Allocated = p.allocated
		chunk, bad, err := Match(ids, st, res)
		if err == nil {
			p.allocated[chunk.PodUID]++
			p.mu.Unlock()
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
		p.tellRefused(bad)
		if p.cfg.Unplanned == UnplannedFreeGPUs {
			r, ok, uerr := p.unplanned(ctx, ids, st)
			if ok {
				p.cfg.Metrics.PluginAllocations.WithLabelValues(p.cfg.ResourceName, "unplanned").Inc()
				return r, nil
			}
			if uerr != nil {
				err = fmt.Errorf("%w; unplanned: %v", err, uerr)
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("gpupack-node %s: %w", p.cfg.ResourceName, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("gpupack-node %s: %w (gave up: %v)", p.cfg.ResourceName, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
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

// unplanned serves a whole-GPU request no plan covers, when none of the
// chosen GPUs is held by a plan, a pod, or an earlier unplanned allocation,
// and records it durably first: the pod it is for (the oldest waiting
// unplanned pod whose next container asks for that many GPUs) gets
// gpupack.io/devices with each GPU's whole allocatable MiB and
// gpupack.io/allocated-by, so the check counts the GPUs and a restarted
// agent still sees them held. ok is false with a reason when it cannot.
func (p *Plugin) unplanned(ctx context.Context, ids []string, st State) (*pluginapi.ContainerAllocateResponse, bool, error) {
	gpus, err := slotGPUs(ids)
	if err != nil || len(gpus) != len(ids) {
		return nil, false, err
	}
	p.unplannedMu.Lock()
	defer p.unplannedMu.Unlock()
	held := Held(st)
	livePods := map[types.UID]bool{}
	for _, pod := range st.Pods {
		if live(pod, st.Node) {
			livePods[pod.UID] = true
		}
	}
	p.mu.Lock()
	for g, uid := range p.recent {
		if !livePods[uid] {
			delete(p.recent, g)
			continue
		}
		held[g] = true
	}
	index, info := p.index, p.info
	p.mu.Unlock()
	for g := range gpus {
		if held[g] {
			return nil, false, fmt.Errorf("GPU %s is held by a plan or a pod", g)
		}
		if _, ok := info[g]; !ok {
			return nil, false, fmt.Errorf("GPU %s is not on this node", g)
		}
	}
	res := corev1.ResourceName(p.cfg.ResourceName)
	var pod *corev1.Pod
	var container string
	p.mu.Lock()
	for _, cand := range waiting(st, res) {
		if _, planned, err := Planned(cand, st.Plans, st.Node); planned || err != nil {
			continue
		}
		names, counts := gpuContainers(cand, res)
		n := 0
		for i, name := range names {
			if started(cand, name) {
				continue
			}
			if n == p.allocated[cand.UID] {
				if counts[i] == len(ids) {
					pod, container = cand, name
				}
				break
			}
			n++
		}
		if pod != nil {
			break
		}
	}
	p.mu.Unlock()
	if pod == nil {
		return nil, false, fmt.Errorf("no unplanned pod on node %s waits for %d %s", st.Node, len(ids), res)
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
	p.mu.Lock()
	for _, u := range uuids {
		p.recent[u] = pod.UID
	}
	p.allocated[pod.UID]++
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

// response builds what the container gets: CDI devices for exactly its
// GPUs, the hook mounts, its own accounting dir and its limits file. GPUs
// are listed in NVML index (PCI) order, the order CUDA enumerates them in,
// so CUDA_DEVICE_MEMORY_LIMIT_<i> and the hook's device i name the same GPU.
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
		if p.cfg.MemoryLimits && !d.Exclusive {
			limits[i] = LimitsGPU{MemoryMiB: d.MemoryMiB, Cores: d.Cores}
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
		// 0o777: the container may run as any user; the dir is its own.
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return nil, fmt.Errorf("gpupack-node: create accounting dir for pod %s: %w", c.Pod, err)
		}
		_ = os.Chmod(dir, 0o777)
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
