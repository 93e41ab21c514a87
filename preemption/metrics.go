package preemption

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	evictionToGone = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpupack_preemption_eviction_to_gone_seconds",
		Help:    "From the eviction being seen to the victim's last pod gone (phase Done).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1 s … ~2.3 h
	})
	checkpointOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpupack_preemption_checkpoint_outcomes_total",
		Help: "Per rank, how its checkpoint ended: Saved, TimedOut or Killed.",
	}, []string{"outcome"})
	phaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpupack_preemption_phase_duration_seconds",
		Help:    "Time spent in each preemption phase (observed when the phase is left).",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 14),
	}, []string{"phase"})
	evictionsHeld = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpupack_preemption_evictions_total",
		Help: "Eviction requests of opted-in pods answered by the webhook, by verdict (held, allowed).",
	}, []string{"verdict"})
)

func init() {
	metrics.Registry.MustRegister(evictionToGone, checkpointOutcomes, phaseSeconds, evictionsHeld)
}
