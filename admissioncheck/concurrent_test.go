package admissioncheck

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kueue/pkg/util/admissioncheck"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/gpucache"
	"github.com/gpupack/gpupack/flavors"
)

// fakeInformer delivers the API's plan writes to a cache in order, late
// (as an informer does), from one goroutine.
type fakeInformer struct {
	ch   chan func()
	done chan struct{}
	lag  func() time.Duration
}

func newFakeInformer(lag func() time.Duration) *fakeInformer {
	f := &fakeInformer{ch: make(chan func(), 4096), done: make(chan struct{}), lag: lag}
	go func() {
		defer close(f.done)
		for fn := range f.ch {
			time.Sleep(f.lag())
			fn()
		}
	}()
	return f
}

// drain waits until everything sent so far is delivered, then stops.
func (f *fakeInformer) drain() { close(f.ch); <-f.done }

// staleClient is the manager's informer-cache client as it can be: a Get
// of a Workload sometimes answers an older version (the cache lags our own
// writes).
type staleClient struct {
	client.Client
	stale func(key client.ObjectKey) *kueue.Workload // nil: answer fresh
}

func (s *staleClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if w, ok := obj.(*kueue.Workload); ok {
		if old := s.stale(key); old != nil {
			old.DeepCopyInto(w)
			return nil
		}
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// assertNoDoubleBooking fails if two stored plans put whole-GPU slots on
// one GPU.
func assertNoDoubleBooking(t *testing.T, c client.Client) []v1alpha1.GPUPlan {
	t.Helper()
	var plans v1alpha1.GPUPlanList
	if err := c.List(context.Background(), &plans); err != nil {
		t.Fatal(err)
	}
	holder := map[string]string{}
	for _, p := range plans.Items {
		for _, a := range p.Spec.Assignments {
			for _, g := range a.GPUs {
				if other, ok := holder[g.UUID]; ok {
					t.Errorf("GPU %s double-booked: plans %s and %s", g.UUID, other, p.Name)
				}
				holder[g.UUID] = p.Name
			}
		}
	}
	return plans.Items
}

// Issue 17 (decisions concurrent, writes outside the decision lock): eight
// workers decide 24 Workloads asking for more GPUs than 4 nodes × 4 have,
// through a client that fails plan creates (refused: nothing stored;
// timed out after storing: ambiguous), answers status writes with
// conflicts, serves stale Workloads from its cache and delivers plans to
// the model late. No GPU may be in two stored plans, every Ready check
// must have its plan, and once every write is delivered and the ambiguous
// writes' hold has passed, the running model must count exactly what a
// model rebuilt from the API counts (a failed write that was not rolled
// back would leak its GPUs; one rolled back too eagerly would free GPUs a
// stored plan holds).
func TestConcurrentDecisionsNeverDoubleBook(t *testing.T) {
	for seed := int64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) { concurrentDecisions(t, seed) })
	}
}

