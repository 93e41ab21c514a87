package bypass

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
)

// Policy says what a bypass costs the pod.
type Policy string

const (
	PolicyWarn Policy = "warn" // Event + metric
	// PolicyKill also SIGKILLs the offending processes, every pass while
	// the finding stands (the container restarts per its restartPolicy).
	PolicyKill Policy = "kill"
	// PolicyEnforce kills the processes and deletes the pod with grace
	// period 0 (the default). Not the Eviction API: a PodDisruptionBudget,
	// a long grace period or an eviction webhook a tenant can steer would
	// hold it.
	PolicyEnforce Policy = "enforce"
)

// ParsePolicy reads a --bypass-policy value.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyWarn, PolicyKill, PolicyEnforce:
		return p, nil
	case "evict":
		return "", fmt.Errorf("bypass policy %q is gone: the Eviction API can be held by a PodDisruptionBudget or the eviction webhook; use enforce (kill + delete with grace 0)", s)
	}
	return "", fmt.Errorf("bypass policy %q: want warn, kill or enforce", s)
}

// Killer ends a host process. verify is called once the process is pinned
// (pidfd) and must confirm it is still the pod's: a PID NVML sampled may
// have exited and been reused since.
type Killer interface {
	Kill(pid uint32, verify func() bool) error
}

// SignalKiller SIGKILLs through a pidfd (race-free against PID reuse),
// falling back to kill(2) on kernels without pidfd_open. gpupack-node
// runs with hostPID, so NVML's host PIDs are its own.
type SignalKiller struct{}

