package deviceplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin/kubelettest"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
	"github.com/gpupack/gpupack/flavors"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type podSlice struct {
	mu   sync.Mutex
	pods []*corev1.Pod
}

func (s *podSlice) List() ([]*corev1.Pod, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*corev1.Pod(nil), s.pods...), nil
}

// Plans are the GPUPlans binding the pods (planFor).
func (s *podSlice) Plans(string) ([]*v1alpha1.GPUPlan, error) {
	pods, _ := s.List()
	return planFor(pods...), nil
}

func (s *podSlice) add(p *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = append(s.pods, p)
}

func TestPluginWithFakeKubelet(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cache, limitsDir := t.TempDir(), t.TempDir()
	kubelet := kubelettest.Start(t, dir)
	pods := &podSlice{}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	rec := record.NewFakeRecorder(100)
	p := New(Config{
		ResourceName: v1alpha1.ResourceVGPU, SlotsPerGPU: 4, NodeName: "n1", PluginDir: dir, SocketName: "gpupack-vgpu.sock",
		HookDir: "/usr/local/gpupack", MountPreload: true, CacheHostDir: cache, LimitsDir: limitsDir, MemoryLimits: true,
		Pods: pods, Plans: pods, Recorder: rec, AllocateWait: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond, Metrics: m,
	})
	gpus := []v1alpha1.GPUInfo{
		{UUID: "GPU-a", Index: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, NUMA: 0, Health: "Healthy"},
		{UUID: "GPU-b", Index: 1, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, NUMA: 0, Health: "Healthy"},
		{UUID: "GPU-c", Index: 2, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, NUMA: 1, Health: "Healthy"},
	}
	p.SetGPUs(gpus)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	waitFor(t, "registration", func() bool { return len(kubelet.Registrations()) == 1 && kubelet.Plugin(v1alpha1.ResourceVGPU) != nil })
	rr := kubelet.Registrations()[0]
	if rr.ResourceName != v1alpha1.ResourceVGPU || rr.Endpoint != "gpupack-vgpu.sock" || !rr.Options.GetPreferredAllocationAvailable {
		t.Errorf("register request = %+v", rr)
	}
	waitFor(t, "device list", func() bool { return len(kubelet.Devices(v1alpha1.ResourceVGPU)) == 12 })

	t.Run("Allocate returns exactly the planned GPUs", func(t *testing.T) {
		// Planned on GPUs c and a (listed out of index order on purpose).
		pods.add(makePod("train").Devices("GPU-c:30000,GPU-a:20000").Container("main", 2).Obj())
		r, ids, err := kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 2)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff([]string{"GPU-c::0", "GPU-a::0"}, ids); d != "" {
			t.Errorf("preferred slots (-want +got):\n%s", d)
		}
		if len(r.Envs) != 0 {
			t.Errorf("envs = %v, want none (devices by CDI, limits by file)", r.Envs)
		}
		var cdi []string
		for _, d := range r.CdiDevices {
			cdi = append(cdi, d.Name)
		}
		if d := cmp.Diff([]string{"nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-c"}, cdi); d != "" {
			t.Errorf("CDI devices (-want +got):\n%s", d)
		}
		limitsFile := filepath.Join(limitsDir, "uid-train", "main", "limits")
		wantMounts := []*pluginapi.Mount{
			{ContainerPath: "/usr/local/gpupack", HostPath: "/usr/local/gpupack", ReadOnly: true},
			{ContainerPath: "/etc/ld.so.preload", HostPath: "/usr/local/gpupack/ld.so.preload", ReadOnly: true},
			{ContainerPath: "/var/run/gpupack", HostPath: filepath.Join(cache, "uid-train", "main")},
			{ContainerPath: "/etc/gpupack/limits", HostPath: limitsFile, ReadOnly: true},
		}
		if d := cmp.Diff(wantMounts, r.Mounts, cmpProto); d != "" {
			t.Errorf("mounts (-want +got):\n%s", d)
		}
		b, err := os.ReadFile(limitsFile)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseLimits(b)
		if err != nil {
			t.Fatalf("limits file does not parse: %v\n%s", err, b)
		}
		wantLimits := map[string]string{
			"CUDA_DEVICE_MEMORY_LIMIT_0": "20000m", "CUDA_DEVICE_SM_LIMIT_0": "30",
			"CUDA_DEVICE_MEMORY_LIMIT_1": "30000m", "CUDA_DEVICE_SM_LIMIT_1": "30",
			"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/var/run/gpupack/vgpu.cache",
			"GPUPACK_CONTEXT_RESERVE":         "512m",
		}
		if d := cmp.Diff(wantLimits, got); d != "" {
			t.Errorf("limits (-want +got):\n%s", d)
		}
		if fi, err := os.Stat(limitsFile); err != nil || fi.Mode().Perm() != 0o444 {
			t.Errorf("limits file mode = %v, %v; want 0444", fi.Mode(), err)
		}
		if fi, err := os.Stat(filepath.Dir(limitsFile)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("limits dir mode = %v, %v; want 0755", fi.Mode(), err)
		}
		if fi, err := os.Stat(filepath.Join(cache, "uid-train", "main")); err != nil || !fi.IsDir() {
			t.Errorf("accounting dir not created: %v", err)
		}
		if v, _ := metrics.Value(reg, "gpupack_node_plugin_allocations_total", map[string]string{"resource": v1alpha1.ResourceVGPU, "result": "planned"}); v != 1 {
			t.Errorf("planned allocations metric = %v, want 1", v)
		}
	})

	t.Run("a pod without a plan gets a clear error and an Event", func(t *testing.T) {
		pods.add(makePod("rogue").Container("main", 1).Obj())
		_, _, err := kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
		if err == nil || !strings.Contains(err.Error(), "ns/rogue, which no GPUPlan covers") {
			t.Fatalf("err = %v, want a clear refusal", err)
		}
		if !hasEvent(drain(rec), "Warning NoGPUPlan gpupack-node n1 refuses gpupack.io/vgpu") {
			t.Error("no NoGPUPlan Event")
		}
		pods.mu.Lock()
		pods.pods = pods.pods[:len(pods.pods)-1]
		pods.mu.Unlock()
	})

	// Finding 1: an unplanned pod bound next to a waiting planned pod gets
	// nothing, and the planned pod's slot is not handed out on a guess.
	t.Run("an unplanned pod next to a planned one is never handed its slot", func(t *testing.T) {
		pods.add(makePod("planned").Devices("GPU-b:1000").Container("main", 1).Created(time.Minute).Obj())
		pods.add(makePod("rogue2").Container("main", 1).Created(2 * time.Minute).Obj())
		_, _, err := kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
		if err == nil || !strings.Contains(err.Error(), "could be for any of ns/planned (planned GPU-b:1000), ns/rogue2 (no plan)") {
			t.Fatalf("err = %v, want a refusal naming both pods", err)
		}
		if _, err := os.Stat(filepath.Join(limitsDir, "uid-planned")); err == nil {
			t.Error("the planned pod's limits file was written for a refused request")
		}
		events := drain(rec)
		for _, want := range []string{"Warning AmbiguousAllocation gpupack-node n1 refuses gpupack.io/vgpu: refused: 1 gpupack.io/vgpu could be for any of"} {
			if n := countEvents(events, want); n != 2 {
				t.Errorf("%d events %q in %q, want one per pod", n, want, events)
			}
		}
		// The kubelet fails the refused pod's admission; the unplanned one
		// gone, the planned pod gets exactly its own slot.
		pods.mu.Lock()
		pods.pods = pods.pods[:len(pods.pods)-1]
		pods.mu.Unlock()
		r, _, err := kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.CdiDevices) != 1 || r.CdiDevices[0].Name != "nvidia.com/gpu=GPU-b" {
			t.Errorf("CDI devices = %v, want GPU-b", r.CdiDevices)
		}
	})

	t.Run("a forged or disagreeing annotation gets a clear error and an Event", func(t *testing.T) {
		// Another tenant's pod claims GPU-a with 70000 MiB; no plan binds it.
		pods.add(makePod("forged").Forged("GPU-a:70000").Container("main", 1).Created(time.Minute).Obj())
		// This one is planned for 1000 MiB but its annotation says 70000.
		pods.add(makePod("liar").Devices("GPU-b:70000").PlanSays("GPU-b:1000").Container("main", 1).Created(2 * time.Minute).Obj())
		for _, want := range []string{"no GPUPlan binds pod UID uid-forged", "disagrees with GPUPlan plan-liar slot main[0] (GPU-b:1000)"} {
			_, _, err := kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("err = %v, want it to contain %q", err, want)
			}
		}
		events := drain(rec)
		for _, want := range []string{"Warning GPUPlanMismatch gpupack-node n1 refuses gpupack.io/vgpu: pod ns/forged", "Warning GPUPlanMismatch gpupack-node n1 refuses gpupack.io/vgpu: pod ns/liar"} {
			if !hasEvent(events, want) {
				t.Errorf("no event %q in %q", want, events)
			}
		}
		if _, err := os.Stat(filepath.Join(limitsDir, "uid-liar")); err == nil {
			t.Error("a limits file was written for a refused pod")
		}
		pods.mu.Lock()
		pods.pods = pods.pods[:len(pods.pods)-2]
		pods.mu.Unlock()
	})

	t.Run("health reaches the kubelet", func(t *testing.T) {
		sick := append([]v1alpha1.GPUInfo(nil), gpus...)
		sick[1].Health = v1alpha1.GPUUnhealthy
		p.SetGPUs(sick)
		waitFor(t, "ListAndWatch update", func() bool {
			for _, d := range kubelet.Devices(v1alpha1.ResourceVGPU) {
				if d.Health == pluginapi.Unhealthy {
					return true
				}
			}
			return false
		})
		unhealthy := 0
		for _, d := range kubelet.Devices(v1alpha1.ResourceVGPU) {
			if d.Health == pluginapi.Unhealthy {
				unhealthy++
				if !strings.HasPrefix(d.ID, "GPU-b::") {
					t.Errorf("slot %s unhealthy", d.ID)
				}
			}
		}
		if unhealthy != 4 {
			t.Errorf("%d unhealthy slots, want 4", unhealthy)
		}
	})

	t.Run("re-registers after a kubelet restart", func(t *testing.T) {
		kubelet.Restart(t)
		waitFor(t, "re-registration", func() bool {
			return len(kubelet.Registrations()) == 2 && kubelet.Plugin(v1alpha1.ResourceVGPU) != nil && len(kubelet.Devices(v1alpha1.ResourceVGPU)) == 12
		})
		if p.Registrations() != 2 {
			t.Errorf("plugin registrations = %d, want 2", p.Registrations())
		}
		// The new connection serves Allocate.
		pods.add(makePod("after").Devices("GPU-c:1000").Container("main", 1).Created(time.Hour).Obj())
		r, _, err := kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.CdiDevices) != 1 || r.CdiDevices[0].Name != "nvidia.com/gpu=GPU-c" {
			t.Errorf("CDI devices = %v, want GPU-c", r.CdiDevices)
		}
	})
}