func concurrentDecisions(t *testing.T, seed int64) {
	var rmu sync.Mutex
	rng := rand.New(rand.NewSource(seed))
	roll := func(p float64) bool { rmu.Lock(); defer rmu.Unlock(); return rng.Float64() < p }
	jitter := func(max time.Duration) time.Duration {
		rmu.Lock()
		defer rmu.Unlock()
		return time.Duration(rng.Int63n(int64(max)))
	}

	objs := []client.Object{gangFitCheck()}
	for i := 0; i < 4; i++ {
		objs = append(objs, gpuNode(fmt.Sprint("n", i), 4, nil))
	}
	var wls []*kueue.Workload
	shapes := [][2]int{{1, 1}, {2, 1}, {1, 1}, {1, 4}, {1, 2}, {1, 1}}
	for i := 0; i < 24; i++ {
		sh := shapes[i%len(shapes)]
		wl := admittedWorkload(fmt.Sprintf("wl-%02d", i), types.UID(fmt.Sprint("uid-", i)), int32(sh[0]), int64(sh[1])).obj()
		wls = append(wls, wl)
		objs = append(objs, wl)
	}

	var now atomic.Pointer[time.Time]
	t0 := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	now.Store(&t0)
	var gc *gpucache.Cache // the running manager's model, listed below
	inf := newFakeInformer(func() time.Duration { return jitter(2 * time.Millisecond) })
	var refused, ambiguous, conflicts, staleReads atomic.Int32

	var base client.WithWatch
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
		WithStatusSubresource(&kueue.Workload{}, &v1alpha1.GPUPlan{}, &kueue.AdmissionCheck{}).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				p, ok := obj.(*v1alpha1.GPUPlan)
				if !ok {
					return cl.Create(ctx, obj, opts...)
				}
				time.Sleep(jitter(time.Millisecond))
				if roll(0.25) {
					refused.Add(1)
					return apierrors.NewInvalid(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "GPUPlan"}, p.Name, field.ErrorList{field.Invalid(field.NewPath("spec"), "", "injected")})
				}
				if err := cl.Create(ctx, obj, opts...); err != nil {
					return err
				}
				stored := p.DeepCopy()
				inf.ch <- func() { gc.UpsertPlan(stored) }
				if roll(0.2) {
					ambiguous.Add(1)
					return apierrors.NewTimeoutError("injected: stored, but the answer was lost", 1)
				}
				return nil
			},
			Delete: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				p, ok := obj.(*v1alpha1.GPUPlan)
				if !ok {
					return cl.Delete(ctx, obj, opts...)
				}
				cur := &v1alpha1.GPUPlan{}
				if err := cl.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
					return err
				}
				if err := cl.Delete(ctx, obj, opts...); err != nil {
					return err
				}
				inf.ch <- func() { gc.DeletePlan(client.ObjectKeyFromObject(cur), cur.UID, cur.Spec.WorkloadUID) }
				return nil
			},
			SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				if _, ok := obj.(*kueue.Workload); ok && roll(0.15) {
					conflicts.Add(1)
					return apierrors.NewConflict(schema.GroupResource{Group: kueue.GroupVersion.Group, Resource: "workloads"}, obj.GetName(), errors.New("injected"))
				}
				return cl.SubResource(sub).Update(ctx, obj, opts...)
			},
		}).Build()
	base = c
	// The cache lags: some Gets answer the Workload as it was created.
	first := map[client.ObjectKey]*kueue.Workload{}
	for _, wl := range wls {
		cur := &kueue.Workload{}
		if err := base.Get(context.Background(), client.ObjectKeyFromObject(wl), cur); err != nil {
			t.Fatal(err)
		}
		first[client.ObjectKeyFromObject(wl)] = cur
	}
	cached := &staleClient{Client: c, stale: func(k client.ObjectKey) *kueue.Workload {
		if w := first[k]; w != nil && roll(0.15) {
			staleReads.Add(1)
			return w
		}
		return nil
	}}
	gc = listCache(t, c) // the informers' initial list
	gc.SetClock(func() time.Time { return *now.Load() })
	r := &workloadReconciler{client: cached, planReader: base, recorder: record.NewFakeRecorder(10000),
		clock: clocktesting.NewFakeClock(t0), cache: gc}

	open := func() []client.ObjectKey {
		var keys []client.ObjectKey
		for _, wl := range wls {
			cur := &kueue.Workload{}
			if err := base.Get(context.Background(), client.ObjectKeyFromObject(wl), cur); err != nil {
				t.Fatal(err)
			}
			if st := admissioncheck.FindAdmissionCheck(cur.Status.AdmissionChecks, testCheck); st != nil && st.State == kueue.CheckStatePending {
				keys = append(keys, client.ObjectKeyFromObject(wl))
			}
		}
		return keys
	}
	for round := 0; round < 40; round++ {
		keys := open()
		if len(keys) == 0 {
			break
		}
		work := make(chan client.ObjectKey)
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range work {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, _ = r.Reconcile(ctx, reconcile.Request{NamespacedName: k}) // errors: retried next round
					cancel()
				}
			}()
		}
		for _, k := range keys {
			work <- k
		}
		close(work)
		wg.Wait()
		time.Sleep(3 * time.Millisecond) // informer lag, as between retries
	}
	inf.drain()
	t.Logf("injected: %d refused creates, %d ambiguous creates, %d status conflicts, %d stale reads; still Pending: %d",
		refused.Load(), ambiguous.Load(), conflicts.Load(), staleReads.Load(), len(open()))

	plans := assertNoDoubleBooking(t, base)
	byName := map[string]bool{}
	for _, p := range plans {
		byName[p.Name] = true
	}
	ready := 0
	for _, wl := range wls {
		cur := &kueue.Workload{}
		_ = base.Get(context.Background(), client.ObjectKeyFromObject(wl), cur)
		if st := admissioncheck.FindAdmissionCheck(cur.Status.AdmissionChecks, testCheck); st != nil && st.State == kueue.CheckStateReady {
			ready++
			if !byName[wl.Name] {
				t.Errorf("%s is Ready without a stored plan", wl.Name)
			}
		}
	}
	if ready == 0 {
		t.Errorf("no Workload was admitted")
	}

	// Past the ambiguous writes' hold, the running model counts exactly the
	// API's plans.
	later := t0.Add(2 * gpucache.GhostTTL)
	now.Store(&later)
	rebuilt := listCache(t, base)
	rebuilt.SetClock(func() time.Time { return later })
	if got, want := freeGPUs(gc), freeGPUs(rebuilt); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("running model and the API disagree (GPUs held only in one of them: leaked or freed too early):\n running: %v\n API:     %v", got, want)
	}
}

