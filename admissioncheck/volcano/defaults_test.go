package volcano_test

import (
	"testing"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/volcano"
)

// A Retry set by the bridge backs off like one set by the check itself
// (volcano cannot import admissioncheck: the check imports volcano).
func TestRetryDefaultsMatchTheCheck(t *testing.T) {
	if volcano.DefaultRetryMinSeconds != admissioncheck.DefaultRetryMinSeconds || volcano.DefaultRetryMaxSeconds != admissioncheck.DefaultRetryMaxSeconds {
		t.Fatalf("retry defaults %d–%d, the check's %d–%d", volcano.DefaultRetryMinSeconds, volcano.DefaultRetryMaxSeconds,
			admissioncheck.DefaultRetryMinSeconds, admissioncheck.DefaultRetryMaxSeconds)
	}
}