func TestUnplannedFreeGPUs(t *testing.T) {
	ctx := context.Background()
	holder := makePod("holder").Devices("GPU-a:70000").WholeGPU("main", 1).Started("main").Obj()
	u1 := makePod("u1").WholeGPU("main", 1).Obj()
	u2 := makePod("u2").WholeGPU("main", 2).Created(time.Minute).Obj()
	client := fake.NewSimpleClientset(holder, u1, u2)
	// A plan (its pod not created yet) reserves GPU-c on this node.
	reserved := &v1alpha1.GPUPlan{
		ObjectMeta: metav1.ObjectMeta{Name: "later", Namespace: "ns"},
		Spec:       v1alpha1.GPUPlanSpec{Assignments: []v1alpha1.PodAssignment{{PodSet: "main", Node: "n1", GPUs: []v1alpha1.GPUAssignment{{UUID: "GPU-c", MemoryMiB: 72228, Exclusive: true}}}}},
		Status:     v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlanned},
	}
	fromAPI := PodListerFunc(func() ([]*corev1.Pod, error) {
		list, err := client.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []*corev1.Pod
		for i := range list.Items {
			out = append(out, &list.Items[i])
		}
		return out, nil
	})
	// The lister lags: it shows the pods as created, never the node's patch.
	stale := &podSlice{pods: []*corev1.Pod{holder, u1, u2}}
	plans := PlanListerFunc(func(string) ([]*v1alpha1.GPUPlan, error) {
		return append(planFor(holder), reserved), nil
	})
	gpus := []v1alpha1.GPUInfo{
		{UUID: "GPU-a", Index: 0, MemoryMiB: 81920, Health: "Healthy"},
		{UUID: "GPU-b", Index: 1, MemoryMiB: 81920, Health: "Healthy"},
		{UUID: "GPU-c", Index: 2, MemoryMiB: 81920, Health: "Healthy"},
	}
	newPlugin := func(pods PodLister) *Plugin {
		p := New(Config{ResourceName: v1alpha1.ResourceNvidiaGPU, NodeName: "n1", Unplanned: UnplannedFreeGPUs, Pods: pods, Plans: plans,
			Client: client, AllocatableMiB: flavors.DefaultBuffer().Allocatable, AllocateWait: time.Millisecond})
		p.SetGPUs(gpus)
		return p
	}
	alloc := func(p *Plugin, slot string) (*pluginapi.ContainerAllocateResponse, error) {
		r, err := p.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{slot}}}})
		if err != nil {
			return nil, err
		}
		return r.ContainerResponses[0], nil
	}
	p := newPlugin(stale)
	for _, slot := range []string{"GPU-a::0", "GPU-c::0"} {
		if _, err := alloc(p, slot); err == nil || !strings.Contains(err.Error(), "held by a plan or a pod") {
			t.Errorf("%s: err = %v, want held", slot, err)
		}
	}
	r, err := alloc(p, "GPU-b::0")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.CdiDevices) != 1 || r.CdiDevices[0].Name != "nvidia.com/gpu=GPU-b" {
		t.Errorf("CDI devices = %v, want GPU-b", r.CdiDevices)
	}
	got, err := client.CoreV1().Pods("ns").Get(ctx, "u1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantDevices := "GPU-b:" + strconv.FormatInt(flavors.DefaultBuffer().Allocatable(81920), 10)
	if got.Annotations[v1alpha1.AnnotationDevices] != wantDevices || got.Annotations[AnnotationAllocatedBy] != "gpupack-node/n1" {
		t.Errorf("u1 annotations = %v, want %s=%s recorded by the node", got.Annotations, v1alpha1.AnnotationDevices, wantDevices)
	}
	// The lister has not caught up; the GPU is still not handed out twice.
	if _, err := alloc(p, "GPU-b::0"); err == nil {
		t.Error("GPU-b handed out twice before the lister saw the record")
	}
	// A restarted agent reads the record back from the API.
	p2 := newPlugin(fromAPI)
	if _, err := alloc(p2, "GPU-b::0"); err == nil || !strings.Contains(err.Error(), "held by a plan or a pod") {
		t.Errorf("after restart: err = %v, want GPU-b held", err)
	}
	// u2 gets the last free GPU... none is left (a holds, b recorded, c planned).
	if _, err := alloc(p2, "GPU-c::0"); err == nil {
		t.Error("u2 got the GPU a plan reserves")
	}
	// With no unplanned pod waiting, a free GPU is not handed out either.
	if _, err := alloc(newPlugin(&podSlice{pods: []*corev1.Pod{holder}}), "GPU-b::0"); err == nil || !strings.Contains(err.Error(), "no planned pod is waiting") {
		t.Errorf("nobody waiting: err = %v", err)
	}
	// Two unplanned pods wait for one GPU each: the node cannot tell which
	// one the kubelet allocates for, so it records nothing on either.
	u3 := makePod("u3").WholeGPU("main", 1).Created(2 * time.Minute).Obj()
	if _, err := alloc(newPlugin(&podSlice{pods: []*corev1.Pod{holder, u1, u3}}), "GPU-b::0"); err == nil || !strings.Contains(err.Error(), "could be for any of ns/u1 (no plan), ns/u3 (no plan)") {
		t.Errorf("two unplanned pods: err = %v, want a refusal naming both", err)
	}
	// Without an API client the allocation cannot be recorded: refused.
	p3 := New(Config{ResourceName: v1alpha1.ResourceNvidiaGPU, NodeName: "n1", Unplanned: UnplannedFreeGPUs, Pods: stale, Plans: plans, AllocateWait: time.Millisecond})
	p3.SetGPUs(gpus)
	if _, err := alloc(p3, "GPU-b::0"); err == nil || !strings.Contains(err.Error(), "cannot record") {
		t.Errorf("no client: err = %v", err)
	}
}

