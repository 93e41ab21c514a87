package bypass

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
)

// procRoot is a fake /proc: WritePID gives a PID the cgroup of a pod.
type procRoot string

func (r procRoot) writePID(t *testing.T, pid uint32, podUID string) {
	t.Helper()
	dir := filepath.Join(string(r), strconv.Itoa(int(pid)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := "0::/system.slice/sshd.service\n"
	if podUID != "" {
		cg = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/cri-containerd-1.scope\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
		t.Fatal(err)
	}
}

func gpuPod(name, uid, devices string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid), Annotations: map[string]string{v1alpha1.AnnotationDevices: devices}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceVGPU: *resource.NewQuantity(int64(strings.Count(devices, ",")+1), resource.DecimalSI)},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// plansOf binds every pod to a GPUPlan slot matching its annotation.
func plansOf(pods ...*corev1.Pod) deviceplugin.PlanLister {
	return deviceplugin.PlanListerFunc(func(string) ([]*v1alpha1.GPUPlan, error) {
		var out []*v1alpha1.GPUPlan
		for _, p := range pods {
			devs, err := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices])
			if err != nil {
				continue
			}
			a := v1alpha1.PodAssignment{PodSet: "main", Node: p.Spec.NodeName}
			for _, d := range devs {
				a.GPUs = append(a.GPUs, v1alpha1.GPUAssignment{UUID: d.UUID, MemoryMiB: d.MemoryMiB})
			}
			out = append(out, &v1alpha1.GPUPlan{
				ObjectMeta: metav1.ObjectMeta{Name: "plan-" + p.Name, Namespace: p.Namespace},
				Spec:       v1alpha1.GPUPlanSpec{Assignments: []v1alpha1.PodAssignment{a}},
				Status:     v1alpha1.GPUPlanStatus{Bindings: []v1alpha1.SlotBinding{{PodSet: "main", PodName: p.Name, PodUID: p.UID}}},
			})
		}
		return out, nil
	})
}

func TestWatcher(t *testing.T) {
	const uidA = "11111111-2222-3333-4444-555555555555"
	hw := nvmlfake.DGXH100()
	g0, g1 := hw.GPUs[0].UUID(), hw.GPUs[1].UUID()
	pod := gpuPod("a", uidA, g1+":20000,"+g0+":10000")
	proc := procRoot(t.TempDir())
	proc.writePID(t, 100, uidA)
	proc.writePID(t, 200, "")
	cache := t.TempDir()

	// The hook accounted 9000 MiB on ordinal 0 (= GPU 0, lower index) and
	// 1000 MiB on ordinal 1 (GPU 1).
	file := deviceplugin.HostCacheFile(cache, types.UID(uidA), "main")
	os.MkdirAll(filepath.Dir(file), 0o755)
	if err := os.WriteFile(file, EncodeRegion([][]uint64{{9000 << 20, 1000 << 20}}), 0o644); err != nil {
		t.Fatal(err)
	}

	cs := fake.NewClientset(pod)
	rec := record.NewFakeRecorder(100)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	now := time.Unix(0, 0)
	w := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
		Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil }),
		Plans: plansOf(pod), Killer: &fakeKiller{},
		Client: cs, Recorder: rec, Policy: PolicyWarn, SlackMiB: 512, CacheDir: cache, Metrics: m,
		ReportEvery: time.Minute, Now: func() time.Time { return now },
	})
	ctx := context.Background()
	setProcs := func(g *nvmlfake.GPU, ps ...nvml.ProcessInfo) { g.Set(func(g *nvmlfake.GPU) { g.Processes = ps }) }
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		v, err := metrics.Value(reg, name, labels)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	events := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}

	// Within its plan (plus a context allowance): nothing to report.
	setProcs(hw.GPUs[0], nvml.ProcessInfo{Pid: 100, UsedGpuMemory: 10200 << 20})
	if f, err := w.Once(ctx); err != nil || len(f) != 0 {
		t.Fatalf("within limit: findings %v, err %v", f, err)
	}
	if got := value("gpupack_node_hook_drift_mib", map[string]string{"namespace": "ns", "pod": "a", "gpu": g0}); got != 1200 {
		t.Errorf("drift on GPU 0 = %v, want 10200-9000 = 1200", got)
	}
	if got := value("gpupack_node_gpu_memory_limit_mib", map[string]string{"gpu": g1}); got != 20000 {
		t.Errorf("limit on GPU 1 = %v, want 20000", got)
	}

	// A static binary in the pod allocates 15 GiB on GPU 0 behind the hook.
	setProcs(hw.GPUs[0], nvml.ProcessInfo{Pid: 100, UsedGpuMemory: 10200 << 20}, nvml.ProcessInfo{Pid: 101, UsedGpuMemory: 15000 << 20})
	proc.writePID(t, 101, uidA)
	f, err := w.Once(ctx)
	if err != nil || len(f) != 1 || f[0].Kind != metrics.KindOverLimit || f[0].UsedMiB != 25200 || f[0].LimitMiB != 10000 {
		t.Fatalf("over limit: findings %+v, err %v", f, err)
	}
	ev := events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonOverLimit+" ") || !strings.Contains(ev[0], "over the 10000 MiB planned") {
		t.Errorf("events = %q", ev)
	}
	if got := value("gpupack_node_bypass_detections_total", map[string]string{"kind": metrics.KindOverLimit}); got != 1 {
		t.Errorf("detections = %v, want 1", got)
	}
	// Warn policy never evicts.
	for _, a := range cs.Actions() {
		if a.GetSubresource() == "eviction" {
			t.Errorf("warn policy evicted: %v", a)
		}
	}

	// The same standing finding is not re-announced every poll…
	if f, _ := w.Once(ctx); len(f) != 0 || len(events()) != 0 {
		t.Errorf("repeated finding re-reported: %v", f)
	}
	// …but is after ReportEvery.
	now = now.Add(time.Minute)
	if f, _ := w.Once(ctx); len(f) != 1 {
		t.Errorf("after ReportEvery: %v", f)
	}
	events()

	// A host process on GPU 1: an Event on the node, never an eviction.
	setProcs(hw.GPUs[1], nvml.ProcessInfo{Pid: 200, UsedGpuMemory: 300 << 20})
	f, _ = w.Once(ctx)
	if len(f) != 1 || f[0].Kind != metrics.KindUnknown {
		t.Errorf("host process: %+v", f)
	}
	if ev := events(); len(ev) != 1 || !strings.Contains(ev[0], ReasonUnknown) {
		t.Errorf("events = %q", ev)
	}
}

