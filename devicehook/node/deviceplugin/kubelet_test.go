package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
)

// fakeKubelet is the kubelet's side of the device-plugin protocol: a
// Registration server on kubelet.sock that, like the real device manager,
// dials the plugin back and keeps its ListAndWatch stream.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir string
	srv *grpc.Server

	mu      sync.Mutex
	regs    []*pluginapi.RegisterRequest
	client  pluginapi.DevicePluginClient
	devices []*pluginapi.Device
	updates chan []*pluginapi.Device
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{dir: dir, updates: make(chan []*pluginapi.Device, 16)}
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k.srv = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	return k
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c := pluginapi.NewDevicePluginClient(conn)
	k.mu.Lock()
	k.regs = append(k.regs, r)
	k.client = c
	k.mu.Unlock()
	go func() {
		s, err := c.ListAndWatch(context.Background(), &pluginapi.Empty{})
		if err != nil {
			return
		}
		for {
			resp, err := s.Recv()
			if err != nil {
				return
			}
			k.mu.Lock()
			k.devices = resp.Devices
			k.mu.Unlock()
			k.updates <- resp.Devices
		}
	}()
	return &pluginapi.Empty{}, nil
}

// restart does what a kubelet restart does to the plugin directory: stop
// serving, delete every socket, serve a new kubelet.sock.
func (k *fakeKubelet) restart(t *testing.T) *fakeKubelet {
	k.srv.Stop()
	ents, _ := os.ReadDir(k.dir)
	for _, e := range ents {
		_ = os.Remove(filepath.Join(k.dir, e.Name()))
	}
	nk := startKubelet(t, k.dir)
	k.mu.Lock()
	nk.regs = append(nk.regs, k.regs...)
	k.mu.Unlock()
	return nk
}

func (k *fakeKubelet) registrations() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.regs)
}

func (k *fakeKubelet) plugin() pluginapi.DevicePluginClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.client
}

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

// allocate plays the kubelet's device manager for one container: ask for a
// preference among the available slots, then Allocate what it got.
func allocate(ctx context.Context, c pluginapi.DevicePluginClient, available []string, size int) (*pluginapi.ContainerAllocateResponse, []string, error) {
	pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: available, AllocationSize: int32(size)},
	}})
	if err != nil {
		return nil, nil, err
	}
	ids := pref.ContainerResponses[0].DeviceIDs
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, ids, err
	}
	return resp.ContainerResponses[0], ids, nil
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
	kubelet := startKubelet(t, dir)
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

	waitFor(t, "registration", func() bool { return kubelet.registrations() == 1 && kubelet.plugin() != nil })
	rr := kubelet.regs[0]
	if rr.ResourceName != v1alpha1.ResourceVGPU || rr.Endpoint != "gpupack-vgpu.sock" || !rr.Options.GetPreferredAllocationAvailable {
		t.Errorf("register request = %+v", rr)
	}
	devs := <-kubelet.updates
	if len(devs) != 12 {
		t.Fatalf("advertised %d slots, want 3 GPUs × 4", len(devs))
	}
	var available []string
	for _, d := range devs {
		available = append(available, d.ID)
	}
	c := kubelet.plugin()

	t.Run("Allocate returns exactly the planned GPUs", func(t *testing.T) {
		// Planned on GPUs c and a (listed out of index order on purpose).
		pods.add(makePod("train").Devices("GPU-c:30000,GPU-a:20000").Container("main", 2).Obj())
		r, ids, err := allocate(ctx, c, available, 2)
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
			v1alpha1.EnvSharedCache:        v1alpha1.DefaultSharedCacheDir + "/main.cache",
		}
		if d := cmp.Diff(wantEnv, r.Envs); d != "" {
			t.Errorf("envs (-want +got):\n%s", d)
		}
		wantMounts := []*pluginapi.Mount{
			{ContainerPath: "/usr/local/gpupack", HostPath: "/usr/local/gpupack", ReadOnly: true},
			{ContainerPath: "/etc/ld.so.preload", HostPath: "/usr/local/gpupack/ld.so.preload", ReadOnly: true},
			{ContainerPath: v1alpha1.DefaultSharedCacheDir, HostPath: filepath.Join(cache, "uid-train")},
		}
		if d := cmp.Diff(wantMounts, r.Mounts, cmpProto); d != "" {
			t.Errorf("mounts (-want +got):\n%s", d)
		}
		if fi, err := os.Stat(filepath.Join(cache, "uid-train")); err != nil || !fi.IsDir() {
			t.Errorf("accounting dir not created: %v", err)
		}
		if v, _ := metrics.Value(reg, "gpupack_node_plugin_allocations_total", map[string]string{"resource": v1alpha1.ResourceVGPU, "result": "planned"}); v != 1 {
			t.Errorf("planned allocations metric = %v, want 1", v)
		}
	})

	t.Run("a pod without a plan gets a clear error", func(t *testing.T) {
		pods.add(makePod("rogue").Container("main", 1).Obj())
		_, _, err := allocate(ctx, c, available, 1)
		if err == nil || !strings.Contains(err.Error(), "no planned pod is waiting for GPUs here") {
			t.Fatalf("err = %v, want a clear refusal", err)
		}
	})

	t.Run("health reaches the kubelet", func(t *testing.T) {
		sick := append([]v1alpha1.GPUInfo(nil), gpus...)
		sick[1].Health = v1alpha1.GPUUnhealthy
		p.SetGPUs(sick)
		var got []*pluginapi.Device
		select {
		case got = <-kubelet.updates:
		case <-time.After(5 * time.Second):
			t.Fatal("no ListAndWatch update")
		}
		unhealthy := 0
		for _, d := range got {
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
		kubelet = kubelet.restart(t)
		waitFor(t, "re-registration", func() bool { return kubelet.registrations() == 2 && kubelet.plugin() != nil })
		if p.Registrations() != 2 {
			t.Errorf("plugin registrations = %d, want 2", p.Registrations())
		}
		// The new connection serves Allocate.
		pods.add(makePod("after").Devices("GPU-c:1000").Container("main", 1).Created(time.Hour).Obj())
		r, _, err := allocate(ctx, kubelet.plugin(), available, 1)
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
