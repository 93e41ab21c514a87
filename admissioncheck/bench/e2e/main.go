// Command e2e is a load driver (not a timed test) for the gang-fit check end
// to end: the real kube-apiserver + etcd + Kueue (from _output/tools, started
// by test/framework), fake GPU nodes as Node objects carrying the inventory
// annotation and holder pods as objects bound to them (no kubelet), and
// gpupack's manager as its own process. In one run it creates Workloads in
// interleaved batches on two ClusterQueues over the same nodes — one with
// the gpupack.io/gang-fit check, one Kueue alone — and prints, from the
// apiserver's watch, admitted/s of each and their ratio, QuotaReserved→check
// Ready p50/p99, the manager's decision histogram, CPU and RSS, and the
// engine-only figures on the same cluster.
//
//	go run ./admissioncheck/bench/e2e -nodes 1250 -pods 5000 -workloads 500
//	go run ./admissioncheck/bench/e2e -nodes 12500 -pods 50000 -workloads 300 -batches 6
//
// Kueue runs with client QPS/burst 500/1000 (-kueue-qps/-kueue-burst): at its
// defaults (20/30) Kueue alone is capped near 4 Workloads/s and the ratio
// would hide the check's cost. The manager's client is not rate-limited
// (controller-runtime's default, qps -1). It prints figures; it never
// asserts a speed.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// benchTB lets the test framework run outside `go test` (as hack/demo does).
type benchTB struct {
	// Only the methods defined below are called; any other would panic.
	testing.TB
	dir      string
	failed   bool
	cleanups []func()
}

func (b *benchTB) Helper()                 {}
func (b *benchTB) Logf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (b *benchTB) Cleanup(f func())        { b.cleanups = append(b.cleanups, f) }
func (b *benchTB) Failed() bool            { return b.failed }
func (b *benchTB) TempDir() string         { return b.dir }
func (b *benchTB) Fatalf(f string, a ...any) {
	b.failed = true
	fmt.Fprintf(os.Stderr, "FAILED: "+f+"\n", a...)
	b.finish()
	os.Exit(1)
}

func (b *benchTB) finish() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
	if !b.failed {
		os.RemoveAll(b.dir)
	}
}

func main() {
	var c Config
	flag.IntVar(&c.Nodes, "nodes", 1250, "GPU nodes (8 H100 each)")
	flag.IntVar(&c.RackSize, "rack-size", 16, "nodes per rack (the topology level the check plans in)")
	flag.IntVar(&c.Pods, "pods", 5000, "holder pods (1 whole GPU each; they fill every other node)")
	flag.BoolVar(&c.PodsRunning, "pods-running", true, "also write each holder pod's status Running (one more write per pod)")
	flag.IntVar(&c.Workloads, "workloads", 500, "Workloads per variant, mixed 1×1, 8×1 and 2×8 GPUs")
	flag.IntVar(&c.Batches, "batches", 10, "interleaved batches (each variant gets workloads/batches per batch)")
	flag.IntVar(&c.Workers, "workers", 16, "concurrent creators")
	flag.BoolVar(&c.Baseline, "baseline", true, "also run the Kueue-alone variant (the ratio needs it)")
	flag.BoolVar(&c.NoopCheck, "noop-check", true, "also run Kueue with a no-op AdmissionCheck (Ready at once): what any check costs")
	flag.StringVar(&c.Manager, "manager", "", "gpupack-manager binary (empty: go build ./cmd/gpupack-manager; \"inprocess\": run the check in this process)")
	flag.DurationVar(&c.BatchTimeout, "batch-timeout", 5*time.Minute, "give up on a batch after this long")
	flag.IntVar(&c.EngineN, "engine-n", 300, "decisions for the engine-only figures (0: skip)")
	flag.IntVar(&c.Paced, "paced", 30, "after the batches, Workloads with the check created one at a time (latency without a queue; 0: skip)")
	flag.DurationVar(&c.PaceInterval, "pace-interval", time.Second, "interval between paced Workloads")
	flag.StringVar(&c.Pprof, "pprof", "", "directory: run the manager with --pprof-bind-address and save its CPU profiles over the measured batches, then heap and allocs (manager binary only)")
	flag.IntVar(&c.ProfileSeconds, "profile-seconds", 10, "length of each CPU profile with -pprof")
	managerArgs := flag.String("manager-args", "", "extra flags for the manager binary, space-separated (e.g. --gang-fit-workers=1)")
	var qps float64
	var burst int
	flag.Float64Var(&qps, "kueue-qps", 500, "Kueue's client QPS")
	flag.IntVar(&burst, "kueue-burst", 1000, "Kueue's client burst")
	flag.Parse()
	c.KueueQPS, c.KueueBurst = float32(qps), int32(burst)
	c.ManagerArgs = strings.Fields(*managerArgs)

	dir, err := os.MkdirTemp("", "gpupack-bench-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	t := &benchTB{dir: dir}
	if _, err := Run(t, c, os.Stdout); err != nil {
		t.Fatalf("%v", err)
	}
	t.finish()
}