// fakeKiller records kills; verify runs as the real one runs it.
type fakeKiller struct{ killed []uint32 }

func (k *fakeKiller) Kill(pid uint32, verify func() bool) error {
	if !verify() {
		return errNotOurs
	}
	k.killed = append(k.killed, pid)
	return nil
}

// reusedAfterFirstLook runs reuse after pid is first resolved.
type reusedAfterFirstLook struct {
	Resolver
	pid   uint32
	reuse func()
	done  bool
}

func (r *reusedAfterFirstLook) PodOf(pid uint32) (types.UID, bool, error) {
	uid, ok, err := r.Resolver.PodOf(pid)
	if pid == r.pid && !r.done {
		r.done = true
		r.reuse()
	}
	return uid, ok, err
}

func deletes(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && a.GetResource().Resource == "pods" {
			grace := "default"
			if o := d.GetDeleteOptions(); o.GracePeriodSeconds != nil {
				grace = strconv.FormatInt(*o.GracePeriodSeconds, 10)
			}
			out = append(out, d.GetNamespace()+"/"+d.GetName()+" grace="+grace)
		}
		if a.GetSubresource() == "eviction" {
			out = append(out, "eviction")
		}
	}
	return out
}

// TestWatcherEnforce: over its plan plus one container's slack, a pod's GPU
// processes are SIGKILLed and the pod is deleted with grace 0 — even when
// it forks 64 processes, each under a per-process allowance.
func TestWatcherEnforce(t *testing.T) {
	const uidA = "11111111-2222-3333-4444-555555555555"
	hw := nvmlfake.DGXH100()
	g0 := hw.GPUs[0].UUID()
	pod := gpuPod("a", uidA, g0+":10000")
	proc := procRoot(t.TempDir())
	var ps []nvml.ProcessInfo
	for i := range 64 {
		pid := uint32(5000 + i)
		proc.writePID(t, pid, uidA)
		ps = append(ps, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: 672 << 20}) // 64 × 672 = 43008 MiB
	}
	proc.writePID(t, 9, "") // a host process on the same GPU
	ps = append(ps, nvml.ProcessInfo{Pid: 9, UsedGpuMemory: 100 << 20})
	// NVML samples: the overrun shows up in the second sample, not at once.
	hw.GPUs[0].Set(func(g *nvmlfake.GPU) {
		g.SampleEvery = 2
		g.Processes = []nvml.ProcessInfo{{Pid: 5000, UsedGpuMemory: 9000 << 20}}
	})
	cs := fake.NewClientset(pod)
	rec := record.NewFakeRecorder(100)
	k := &fakeKiller{}
	w := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
		Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil }),
		Plans: plansOf(pod), Killer: k,
		Client: cs, Recorder: rec, SlackMiB: 512, // default policy: enforce
	})
	ctx := context.Background()
	if _, err := w.Once(ctx); err != nil { // sample 1: within plan
		t.Fatal(err)
	}
	hw.GPUs[0].Set(func(g *nvmlfake.GPU) { g.Processes = ps })
	if f, _ := w.Once(ctx); len(f) != 0 || len(k.killed) != 0 { // still sample 1
		t.Fatalf("acted on a process list NVML had not sampled yet: %v, killed %v", f, k.killed)
	}
	// PID 5063 exits right after NVML sampled it and the watcher resolved
	// it, and the PID is reused by a host process before the kill.
	w.cfg.Resolver = &reusedAfterFirstLook{Resolver: w.cfg.Resolver, pid: 5063, reuse: func() { proc.writePID(t, 5063, "") }}
	for range 3 {
		if _, err := w.Once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(k.killed) != 3*63 {
		t.Fatalf("killed %d processes, want the pod's 63 in each of 3 passes (PID 5063 is not the pod's any more)", len(k.killed))
	}
	for _, pid := range k.killed {
		if pid == 9 || pid == 5063 {
			t.Errorf("killed pid %d, which is not the pod's", pid)
		}
	}
	if d := cmp.Diff([]string{"ns/a grace=0"}, deletes(cs)); d != "" {
		t.Errorf("pod deletes (-want +got):\n%s", d)
	}
	var enforced int
	for len(rec.Events) > 0 {
		if e := <-rec.Events; strings.Contains(e, ReasonEnforced) && strings.Contains(e, "deleted the pod (grace period 0)") {
			enforced++
		}
	}
	if enforced != 1 {
		t.Errorf("%d %s events naming the delete, want 1", enforced, ReasonEnforced)
	}

	// Policy warn reports the same thing and touches nothing.
	cs2, k2 := fake.NewClientset(pod), &fakeKiller{}
	warn := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
		Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil }),
		Plans: plansOf(pod), Killer: k2, Client: cs2, Policy: PolicyWarn, SlackMiB: 512,
	})
	if f, _ := warn.Once(ctx); len(f) != 2 || f[1].Kind != metrics.KindOverLimit || len(k2.killed) != 0 || len(deletes(cs2)) != 0 {
		t.Errorf("warn: findings %v, killed %v, deletes %v", f, k2.killed, deletes(cs2))
	}
}