// Kill implements Killer.
func (SignalKiller) Kill(pid uint32, verify func() bool) error {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err == unix.ENOSYS {
		if !verify() {
			return errNotOurs
		}
		return unix.Kill(int(pid), unix.SIGKILL)
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !verify() {
		return errNotOurs
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

var errNotOurs = errors.New("process is no longer the pod's")

// Event reasons (stable, CamelCase).
const (
	ReasonOverLimit  = "GPUMemoryOverLimit"
	ReasonUnassigned = "GPUNotAssigned"
	ReasonUnknown    = "UnknownGPUProcess"
	ReasonEnforced   = "GPUBypassEnforced"
	// ReasonUnattributed (on the Node): device memory in use that no NVML
	// process list accounts for.
	ReasonUnattributed = "GPUMemoryUnattributed"
	// ReasonHostileAccounting: the container's accounting file is not one
	// the hook writes (FIFO, symlink, oversized).
	ReasonHostileAccounting = "HookAccountingHostile"
	// ReasonMountOverride: a GPU process sees another mount than
	// gpupack-node's at the hook's paths (KindMountOverride).
	ReasonMountOverride = "GPUMountOverride"
)

// Config of a Watcher.
type Config struct {
	NodeName string
	NVML     nvml.Interface
	Resolver Resolver
	Pods     deviceplugin.PodLister
	Plans    deviceplugin.PlanLister // the truth about who holds what
	Client   kubernetes.Interface    // deletes pods under PolicyEnforce
	Killer   Killer                  // nil: SignalKiller
	Recorder record.EventRecorder
	Policy   Policy
	// SlackMiB per container (not per process: 64 processes must not hide
	// 32 GiB) covers the CUDA contexts NVML counts beyond the plan.
	SlackMiB int64
	// UnattributedMiB is the device memory in use beyond what NVML's
	// process lists account for (driver overhead) that is tolerated on a
	// GPU; more, in two passes running, is a KindUnattributed finding on
	// the node (reported, never enforced: no process to kill). 0: 1024.
	UnattributedMiB int64
	// CacheDir is the host root of per-pod accounting dirs (drift); "" skips drift.
	CacheDir string
	Hook     HookUsage
	// Mounts, when set, verifies in every pass that each GPU process of a
	// pod gpupack-node allocated sees gpupack-node's own binds at
	// /etc/ld.so.preload, /etc/gpupack/limits and the hook library
	// (KindMountOverride, enforced like a bypass). Nil checks nothing.
	Mounts   *MountCheck
	Metrics  *metrics.Metrics
	Interval time.Duration
	// ReportEvery re-announces a standing finding (Events and the counter
	// count detections, not polls).
	ReportEvery time.Duration
	Now         func() time.Time
}

// Watcher is the bypass loop.
type Watcher struct {
	cfg      Config
	mu       sync.Mutex
	reported map[string]time.Time
	deleted  map[types.UID]bool
	// confirmed remembers what a plan gave each pod, for when the manager
	// deletes the plan while the pod still runs.
	confirmed map[types.UID][]v1alpha1.GPUAssignment
	// unattributed counts the passes running in which a GPU's unattributed
	// memory stood over the threshold (one pass may compare a process list
	// NVML sampled earlier with the live memory counter).
	unattributed map[string]int
}

// New creates a watcher.
func New(cfg Config) *Watcher {
	if cfg.Hook == nil {
		cfg.Hook = RegionFile{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(nil)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.ReportEvery <= 0 {
		cfg.ReportEvery = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.UnattributedMiB <= 0 {
		cfg.UnattributedMiB = 1024
	}
	if cfg.Policy == "" {
		cfg.Policy = PolicyEnforce
	}
	if cfg.Killer == nil {
		cfg.Killer = SignalKiller{}
	}
	return &Watcher{cfg: cfg, reported: map[string]time.Time{}, deleted: map[types.UID]bool{}, confirmed: map[types.UID][]v1alpha1.GPUAssignment{}, unattributed: map[string]int{}}
}

// Run polls until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := w.Once(ctx); err != nil {
			klog.ErrorS(err, "bypass watcher pass failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// notAvailable is NVML_VALUE_NOT_AVAILABLE for unsigned long long.
const notAvailable = ^uint64(0)

// Once runs one pass and returns the findings it reported or acted on.
func (w *Watcher) Once(ctx context.Context) ([]Finding, error) {
	procs, index, residual, err := w.processes()
	if err != nil {
		return nil, err
	}
	podList, err := w.cfg.Pods.List()
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	var plans []*v1alpha1.GPUPlan
	if w.cfg.Plans != nil {
		if plans, err = w.cfg.Plans.Plans(""); err != nil {
			return nil, fmt.Errorf("list GPUPlans: %w", err)
		}
	}
	st := deviceplugin.State{Node: w.cfg.NodeName, Pods: podList, Plans: plans}
	byUID := map[types.UID]*corev1.Pod{}
	in := Input{Procs: procs, Pods: map[types.UID]Pod{}, Held: deviceplugin.Held(st), SlackMiB: w.cfg.SlackMiB}
	limitPerGPU := map[string]int64{}
	for _, p := range podList {
		if p.Spec.NodeName != w.cfg.NodeName {
			continue
		}
		byUID[p.UID] = p
		pod := Pod{Key: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, UID: p.UID}
		if gpus := w.podGPUs(p, plans); gpus != nil {
			pod.Limits, pod.Containers, pod.Chunks = map[string]int64{}, map[string]int{}, chunksOf(p, gpus)
			for _, g := range gpus {
				pod.Limits[g.UUID] += g.MemoryMiB
				if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
					limitPerGPU[g.UUID] += g.MemoryMiB
				}
			}
			for _, c := range pod.Chunks {
				for _, d := range c.Devices {
					pod.Containers[d.UUID]++
				}
			}
		}
		in.Pods[p.UID] = pod
	}
	w.forget(byUID)
	usage, findings := Decide(in)
	w.observe(procs, index, usage, limitPerGPU, in.Pods, byUID)
	findings = append(findings, w.mountFindings(procs, in.Pods, byUID)...)
	findings = append(findings, w.unattributedFindings(index, residual)...)

	var acted []Finding
	for _, f := range findings {
		if w.act(ctx, f, byUID[f.Pod]) {
			acted = append(acted, f)
		}
	}
	return acted, nil
}

// forget drops what the watcher remembers of pods no longer on this node
// (byUID): what their plans gave them, that they were deleted; and every
// report older than ReportEvery (it would be fresh again anyway). Otherwise
// these maps grow with every pod UID for the agent's life.
func (w *Watcher) forget(byUID map[types.UID]*corev1.Pod) {
	now := w.cfg.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for uid := range w.confirmed {
		if _, ok := byUID[uid]; !ok {
			delete(w.confirmed, uid)
		}
	}
	for uid := range w.deleted {
		if _, ok := byUID[uid]; !ok {
			delete(w.deleted, uid)
		}
	}
	// By age only: a finding about a process of a pod not on this node
	// (unknown) is keyed by that pod's UID and must stay deduplicated.
	for key, last := range w.reported {
		if now.Sub(last) >= w.cfg.ReportEvery {
			delete(w.reported, key)
		}
	}
}

// podGPUs is what the node trusts a pod to hold: its GPUPlan binding, or
// the whole GPUs this node recorded for it (unplanned); nil otherwise (a
// pod whose annotation no plan confirms holds nothing here).
//
// The manager deletes a workload's plan when it finishes or is evicted,
// while its pods may still run (checkpointing, terminating). Such a pod
// keeps what was confirmed: what this watcher saw the plan give it, or,
// after an agent restart, its gpupack.io/devices when its GPU containers
// have started — they could only start through Allocate, which checked the
// annotation against the plan, and only the manager may change it since.
func (w *Watcher) podGPUs(p *corev1.Pod, plans []*v1alpha1.GPUPlan) []v1alpha1.GPUAssignment {
	gpus, planned, err := deviceplugin.Planned(p, plans, w.cfg.NodeName)
	switch {
	case err == nil && planned:
		w.mu.Lock()
		w.confirmed[p.UID] = gpus
		w.mu.Unlock()
		return gpus
	case err == nil && p.Annotations[deviceplugin.AnnotationAllocatedBy] == deviceplugin.AllocatedByValue(w.cfg.NodeName):
		devs, err := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices])
		if err != nil {
			return nil
		}
		out := make([]v1alpha1.GPUAssignment, len(devs))
		for i, d := range devs {
			out[i] = v1alpha1.GPUAssignment{UUID: d.UUID, MemoryMiB: d.MemoryMiB, Cores: 100, Exclusive: true}
		}
		return out
	case err == nil:
		return nil
	}
	if _, bound := deviceplugin.BindingOf(p, plans); !bound {
		w.mu.Lock()
		c, ok := w.confirmed[p.UID]
		w.mu.Unlock()
		if ok {
			return c
		}
		if startedGPUContainers(p) {
			if devs, err := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices]); err == nil {
				out := make([]v1alpha1.GPUAssignment, len(devs))
				for i, d := range devs {
					out[i] = v1alpha1.GPUAssignment{UUID: d.UUID, MemoryMiB: d.MemoryMiB}
				}
				return out
			}
		}
	}
	klog.V(2).InfoS("pod's devices not confirmed by a plan; it holds no GPU here", "pod", klog.KObj(p), "err", err)
	return nil
}

// startedGPUContainers reports whether every container of p that requests
// a gpupack GPU resource has started (and there is at least one): each went
// through the device plugin's Allocate.
func startedGPUContainers(p *corev1.Pod) bool {
	n := 0
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			c := &list[i]
			gpu := false
			for _, r := range []corev1.ResourceName{v1alpha1.ResourceVGPU, v1alpha1.ResourceNvidiaGPU} {
				_, lim := c.Resources.Limits[r]
				_, req := c.Resources.Requests[r]
				gpu = gpu || lim || req
			}
			if !gpu {
				continue
			}
			n++
			if !containerStarted(p, c.Name) {
				return false
			}
		}
	}
	return n > 0
}

