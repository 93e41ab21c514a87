package gpucache

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/admissioncheck/usage"
	"github.com/gpupack/gpupack/flavors"
)

// sim is a small cluster: the API's objects (the truth), an informer that
// delivers their events late and in order, and the check deciding through
// the cache. The awkward parts of the real thing are all there: events lag
// behind writes, plan writes fail, re-admitted workloads reuse the plan
// name while their old pods terminate, and the manager restarts.
type sim struct {
	t       *testing.T
	nodes   []*corev1.Node
	pods    map[types.UID]*corev1.Pod
	plans   map[string]*v1alpha1.GPUPlan
	wls     []*simWL
	queue   []event // informer events not yet delivered
	cache   *Cache
	uid     int
	now     time.Time
	buf     flavors.Buffer
	alloc   map[string]int64
	ops     []string
	decided int
}

// event is one informer event and when its write happened.
type event struct {
	at time.Time
	f  func(*Cache)
}

// maxLag bounds informer lag, below GhostTTL (the cache's assumption).
const maxLag = GhostTTL - 5*time.Second

type simWL struct {
	name      string
	uid       types.UID
	admitted  bool
	pods      int
	exclusive bool
}

func newSim(t *testing.T) *sim {
	s := &sim{t: t, pods: map[types.UID]*corev1.Pod{}, plans: map[string]*v1alpha1.GPUPlan{}, now: time.Unix(0, 0), buf: flavors.DefaultBuffer(), alloc: map[string]int64{}}
	for i := 0; i < 2; i++ {
		var gpus []v1alpha1.GPUInfo
		for j := 0; j < 2; j++ {
			gpus = append(gpus, v1alpha1.GPUInfo{UUID: fmt.Sprintf("n%d-g%d", i, j), Index: j, Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559})
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i), Annotations: map[string]string{v1alpha1.AnnotationGPUs: v1alpha1.FormatGPUs(gpus)}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
		s.nodes = append(s.nodes, n)
		fn, err := inventory.NodeFromObject(n, s.buf, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range fn.GPUs {
			s.alloc[g.UUID] = g.AllocatableMiB
		}
	}
	for i := 0; i < 4; i++ {
		s.wls = append(s.wls, &simWL{name: fmt.Sprintf("wl%d", i), pods: 1 + i%2, exclusive: i%2 == 0})
	}
	s.restart()
	return s
}

func (s *sim) newUID(prefix string) types.UID {
	s.uid++
	return types.UID(fmt.Sprintf("%s-%d", prefix, s.uid))
}

func (s *sim) emit(f func(*Cache)) { s.queue = append(s.queue, event{s.now, f}) }

// restart: a new manager lists everything from the API.
func (s *sim) restart() {
	s.queue = nil
	s.cache = New(nil)
	s.cache.SetClock(func() time.Time { return s.now })
	for _, n := range s.nodes {
		s.cache.UpsertNode(n)
	}
	for _, p := range s.pods {
		s.cache.UpsertPod(p.DeepCopy())
	}
	for _, p := range s.plans {
		s.cache.UpsertPlan(p.DeepCopy())
	}
}

// admit: Kueue reserved quota; the check decides through the cache,
// assumes the plan, writes it (which may fail).
func (s *sim) admit(w *simWL, fail bool) {
	if w.admitted {
		return
	}
	if old, ok := s.plans[w.name]; ok && old.Spec.WorkloadUID != w.uid {
		s.deletePlan(w.name) // a leftover of an earlier workload of the name
	}
	w.uid = s.newUID(w.name)
	g := fit.Gang{PodSets: []fit.PodSet{{Name: "main", Count: w.pods, GPUsPerPod: 1}}}
	if !w.exclusive {
		g.PodSets[0].MemoryMiB = 30000
		g.PodSets[0].Cores = 40
	}
	var res fit.Result
	s.cache.Read(s.buf, func(sn *Snapshot) { res = sn.Model.Fit(g, fit.Options{}) })
	if !res.Fits {
		return
	}
	s.decided++
	plan := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: w.name}, Spec: inventory.PlanFromResult(res)}
	plan.Spec.WorkloadName, plan.Spec.WorkloadUID = w.name, w.uid
	plan.Status.Phase = v1alpha1.PlanPlanned
	s.cache.Assume(plan.DeepCopy())
	if fail {
		s.cache.Forget(types.NamespacedName{Namespace: "ns", Name: w.name}, w.uid)
		return
	}
	plan.UID = s.newUID("plan")
	s.cache.Created(types.NamespacedName{Namespace: "ns", Name: w.name}, w.uid, plan.UID)
	s.plans[w.name] = plan
	cp := plan.DeepCopy()
	s.emit(func(c *Cache) { c.UpsertPlan(cp) })
	w.admitted = true
}

