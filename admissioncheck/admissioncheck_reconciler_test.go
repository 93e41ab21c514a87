package admissioncheck

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
)

func TestValidateParameters(t *testing.T) {
	cases := []struct {
		name    string
		spec    v1alpha1.GangFitParametersSpec
		wantErr string
	}{
		{name: "empty is the whole cluster with defaults"},
		{name: "required level among levels", spec: v1alpha1.GangFitParametersSpec{TopologyLevels: []string{"spine", "leaf"}, RequiredLevel: "leaf"}},
		{name: "hostname is always a level", spec: v1alpha1.GangFitParametersSpec{TopologyLevels: []string{"leaf"}, RequiredLevel: "kubernetes.io/hostname"}},
		{name: "required level without levels", spec: v1alpha1.GangFitParametersSpec{RequiredLevel: "rack"}},
		{name: "unknown required level", spec: v1alpha1.GangFitParametersSpec{TopologyLevels: []string{"leaf"}, RequiredLevel: "rack"}, wantErr: `requiredLevel "rack" is not one of`},
		{name: "repeated level", spec: v1alpha1.GangFitParametersSpec{TopologyLevels: []string{"leaf", "leaf"}}, wantErr: "repeats"},
		{name: "empty level", spec: v1alpha1.GangFitParametersSpec{TopologyLevels: []string{""}}, wantErr: "empty label key"},
		{name: "buffer above 90", spec: v1alpha1.GangFitParametersSpec{Buffer: v1alpha1.BufferSettings{BufferPercent: ptr.To[int32](95)}}, wantErr: "outside 0–90"},
		{name: "negative overhead", spec: v1alpha1.GangFitParametersSpec{Buffer: v1alpha1.BufferSettings{DriverOverheadMiB: ptr.To[int64](-1)}}, wantErr: "negative"},
		{name: "backoff max below min", spec: v1alpha1.GangFitParametersSpec{RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](10), MaxSeconds: ptr.To[int32](5)}}, wantErr: "retryBackoff"},
	}
	for _, tc := range cases {
		err := validateParameters(&v1alpha1.GangFitParameters{Spec: tc.spec})
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestSummarizeKeepsThreeReasons(t *testing.T) {
	got := summarize(fitResult("a", "b", "c", "d", "e"))
	if !strings.Contains(got, "a; b; c") || !strings.Contains(got, "(and 2 more)") || strings.Contains(got, "d;") {
		t.Errorf("summarize = %q", got)
	}
	if got := summarize(fitResult()); got == "" {
		t.Error("empty reasons give an empty message")
	}
	long := strings.Repeat("x", 5000)
	if got := truncate(long); len(got) != maxMessage || !strings.HasSuffix(got, "...") {
		t.Errorf("truncate gives %d bytes", len(got))
	}
}

func fitResult(reasons ...string) fit.Result { return fit.Result{Reasons: reasons} }
