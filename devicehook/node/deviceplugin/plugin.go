// Package deviceplugin serves the kubelet device-plugin API (v1beta1) for
// gpupack's GPU resources. Each GPU is advertised as N slots; Allocate hands
// a container exactly the GPUs its pod's gpupack.io/devices annotation
// plans (the plan is the truth, not the slots the kubelet picked), plus the
// hook library mount and the pod's accounting directory.
//
// The kubelet does not say which pod an Allocate is for. match.go finds it:
// the oldest planned, not yet allocated container whose planned GPUs are
// the GPUs of the slots the kubelet chose — and GetPreferredAllocation
// steers the kubelet to exactly those slots. Anything else fails loudly.
package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
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
	// ld.so.preload); mounted read-only at the same path. "" (the default in
	// gpupack-node) leaves mounting to the webhook, which mounts the same
	// folders on every GPU container; a duplicate mount point would fail
	// container creation.
	HookDir string
	// MountPreload also mounts HookDir/ld.so.preload at /etc/ld.so.preload,
	// so static-linked launchers and exec'd children load the hook.
	MountPreload bool
	// CacheHostDir is the host root of accounting dirs; each container gets
	// <CacheHostDir>/<pod-uid>/<container> at CacheMountPath, the layout the
	// webhook's subPathExpr mount produces. "" leaves it to the webhook.
	CacheHostDir string
	// MemoryLimits sets CUDA_DEVICE_MEMORY_LIMIT_<i> from the plan's MiB.
	MemoryLimits bool
	Unplanned    UnplannedPolicy
	Pods         PodLister
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
	gen       uint64
	changed   chan struct{} // closed and replaced on every SetGPUs
	allocated map[types.UID]int
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
	return &Plugin{cfg: cfg, changed: make(chan struct{}), allocated: map[types.UID]int{}, index: map[string]int{}}
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
	for _, g := range gpus {
		p.index[g.UUID] = g.Index
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

// GetPreferredAllocation steers the kubelet to the planned GPUs.
func (p *Plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	pods, err := p.cfg.Pods.List()
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	res := corev1.ResourceName(p.cfg.ResourceName)
	// The kubelet asks right after binding; the informer may not have the
	// pod yet. Give it a moment to show up rather than steer the kubelet to
	// slots that Allocate will then refuse.
	deadline := time.Now().Add(p.cfg.AllocateWait / 2)
	for p.waitForPlan(pods, req) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if pods, err = p.cfg.Pods.List(); err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cr := range req.ContainerRequests {
		ids := Preferred(cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize), pods, p.cfg.NodeName, res, p.allocated)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// waitForPlan reports whether some container request has no pending planned
// chunk of its size yet.
func (p *Plugin) waitForPlan(pods []*corev1.Pod, req *pluginapi.PreferredAllocationRequest) bool {
	p.mu.Lock()
	next, _ := pending(pods, p.cfg.NodeName, corev1.ResourceName(p.cfg.ResourceName), p.allocated)
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

func (p *Plugin) allocateOne(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	deadline := time.Now().Add(p.cfg.AllocateWait)
	res := corev1.ResourceName(p.cfg.ResourceName)
	for {
		pods, err := p.cfg.Pods.List()
		if err != nil {
			return nil, fmt.Errorf("gpupack-node: list pods on %s: %w", p.cfg.NodeName, err)
		}
		p.mu.Lock()
		chunk, err := Match(ids, pods, p.cfg.NodeName, res, p.allocated)
		if err == nil {
			p.allocated[chunk.PodUID]++
			index := p.index
			p.mu.Unlock()
			r, err := p.response(chunk, index)
			if err != nil {
				return nil, err
			}
			p.cfg.Metrics.PluginAllocations.WithLabelValues(p.cfg.ResourceName, "planned").Inc()
			klog.InfoS("Allocated planned GPUs", "pod", chunk.Pod, "container", chunk.Container, "devices", v1alpha1.FormatDevices(chunk.Devices))
			return r, nil
		}
		p.mu.Unlock()
		if p.cfg.Unplanned == UnplannedFreeGPUs {
			if r, ok := p.freeGPUs(ids, pods); ok {
				p.cfg.Metrics.PluginAllocations.WithLabelValues(p.cfg.ResourceName, "unplanned").Inc()
				return r, nil
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

// freeGPUs serves an unplanned whole-GPU request when none of the chosen
// GPUs is held by a live planned pod.
func (p *Plugin) freeGPUs(ids []string, pods []*corev1.Pod) (*pluginapi.ContainerAllocateResponse, bool) {
	gpus, err := slotGPUs(ids)
	if err != nil {
		return nil, false
	}
	held := Held(pods, p.cfg.NodeName)
	for g := range gpus {
		if held[g] {
			return nil, false
		}
	}
	p.mu.Lock()
	index := p.index
	p.mu.Unlock()
	uuids := sortedKeys(gpus)
	sort.SliceStable(uuids, func(i, j int) bool { return index[uuids[i]] < index[uuids[j]] })
	klog.InfoS("Allocated unplanned free GPUs", "resource", p.cfg.ResourceName, "gpus", uuids)
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{v1alpha1.EnvVisibleDevices: strings.Join(uuids, ",")}}, true
}

// response builds the container's environment and mounts. GPUs are listed
// in NVML index (PCI) order, the order CUDA enumerates them in, so
// CUDA_DEVICE_MEMORY_LIMIT_<i> and the hook's device i name the same GPU.
func (p *Plugin) response(c Chunk, index map[string]int) (*pluginapi.ContainerAllocateResponse, error) {
	devs := append([]v1alpha1.DeviceAssignment(nil), c.Devices...)
	sort.SliceStable(devs, func(i, j int) bool { return index[devs[i].UUID] < index[devs[j].UUID] })
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	uuids := make([]string, len(devs))
	for i, d := range devs {
		uuids[i] = d.UUID
		if p.cfg.MemoryLimits {
			r.Envs[v1alpha1.EnvMemoryLimit+"_"+strconv.Itoa(i)] = strconv.FormatInt(d.MemoryMiB, 10) + "m"
		}
	}
	r.Envs[v1alpha1.EnvVisibleDevices] = strings.Join(uuids, ",")
	if p.cfg.HookDir != "" {
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: p.cfg.HookDir, HostPath: p.cfg.HookDir, ReadOnly: true})
		if p.cfg.MountPreload {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: "/etc/ld.so.preload", HostPath: filepath.Join(p.cfg.HookDir, "ld.so.preload"), ReadOnly: true})
		}
	}
	if p.cfg.CacheHostDir != "" {
		dir := ContainerCacheDir(p.cfg.CacheHostDir, c.PodUID, c.Container)
		// 0o777: the container may run as any user; the dir is its own.
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return nil, fmt.Errorf("gpupack-node: create accounting dir for pod %s: %w", c.Pod, err)
		}
		_ = os.Chmod(dir, 0o777)
		r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: CacheMountPath, HostPath: dir})
		r.Envs[v1alpha1.EnvSharedCache] = filepath.Join(CacheMountPath, CacheFileName)
	}
	return r, nil
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