func TestParsePolicy(t *testing.T) {
	for _, s := range []string{"warn", "kill", "enforce"} {
		if p, err := ParsePolicy(s); err != nil || string(p) != s {
			t.Errorf("ParsePolicy(%q) = %q, %v", s, p, err)
		}
	}
	if _, err := ParsePolicy("evict"); err == nil || !strings.Contains(err.Error(), "use enforce") {
		t.Errorf("evict: %v", err)
	}
}

// TestWatcherHostileAccountingFile: a container replaces its accounting file
// with a FIFO; the watcher neither blocks nor fails, and says so once.
func TestWatcherHostileAccountingFile(t *testing.T) {
	const uidA = "11111111-2222-3333-4444-555555555555"
	hw := nvmlfake.DGXH100()
	g0 := hw.GPUs[0].UUID()
	pod := gpuPod("a", uidA, g0+":10000")
	proc := procRoot(t.TempDir())
	proc.writePID(t, 100, uidA)
	cache := t.TempDir()
	file := deviceplugin.HostCacheFile(cache, types.UID(uidA), "main")
	if err := os.MkdirAll(filepath.Dir(file), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(file, 0o666); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(100)
	w := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
		Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil }),
		Plans: plansOf(pod), Killer: &fakeKiller{}, Recorder: rec, Policy: PolicyWarn, SlackMiB: 512, CacheDir: cache,
	})
	hw.GPUs[0].Set(func(g *nvmlfake.GPU) { g.Processes = []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 1000 << 20}} })
	for range 2 {
		done := make(chan error, 1)
		go func() { _, err := w.Once(context.Background()); done <- err }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("watcher pass blocked on a FIFO")
		}
	}
	var got []string
	for len(rec.Events) > 0 {
		got = append(got, <-rec.Events)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning "+ReasonHostileAccounting+" ") || !strings.Contains(got[0], "not a regular file") {
		t.Errorf("events = %q, want one %s", got, ReasonHostileAccounting)
	}
}

