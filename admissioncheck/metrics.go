package admissioncheck

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Decision results, the "result" label of gpupack_gangfit_decisions_total.
const (
	ResultReady    = "ready"
	ResultPending  = "pending_terminating"
	ResultRetry    = "retry"
	ResultRejected = "rejected"
	ResultNoGPU    = "no_gpu"
)

var (
	decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpupack_gangfit_decisions_total",
		Help: "Gang-fit decisions by result (ready, pending_terminating, retry, rejected, no_gpu).",
	}, []string{"result"})
	decisionSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpupack_gangfit_decision_duration_seconds",
		Help:    "Time to build the cluster model and decide one workload.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
	})
	allocatableMiB = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpupack_gpu_allocatable_mib",
		Help: "Allocatable GPU memory (physical − overhead − buffer) summed per GPU model.",
	}, []string{"model"})
	usedMiB = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpupack_gpu_used_mib",
		Help: "GPU memory held by pods and plans, summed per GPU model.",
	}, []string{"model"})
	plansActive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpupack_gpuplans_active",
		Help: "GPUPlans that reserve capacity.",
	})
	// Fragmentation, per domain of the widest topology level and GPU model.
	fragLabels = []string{"level", "domain", "model"}
	freeWhole  = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpupack_gpu_free_whole",
		Help: "Healthy GPUs of Ready nodes with no holder, per topology domain and GPU model.",
	}, fragLabels)
	freeMiB = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpupack_gpu_free_mib",
		Help: "Free allocatable GPU memory, per topology domain and GPU model.",
	}, fragLabels)
	largestPods = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpupack_gang_largest_fit_pods",
		Help: "Pods of one GPU each that fit now in the domain, by size: whole GPUs, or 10/20/40 GiB fractions.",
	}, []string{"level", "domain", "model", "size"})
	fragmentation = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpupack_gpu_fragmentation_index",
		Help: "Share of free GPU memory not on whole free GPUs (0: none scattered; towards 1: all in slivers).",
	}, fragLabels)
)

func init() {
	metrics.Registry.MustRegister(decisions, decisionSeconds, allocatableMiB, usedMiB, plansActive, freeWhole, freeMiB, largestPods, fragmentation)
}
