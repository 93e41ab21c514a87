// Package metrics holds gpupack-node's Prometheus metrics. One Metrics value
// is shared by the inventory loop, the device plugin and the bypass watcher;
// tests give each its own registry.
package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Bypass detection kinds (label "kind").
const (
	KindOverLimit  = "over_limit" // a pod's processes use more than its planned MiB on a GPU
	KindUnassigned = "unassigned" // a pod uses a GPU its plan does not give it
	KindUnknown    = "unknown"    // a GPU process that belongs to no pod
	// KindUnattributed: device memory in use that no NVML process list
	// (compute, graphics, MPS) accounts for, beyond the driver's overhead.
	KindUnattributed = "unattributed"
	// KindMountOverride: a GPU process of a pod sees, at /etc/ld.so.preload,
	// /etc/gpupack/limits or the hook library, a mount that is not the bind
	// gpupack-node's Allocate returned (a pod mount over it, e.g. through an
	// image symlink the webhook's string compare cannot see).
	KindMountOverride = "mount_override"
)

// Metrics of one agent.
type Metrics struct {
	NVMLAvailable        prometheus.Gauge
	GPUHealthy           *prometheus.GaugeVec // gpu, index
	GPUAllocatableMiB    *prometheus.GaugeVec // gpu
	GPUUsedMiB           *prometheus.GaugeVec // gpu (NVML, all processes)
	GPULimitMiB          *prometheus.GaugeVec // gpu (sum of planned MiB of live pods)
	GPUUnattributedMiB   *prometheus.GaugeVec // gpu (used memory no process accounts for)
	NVLinkActiveLinks    *prometheus.GaugeVec // gpu
	GPUMIGEnabled        *prometheus.GaugeVec // gpu: SM limits do not apply
	InventoryPublishes   *prometheus.CounterVec
	PluginAllocations    *prometheus.CounterVec // resource, result
	BypassDetections     *prometheus.CounterVec // kind
	BypassActions        *prometheus.CounterVec // action = kill / delete
	ToolkitUnsafe        *prometheus.GaugeVec   // setting
	PodGPUUsedMiB        *prometheus.GaugeVec   // namespace, pod, gpu
	HookDriftMiB         *prometheus.GaugeVec   // namespace, pod, gpu
	HookAccountingErrors prometheus.Counter
}

// New creates the metrics and registers them with reg (nil: not registered).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		NVMLAvailable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpupack_node_nvml_available",
			Help: "1 when libnvidia-ml.so.1 loaded and initialised, 0 when the node has no usable NVIDIA driver."}),
		GPUHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_gpu_healthy",
			Help: "1 for a healthy GPU, 0 for one marked Unhealthy (lost, failing, or vanished)."}, []string{"gpu", "index"}),
		GPUAllocatableMiB: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_gpu_memory_allocatable_mib",
			Help: "Per-GPU allocatable memory: physical - driver overhead - safety buffer."}, []string{"gpu"}),
		GPUUsedMiB: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_gpu_memory_used_mib",
			Help: "Per-GPU memory used by processes (compute, graphics and MPS lists), as NVML reports it."}, []string{"gpu"}),
		GPULimitMiB: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_gpu_memory_limit_mib",
			Help: "Per-GPU sum of the memory planned for live pods (gpupack.io/devices)."}, []string{"gpu"}),
		GPUUnattributedMiB: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_gpu_memory_unattributed_mib",
			Help: "Per-GPU memory in use that no NVML process list (compute, graphics, MPS) accounts for: driver overhead, or a context NVML does not list."}, []string{"gpu"}),
		NVLinkActiveLinks: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_nvlink_active_links",
			Help: "NVLink links in state enabled, per GPU."}, []string{"gpu"}),
		GPUMIGEnabled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_gpu_mig_enabled",
			Help: "1 when the GPU is in MIG mode: its MIG slices bound the SMs, and SM limits (gpupack.io/gpu-cores, CUDA_DEVICE_SM_LIMIT) do not apply on it (the hook logs this and does not throttle); 0 otherwise."}, []string{"gpu"}),
		InventoryPublishes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpupack_node_inventory_patches_total",
			Help: "Node patches written by the inventory loop (what: metadata or status)."}, []string{"what"}),
		PluginAllocations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpupack_node_plugin_allocations_total",
			Help: "Device-plugin Allocate results per container (result: planned, unplanned, error)."}, []string{"resource", "result"}),
		BypassDetections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpupack_node_bypass_detections_total",
			Help: "GPU memory use the hook did not bound (kind: over_limit, unassigned, unknown, unattributed)."}, []string{"kind"}),
		BypassActions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpupack_node_bypass_actions_total",
			Help: "Enforcement by the bypass watcher (action: kill = a process SIGKILLed, delete = a pod deleted with grace 0)."}, []string{"action"}),
		ToolkitUnsafe: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_toolkit_unsafe",
			Help: "1 when the NVIDIA container toolkit setting named by setting lets a container pick its own GPUs (see docs/node-agent.md), else 0."}, []string{"setting"}),
		PodGPUUsedMiB: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_pod_gpu_memory_used_mib",
			Help: "Memory a pod's processes use on a GPU, as NVML reports it."}, []string{"namespace", "pod", "gpu"}),
		HookDriftMiB: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpupack_node_hook_drift_mib",
			Help: "NVML-reported minus hook-accounted memory of a pod on a GPU (context overhead plus anything the hook missed)."}, []string{"namespace", "pod", "gpu"}),
		HookAccountingErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "gpupack_node_hook_accounting_errors_total",
			Help: "Per-pod accounting files that could not be read."}),
	}
	if reg != nil {
		reg.MustRegister(m.NVMLAvailable, m.GPUHealthy, m.GPUAllocatableMiB, m.GPUUsedMiB, m.GPULimitMiB, m.GPUUnattributedMiB,
			m.NVLinkActiveLinks, m.GPUMIGEnabled, m.InventoryPublishes, m.PluginAllocations, m.BypassDetections,
			m.BypassActions, m.ToolkitUnsafe, m.PodGPUUsedMiB, m.HookDriftMiB, m.HookAccountingErrors)
	}
	return m
}

// Value reads one sample from a gatherer: the metric name and its labels
// (all of them). For tests and the demo.
func Value(g prometheus.Gatherer, name string, labels map[string]string) (float64, error) {
	fams, err := g.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !labelsMatch(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), nil
			case m.Gauge != nil:
				return m.Gauge.GetValue(), nil
			}
		}
	}
	return 0, fmt.Errorf("no sample %s%v", name, labels)
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	if len(m.GetLabel()) != len(want) {
		return false
	}
	for _, l := range m.GetLabel() {
		if want[l.GetName()] != l.GetValue() {
			return false
		}
	}
	return true
}
