package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	kueueac "sigs.k8s.io/kueue/pkg/util/admissioncheck"
	"sigs.k8s.io/kueue/pkg/workload"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/gpucache"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
)

// Config sizes one run.
type Config struct {
	Nodes, RackSize, Pods int
	PodsRunning           bool
	Workloads, Batches    int
	Workers               int
	Baseline              bool
	// NoopCheck adds a third variant: a ClusterQueue with an AdmissionCheck
	// whose controller (in the driver) marks it Ready at once, with one
	// status write and nothing else: what any check costs in Kueue.
	NoopCheck bool
	// Manager: a gpupack-manager binary, "" to build one, or "inprocess".
	Manager      string
	BatchTimeout time.Duration
	EngineN      int
	// Paced Workloads of the check's variant, one every PaceInterval after
	// the batches: QuotaReserved→Ready without a queue of decisions.
	Paced        int
	PaceInterval time.Duration
	KueueQPS     float32
	KueueBurst   int32
	// Pprof, when set (manager binary only), is a directory: the manager
	// serves --pprof-bind-address and the driver saves back-to-back CPU
	// profiles (cpu-NNN.pb.gz, ProfileSeconds each) over the measured
	// batches, then a heap and an allocs profile.
	Pprof          string
	ProfileSeconds int
	// ManagerArgs are extra flags for the manager binary.
	ManagerArgs []string
}

const (
	checkName   = "gang-fit"
	nsHolders   = "holders"
	nsCheck     = "with-check"
	nsAlone     = "kueue-alone"
	nsNoop      = "noop-check"
	noopName    = "noop"
	warmupPerNS = 3
)

// variant is one ClusterQueue's run.
type variant struct {
	name, ns string
	batches  []time.Duration // first create → last Admitted seen, per batch
	counts   []int
	keys     []string
	cpu      map[string]time.Duration // per process, summed over its batches
	requests counts                   // apiserver requests during its batches
	latency  [2]counts                // apiserver request seconds: sum, count
}

// Report is what a run measured (the smoke test reads it).
type Report struct {
	Admitted       map[string]int // per variant
	RatePerSecond  map[string]float64
	Ratio          float64 // with check / Kueue alone (0 without a baseline)
	QuotaToReady   []time.Duration
	PacedToReady   []time.Duration
	Decisions      uint64
	ManagerHWMKiB  int64
	EngineP99      time.Duration
	CheckRetries   int
	CheckRejected  int
	ManagerProcess bool
}

