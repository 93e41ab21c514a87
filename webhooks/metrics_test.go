package webhooks

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// Every answer is counted by what gpupack decided, and warnings by kind.
func TestAdmissionMetrics(t *testing.T) {
	ctx := context.Background()
	h := handlers(t, mutation.Config{})
	count := func(webhook, op, result string) float64 {
		return testutil.ToFloat64(admissions.WithLabelValues(webhook, "Pod", op, result))
	}
	type step struct {
		path    string
		req     admission.Request
		webhook string
		op      string
		result  string
	}
	bad := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create, Object: kruntime.RawExtension{Raw: []byte("{not json")}}}
	edited := gpuPod("2Gi")
	steps := []step{
		{PathMutatePod, request(t, admissionv1.Create, gpuPod("10Gi"), nil), "mutating", "CREATE", ResultMutated},
		{PathMutatePod, request(t, admissionv1.Create, gpuPod("79Gi"), nil), "mutating", "CREATE", ResultDenied},
		{PathMutatePod, bad, "mutating", "CREATE", ResultError},
		{PathValidatePod, request(t, admissionv1.Update, gpuPod("1Gi"), gpuPod("1Gi")), "validating", "UPDATE", ResultAllowed},
		{PathValidatePod, request(t, admissionv1.Update, edited, gpuPod("1Gi")), "validating", "UPDATE", ResultDenied},
	}
	for _, s := range steps {
		before := count(s.webhook, s.op, s.result)
		h[s.path].Handle(ctx, s.req)
		if got := count(s.webhook, s.op, s.result) - before; got != 1 {
			t.Errorf("%s %s: %s count +%v, want +1", s.path, s.op, s.result, got)
		}
	}
	before := testutil.ToFloat64(warnings.WithLabelValues("Pod"))
	resp := h[PathMutatePod].Handle(ctx, request(t, admissionv1.Create, gpuPod("10Gi", corev1.EnvVar{Name: v1alpha1.EnvLDPreload, Value: "/x.so"}), nil))
	if got := testutil.ToFloat64(warnings.WithLabelValues("Pod")) - before; got != float64(len(resp.Warnings)) || got == 0 {
		t.Errorf("warnings +%v, response had %d", got, len(resp.Warnings))
	}
}
