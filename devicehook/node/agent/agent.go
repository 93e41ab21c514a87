// Package agent wires gpupack-node together: NVML inventory publishing,
// the device plugins, the hook installer and the bypass watcher. Each part
// lives in its own package and is tested there; this package only runs
// them, and offers Publish so other tests can run one inventory pass.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/bypass"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/installer"
	"github.com/gpupack/gpupack/devicehook/node/inventory"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
	"github.com/gpupack/gpupack/devicehook/node/toolkit"
	"github.com/gpupack/gpupack/flavors"
)

// Options configure the agent (flags in Main).
type Options struct {
	NodeName    string
	Buffer      flavors.Buffer
	SlotsPerGPU int

	// DevicePlugin serves gpupack.io/vgpu; WholeGPU also serves
	// nvidia.com/gpu (one slot per GPU), replacing NVIDIA's plugin.
	DevicePlugin bool
	WholeGPU     bool
	PluginDir    string

	// HookSource is the library inside the agent image; "" skips installing.
	HookSource string
	HookDir    string // host folder GPU containers mount
	// PluginMounts makes Allocate mount the hook folder, ld.so.preload, the
	// container's accounting dir and its limits file (the default: the
	// webhook adds no hostPath volume to tenant pods). false only for an old
	// webhook that still mounts them (both at once would clash).
	PluginMounts bool
	CacheDir     string // host root of per-pod accounting dirs
	// AccountingTmpfs mounts a small tmpfs on each container's accounting
	// dir (the default; the folder is the tenant's, read-write): false
	// leaves it an unbounded folder on the host disk.
	AccountingTmpfs bool
	LimitsDir       string // host root of the trusted limits files
	// ContextReserve is the per-model GPUPACK_CONTEXT_RESERVE table.
	ContextReserve deviceplugin.ContextReserve
	// VisibleDevicesEnv also sets NVIDIA_VISIBLE_DEVICES in Allocate (a
	// runtime without CDI); devices are otherwise given by CDI name only.
	VisibleDevicesEnv bool
	// ToolkitConfig is the NVIDIA container toolkit's config.toml checked
	// at start; "" skips the check.
	ToolkitConfig string
	Version       string

	ProcRoot     string
	BypassPolicy bypass.Policy
	// Killer ends processes under policies kill/enforce; nil signals them
	// (tests pass a fake: NVML's PIDs are host PIDs).
	Killer         bypass.Killer
	BypassInterval time.Duration
	SlackMiB       int64 // per container, over its plan (CUDA contexts)
	// UnattributedMiB per GPU: device memory no NVML process list accounts
	// for that is tolerated (driver overhead) before a node finding.
	UnattributedMiB int64
	PublishInterval time.Duration
	NVMLRetry       time.Duration
	MetricsAddr     string // "" disables the metrics endpoint

	// Fabric reads fabric info; nil uses the versioned call (real NVML).
	Fabric inventory.FabricReader
	// Dynamic reads GPUPlans (the device plugin and the watcher trust plan
	// bindings, not pod annotations). Without it no pod is planned.
	Dynamic dynamic.Interface
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		Buffer: flavors.DefaultBuffer(), SlotsPerGPU: 10,
		DevicePlugin: true, PluginDir: "/var/lib/kubelet/device-plugins",
		HookDir: v1alpha1.DefaultHookHostPath, CacheDir: v1alpha1.DefaultSharedCacheDir, AccountingTmpfs: true, Version: "dev",
		PluginMounts: true, LimitsDir: deviceplugin.DefaultLimitsDir, ContextReserve: deviceplugin.DefaultContextReserve(),
		ToolkitConfig: "/etc/nvidia-container-runtime/config.toml",
		ProcRoot:      "/proc", BypassPolicy: bypass.PolicyEnforce, BypassInterval: 5 * time.Second, SlackMiB: 512, UnattributedMiB: 1024,
		PublishInterval: 30 * time.Second, NVMLRetry: time.Minute, MetricsAddr: ":9400",
	}
}