func containerStarted(p *corev1.Pod, name string) bool {
	for _, ss := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, s := range ss {
			if s.Name == name && s.ContainerID != "" {
				return true
			}
		}
	}
	return false
}

// chunksOf splits a pod's GPUs among its containers (whichever resource
// they request); a pod whose counts do not add up is one chunk per GPU.
func chunksOf(p *corev1.Pod, gpus []v1alpha1.GPUAssignment) []deviceplugin.Chunk {
	for _, res := range []corev1.ResourceName{v1alpha1.ResourceVGPU, v1alpha1.ResourceNvidiaGPU} {
		if c, err := deviceplugin.ContainerChunks(p, res, gpus); err == nil && len(c) > 0 {
			return c
		}
	}
	out := make([]deviceplugin.Chunk, len(gpus))
	for i := range gpus {
		out[i] = deviceplugin.Chunk{PodUID: p.UID, Devices: gpus[i : i+1]}
	}
	return out
}

// processes lists the processes on every GPU with their pods: compute,
// graphics (Vulkan, EGL/OpenGL contexts) and MPS clients, one entry per PID
// (the most memory any list gives it: NVML reports a process's memory in
// each list it is in). residual is, per GPU whose memory info was read, the
// device's used memory that no process accounts for.
func (w *Watcher) processes() (out []Proc, index map[string]int, residual map[string]int64, err error) {
	n, ret := w.cfg.NVML.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nil, nil, fmt.Errorf("nvml DeviceGetCount: %v", ret)
	}
	index, residual = map[string]int{}, map[string]int64{}
	for i := 0; i < n; i++ {
		d, ret := w.cfg.NVML.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		index[uuid] = i
		ps, ok := runningProcesses(d, uuid)
		if !ok {
			continue
		}
		var known int64
		var unmeasured []int // indexes into out
		for _, p := range ps {
			used := int64(0)
			if p.UsedGpuMemory != notAvailable {
				used = int64(p.UsedGpuMemory >> 20)
				known += used
			} else {
				unmeasured = append(unmeasured, len(out))
			}
			uid, ok, err := w.cfg.Resolver.PodOf(p.Pid)
			if err != nil || !ok {
				uid = ""
			}
			out = append(out, Proc{PID: p.Pid, GPU: uuid, UsedMiB: used, Pod: uid})
		}
		if r, ok := w.attributeUnmeasured(d, uuid, out, unmeasured, known); ok {
			residual[uuid] = r
		}
	}
	return out, index, residual, nil
}

