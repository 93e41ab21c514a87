package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin/kubelettest"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
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
	cache := t.TempDir()
	kubelet := kubelettest.Start(t, dir)
	pods := &podSlice{}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	p := New(Config{
		ResourceName: v1alpha1.ResourceVGPU, SlotsPerGPU: 4, NodeName: "n1", PluginDir: dir, SocketName: "gpupack-vgpu.sock",
		HookDir: "/usr/local/gpupack", MountPreload: true, CacheHostDir: cache, MemoryLimits: true,
		Pods: pods, AllocateWait: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond, Metrics: m,
	})
	gpus := []v1alpha1.GPUInfo{
		{UUID: "GPU-a", Index: 0, MemoryMiB: 81920, NUMA: 0, Health: "Healthy"},
		{UUID: "GPU-b", Index: 1, MemoryMiB: 81920, NUMA: 0, Health: "Healthy"},
		{UUID: "GPU-c", Index: 2, MemoryMiB: 81920, NUMA: 1, Health: "Healthy"},
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
		wantEnv := map[string]string{
			v1alpha1.EnvVisibleDevices:     "GPU-a,GPU-c",
			v1alpha1.EnvMemoryLimit + "_0": "20000m",
			v1alpha1.EnvMemoryLimit + "_1": "30000m",
			v1alpha1.EnvSharedCache:        "/var/run/gpupack/vgpu.cache",
		}
		if d := cmp.Diff(wantEnv, r.Envs); d != "" {
			t.Errorf("envs (-want +got):\n%s", d)
		}
		wantMounts := []*pluginapi.Mount{
			{ContainerPath: "/usr/local/gpupack", HostPath: "/usr/local/gpupack", ReadOnly: true},
			{ContainerPath: "/etc/ld.so.preload", HostPath: "/usr/local/gpupack/ld.so.preload", ReadOnly: true},
			{ContainerPath: "/var/run/gpupack", HostPath: filepath.Join(cache, "uid-train", "main")},
		}
		if d := cmp.Diff(wantMounts, r.Mounts, cmpProto); d != "" {
			t.Errorf("mounts (-want +got):\n%s", d)
		}
		if fi, err := os.Stat(filepath.Join(cache, "uid-train", "main")); err != nil || !fi.IsDir() {
			t.Errorf("accounting dir not created: %v", err)
		}
		if v, _ := metrics.Value(reg, "gpupack_node_plugin_allocations_total", map[string]string{"resource": v1alpha1.ResourceVGPU, "result": "planned"}); v != 1 {
			t.Errorf("planned allocations metric = %v, want 1", v)
		}
	})

	t.Run("a pod without a plan gets a clear error", func(t *testing.T) {
		pods.add(makePod("rogue").Container("main", 1).Obj())
		_, _, err := kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
		if err == nil || !strings.Contains(err.Error(), "no planned pod is waiting for GPUs here") {
			t.Fatalf("err = %v, want a clear refusal", err)
		}
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
		if got := r.Envs[v1alpha1.EnvVisibleDevices]; got != "GPU-c" {
			t.Errorf("%s = %q, want GPU-c", v1alpha1.EnvVisibleDevices, got)
		}
	})
}

func TestUnplannedFreeGPUs(t *testing.T) {
	pods := &podSlice{}
	pods.add(makePod("holder").Devices("GPU-a:70000").Container("main", 1).Started("main").Obj())
	p := New(Config{ResourceName: v1alpha1.ResourceNvidiaGPU, NodeName: "n1", Unplanned: UnplannedFreeGPUs, Pods: pods, AllocateWait: time.Millisecond})
	p.SetGPUs([]v1alpha1.GPUInfo{{UUID: "GPU-a", Index: 0, MemoryMiB: 1, Health: "Healthy"}, {UUID: "GPU-b", Index: 1, MemoryMiB: 1, Health: "Healthy"}})
	ctx := context.Background()
	r, err := p.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-b::0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.ContainerResponses[0].Envs[v1alpha1.EnvVisibleDevices]; got != "GPU-b" {
		t.Errorf("free GPU: %q", got)
	}
	_, err = p.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a::0"}}}})
	if err == nil {
		t.Error("an unplanned request got a GPU a planned pod holds")
	}
}

var cmpProto = cmp.Comparer(func(a, b *pluginapi.Mount) bool {
	return a.ContainerPath == b.ContainerPath && a.HostPath == b.HostPath && a.ReadOnly == b.ReadOnly
})
