package bypass

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
)

// TestWatcherGraphicsAndMPSProcesses (outside review rev14, 0e1386c): GPU
// memory held through a graphics context (Vulkan compute, EGL/OpenGL) or as
// an MPS client is only in GetGraphicsRunningProcesses /
// GetMPSComputeRunningProcesses, and bypasses the hook as well. The watcher
// lists all three; a PID in several lists counts once.
func TestWatcherGraphicsAndMPSProcesses(t *testing.T) {
	const uidA = "11111111-2222-3333-4444-555555555555"
	for _, tc := range []struct {
		name                   string
		compute, graphics, mps []nvml.ProcessInfo
		wantKill               bool
	}{
		{name: "graphics context", graphics: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 60 << 30}}, wantKill: true},
		{name: "MPS client", mps: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 60 << 30}}, wantKill: true},
		{name: "graphics only in addition to a small compute context", compute: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 500 << 20}},
			graphics: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 500 << 20}, {Pid: 101, UsedGpuMemory: 30 << 30}}, wantKill: true},
		// One process with a compute and a graphics context: NVML gives its
		// memory in both lists. Summed it would be 18000 MiB and be killed.
		{name: "one PID in two lists counts once", compute: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 9000 << 20}},
			graphics: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 9000 << 20}}, mps: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: nvmlfake.NotAvailable}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hw := nvmlfake.DGXH100()
			g0 := hw.GPUs[0]
			pod := gpuPod("a", uidA, g0.UUID()+":10000")
			proc := procRoot(t.TempDir())
			proc.writePID(t, 100, uidA)
			proc.writePID(t, 101, uidA)
			g0.Set(func(g *nvmlfake.GPU) { g.Processes, g.Graphics, g.MPS = tc.compute, tc.graphics, tc.mps })
			k := &fakeKiller{}
			cs := fake.NewClientset(pod)
			w := New(Config{
				NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
				Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil }),
				Plans: plansOf(pod), Killer: k, Client: cs, Recorder: record.NewFakeRecorder(10),
				Policy: PolicyEnforce, SlackMiB: 512,
			})
			found, err := w.Once(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !tc.wantKill {
				if len(found) != 0 || len(k.killed) != 0 {
					t.Errorf("findings %v, killed %v; want none", found, k.killed)
				}
				return
			}
			if len(found) != 1 || found[0].Kind != metrics.KindOverLimit || len(k.killed) == 0 {
				t.Fatalf("findings %+v, killed %v; want over_limit and the pod's processes killed", found, k.killed)
			}
			if d := cmp.Diff([]string{"ns/a grace=0"}, deletes(cs)); d != "" {
				t.Errorf("pod deletes (-want +got):\n%s", d)
			}
		})
	}
}

// TestWatcherUnattributedMemory: device memory in use that no process list
// shows cannot be charged to a pod; beyond the tolerance for two passes
// running it is a finding on the node (metric, Event on the Node), and
// nothing is killed or deleted.
func TestWatcherUnattributedMemory(t *testing.T) {
	const uidA = "11111111-2222-3333-4444-555555555555"
	hw := nvmlfake.DGXH100()
	g0 := hw.GPUs[0]
	pod := gpuPod("a", uidA, g0.UUID()+":10000")
	proc := procRoot(t.TempDir())
	proc.writePID(t, 100, uidA)
	g0.Set(func(g *nvmlfake.GPU) {
		g.Processes = []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 9000 << 20}}
		g.UnlistedMiB = 30000
	})
	reg := prometheus.NewRegistry()
	k := &fakeKiller{}
	cs := fake.NewClientset(pod)
	rec := record.NewFakeRecorder(10)
	w := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
		Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil }),
		Plans: plansOf(pod), Killer: k, Client: cs, Recorder: rec, Metrics: metrics.New(reg),
		Policy: PolicyEnforce, SlackMiB: 512, UnattributedMiB: 1024,
	})
	ctx := context.Background()
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		v, err := metrics.Value(reg, name, labels)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if f, err := w.Once(ctx); err != nil || len(f) != 0 {
		t.Fatalf("first pass: findings %v (%v); one pass may compare a stale process list, want none", f, err)
	}
	if v := value("gpupack_node_gpu_memory_unattributed_mib", map[string]string{"gpu": g0.UUID()}); v != 30000 {
		t.Errorf("unattributed gauge %v, want 30000", v)
	}
	f, err := w.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 1 || f[0].Kind != metrics.KindUnattributed || f[0].GPU != g0.UUID() || f[0].UsedMiB != 30000 || f[0].Pod != "" {
		t.Fatalf("second pass: findings %+v, want one unattributed finding of 30000 MiB on GPU 0", f)
	}
	if len(k.killed) != 0 || len(deletes(cs)) != 0 {
		t.Errorf("killed %v, deletes %v: nothing is attributable, nothing may be enforced", k.killed, deletes(cs))
	}
	if e := <-rec.Events; !strings.Contains(e, ReasonUnattributed) || !strings.Contains(e, "30000 MiB") {
		t.Errorf("event %q", e)
	}
	if v := value("gpupack_node_bypass_detections_total", map[string]string{"kind": metrics.KindUnattributed}); v != 1 {
		t.Errorf("detections{unattributed} = %v, want 1", v)
	}
	// Back within the tolerance: the gauge follows, no finding.
	g0.Set(func(g *nvmlfake.GPU) { g.UnlistedMiB = 500 })
	if f, _ := w.Once(ctx); len(f) != 0 {
		t.Errorf("findings %v at 500 MiB unattributed", f)
	}
	if v := value("gpupack_node_gpu_memory_unattributed_mib", map[string]string{"gpu": g0.UUID()}); v != 500 {
		t.Errorf("unattributed gauge %v, want 500", v)
	}
}