// freeGPUs lists the whole free GPUs of a model.
func freeGPUs(c *gpucache.Cache) []string {
	var free []string
	c.Read(flavors.NewBuffer(nil, nil), func(s *gpucache.Snapshot) {
		for _, n := range s.Nodes {
			for _, g := range n.GPUs {
				if _, _, holders, ok := s.Model.GPUState(g.UUID); ok && holders == 0 {
					free = append(free, g.UUID)
				}
			}
		}
	})
	sort.Strings(free)
	return free
}

// Issue 17 (restart with a write in flight): the old leader's plan create
// for A is still in flight when a new manager lists the cluster (no plan
// yet) and gives the only GPU to B; then A's create lands. The new manager
// must not reuse A's stored plan (the GPU is B's): it replaces it and
// decides A afresh.
func TestRestartWithPlanWriteInFlight(t *testing.T) {
	a := admittedWorkload("a", "a-uid", 1, 1).obj()
	b := admittedWorkload("b", "b-uid", 1, 1).obj()
	inFlight, land := make(chan struct{}), make(chan struct{})
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(gangFitCheck(), gpuNode("n1", 1, nil), a, b).
		WithStatusSubresource(&kueue.Workload{}, &v1alpha1.GPUPlan{}, &kueue.AdmissionCheck{}).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if p, ok := obj.(*v1alpha1.GPUPlan); ok && p.Name == "a" && p.Spec.WorkloadUID == "a-uid" && inFlight != nil {
				close(inFlight)
				inFlight = nil
				<-land
				if err := cl.Create(ctx, obj, opts...); err != nil {
					return err
				}
				return errors.New("connection reset by peer") // the old leader is gone
			}
			return cl.Create(ctx, obj, opts...)
		}}).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
	old := &workloadReconciler{client: c, planReader: c, recorder: record.NewFakeRecorder(100), clock: clk, cache: listCache(t, c)}
	oldDone := make(chan error, 1)
	started := inFlight
	go func() {
		_, err := old.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(a)})
		oldDone <- err
	}()
	<-started

	// The new leader lists the cluster while A's create is in flight.
	r := &workloadReconciler{client: c, planReader: c, recorder: record.NewFakeRecorder(100), clock: clk, cache: listCache(t, c)}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(b)}); err != nil {
		t.Fatal(err)
	}
	close(land)
	t.Logf("old leader: %v", <-oldDone)
	// The new leader's informer shows the plan that landed.
	stored := &v1alpha1.GPUPlan{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(a), stored); err != nil {
		t.Fatalf("the in-flight plan did not land: %v", err)
	}
	r.cache.UpsertPlan(stored)
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(a)}); err != nil {
		t.Fatal(err)
	}

	assertNoDoubleBooking(t, c)
	e := &env{t: t, c: c}
	if st := e.check(b); st.State != kueue.CheckStateReady {
		t.Errorf("b: check %s (%q), want Ready", st.State, st.Message)
	}
	if st := e.check(a); st.State == kueue.CheckStateReady {
		t.Errorf("a: Ready (%q) on the GPU b holds", st.Message)
	}
}