// bind: the placement gate lets one pod of an admitted workload take an
// unbound slot: the pod (with its devices) and the binding are written.
func (s *sim) bind(w *simWL) {
	plan, ok := s.plans[w.name]
	if !ok || !w.admitted {
		return
	}
	taken := map[int32]bool{}
	for _, b := range plan.Status.Bindings {
		if p, ok := s.pods[b.PodUID]; ok && p.Status.Phase != corev1.PodSucceeded {
			taken[b.Index] = true
		}
	}
	for _, a := range plan.Spec.Assignments {
		if taken[a.Index] {
			continue
		}
		uid := s.newUID(w.name + "-pod")
		devs := make([]v1alpha1.DeviceAssignment, len(a.GPUs))
		for i, g := range a.GPUs {
			devs[i] = v1alpha1.DeviceAssignment{UUID: g.UUID, MemoryMiB: g.MemoryMiB}
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("%s-%d", w.name, a.Index), UID: uid,
			Annotations: map[string]string{v1alpha1.AnnotationDevices: v1alpha1.FormatDevices(devs), v1alpha1.AnnotationPlan: plan.Name}},
			Spec:   corev1.PodSpec{NodeName: a.Node, Containers: []corev1.Container{{Name: "c", Resources: podResources(w, len(a.GPUs))}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if !w.exclusive {
			pod.Annotations[v1alpha1.AnnotationGPUCores] = "40"
		}
		s.pods[uid] = pod
		plan.Status.Bindings = append(plan.Status.Bindings, v1alpha1.SlotBinding{PodSet: a.PodSet, Index: a.Index, PodName: pod.Name, PodUID: uid})
		pc, plc := pod.DeepCopy(), plan.DeepCopy()
		s.emit(func(c *Cache) { c.UpsertPod(pc) })
		s.emit(func(c *Cache) { c.UpsertPlan(plc) })
		return
	}
}

func podResources(w *simWL, gpus int) corev1.ResourceRequirements {
	if w.exclusive {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI)}}
	}
	return corev1.ResourceRequirements{Limits: corev1.ResourceList{
		v1alpha1.ResourceVGPU:      *resource.NewQuantity(int64(gpus), resource.DecimalSI),
		v1alpha1.ResourceGPUMemory: *resource.NewQuantity(30000*int64(gpus), resource.DecimalSI),
		v1alpha1.ResourceGPUCores:  *resource.NewQuantity(40*int64(gpus), resource.DecimalSI),
	}}
}

// deletePlan: the check releases a plan (its own Delete, seen at once).
func (s *sim) deletePlan(name string) {
	plan, ok := s.plans[name]
	if !ok {
		return
	}
	delete(s.plans, name)
	key, uid, wl := types.NamespacedName{Namespace: "ns", Name: name}, plan.UID, plan.Spec.WorkloadUID
	s.cache.DeletePlan(key, uid, wl)
	s.emit(func(c *Cache) { c.DeletePlan(key, uid, wl) })
}

// evict: Kueue evicts; the check releases the plan; the pods start
// terminating (checkpointing) and keep their GPUs until gone.
func (s *sim) evict(w *simWL) {
	if !w.admitted {
		return
	}
	w.admitted = false
	s.deletePlan(w.name)
	for _, p := range s.pods {
		if p.Annotations[v1alpha1.AnnotationPlan] == w.name && p.DeletionTimestamp == nil {
			ts := metav1.NewTime(s.now)
			p.DeletionTimestamp = &ts
			pc := p.DeepCopy()
			s.emit(func(c *Cache) { c.UpsertPod(pc) })
		}
	}
}

// terminate: one terminating pod is gone; or a running one finishes.
func (s *sim) terminate(pick int) {
	var cands []*corev1.Pod
	for _, p := range s.pods {
		cands = append(cands, p)
	}
	if len(cands) == 0 {
		return
	}
	// map order is random: pick deterministically
	sortPods(cands)
	p := cands[pick%len(cands)]
	if p.DeletionTimestamp != nil {
		delete(s.pods, p.UID)
		uid := p.UID
		s.emit(func(c *Cache) { c.DeletePod(uid) })
		return
	}
	p.Status.Phase = corev1.PodSucceeded
	pc := p.DeepCopy()
	s.emit(func(c *Cache) { c.UpsertPod(pc) })
}

func sortPods(ps []*corev1.Pod) {
	for i := 1; i < len(ps); i++ {
		for j := i; j > 0 && ps[j].UID < ps[j-1].UID; j-- {
			ps[j], ps[j-1] = ps[j-1], ps[j]
		}
	}
}

func (s *sim) deliver(n int) {
	for i := 0; i < n && len(s.queue) > 0; i++ {
		s.queue[0].f(s.cache)
		s.queue = s.queue[1:]
	}
	// Lag is bounded: what is older than maxLag has arrived.
	for len(s.queue) > 0 && s.now.Sub(s.queue[0].at) > maxLag {
		s.queue[0].f(s.cache)
		s.queue = s.queue[1:]
	}
}

