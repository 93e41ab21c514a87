package placement

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "gpupack_placement_decisions_total",
	Help: "Placement ungater steps by result: Placed, WaitingForSlot, NoPlanSlot, PlanNotFound (the Event reasons).",
}, []string{"result"})

func init() {
	metrics.Registry.MustRegister(decisions)
}
