package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the driver at a tiny size against the real control plane
// (the check in process) and checks that it measures both variants and
// reports every figure. It asserts no speed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	var out bytes.Buffer
	rep, err := Run(t, Config{Nodes: 16, RackSize: 4, Pods: 32, PodsRunning: true, Workloads: 6, Batches: 2, Workers: 4,
		Baseline: true, NoopCheck: true, Manager: "inprocess", BatchTimeout: 2 * time.Minute, EngineN: 10, Paced: 2, PaceInterval: 100 * time.Millisecond, KueueQPS: 500, KueueBurst: 1000}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"with gang-fit check", "Kueue alone", "Kueue + no-op check"} {
		if rep.Admitted[v] != 6 || !(rep.RatePerSecond[v] > 0) {
			t.Errorf("%s: %d admitted at %v/s, want 6 at a positive rate", v, rep.Admitted[v], rep.RatePerSecond[v])
		}
	}
	if !(rep.Ratio > 0) || math.IsInf(rep.Ratio, 0) {
		t.Errorf("ratio %v", rep.Ratio)
	}
	// Every Workload of the check's variant went QuotaReserved → Ready
	// (measured) through at least one decision each.
	if len(rep.QuotaToReady) != 6 || rep.Decisions < 6 || rep.CheckRejected != 0 {
		t.Errorf("QuotaReserved→Ready measured for %d Workloads, %d decisions, %d rejected; want 6, ≥ 6, 0", len(rep.QuotaToReady), rep.Decisions, rep.CheckRejected)
	}
	if len(rep.PacedToReady) != 2 {
		t.Errorf("paced QuotaReserved→Ready measured for %d Workloads, want 2", len(rep.PacedToReady))
	}
	if rep.EngineP99 <= 0 {
		t.Errorf("engine-only p99 %v", rep.EngineP99)
	}
	for _, want := range []string{"admitted/s with gang-fit check ÷ Kueue alone", "Kueue + no-op check ÷ Kueue alone", "no-op check (the driver's", "QuotaReserved→check Ready", "decision histogram", "engine only"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestRefusesOverfull: Workloads that cannot all fit the free GPUs would
// measure Retry loops, not decisions; the driver says so before starting.
func TestRefusesOverfull(t *testing.T) {
	_, err := Run(t, Config{Nodes: 4, Pods: 16, Workloads: 30}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "free") {
		t.Fatalf("err = %v, want a refusal naming the free GPUs", err)
	}
}

func TestParseHistogram(t *testing.T) {
	text := `# TYPE gpupack_gangfit_decision_duration_seconds histogram
gpupack_gangfit_decision_duration_seconds_bucket{le="0.001"} 90
gpupack_gangfit_decision_duration_seconds_bucket{le="0.002"} 99
gpupack_gangfit_decision_duration_seconds_bucket{le="0.004"} 100
gpupack_gangfit_decision_duration_seconds_bucket{le="+Inf"} 100
gpupack_gangfit_decision_duration_seconds_sum 0.12
gpupack_gangfit_decision_duration_seconds_count 100
gpupack_gangfit_decisions_total{result="ready"} 100
`
	h, err := parseHistogram(text, decisionMetric)
	if err != nil {
		t.Fatal(err)
	}
	if h.count != 100 || h.quantile(0.5) != 0.001 || h.quantile(0.99) != 0.002 || h.quantile(1) != 0.004 {
		t.Fatalf("count %d p50 %v p99 %v max %v", h.count, h.quantile(0.5), h.quantile(0.99), h.quantile(1))
	}
	// A later scrape minus an earlier one is the histogram in between.
	d := h.minus(hist{le: h.le, cum: []uint64{90, 90, 90}, count: 90})
	if d.count != 10 || d.quantile(0.5) != 0.002 {
		t.Fatalf("difference: count %d p50 %v", d.count, d.quantile(0.5))
	}
	if _, err := parseHistogram("other_metric 1\n", decisionMetric); err == nil {
		t.Fatal("a missing histogram must be an error, not zeros")
	}
	if !math.IsNaN((hist{}).quantile(0.99)) {
		t.Fatal("an empty histogram has no quantile")
	}
}

func TestParseCounter(t *testing.T) {
	text := `apiserver_request_total{code="201",component="apiserver",resource="gpuplans",scope="resource",subresource="",verb="POST",version="v1alpha1"} 3
apiserver_request_total{code="409",component="apiserver",resource="workloads",scope="resource",subresource="status",verb="PUT",version="v1beta2"} 2
apiserver_request_total{code="200",component="apiserver",resource="workloads",scope="resource",subresource="status",verb="PUT",version="v1beta2"} 5
apiserver_request_total_other{code="200"} 7
`
	c := parseCounter(text, "apiserver_request_total", "resource", "subresource", "verb", "code")
	want := counts{"gpuplans/POST/201": 3, "workloads/status/PUT/409": 2, "workloads/status/PUT/200": 5}
	if len(c) != len(want) {
		t.Fatalf("got %v, want %v", c, want)
	}
	for k, v := range want {
		if c[k] != v {
			t.Fatalf("got %v, want %v", c, want)
		}
	}
	if got := c.top(1, 1); got != "10.0 in all: workloads/status/PUT/200 5.00" {
		t.Fatalf("top: %q", got)
	}
}