// runningProcesses merges NVML's three process lists of a device, one entry
// per PID. A list the device does not support (no MPS, no graphics) is
// skipped; false when none could be read.
func runningProcesses(d nvml.Device, uuid string) ([]nvml.ProcessInfo, bool) {
	var out []nvml.ProcessInfo
	at := map[uint32]int{}
	read := false
	for _, l := range []struct {
		name string
		get  func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"compute", d.GetComputeRunningProcesses},
		{"graphics", d.GetGraphicsRunningProcesses},
		{"mps", d.GetMPSComputeRunningProcesses},
	} {
		ps, ret := l.get()
		if ret != nvml.SUCCESS {
			if ret != nvml.ERROR_NOT_SUPPORTED {
				klog.V(2).InfoS("cannot list GPU processes", "gpu", uuid, "list", l.name, "ret", ret)
			}
			continue
		}
		read = true
		for _, p := range ps {
			i, seen := at[p.Pid]
			switch {
			case !seen:
				at[p.Pid] = len(out)
				out = append(out, p)
			case out[i].UsedGpuMemory == notAvailable || (p.UsedGpuMemory != notAvailable && p.UsedGpuMemory > out[i].UsedGpuMemory):
				out[i].UsedGpuMemory = p.UsedGpuMemory
			}
		}
	}
	return out, read
}