// Agent is one gpupack-node.
type Agent struct {
	opts     Options
	lib      nvml.Interface
	client   kubernetes.Interface
	reg      *prometheus.Registry
	Metrics  *metrics.Metrics
	recorder record.EventRecorder
	pub      *inventory.Publisher

	mu      sync.Mutex
	plugins []*deviceplugin.Plugin
	mig     map[string]bool // GPUs seen in MIG mode (logged once per change)
	pods    deviceplugin.PodLister
	plans   deviceplugin.PlanLister
}

// New creates an agent. lib is nvml.New() in production and a go-nvml mock
// in tests.
func New(opts Options, lib nvml.Interface, client kubernetes.Interface) *Agent {
	reg := prometheus.NewRegistry()
	a := &Agent{opts: opts, lib: lib, client: client, reg: reg, Metrics: metrics.New(reg)}
	a.pub = &inventory.Publisher{Client: client, NodeName: opts.NodeName, Buffer: opts.Buffer, SlotsPerGPU: opts.SlotsPerGPU}
	return a
}

// Registry exposes the agent's metrics (tests read them).
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// Publish runs one inventory pass for nodeName against client: read NVML
// through lib, merge with what the Node carries, patch what differs. This is
// the function other parts' tests call to make a node publish its GPUs.
func Publish(ctx context.Context, client kubernetes.Interface, lib nvml.Interface, nodeName string, buf flavors.Buffer, slotsPerGPU int) (inventory.Result, error) {
	now, err := inventory.Read(lib, inventory.ReadOptions{})
	if err != nil {
		return inventory.Result{}, err
	}
	p := &inventory.Publisher{Client: client, NodeName: nodeName, Buffer: buf, SlotsPerGPU: slotsPerGPU}
	return p.Publish(ctx, now)
}

// PublishOnce is one full pass of the agent: inventory, plugin device
// lists, GPU metrics, and Events for health changes.
func (a *Agent) PublishOnce(ctx context.Context) (inventory.Result, error) {
	now, err := inventory.Read(a.lib, inventory.ReadOptions{Fabric: a.opts.Fabric})
	if err != nil {
		return inventory.Result{}, err
	}
	res, err := a.pub.Publish(ctx, now)
	if err != nil {
		return res, err
	}
	if res.PreviousMalformed != nil {
		klog.ErrorS(res.PreviousMalformed, "replaced a malformed inventory annotation", "node", a.opts.NodeName)
	}
	if res.MetadataPatched {
		a.Metrics.InventoryPublishes.WithLabelValues("metadata").Inc()
	}
	if res.StatusPatched {
		a.Metrics.InventoryPublishes.WithLabelValues("status").Inc()
	}
	for _, tr := range res.Transitions {
		reason, typ := "GPUUnhealthy", corev1.EventTypeWarning
		if tr.To == v1alpha1.GPUHealthy {
			reason, typ = "GPUHealthy", corev1.EventTypeNormal
		}
		klog.InfoS("GPU health changed", "node", a.opts.NodeName, "gpu", tr.UUID, "index", tr.Index, "from", tr.From, "to", tr.To, "reason", tr.Reason)
		if a.recorder != nil {
			a.recorder.Eventf(a.nodeRef(), typ, reason, "GPU %d (%s) is %s: %s", tr.Index, tr.UUID, tr.To, tr.Reason)
		}
	}
	for _, g := range res.State.GPUs {
		h := 0.0
		if g.Healthy() {
			h = 1
		}
		a.Metrics.GPUHealthy.WithLabelValues(g.UUID, strconv.Itoa(g.Index)).Set(h)
		a.Metrics.GPUAllocatableMiB.WithLabelValues(g.UUID).Set(float64(a.opts.Buffer.Allocatable(g.MemoryMiB)))
	}
	for _, g := range now {
		a.Metrics.NVLinkActiveLinks.WithLabelValues(g.UUID).Set(float64(g.ActiveLinks))
		mig := 0.0
		if g.MIG {
			mig = 1
		}
		a.Metrics.GPUMIGEnabled.WithLabelValues(g.UUID).Set(mig)
		a.mu.Lock()
		changed := a.mig[g.UUID] != g.MIG
		if a.mig == nil {
			a.mig = map[string]bool{}
		}
		a.mig[g.UUID] = g.MIG
		a.mu.Unlock()
		if changed && g.MIG {
			klog.InfoS("GPU is in MIG mode: SM limits (gpupack.io/gpu-cores, CUDA_DEVICE_SM_LIMIT) do not apply on it; the MIG slice bounds the SMs and the hook does not throttle",
				"node", a.opts.NodeName, "gpu", g.UUID, "index", g.Index)
		}
	}
	a.mu.Lock()
	for _, p := range a.plugins {
		p.SetGPUs(res.State.GPUs)
	}
	a.mu.Unlock()
	return res, nil
}