// Run starts the control plane, builds the cluster, runs the batches and
// writes the table to out.
func Run(t framework.TB, c Config, out io.Writer) (*Report, error) {
	if c.Batches < 1 {
		c.Batches = 1
	}
	if c.Workers < 1 {
		c.Workers = 1
	}
	if c.Pods > c.Nodes*4 {
		return nil, fmt.Errorf("-pods %d: at most half the GPUs (%d) can be held", c.Pods, c.Nodes*4)
	}
	// Every Workload of the check's variant keeps its GPUs (nothing runs or
	// finishes): they must fit the free GPUs, with room for packing, or
	// the check answers Retry and the run measures waiting, not deciding.
	need := 0
	for i := range c.Workloads + warmupPerNS + c.Paced {
		m := mix[i%len(mix)]
		need += int(m[0] * m[1])
	}
	if free := c.Nodes*8 - c.Pods; need > free*9/10 {
		return nil, fmt.Errorf("%d Workloads need %d GPUs, more than 90%% of the %d free; use more nodes or fewer Workloads", c.Workloads, need, free)
	}
	say := func(f string, a ...any) {
		fmt.Fprintf(out, "%s [load %s] %s\n", time.Now().UTC().Format("15:04:05"), loadavg(), fmt.Sprintf(f, a...))
	}
	say("starting kube-apiserver + etcd + Kueue (client qps %g, burst %d)", c.KueueQPS, c.KueueBurst)
	env := framework.Start(t, framework.Options{KueueClientQPS: c.KueueQPS, KueueClientBurst: c.KueueBurst})
	ctx := env.Ctx
	for _, ns := range []string{nsHolders, nsCheck, nsAlone, nsNoop} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, err
		}
	}

	// Nodes: 8 H100 each, the inventory annotation, racks of RackSize, no
	// kubelet. The apiserver adds the not-ready taint at creation (as for
	// any new node); the node-lifecycle controller would lift it, here the
	// driver does.
	t0 := time.Now()
	untaint := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"taints":null}}`))
	err := parallel(c.Nodes, c.Workers*2, func(i int) error {
		n := framework.MakeNode(nodeName(i)).GPUs(8, framework.H100).Label(framework.LabelRack, fmt.Sprint("rack-", i/max(c.RackSize, 1))).Obj()
		delete(n.Labels, framework.KwokNodeLabel)
		delete(n.Annotations, "kwok.x-k8s.io/node")
		n.Spec.Taints = nil
		if err := env.Client.Create(ctx, n); err != nil {
			return err
		}
		return env.Client.Patch(ctx, n, untaint)
	})
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	say("%d nodes (%d GPUs) created in %v", c.Nodes, c.Nodes*8, time.Since(t0).Round(time.Millisecond))

	// Holder pods: bound (spec.nodeName), one GPU each, the device
	// annotation the node agent writes; they fill every other node.
	t0 = time.Now()
	err = parallel(c.Pods, c.Workers*2, func(i int) error {
		node, gpu := (i/8)*2, i%8
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: nsHolders, Name: fmt.Sprintf("holder-%06d", i),
				Annotations: map[string]string{v1alpha1.AnnotationDevices: fmt.Sprintf("GPU-%s-%d:71903", nodeName(node), gpu)}},
			Spec: corev1.PodSpec{NodeName: nodeName(node), Containers: []corev1.Container{{Name: "c", Image: "trainer:latest",
				Resources: corev1.ResourceRequirements{Limits: gpus(1), Requests: gpus(1)}}}},
		}
		if err := env.Client.Create(ctx, p); err != nil {
			return err
		}
		if !c.PodsRunning {
			return nil
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		return env.Client.Status().Update(ctx, p)
	})
	if err != nil {
		return nil, fmt.Errorf("holder pods: %w", err)
	}
	say("%d holder pods created in %v (status Running: %v)", c.Pods, time.Since(t0).Round(time.Millisecond), c.PodsRunning)

	// The check, then gpupack's manager on the existing cluster.
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"}, Spec: v1alpha1.GangFitParametersSpec{
		TopologyLevels: []string{framework.LabelRack},
		RetryBackoff:   v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)},
	}})
	env.MustCreate(t, framework.MakeGangFitCheck(checkName, "gf"))
	t0 = time.Now()
	mgr, err := startManager(t, env, c.Manager, c.Pprof != "", c.ManagerArgs)
	if err != nil {
		return nil, err
	}
	env.WaitForAdmissionCheckActive(t, checkName)
	say("gpupack manager (%s) up, check Active, in %v", mgr.kind, time.Since(t0).Round(time.Millisecond))

	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	quota := int64(max(c.Nodes*8, 1) * 10)
	cqs := []*kueue.ClusterQueue{framework.MakeClusterQueue("cq-check").GPUFlavor("gpu", quota, framework.H100).AdmissionChecks(checkName).Obj()}
	vs := []*variant{{name: "with gang-fit check", ns: nsCheck}}
	if c.Baseline {
		cqs = append(cqs, framework.MakeClusterQueue("cq-alone").GPUFlavor("gpu", quota, framework.H100).Obj())
		vs = append(vs, &variant{name: "Kueue alone", ns: nsAlone})
	}
	if c.NoopCheck {
		env.MustCreate(t, &kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: noopName}, Spec: kueue.AdmissionCheckSpec{ControllerName: "bench.gpupack.io/noop"}})
		env.SetAdmissionCheckActive(t, noopName)
		cqs = append(cqs, framework.MakeClusterQueue("cq-noop").GPUFlavor("gpu", quota, framework.H100).AdmissionChecks(noopName).Obj())
		vs = append(vs, &variant{name: "Kueue + no-op check", ns: nsNoop})
	}
	for i, cq := range cqs {
		env.MustCreate(t, cq)
		env.MustCreate(t, framework.MakeLocalQueue("lq", vs[i].ns, cq.Name))
		env.Eventually(t, 60*time.Second, cq.Name+" Active", func() (bool, string) {
			var cur kueue.ClusterQueue
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cq), &cur); err != nil {
				return false, err.Error()
			}
			return apimeta.IsStatusConditionTrue(cur.Status.Conditions, kueue.ClusterQueueActive), fmt.Sprint(cur.Status.Conditions)
		})
	}

	rec, err := watchWorkloads(ctx, env)
	if err != nil {
		return nil, err
	}
	if c.NoopCheck {
		rec.noop = make(chan *kueue.Workload, 4096)
		for range 4 {
			go noopCheck(ctx, env, rec.noop)
		}
	}
	procs := children()
	seq := 0
	create := func(v *variant, n int) (time.Duration, []string, error) {
		keys := make([]string, n)
		base := seq
		seq += n
		start := time.Now()
		err := parallel(n, c.Workers, func(i int) error {
			wl := workloadFor(v.ns, base+i)
			keys[i] = v.ns + "/" + wl.Name
			rec.created(keys[i])
			return createRetrying(ctx, env, wl)
		})
		if err != nil {
			return 0, keys, err
		}
		last, err := rec.waitAdmitted(ctx, keys, c.BatchTimeout)
		if err != nil {
			return 0, keys, fmt.Errorf("%s: %w; %s", v.name, err, describeStuck(ctx, env, rec, keys))
		}
		return last.Sub(start), keys, nil
	}

	// Warm-up (not measured): the first decisions start informers and
	// lazy clients in Kueue and the manager.
	for _, v := range vs {
		if _, _, err := create(v, warmupPerNS); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	say("warm-up admitted; measuring %d Workloads per variant in %d interleaved batches", c.Workloads, c.Batches)
	hist0, err := mgr.histogram()
	if err != nil {
		return nil, err
	}
	mcpu0, mreq0 := procCPU(mgr.pid), mgr.requests()
	stopProfiles := mgr.profile(c.Pprof, c.ProfileSeconds, say)
	for b := 0; b < c.Batches; b++ {
		n := c.Workloads / c.Batches
		if b < c.Workloads%c.Batches {
			n++
		}
		if n == 0 {
			continue
		}
		order := slices.Clone(vs)
		if b%2 == 1 {
			slices.Reverse(order) // ABBA: neither variant always goes first
		}
		for _, v := range order {
			cpu0, req0, lat0 := cpuOf(procs), apiserverRequests(ctx, env), apiserverLatency(ctx, env)
			d, keys, err := create(v, n)
			if err != nil {
				return nil, err
			}
			cpu1, req1, lat1 := cpuOf(procs), apiserverRequests(ctx, env), apiserverLatency(ctx, env)
			v.requests = v.requests.add(req1.minus(req0))
			v.latency[0], v.latency[1] = v.latency[0].add(lat1[0].minus(lat0[0])), v.latency[1].add(lat1[1].minus(lat0[1]))
			if v.cpu == nil {
				v.cpu = map[string]time.Duration{}
			}
			for k := range cpu1 {
				v.cpu[k] += cpu1[k] - cpu0[k]
			}
			v.batches, v.counts, v.keys = append(v.batches, d), append(v.counts, n), append(v.keys, keys...)
			say("batch %d %-20s %3d admitted in %v (%.1f/s)", b+1, v.name, n, d.Round(time.Millisecond), float64(n)/d.Seconds())
		}
	}
	mcpu1, mreq1 := procCPU(mgr.pid), mgr.requests()
	stopProfiles()
	hist1, err := mgr.histogram()
	if err != nil {
		return nil, err
	}
	var paced []time.Duration
	if c.Paced > 0 {
		say("paced: %d Workloads with the check, one every %v", c.Paced, c.PaceInterval)
		var keys []string
		for i := 0; i < c.Paced; i++ {
			wl := workloadFor(nsCheck, seq)
			seq++
			k := nsCheck + "/" + wl.Name
			keys = append(keys, k)
			rec.created(k)
			if err := createRetrying(ctx, env, wl); err != nil {
				return nil, err
			}
			time.Sleep(c.PaceInterval)
		}
		if _, err := rec.waitAdmitted(ctx, keys, c.BatchTimeout); err != nil {
			return nil, fmt.Errorf("paced: %w; %s", err, describeStuck(ctx, env, rec, keys))
		}
		rec.mu.Lock()
		for _, k := range keys {
			if t := rec.get(k); !t.quota.IsZero() && !t.ready.IsZero() {
				paced = append(paced, t.ready.Sub(t.quota))
			}
		}
		rec.mu.Unlock()
	}

	// Engine-only and in-process decision figures on the same cluster:
	// the objects as the apiserver now holds them, plans included.
	var eng engineFigures
	if c.EngineN > 0 {
		if eng, err = engine(ctx, env, c.EngineN); err != nil {
			return nil, err
		}
	}
	rep := report(out, c, vs, rec, hist1.minus(hist0), mgr, mcpu1-mcpu0, mreq1.minus(mreq0), eng)
	if rep.PacedToReady = paced; len(paced) > 0 {
		fmt.Fprintf(out, "- **paced** (one Workload every %v, no queue of decisions), %d Workloads: QuotaReserved→check Ready p50 %s, **p99 %s**, max %s (load %s)\n",
			c.PaceInterval, len(paced), ms(q(paced, 0.5)), ms(q(paced, 0.99)), ms(q(paced, 1)), loadavg())
	}
	return rep, nil
}

func nodeName(i int) string { return fmt.Sprintf("node-%05d", i) }

func gpus(n int64) corev1.ResourceList {
	return corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: *resource.NewQuantity(n, resource.DecimalSI)}
}

// mix is the Workloads' shape, in turn: pods × GPUs per pod.
var mix = [][2]int32{{1, 1}, {8, 1}, {2, 8}}

// workloadFor builds a Workload as a job integration would (one pod set
// asking for whole GPUs), straight in a LocalQueue: no job controller.
func workloadFor(ns string, i int) *kueue.Workload {
	m := mix[i%len(mix)]
	return &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("wl-%05d", i)},
		Spec: kueue.WorkloadSpec{QueueName: "lq", PodSets: []kueue.PodSet{{Name: "main", Count: m[0],
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "trainer", Image: "trainer:latest",
				Resources: corev1.ResourceRequirements{Requests: gpus(int64(m[1])), Limits: gpus(int64(m[1]))}}}}}}}},
	}
}

// createRetrying creates a Workload, retrying what an overloaded
// apiserver answers (Kueue's webhook timing out, 429, 5xx): the run
// measures how long admission takes, it must not end on a slow call. A
// retry that finds the first try stored is fine.
func createRetrying(ctx context.Context, env *framework.Env, wl *kueue.Workload) error {
	var err error
	for try := 0; try < 5; try++ {
		err = env.Client.Create(ctx, wl.DeepCopy())
		switch {
		case err == nil, try > 0 && apierrors.IsAlreadyExists(err):
			return nil
		case apierrors.IsInternalError(err), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err), apierrors.IsServiceUnavailable(err):
			time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
		default:
			return err
		}
	}
	return err
}

// parallel runs f(0..n-1) on workers goroutines; the first error wins.
func parallel(n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || first.Load() != nil {
					return
				}
				if err := f(i); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}

// times are when the driver created a Workload and first saw, on its
// watch, quota reserved, the check Ready and the Workload Admitted.
type times struct {
	created, quota, ready, admitted time.Time
	retry, rejected, noopSent       bool
}

// noopCheck is the no-op check's controller: one status write per
// Workload, setting its check Ready (re-read and retried on conflict).
func noopCheck(ctx context.Context, env *framework.Env, ch <-chan *kueue.Workload) {
	for {
		var wl *kueue.Workload
		select {
		case <-ctx.Done():
			return
		case wl = <-ch:
		}
		_ = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			st := kueueac.FindAdmissionCheck(wl.Status.AdmissionChecks, noopName)
			if st == nil || st.State != kueue.CheckStatePending {
				return nil
			}
			ns := *st.DeepCopy()
			ns.State, ns.Message, ns.LastTransitionTime = kueue.CheckStateReady, "no-op", metav1.Time{}
			workload.SetAdmissionCheckState(&wl.Status.AdmissionChecks, ns, clock.RealClock{})
			err := env.Client.Status().Update(ctx, wl)
			if apierrors.IsConflict(err) {
				cur := &kueue.Workload{}
				if gerr := env.Client.Get(ctx, client.ObjectKeyFromObject(wl), cur); gerr != nil {
					return gerr
				}
				wl = cur
			}
			return err
		})
	}
}

type recorder struct {
	mu sync.Mutex
	m  map[string]*times
	// noop receives Workloads whose no-op check is Pending with quota
	// reserved (nil: no such variant).
	noop chan *kueue.Workload
}

func (r *recorder) get(k string) *times {
	t := r.m[k]
	if t == nil {
		t = &times{}
		r.m[k] = t
	}
	return t
}

func (r *recorder) created(k string) {
	r.mu.Lock()
	r.get(k).created = time.Now()
	r.mu.Unlock()
}

func (r *recorder) observe(o any) {
	now := time.Now()
	wl, ok := o.(*kueue.Workload)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.get(wl.Namespace + "/" + wl.Name)
	if t.quota.IsZero() && apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved) {
		t.quota = now
	}
	for _, st := range wl.Status.AdmissionChecks {
		if st.Name == noopName && st.State == kueue.CheckStatePending && r.noop != nil && !t.noopSent &&
			apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved) {
			t.noopSent = true
			r.noop <- wl.DeepCopy()
		}
		switch st.State {
		case kueue.CheckStateReady:
			if t.ready.IsZero() {
				t.ready = now
			}
		case kueue.CheckStateRetry:
			t.retry = true
		case kueue.CheckStateRejected:
			t.rejected = true
		}
	}
	if t.admitted.IsZero() && apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) {
		t.admitted = now
	}
}

// waitAdmitted returns when every key was seen Admitted, with the latest
// of those times.
func (r *recorder) waitAdmitted(ctx context.Context, keys []string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		var last time.Time
		missing := 0
		r.mu.Lock()
		for _, k := range keys {
			t := r.get(k)
			if t.admitted.IsZero() {
				missing++
			} else if t.admitted.After(last) {
				last = t.admitted
			}
		}
		r.mu.Unlock()
		if missing == 0 {
			return last, nil
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("%d of %d Workloads not Admitted after %v", missing, len(keys), timeout)
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func watchWorkloads(ctx context.Context, env *framework.Env) (*recorder, error) {
	rec := &recorder{m: map[string]*times{}}
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}
	inf, err := c.GetInformer(ctx, &kueue.Workload{})
	if err != nil {
		return nil, err
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    rec.observe,
		UpdateFunc: func(_, o any) { rec.observe(o) },
	}); err != nil {
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, errors.New("workload watch did not sync")
	}
	return rec, nil
}

func describeStuck(ctx context.Context, env *framework.Env, rec *recorder, keys []string) string {
	var out []string
	rec.mu.Lock()
	var stuck []string
	for _, k := range keys {
		if rec.get(k).admitted.IsZero() {
			stuck = append(stuck, k)
		}
	}
	rec.mu.Unlock()
	for _, k := range stuck[:min(len(stuck), 3)] {
		ns, name, _ := strings.Cut(k, "/")
		var wl kueue.Workload
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &wl); err != nil {
			out = append(out, k+": "+err.Error())
			continue
		}
		out = append(out, framework.DescribeWorkload(&wl))
	}
	return strings.Join(out, "; ")
}

// manager is gpupack's manager under test.
type manager struct {
	kind      string
	pid       int // 0: in this process
	metricsAt string
	pprofAt   string // "": no pprof endpoint
}

// startManager runs gpupack's manager with only the gang-fit check (and
// its informers) on: as a built binary in its own process, so its RSS and
// CPU are its own, or in this process for the smoke test.
func startManager(t framework.TB, env *framework.Env, bin string, pprof bool, extra []string) (*manager, error) {
	if bin == "inprocess" {
		env.StartManager(t, func(m ctrl.Manager) error { return admissioncheck.Setup(m, admissioncheck.Options{}) })
		return &manager{kind: "in process"}, nil
	}
	if bin == "" {
		bin = filepath.Join(env.Dir, "gpupack-manager")
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/gpupack-manager")
		cmd.Dir = framework.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building gpupack-manager: %v\n%s", err, out)
		}
	}
	port, err := framework.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logPath := filepath.Join(env.Dir, "gpupack-manager.log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := []string{"--kubeconfig=" + env.Kubeconfig, "--leader-elect=false",
		"--metrics-bind-address=" + addr, "--health-probe-bind-address=0",
		"--enable-webhooks=false", "--enable-preemption=false", "--enable-topology=false", "--enable-volcano=false",
		"--zap-log-level=error"}
	pprofAt := ""
	if pprof {
		pport, err := framework.FreePort()
		if err != nil {
			return nil, err
		}
		pprofAt = fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", pport)
		args = append(args, fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", pport))
	}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	m := &manager{kind: "binary " + filepath.Base(bin) + fmt.Sprintf(", pid %d", cmd.Process.Pid), pid: cmd.Process.Pid,
		metricsAt: "http://" + addr + "/metrics", pprofAt: pprofAt}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := m.histogram(); err == nil {
			return m, nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("gpupack-manager exited:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			return nil, errors.New("gpupack-manager metrics not answering after 60s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// profile saves back-to-back CPU profiles of the manager into dir until
// the returned stop is called (the profile running then is waited for: a
// CPU profile can only be read whole), then its heap and allocs profiles.
// Without a directory or a pprof endpoint it does nothing.
func (m *manager) profile(dir string, seconds int, say func(string, ...any)) (stop func()) {
	if dir == "" || m.pprofAt == "" {
		if dir != "" {
			say("-pprof needs the manager as its own process; no profiles")
		}
		return func() {}
	}
	if seconds <= 0 {
		seconds = 10
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		say("pprof: %v", err)
		return func() {}
	}
	fetch := func(path, file string) error {
		resp, err := http.Get(m.pprofAt + path) //nolint:gosec,noctx // loopback pprof of the process under test
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", path, resp.Status)
		}
		f, err := os.Create(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	var done atomic.Bool
	finished := make(chan int)
	go func() {
		n := 0
		for !done.Load() {
			if err := fetch(fmt.Sprintf("profile?seconds=%d", seconds), fmt.Sprintf("cpu-%03d.pb.gz", n)); err != nil {
				say("pprof: %v", err)
				break
			}
			n++
		}
		finished <- n
	}()
	return func() {
		done.Store(true)
		n := <-finished
		for _, p := range []string{"heap", "allocs"} {
			if err := fetch(p, p+".pb.gz"); err != nil {
				say("pprof: %v", err)
			}
		}
		say("pprof: %d CPU profiles of %ds over the measured batches, heap and allocs in %s (go tool pprof -top %s/cpu-*.pb.gz)", n, seconds, dir, dir)
	}
}

// histogram reads gpupack_gangfit_decision_duration_seconds.
func (m *manager) histogram() (hist, error) {
	if m.pid == 0 {
		mfs, err := metrics.Registry.Gather()
		if err != nil {
			return hist{}, err
		}
		for _, mf := range mfs {
			if mf.GetName() != decisionMetric || len(mf.GetMetric()) == 0 {
				continue
			}
			h := mf.GetMetric()[0].GetHistogram()
			var out hist
			for _, b := range h.GetBucket() {
				out.le = append(out.le, b.GetUpperBound())
				out.cum = append(out.cum, b.GetCumulativeCount())
			}
			out.count, out.sum = h.GetSampleCount(), h.GetSampleSum()
			return out, nil
		}
		return hist{}, nil
	}
	resp, err := http.Get(m.metricsAt) //nolint:gosec,noctx // loopback metrics of the process under test
	if err != nil {
		return hist{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return hist{}, err
	}
	return parseHistogram(string(b), decisionMetric)
}

const decisionMetric = "gpupack_gangfit_decision_duration_seconds"

// requests are the manager's own API requests by method and code
// (client-go's rest_client_requests_total); empty in process.
func (m *manager) requests() counts {
	if m.pid == 0 {
		return nil
	}
	resp, err := http.Get(m.metricsAt) //nolint:gosec,noctx // loopback metrics of the process under test
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return parseCounter(string(b), "rest_client_requests_total", "method", "code")
}

// apiserverLatency is the apiserver's request time so far (sum of
// seconds, count) by resource, subresource and verb.
func apiserverLatency(ctx context.Context, env *framework.Env) [2]counts {
	b, err := env.Clientset.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return [2]counts{}
	}
	return [2]counts{parseCounter(string(b), "apiserver_request_duration_seconds_sum", "resource", "subresource", "verb"),
		parseCounter(string(b), "apiserver_request_duration_seconds_count", "resource", "subresource", "verb")}
}

// apiserverRequests are the apiserver's requests so far by resource, verb
// and code (apiserver_request_total, all clients).
func apiserverRequests(ctx context.Context, env *framework.Env) counts {
	b, err := env.Clientset.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil
	}
	return parseCounter(string(b), "apiserver_request_total", "resource", "subresource", "verb", "code")
}

type engineFigures struct {
	nodes, pods, plans int
	fedIn              time.Duration
	engine, decision   []time.Duration
}

// engine feeds a fresh long-lived model with the cluster as the apiserver
// holds it now and times the engine alone (Fit on the model) and the
// in-process decision (read under the lock, decide, assume, forget), the
// figures admissioncheck/bench/decide prints, for the same mix.
func engine(ctx context.Context, env *framework.Env, n int) (engineFigures, error) {
	var f engineFigures
	var nodes corev1.NodeList
	var pods corev1.PodList
	var plans v1alpha1.GPUPlanList
	for _, l := range []client.ObjectList{&nodes, &pods, &plans} {
		if err := env.Client.List(ctx, l); err != nil {
			return f, err
		}
	}
	f.nodes, f.pods, f.plans = len(nodes.Items), len(pods.Items), len(plans.Items)
	t0 := time.Now()
	c := gpucache.New(nil)
	for i := range nodes.Items {
		c.UpsertNode(&nodes.Items[i])
	}
	for i := range pods.Items {
		c.UpsertPod(&pods.Items[i])
	}
	for i := range plans.Items {
		c.UpsertPlan(&plans.Items[i])
	}
	buf := flavors.NewBuffer(nil, nil)
	c.Read(buf, func(*gpucache.Snapshot) {})
	f.fedIn = time.Since(t0)
	var gangs []fit.Gang
	for i := range mix {
		g, _, err := inventory.GangFromPodSets("x", workloadFor("x", i).Spec.PodSets)
		if err != nil {
			return f, err
		}
		gangs = append(gangs, g)
	}
	opts := fit.Options{Levels: []string{framework.LabelRack}}
	var m *fit.Model
	c.Read(buf, func(s *gpucache.Snapshot) { m = s.Model.Clone() })
	for i := 0; i < n; i++ {
		t := time.Now()
		m.Fit(gangs[i%len(gangs)], opts)
		f.engine = append(f.engine, time.Since(t))
	}
	for i := 0; i < n; i++ {
		key := types.NamespacedName{Namespace: "bench", Name: fmt.Sprint("wl-", i)}
		uid := types.UID(fmt.Sprint("uid-", i))
		t := time.Now()
		fits := false
		c.Read(buf, func(s *gpucache.Snapshot) {
			v := s.Decide(gangs[i%len(gangs)], nil, opts)
			if fits = v.Result.Fits; fits {
				p := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Spec: inventory.PlanFromResult(v.Result)}
				p.Spec.WorkloadUID = uid
				s.Assume(p)
			}
		})
		if fits {
			c.Forget(key, uid)
		}
		f.decision = append(f.decision, time.Since(t))
	}
	sort.Slice(f.engine, func(i, j int) bool { return f.engine[i] < f.engine[j] })
	sort.Slice(f.decision, func(i, j int) bool { return f.decision[i] < f.decision[j] })
	return f, nil
}