// mountFindings checks the mount table of each GPU process of a pod this
// node allocated (one with Limits): one finding per pod, naming its
// processes that see a foreign mount at the hook's paths. A process that
// exited, or gpupack-node's own side unknown (the pod's limits folder gone),
// is skipped; a table that cannot be parsed is a finding (fail closed).
func (w *Watcher) mountFindings(procs []Proc, pods map[types.UID]Pod, byUID map[types.UID]*corev1.Pod) []Finding {
	if w.cfg.Mounts == nil {
		return nil
	}
	self, err := w.cfg.Mounts.Self()
	if err != nil {
		klog.ErrorS(err, "mount check skipped: cannot read gpupack-node's own mount table")
		return nil
	}
	byPod := map[types.UID]*Finding{}
	checked := map[uint32]bool{}
	for _, p := range procs {
		pod, ok := pods[p.Pod]
		if p.Pod == "" || !ok || pod.Limits == nil || byUID[p.Pod] == nil || checked[p.PID] {
			continue
		}
		checked[p.PID] = true
		vs, err := w.cfg.Mounts.Check(self, p.PID, string(p.Pod), containerNames(byUID[p.Pod]))
		if err != nil {
			klog.V(2).InfoS("mount check skipped", "pod", pod.Key, "pid", p.PID, "err", err)
			continue
		}
		if len(vs) == 0 {
			continue
		}
		f := byPod[p.Pod]
		if f == nil {
			f = &Finding{Kind: metrics.KindMountOverride, Pod: p.Pod, Key: pod.Key, Detail: vs[0].String()}
			byPod[p.Pod] = f
		}
		f.PIDs = append(f.PIDs, p.PID)
	}
	out := make([]Finding, 0, len(byPod))
	for _, f := range byPod {
		sort.Slice(f.PIDs, func(i, j int) bool { return f.PIDs[i] < f.PIDs[j] })
		out = append(out, *f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	return out
}

func containerNames(p *corev1.Pod) []string {
	var out []string
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range list {
			out = append(out, c.Name)
		}
	}
	return out
}

// unattributedFindings reports GPUs whose memory in use exceeds what the
// processes account for by more than UnattributedMiB in this pass and the
// one before: memory no process list shows cannot be charged to a pod (or
// killed), so it is a finding on the node only.
func (w *Watcher) unattributedFindings(index map[string]int, residual map[string]int64) []Finding {
	var out []Finding
	w.mu.Lock()
	defer w.mu.Unlock()
	for uuid := range index {
		r, ok := residual[uuid]
		w.cfg.Metrics.GPUUnattributedMiB.WithLabelValues(uuid).Set(float64(max(r, 0)))
		if !ok || r <= w.cfg.UnattributedMiB {
			delete(w.unattributed, uuid)
			continue
		}
		w.unattributed[uuid]++
		if w.unattributed[uuid] >= 2 {
			out = append(out, Finding{Kind: metrics.KindUnattributed, GPU: uuid, UsedMiB: r, LimitMiB: w.cfg.UnattributedMiB})
		}
	}
	for uuid := range w.unattributed {
		if _, ok := index[uuid]; !ok {
			delete(w.unattributed, uuid)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GPU < out[j].GPU })
	return out
}

// attributeUnmeasured handles processes whose memory NVML reports as not
// available (MIG, WDDM, missing permission), which would otherwise count as
// 0 MiB and hide a bypass: the device's used memory minus what the other
// processes account for is charged to them when they all belong to one pod
// (to its first such process). Processes of several pods cannot be told
// apart; that is logged and left at 0. It returns the device memory no
// process accounts for (false when the device's memory info is unreadable
// or processes of several pods hold memory NVML does not report per process).
func (w *Watcher) attributeUnmeasured(d nvml.Device, uuid string, procs []Proc, unmeasured []int, known int64) (int64, bool) {
	mem, ret := d.GetMemoryInfo_v2()
	if ret != nvml.SUCCESS {
		if len(unmeasured) > 0 {
			klog.V(2).InfoS("per-process GPU memory not available and device memory unreadable", "gpu", uuid, "ret", ret)
		}
		return 0, false
	}
	residual := int64(mem.Used>>20) - known
	if residual <= 0 || len(unmeasured) == 0 {
		return residual, true
	}
	pod := procs[unmeasured[0]].Pod
	for _, i := range unmeasured {
		if procs[i].Pod != pod {
			// Not "unattributed" either: those processes hold it (MIG
			// slices bound each), NVML just does not say how much each.
			klog.InfoS("per-process GPU memory not available for processes of several pods; not attributed", "gpu", uuid, "unattributedMiB", residual)
			return 0, false
		}
	}
	procs[unmeasured[0]].UsedMiB = residual
	return 0, true
}

// observe sets the gauges of this pass, including hook-vs-NVML drift.
func (w *Watcher) observe(procs []Proc, index map[string]int, usage []Usage, limitPerGPU map[string]int64, pods map[types.UID]Pod, byUID map[types.UID]*corev1.Pod) {
	m := w.cfg.Metrics
	perGPU := map[string]int64{}
	for _, p := range procs {
		perGPU[p.GPU] += p.UsedMiB
	}
	for uuid := range index {
		m.GPUUsedMiB.WithLabelValues(uuid).Set(float64(perGPU[uuid]))
		m.GPULimitMiB.WithLabelValues(uuid).Set(float64(limitPerGPU[uuid]))
	}
	m.PodGPUUsedMiB.Reset()
	m.HookDriftMiB.Reset()
	hookUsed := w.hookUsage(pods, byUID, index)
	for _, u := range usage {
		pod, ok := pods[u.Pod]
		if !ok {
			continue
		}
		m.PodGPUUsedMiB.WithLabelValues(pod.Key.Namespace, pod.Key.Name, u.GPU).Set(float64(u.UsedMiB))
		if h, ok := hookUsed[u.Pod][u.GPU]; ok {
			m.HookDriftMiB.WithLabelValues(pod.Key.Namespace, pod.Key.Name, u.GPU).Set(float64(u.UsedMiB - h))
		}
	}
}

// hookUsage reads each planned pod's accounting files: pod → GPU → MiB the
// hook charged. Device ordinal i of a container is its i-th planned GPU in
// NVML index order (the order the device plugin exposes them in).
func (w *Watcher) hookUsage(pods map[types.UID]Pod, byUID map[types.UID]*corev1.Pod, index map[string]int) map[types.UID]map[string]int64 {
	out := map[types.UID]map[string]int64{}
	if w.cfg.CacheDir == "" {
		return out
	}
	for uid, pod := range pods {
		chunks := pod.Chunks
		for _, c := range chunks {
			path := deviceplugin.HostCacheFile(w.cfg.CacheDir, uid, c.Container)
			used, err := w.cfg.Hook.Used(path)
			if err != nil {
				switch {
				case errors.Is(err, os.ErrNotExist): // container not started yet, or no hook
				case errors.Is(err, ErrHostileFile):
					w.cfg.Metrics.HookAccountingErrors.Inc()
					w.hostile(byUID[uid], pod.Key, err)
				default:
					w.cfg.Metrics.HookAccountingErrors.Inc()
					klog.V(2).InfoS("cannot read hook accounting", "pod", pod.Key, "file", path, "err", err)
				}
				continue
			}
			if c.Container == "" {
				continue
			}
			devs := append([]v1alpha1.GPUAssignment(nil), c.Devices...)
			sort.SliceStable(devs, func(i, j int) bool { return index[devs[i].UUID] < index[devs[j].UUID] })
			if out[uid] == nil {
				out[uid] = map[string]int64{}
			}
			for i, d := range devs {
				if i < len(used) {
					out[uid][d.UUID] += int64(used[i] >> 20)
				}
			}
		}
	}
	return out
}

// act reports a finding (deduplicated) and enforces the policy: kill the
// offending processes (every pass while the finding stands), and under
// enforce delete the pod with grace period 0 (once; retried on failure).
// Processes of no pod on this node are reported, never killed. It returns
// whether the finding was reported or acted on in this pass.
func (w *Watcher) act(ctx context.Context, f Finding, pod *corev1.Pod) bool {
	key := string(f.Pod) + "|" + f.GPU + "|" + f.Kind + "|" + strconv.Itoa(len(f.PIDs))
	now := w.cfg.Now()
	enforce := w.cfg.Policy != PolicyWarn && pod != nil && f.Kind != metrics.KindUnknown && f.Kind != metrics.KindUnattributed
	w.mu.Lock()
	last, seen := w.reported[key]
	fresh := !seen || now.Sub(last) >= w.cfg.ReportEvery
	if fresh {
		w.reported[key] = now
	}
	del := enforce && w.cfg.Policy == PolicyEnforce && !w.deleted[f.Pod]
	if del {
		w.deleted[f.Pod] = true
	}
	w.mu.Unlock()

	if fresh {
		w.cfg.Metrics.BypassDetections.WithLabelValues(f.Kind).Inc()
		reason := map[string]string{metrics.KindOverLimit: ReasonOverLimit, metrics.KindUnassigned: ReasonUnassigned, metrics.KindUnknown: ReasonUnknown, metrics.KindUnattributed: ReasonUnattributed, metrics.KindMountOverride: ReasonMountOverride}[f.Kind]
		if w.cfg.Recorder != nil {
			if pod != nil {
				w.cfg.Recorder.Event(pod, corev1.EventTypeWarning, reason, f.Message())
			} else {
				w.cfg.Recorder.Event(w.nodeRef(), corev1.EventTypeWarning, reason, f.Message())
			}
		}
		klog.InfoS("GPU bypass detected", "kind", f.Kind, "pod", f.Key, "gpu", f.GPU, "usedMiB", f.UsedMiB, "limitMiB", f.LimitMiB, "pids", f.PIDs)
	}
	if !enforce {
		return fresh
	}
	var killed []uint32
	for _, pid := range f.PIDs {
		err := w.cfg.Killer.Kill(pid, func() bool {
			uid, ok, err := w.cfg.Resolver.PodOf(pid)
			return err == nil && ok && uid == f.Pod
		})
		if err != nil {
			klog.V(2).InfoS("bypass kill skipped", "pod", f.Key, "pid", pid, "err", err)
			continue
		}
		killed = append(killed, pid)
		w.cfg.Metrics.BypassActions.WithLabelValues("kill").Inc()
	}
	if del {
		uid := pod.UID
		err := w.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr(int64(0)),
			Preconditions:      &metav1.Preconditions{UID: &uid},
		})
		if err != nil && !apierrors.IsNotFound(err) {
			w.mu.Lock()
			delete(w.deleted, f.Pod) // try again next pass
			w.mu.Unlock()
			klog.ErrorS(err, "bypass pod delete failed", "pod", f.Key)
		} else if err == nil {
			w.cfg.Metrics.BypassActions.WithLabelValues("delete").Inc()
		}
	}
	if (len(killed) > 0 || del) && w.cfg.Recorder != nil {
		what := fmt.Sprintf("killed processes %v", killed)
		if del {
			what += " and deleted the pod (grace period 0)"
		}
		w.cfg.Recorder.Event(pod, corev1.EventTypeWarning, ReasonEnforced, fmt.Sprintf("gpupack-node %s (bypass policy %s): %s", what, w.cfg.Policy, f.Message()))
	}
	return fresh || len(killed) > 0 || del
}

func ptr[T any](v T) *T { return &v }

// hostile reports an accounting file the hook cannot have written (a FIFO,
// a symlink, a 4 TiB sparse file): a finding about the pod, once per
// ReportEvery; the file itself is never read.
func (w *Watcher) hostile(pod *corev1.Pod, key types.NamespacedName, err error) {
	k := "hostile|" + key.String()
	now := w.cfg.Now()
	w.mu.Lock()
	last, seen := w.reported[k]
	fresh := !seen || now.Sub(last) >= w.cfg.ReportEvery
	if fresh {
		w.reported[k] = now
	}
	w.mu.Unlock()
	if !fresh {
		return
	}
	klog.InfoS("hostile accounting file", "pod", key, "err", err)
	if w.cfg.Recorder != nil && pod != nil {
		w.cfg.Recorder.Event(pod, corev1.EventTypeWarning, ReasonHostileAccounting, "gpupack-node ignores this container's accounting file: "+err.Error())
	}
}

func (w *Watcher) nodeRef() *corev1.ObjectReference {
	// The kubelet uses the node name as the UID of node events.
	return &corev1.ObjectReference{Kind: "Node", Name: w.cfg.NodeName, UID: types.UID(w.cfg.NodeName)}
}