func (a *Agent) nodeRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: a.opts.NodeName, UID: types.UID(a.opts.NodeName)}
}

// Run runs every part until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if a.opts.NodeName == "" {
		return errors.New("gpupack-node: node name is empty (set --node-name or NODE_NAME from the downward API)")
	}
	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	defer bc.Shutdown()
	a.recorder = bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "gpupack-node", Host: a.opts.NodeName})

	a.checkToolkit(ctx)

	if a.opts.MetricsAddr != "" {
		srv := &http.Server{Addr: a.opts.MetricsAddr, Handler: promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "metrics server stopped")
			}
		}()
		defer srv.Close()
	}
	if !a.waitForNVML(ctx) {
		return nil
	}
	defer a.lib.Shutdown()

	if a.opts.HookSource != "" {
		res, err := installer.Install(a.opts.HookSource, a.opts.HookDir, a.opts.Version)
		if err != nil {
			klog.ErrorS(err, "hook library not installed; GPU containers will run without the hook")
			a.recorder.Eventf(a.nodeRef(), corev1.EventTypeWarning, "HookInstallFailed", "%v", err)
		} else {
			klog.InfoS("hook library installed", "dir", a.opts.HookDir, "stamp", res.Stamp, "changed", res.Changed)
		}
	}

	// Pods on this node (device plugin matching, bypass, accounting GC).
	pf := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.opts.NodeName).String()
	}))
	podLister := pf.Core().V1().Pods().Lister()
	a.pods = deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return podLister.List(labels.Everything()) })
	a.plans = deviceplugin.PlanListerFunc(func(string) ([]*v1alpha1.GPUPlan, error) { return nil, nil })
	if a.opts.Dynamic != nil {
		a.plans = WatchPlans(ctx, a.opts.Dynamic)
	} else {
		klog.InfoS("no GPUPlan client: every planned pod will be refused", "node", a.opts.NodeName)
	}
	// This node alone, to republish as soon as the kubelet resets capacity.
	nf := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.opts.NodeName).String()
	}))
	trigger := make(chan struct{}, 1)
	kick := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	_, _ = nf.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, _ any) { kick() },
	})
	pf.Start(ctx.Done())
	nf.Start(ctx.Done())
	pf.WaitForCacheSync(ctx.Done())
	nf.WaitForCacheSync(ctx.Done())

	var wg sync.WaitGroup
	if a.opts.DevicePlugin {
		a.startPlugins(ctx, &wg)
	}
	if _, err := a.PublishOnce(ctx); err != nil {
		klog.ErrorS(err, "first inventory publish failed")
	}
	// What Allocate binds into GPU containers is verified in each
	// container's own mount table (a pod mount over it through an image
	// symlink passes the webhook's string compare).
	var mounts *bypass.MountCheck
	if a.opts.PluginMounts {
		mounts = &bypass.MountCheck{ProcRoot: a.opts.ProcRoot, LimitsDir: a.opts.LimitsDir, HookDir: a.opts.HookDir, Preload: true}
	}
	w := bypass.New(bypass.Config{
		NodeName: a.opts.NodeName, NVML: a.lib, Resolver: bypass.ProcResolver{Root: a.opts.ProcRoot}, Mounts: mounts,
		Pods: a.pods, Plans: a.plans, Client: a.client, Killer: a.opts.Killer, Recorder: a.recorder, Policy: a.opts.BypassPolicy,
		SlackMiB: a.opts.SlackMiB, UnattributedMiB: a.opts.UnattributedMiB, CacheDir: a.opts.CacheDir, Metrics: a.Metrics, Interval: a.opts.BypassInterval,
	})
	wg.Add(1)
	go func() { defer wg.Done(); w.Run(ctx) }()

	t := time.NewTicker(a.opts.PublishInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-t.C:
			a.gcAccounting()
		case <-trigger:
		}
		if _, err := a.PublishOnce(ctx); err != nil {
			klog.ErrorS(err, "inventory publish failed")
		}
	}
}