// TestWatcherPlanDeletedWhilePodRuns: the manager deletes a workload's plan
// when it is evicted, while its pods still checkpoint. They keep their
// limits (not "unassigned", not killed for holding their own GPU), also
// after an agent restart; a pod that never went through Allocate does not
// gain a limit from its annotation.
func TestWatcherPlanDeletedWhilePodRuns(t *testing.T) {
	const uidA, uidB = "11111111-2222-3333-4444-555555555555", "22222222-2222-3333-4444-555555555555"
	hw := nvmlfake.DGXH100()
	g0 := hw.GPUs[0].UUID()
	pod := gpuPod("a", uidA, g0+":10000")
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://a"}}
	forged := gpuPod("forged", uidB, g0+":70000") // never allocated: not started
	proc := procRoot(t.TempDir())
	proc.writePID(t, 100, uidA)
	proc.writePID(t, 200, uidB)
	plans := []*corev1.Pod{pod}
	lister := deviceplugin.PlanListerFunc(func(ns string) ([]*v1alpha1.GPUPlan, error) { return plansOf(plans...).Plans(ns) })
	newWatcher := func() (*Watcher, *fakeKiller) {
		k := &fakeKiller{}
		return New(Config{
			NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
			Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod, forged}, nil }),
			Plans: lister, Killer: k, Client: fake.NewClientset(pod, forged), SlackMiB: 512,
		}), k
	}
	kinds := func(fs []Finding) map[string]string {
		out := map[string]string{}
		for _, f := range fs {
			out[f.Key.Name] = f.Kind
		}
		return out
	}
	ctx := context.Background()
	w, k := newWatcher()
	hw.GPUs[0].Set(func(g *nvmlfake.GPU) { g.Processes = []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 9000 << 20}} })
	if f, _ := w.Once(ctx); len(f) != 0 {
		t.Fatalf("with plan: %v", f)
	}
	plans = nil // released: the manager deleted it
	if f, _ := w.Once(ctx); len(f) != 0 || len(k.killed) != 0 {
		t.Fatalf("plan deleted, within limit: findings %v, killed %v", f, k.killed)
	}
	w2, k2 := newWatcher() // an agent restart: nothing remembered
	if f, _ := w2.Once(ctx); len(f) != 0 || len(k2.killed) != 0 {
		t.Fatalf("after restart, within limit: findings %v, killed %v", f, k2.killed)
	}
	hw.GPUs[0].Set(func(g *nvmlfake.GPU) {
		g.Processes = []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 20000 << 20}, {Pid: 200, UsedGpuMemory: 1000 << 20}}
	})
	f, _ := w2.Once(ctx)
	if d := cmp.Diff(map[string]string{"a": metrics.KindOverLimit, "forged": metrics.KindUnassigned}, kinds(f)); d != "" {
		t.Errorf("findings (-want +got):\n%s", d)
	}
}

// TestWatcherMemoryNotAvailable: NVML reports a process's memory as not
// available; the device's used memory still convicts the pod.
func TestWatcherMemoryNotAvailable(t *testing.T) {
	const uidA = "11111111-2222-3333-4444-555555555555"
	hw := nvmlfake.DGXH100()
	g0 := hw.GPUs[0].UUID()
	pod := gpuPod("a", uidA, g0+":10000")
	proc := procRoot(t.TempDir())
	proc.writePID(t, 100, uidA)
	proc.writePID(t, 101, uidA)
	w := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
		Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil }),
		Plans: plansOf(pod), Killer: &fakeKiller{}, Policy: PolicyWarn, SlackMiB: 512,
	})
	hw.GPUs[0].Set(func(g *nvmlfake.GPU) {
		g.HideProcessMemory = true
		g.Processes = []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 9000 << 20}, {Pid: 101, UsedGpuMemory: 11000 << 20}}
	})
	f, err := w.Once(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 1 || f[0].Kind != metrics.KindOverLimit || f[0].UsedMiB != 20000 {
		t.Errorf("findings %+v, want over_limit at 20000 MiB", f)
	}
}