func hasEvent(events []string, prefix string) bool { return countEvents(events, prefix) > 0 }

func countEvents(events []string, prefix string) int {
	n := 0
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

func drain(rec *record.FakeRecorder) []string {
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

var cmpProto = cmp.Comparer(func(a, b *pluginapi.Mount) bool {
	return a.ContainerPath == b.ContainerPath && a.HostPath == b.HostPath && a.ReadOnly == b.ReadOnly
})

// TestUnplannedFailsFast (finding 3): a pod no plan covers is answered at
// once, by GetPreferredAllocation and Allocate alike, instead of holding
// the kubelet's admission for the informer wait. The wait is an hour here:
// a plugin that waited would end at the context's deadline instead, with
// a different error.
func TestUnplannedFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods := &podSlice{pods: []*corev1.Pod{makePod("rogue").Container("main", 1).Obj()}}
	p := New(Config{ResourceName: v1alpha1.ResourceVGPU, SlotsPerGPU: 4, NodeName: "n1", Pods: pods, Plans: pods, AllocateWait: time.Hour})
	p.SetGPUs([]v1alpha1.GPUInfo{{UUID: "GPU-a", Index: 0, MemoryMiB: 81920, Health: "Healthy"}})
	if _, err := p.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"GPU-a::0", "GPU-a::1"}, AllocationSize: 1}}}); err != nil {
		t.Fatalf("GetPreferredAllocation: %v (it waited for a plan that cannot come)", err)
	}
	_, err := p.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a::0"}}}})
	if err == nil || !errors.Is(err, ErrRefused) || strings.Contains(err.Error(), "gave up") {
		t.Fatalf("Allocate: err = %v, want an immediate refusal", err)
	}
}