// waitForNVML initialises NVML, retrying while the driver is absent. It
// returns false when ctx ended first. A node without libnvidia-ml says so
// (log, metric, node Event) and publishes nothing.
func (a *Agent) waitForNVML(ctx context.Context) bool {
	announced := false
	for {
		err := inventory.Init(a.lib)
		if err == nil {
			a.Metrics.NVMLAvailable.Set(1)
			return true
		}
		a.Metrics.NVMLAvailable.Set(0)
		if !announced {
			klog.ErrorS(err, "NVML unavailable; publishing nothing for this node until it loads", "node", a.opts.NodeName, "retry", a.opts.NVMLRetry)
			a.recorder.Eventf(a.nodeRef(), corev1.EventTypeWarning, "NVMLUnavailable", "gpupack-node: %v", err)
			announced = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(a.opts.NVMLRetry):
		}
	}
}

func (a *Agent) startPlugins(ctx context.Context, wg *sync.WaitGroup) {
	cfgs := []deviceplugin.Config{{
		ResourceName: v1alpha1.ResourceVGPU, SlotsPerGPU: a.opts.SlotsPerGPU, SocketName: "gpupack-vgpu.sock",
		MemoryLimits: true, Unplanned: deviceplugin.UnplannedReject,
	}}
	if a.opts.WholeGPU {
		cfgs = append(cfgs, deviceplugin.Config{
			ResourceName: v1alpha1.ResourceNvidiaGPU, SlotsPerGPU: 1, SocketName: "gpupack-gpu.sock",
			Unplanned: deviceplugin.UnplannedFreeGPUs,
		})
	}
	// One ledger for the node's plugins: their resources share the GPUs.
	ledger := deviceplugin.NewLedger()
	var fresh func(context.Context) ([]*v1alpha1.GPUPlan, error)
	if a.opts.Dynamic != nil {
		fresh = func(ctx context.Context) ([]*v1alpha1.GPUPlan, error) { return ListPlans(ctx, a.opts.Dynamic) }
	}
	for _, c := range cfgs {
		c.NodeName, c.PluginDir, c.Pods, c.Plans, c.Metrics = a.opts.NodeName, a.opts.PluginDir, a.pods, a.plans, a.Metrics
		c.Ledger, c.FreshPlans = ledger, fresh
		c.Client, c.Recorder, c.AllocatableMiB = a.client, a.recorder, a.opts.Buffer.Allocatable
		c.ContextReserve, c.VisibleDevicesEnv, c.LimitsDir = a.opts.ContextReserve, a.opts.VisibleDevicesEnv, a.opts.LimitsDir
		if a.opts.PluginMounts {
			c.HookDir, c.MountPreload, c.CacheHostDir = a.opts.HookDir, true, a.opts.CacheDir
			if a.opts.AccountingTmpfs {
				c.AccountingRegionBytes = bypass.RegionSize
			}
		}
		p := deviceplugin.New(c)
		a.mu.Lock()
		a.plugins = append(a.plugins, p)
		a.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Run(ctx); err != nil {
				klog.ErrorS(err, "device plugin stopped", "resource", c.ResourceName)
			}
		}()
	}
}

// Toolkit node condition (type, reasons).
const (
	ConditionToolkitSafe = "GPUPackToolkitSafe"
	ReasonToolkitSafe    = "CDIOnly"
	ReasonToolkitUnsafe  = "ToolkitUnsafe"
)