// TestWatcherForgetsGonePods: the watcher's memory of reports and deletes
// does not grow with every pod UID for the agent's life: a deleted pod's
// entry goes with the pod, a report once it is older than ReportEvery
// (when it would be announced again anyway).
func TestWatcherForgetsGonePods(t *testing.T) {
	hw := nvmlfake.DGXH100()
	g0 := hw.GPUs[0]
	proc := procRoot(t.TempDir())
	var pods []*corev1.Pod
	now := time.Unix(0, 0)
	cs := fake.NewClientset()
	w := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
		Pods:   deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return pods, nil }),
		Plans:  deviceplugin.PlanListerFunc(func(string) ([]*v1alpha1.GPUPlan, error) { return plansOf(pods...).Plans("") }),
		Killer: &fakeKiller{}, Client: cs, Recorder: record.NewFakeRecorder(1000),
		Policy: PolicyEnforce, SlackMiB: 512, ReportEvery: time.Minute, Now: func() time.Time { return now },
	})
	ctx := context.Background()
	for i := range 50 {
		uid := fmt.Sprintf("11111111-2222-3333-4444-%012d", i)
		pod := gpuPod(fmt.Sprintf("p%d", i), uid, g0.UUID()+":10000")
		pods = []*corev1.Pod{pod}
		proc.writePID(t, uint32(100+i), uid)
		g0.Set(func(g *nvmlfake.GPU) {
			g.Processes = []nvml.ProcessInfo{{Pid: uint32(100 + i), UsedGpuMemory: 20000 << 20}}
		})
		if f, err := w.Once(ctx); err != nil || len(f) != 1 {
			t.Fatalf("pod %d: findings %v (%v), want one over_limit", i, f, err)
		}
		// The pod is deleted (grace 0) and gone from the lister.
		pods = nil
		g0.Set(func(g *nvmlfake.GPU) { g.Processes = nil })
		now = now.Add(20 * time.Second)
		if _, err := w.Once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w.mu.Lock()
	reported, deleted := len(w.reported), len(w.deleted)
	w.mu.Unlock()
	// Reports of the last minute (3 passes of 20 s) at most; no deletes.
	if reported > 3 || deleted != 0 {
		t.Errorf("after 50 pods came and went: %d reports, %d deletes remembered; want ≤ 3 and 0", reported, deleted)
	}
}

// TestWatcherHiddenMemoryOfSeveralPodsIsNotUnattributed: where NVML does not
// report per-process memory (MIG, missing permission) and the processes are
// several pods', the device's memory is theirs, just not split: no
// "unattributed" finding on the node every pass (MIG slices bound each).
func TestWatcherHiddenMemoryOfSeveralPodsIsNotUnattributed(t *testing.T) {
	const uidA, uidB = "11111111-2222-3333-4444-555555555555", "11111111-2222-3333-4444-666666666666"
	hw := nvmlfake.DGXH100()
	g0 := hw.GPUs[0]
	a, b := gpuPod("a", uidA, g0.UUID()+":10000"), gpuPod("b", uidB, g0.UUID()+":10000")
	proc := procRoot(t.TempDir())
	proc.writePID(t, 100, uidA)
	proc.writePID(t, 200, uidB)
	g0.Set(func(g *nvmlfake.GPU) {
		g.HideProcessMemory = true
		g.Processes = []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 9000 << 20}, {Pid: 200, UsedGpuMemory: 9000 << 20}}
	})
	w := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)},
		Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{a, b}, nil }),
		Plans: plansOf(a, b), Killer: &fakeKiller{}, Client: fake.NewClientset(a, b), Policy: PolicyWarn, SlackMiB: 512,
	})
	for range 3 {
		if f, err := w.Once(context.Background()); err != nil || len(f) != 0 {
			t.Fatalf("findings %+v (%v), want none", f, err)
		}
	}
}