// check: by the one usage rule over the API's objects, no GPU holds more
// than its allocatable MiB or 100 % SM, and an exclusive holder is alone.
func (s *sim) check() {
	pods := make([]corev1.Pod, 0, len(s.pods))
	for _, p := range s.pods {
		pods = append(pods, *p)
	}
	plans := make([]v1alpha1.GPUPlan, 0, len(s.plans))
	for _, p := range s.plans {
		plans = append(plans, *p)
	}
	holders, warns := usage.Ledger(pods, plans)
	if len(warns) > 0 {
		s.t.Fatalf("warnings %v", warns)
	}
	mem, cores, n, excl := map[string]int64{}, map[string]int32{}, map[string]int{}, map[string]int{}
	who := map[string][]string{}
	for _, h := range holders {
		for _, u := range h.GPUs {
			mem[u.UUID] += u.MemoryMiB
			cores[u.UUID] += u.Cores
			n[u.UUID]++
			if u.Exclusive {
				excl[u.UUID]++
			}
			who[u.UUID] = append(who[u.UUID], h.Pod+h.Plan)
		}
	}
	for uuid := range n {
		if mem[uuid] > s.alloc[uuid] || cores[uuid] > 100 || (excl[uuid] > 0 && n[uuid] > 1) {
			s.t.Fatalf("GPU %s over-booked: %d MiB of %d, %d%% SM, %d holders (%d exclusive): %v\nops: %v",
				uuid, mem[uuid], s.alloc[uuid], cores[uuid], n[uuid], excl[uuid], who[uuid], s.ops)
		}
	}
}

// run interprets data as a sequence of operations.
func runSequence(t *testing.T, data []byte) *sim {
	s := newSim(t)
	for i := 0; i+1 < len(data); i += 2 {
		op, arg := data[i]%8, int(data[i+1])
		w := s.wls[arg%len(s.wls)]
		s.now = s.now.Add(time.Second)
		s.deliver(0)
		switch op {
		case 0, 1:
			s.ops = append(s.ops, "admit "+w.name)
			s.admit(w, arg%7 == 6)
		case 2:
			s.ops = append(s.ops, "bind "+w.name)
			s.bind(w)
		case 3:
			s.ops = append(s.ops, "evict "+w.name)
			s.evict(w)
		case 4:
			s.ops = append(s.ops, fmt.Sprint("terminate ", arg))
			s.terminate(arg)
		case 5, 6:
			s.ops = append(s.ops, fmt.Sprint("deliver ", arg%4))
			s.deliver(arg % 4)
		case 7:
			s.ops = append(s.ops, "restart")
			s.restart()
		}
		s.check()
	}
	s.deliver(len(s.queue))
	s.check()
	return s
}

// FuzzChurn: random sequences of admit / bind / evict / re-admit /
// pod-terminate / event delivery / manager-restart never put two plans or
// pods over a GPU's allocatable. The seed corpus (testdata/fuzz/FuzzChurn)
// holds over 1,000 sequences and runs with go test.
func FuzzChurn(f *testing.F) {
	f.Add([]byte{0, 0, 2, 0, 3, 0, 0, 0, 0, 1}) // admit, bind, evict, re-admit while the old pod terminates
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 400 {
			data = data[:400]
		}
		runSequence(t, data)
	})
}

// The seed corpus must exercise the interesting paths, not only no-ops.
func TestChurnCorpusDecides(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzChurn")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) < 1000 {
		t.Fatalf("%d seed sequences, want ≥ 1000", len(ents))
	}
	decided := 0
	for _, e := range ents[:50] {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		data, err := parseCorpus(b)
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		decided += runSequence(t, data).decided
	}
	if decided < 100 {
		t.Errorf("the first 50 sequences made %d plans; the corpus does not exercise the check", decided)
	}
}

// TestGenerateChurnCorpus writes the seed corpus when GPUPACK_GEN_CORPUS=1.
func TestGenerateChurnCorpus(t *testing.T) {
	if os.Getenv("GPUPACK_GEN_CORPUS") != "1" {
		t.Skip("set GPUPACK_GEN_CORPUS=1 to regenerate testdata/fuzz/FuzzChurn")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzChurn")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i < 1024; i++ {
		n := 40 + i%160
		data := make([]byte, n)
		for j := 0; j < n; j += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], x)
			copy(data[j:], b[:])
		}
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%04d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func parseCorpus(b []byte) ([]byte, error) {
	var s string
	if _, err := fmt.Sscanf(string(b), "go test fuzz v1\n[]byte(%q)\n", &s); err != nil {
		return nil, err
	}
	return []byte(s), nil
}
