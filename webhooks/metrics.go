package webhooks

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Results, the "result" label of gpupack_webhook_admissions_total.
// controller-runtime's own webhook metrics count requests by HTTP code,
// which is 200 for a denial too; these say what gpupack decided.
const (
	ResultAllowed = "allowed" // nothing to change
	ResultMutated = "mutated" // allowed with a patch
	ResultDenied  = "denied"  // refused with a message for the user
	ResultError   = "error"   // the request itself could not be read
)

var (
	admissions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpupack_webhook_admissions_total",
		Help: "Admission requests gpupack's webhooks answered, by webhook (mutating, validating), kind, operation and result (allowed, mutated, denied, error).",
	}, []string{"webhook", "kind", "operation", "result"})
	warnings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpupack_webhook_warnings_total",
		Help: "Warnings returned to clients (tenant hook env removed, GPU model unknown, ...), by kind.",
	}, []string{"kind"})
)

func init() {
	metrics.Registry.MustRegister(admissions, warnings)
}

// instrumented counts what a handler decided.
type instrumented struct {
	webhook, kind string
	h             admission.Handler
}

func (i instrumented) Handle(ctx context.Context, req admission.Request) admission.Response {
	resp := i.h.Handle(ctx, req)
	result := ResultAllowed
	switch {
	case !resp.Allowed && resp.Result != nil && resp.Result.Code != 0 && resp.Result.Code != http.StatusForbidden:
		result = ResultError // admission.Errored: 400/500; admission.Denied is 403
	case !resp.Allowed:
		result = ResultDenied
	case len(resp.Patches) > 0 || len(resp.Patch) > 0:
		result = ResultMutated
	}
	admissions.WithLabelValues(i.webhook, i.kind, string(req.Operation), result).Inc()
	if n := len(resp.Warnings); n > 0 {
		warnings.WithLabelValues(i.kind).Add(float64(n))
	}
	return resp
}