// checkToolkit checks the NVIDIA container toolkit settings once at start
// and reports them: the gpupack_node_toolkit_unsafe metric per setting, a
// GPUPackToolkitSafe condition on the Node, and a Warning Event when unsafe.
// It never stops the agent (a node without the toolkit still publishes).
func (a *Agent) checkToolkit(ctx context.Context) toolkit.Result {
	if a.opts.ToolkitConfig == "" {
		return toolkit.Result{}
	}
	r := toolkit.CheckFile(a.opts.ToolkitConfig, toolkit.CDISpecDirs)
	unsafe := map[string]bool{}
	for _, f := range r.Findings {
		unsafe[f.Setting] = true
	}
	for _, s := range toolkit.Settings {
		v := 0.0
		if unsafe[s] {
			v = 1
		}
		a.Metrics.ToolkitUnsafe.WithLabelValues(s).Set(v)
	}
	cond := corev1.NodeCondition{Type: ConditionToolkitSafe, Status: corev1.ConditionTrue, Reason: ReasonToolkitSafe,
		Message: r.Message(), LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now()}
	if !r.Safe() {
		cond.Status, cond.Reason = corev1.ConditionFalse, ReasonToolkitUnsafe
		klog.ErrorS(nil, "NVIDIA container toolkit settings let containers choose their own GPUs", "node", a.opts.NodeName, "findings", r.Message())
		if a.recorder != nil {
			a.recorder.Eventf(a.nodeRef(), corev1.EventTypeWarning, ReasonToolkitUnsafe, "%s", r.Message())
		}
	}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.opts.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "gpupack-node"}, "status"); err != nil {
		klog.ErrorS(err, "cannot set the toolkit condition", "node", a.opts.NodeName)
	}
	return r
}

// WatchPlans watches every GPUPlan and returns a lister over the typed
// cache (the agent's, and for anything else that drives a device plugin
// against an API server, e.g. the demo).
func WatchPlans(ctx context.Context, dyn dynamic.Interface) deviceplugin.PlanLister {
	gvr := v1alpha1.GroupVersion.WithResource("gpuplans")
	inf := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0).ForResource(gvr).Informer()
	_ = inf.SetTransform(func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil // a tombstone
		}
		plan := &v1alpha1.GPUPlan{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, plan); err != nil {
			klog.ErrorS(err, "unreadable GPUPlan ignored", "plan", u.GetNamespace()+"/"+u.GetName())
			return &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace()}}, nil
		}
		return plan, nil
	})
	go inf.Run(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	return deviceplugin.PlanListerFunc(func(ns string) ([]*v1alpha1.GPUPlan, error) {
		var out []*v1alpha1.GPUPlan
		for _, o := range inf.GetStore().List() {
			if p, ok := o.(*v1alpha1.GPUPlan); ok && (ns == "" || p.Namespace == ns) {
				out = append(out, p)
			}
		}
		return out, nil
	})
}

// ListPlans reads every GPUPlan from the API server (a quorum read, not
// the informer's cache): what the device plugin checks an unplanned
// allocation against once it is recorded.
func ListPlans(ctx context.Context, dyn dynamic.Interface) ([]*v1alpha1.GPUPlan, error) {
	list, err := dyn.Resource(v1alpha1.GroupVersion.WithResource("gpuplans")).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*v1alpha1.GPUPlan, 0, len(list.Items))
	for i := range list.Items {
		plan := &v1alpha1.GPUPlan{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, plan); err != nil {
			return nil, fmt.Errorf("GPUPlan %s/%s: %w", list.Items[i].GetNamespace(), list.Items[i].GetName(), err)
		}
		out = append(out, plan)
	}
	return out, nil
}

// gcAccounting removes accounting and limits dirs of pods no longer on this
// node, an hour after their last write (a pod's processes may still be
// exiting); an accounting dir's tmpfs is unmounted first. The device
// plugins forget the Events they told pods that are gone.
func (a *Agent) gcAccounting() {
	if a.pods == nil {
		return
	}
	pods, err := a.pods.List()
	if err != nil {
		return
	}
	live := map[string]bool{}
	liveUIDs := map[types.UID]bool{}
	for _, p := range pods {
		live[string(p.UID)] = true
		liveUIDs[p.UID] = true
	}
	a.mu.Lock()
	for _, p := range a.plugins {
		p.Forget(liveUIDs)
	}
	a.mu.Unlock()
	for _, root := range []string{a.opts.CacheDir, a.opts.LimitsDir} {
		if root == "" {
			continue
		}
		ents, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() || live[e.Name()] {
				continue
			}
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Hour {
				var err error
				if root == a.opts.CacheDir {
					err = deviceplugin.RemovePodAccounting(root, types.UID(e.Name()))
				} else {
					err = os.RemoveAll(filepath.Join(root, e.Name()))
				}
				if err != nil {
					klog.ErrorS(err, "accounting dir GC")
				}
			}
		}
	}
}
