// Command decide is a load driver (not a test) for the gang-fit decision
// in process: it builds a cluster of fake GPU nodes and holder pods and
// times N decisions of a 1×1 / 8×1 / 2×8 whole-GPU mix, the way the
// controller makes them.
//
//	go run ./admissioncheck/bench/decide -nodes 1250 -pods 5000 -n 500 -mode cache
//	go run ./admissioncheck/bench/decide -nodes 1250 -pods 5000 -n 50  -mode list
//
// -mode cache: the long-lived model (gpucache): fed once, each decision
// reads it under the lock, fits, assumes the plan and forgets it again.
// -mode list: what the controller did before: each decision copies every
// node and pod (as a LIST from the informer cache does), applies the usage
// rule, builds the model and fits. Both print the decision p50/p99/max,
// the engine-only p50/p99 (Fit on a built model), bytes and allocations
// per decision, and the process's RSS.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/gpucache"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/admissioncheck/usage"
	"github.com/gpupack/gpupack/flavors"
)

func main() {
	nNodes := flag.Int("nodes", 1250, "GPU nodes (8 H100 each, 16 per rack)")
	nPods := flag.Int("pods", 5000, "running holder pods (1 whole GPU each)")
	n := flag.Int("n", 300, "decisions")
	mode := flag.String("mode", "cache", "cache or list")
	flag.Parse()

	nodes, pods := cluster(*nNodes, *nPods)
	buf := flavors.DefaultBuffer()
	gangs := []fit.Gang{gang(1, 1), gang(8, 1), gang(2, 8)}
	opts := fit.Options{Levels: []string{"rack"}}

	var decide func(i int) fit.Result
	var model func() *fit.Model
	switch *mode {
	case "cache":
		c := gpucache.New(nil)
		t0 := time.Now()
		for i := range nodes {
			c.UpsertNode(&nodes[i])
		}
		for i := range pods {
			c.UpsertPod(&pods[i])
		}
		c.Read(buf, func(*gpucache.Snapshot) {}) // first build
		fmt.Printf("cache fed and built in %v\n", time.Since(t0).Round(time.Millisecond))
		decide = func(i int) fit.Result {
			var res fit.Result
			c.Read(buf, func(s *gpucache.Snapshot) {
				res = s.Model.Fit(gangs[i%len(gangs)], opts)
				if res.Fits {
					p := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint("wl-", i)}, Spec: inventory.PlanFromResult(res)}
					p.Spec.WorkloadUID = types.UID(fmt.Sprint("uid-", i))
					s.Assume(p)
				}
			})
			if res.Fits {
				c.Forget(types.NamespacedName{Namespace: "ns", Name: fmt.Sprint("wl-", i)}, types.UID(fmt.Sprint("uid-", i)))
			}
			return res
		}
		model = func() *fit.Model {
			var m *fit.Model
			c.Read(buf, func(s *gpucache.Snapshot) { m = s.Model.Clone() })
			return m
		}
	case "list":
		build := func() *fit.Model {
			ns := make([]corev1.Node, len(nodes))
			for i := range nodes {
				nodes[i].DeepCopyInto(&ns[i])
			}
			ps := make([]corev1.Pod, len(pods))
			for i := range pods {
				pods[i].DeepCopyInto(&ps[i])
			}
			var fns []fit.Node
			for i := range ns {
				fn, err := inventory.NodeFromObject(&ns[i], buf, "")
				if err == nil {
					fns = append(fns, fn)
				}
			}
			m := fit.NewModel(fns)
			hs, _ := usage.Ledger(ps, nil)
			for _, h := range hs {
				for _, u := range h.GPUs {
					_ = m.Use(u)
				}
			}
			return m
		}
		decide = func(i int) fit.Result { return build().Fit(gangs[i%len(gangs)], opts) }
		model = build
	default:
		fmt.Fprintln(os.Stderr, "-mode: cache or list")
		os.Exit(2)
	}

	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	ds := make([]time.Duration, *n)
	fits := 0
	for i := range ds {
		t0 := time.Now()
		if decide(i).Fits {
			fits++
		}
		ds[i] = time.Since(t0)
	}
	runtime.ReadMemStats(&m1)
	runtime.GC()
	var live runtime.MemStats
	runtime.ReadMemStats(&live)
	liveRSS := rss()
	slices.Sort(ds)
	q := func(ds []time.Duration, p float64) time.Duration { return ds[int(p*float64(len(ds)-1))] }
	fmt.Printf("mode=%s nodes=%d gpus=%d holder pods=%d decisions=%d (fit %d)\n", *mode, *nNodes, *nNodes*8, *nPods, *n, fits)
	fmt.Printf("decision: p50=%v p99=%v max=%v; per decision %.1f MB, %d allocs\n",
		q(ds, 0.5), q(ds, 0.99), ds[len(ds)-1], float64(m1.TotalAlloc-m0.TotalAlloc)/float64(*n)/1e6, (m1.Mallocs-m0.Mallocs)/uint64(*n))

	em := model()
	es := make([]time.Duration, *n)
	for i := range es {
		t0 := time.Now()
		em.Fit(gangs[i%len(gangs)], opts)
		es[i] = time.Since(t0)
	}
	slices.Sort(es)
	fmt.Printf("engine only: p50=%v p99=%v\n", q(es, 0.5), q(es, 0.99))
	fmt.Printf("after the decisions (objects, model and cache live): heap in use %.0f MB, RSS %s\n", float64(live.HeapInuse)/1e6, liveRSS)
}

func gang(pods, gpus int) fit.Gang {
	return fit.Gang{PodSets: []fit.PodSet{{Name: "main", Count: pods, GPUsPerPod: gpus}}}
}

// cluster: nodes of 8 H100s, 16 to a rack; holder pods fill the first GPUs
// of every other node.
func cluster(nNodes, nPods int) ([]corev1.Node, []corev1.Pod) {
	nodes := make([]corev1.Node, nNodes)
	for i := range nodes {
		gpus := make([]v1alpha1.GPUInfo, 8)
		for j := range gpus {
			gpus[j] = v1alpha1.GPUInfo{UUID: fmt.Sprintf("GPU-%05d-%d", i, j), Index: j, Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559, Health: v1alpha1.GPUHealthy}
		}
		nodes[i] = corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i), Labels: map[string]string{"rack": fmt.Sprint("rack-", i/16), "kubernetes.io/hostname": fmt.Sprintf("node-%05d", i)},
				Annotations: map[string]string{v1alpha1.AnnotationGPUs: v1alpha1.FormatGPUs(gpus)}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				Capacity: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("8")}},
		}
	}
	pods := make([]corev1.Pod, nPods)
	for i := range pods {
		node, gpu := (i/8)*2%nNodes, i%8
		if (i/8)*2 >= nNodes {
			node = ((i/8)*2)%nNodes + 1
		}
		uuid := fmt.Sprintf("GPU-%05d-%d", node, gpu)
		pods[i] = corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint("holder-", i), UID: types.UID(fmt.Sprint("pod-", i)),
				Annotations: map[string]string{v1alpha1.AnnotationDevices: uuid + ":71903"}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%05d", node), Containers: []corev1.Container{{Name: "c",
				Image: "trainer:" + strings.Repeat("x", 20), Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	return nodes, pods
}

func rss() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "n/a"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:"))
		}
	}
	return "n/a"
}
