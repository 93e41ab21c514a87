// Package kubelettest is the kubelet's side of the device-plugin protocol,
// for tests: a Registration server on <dir>/kubelet.sock that, like the
// real device manager, dials each registering plugin back, keeps its
// ListAndWatch stream, and asks for allocations the way the kubelet does
// (GetPreferredAllocation, then Allocate).
package kubelettest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Kubelet is a fake kubelet device manager.
type Kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir string
	srv *grpc.Server

	mu      sync.Mutex
	regs    []*pluginapi.RegisterRequest
	clients map[string]pluginapi.DevicePluginClient // by resource
	devices map[string][]*pluginapi.Device
	// Updates receives every ListAndWatch response (resource, devices).
	Updates chan Update
}

// Update is one ListAndWatch message.
type Update struct {
	Resource string
	Devices  []*pluginapi.Device
}

// Start serves <dir>/kubelet.sock until the test ends.
func Start(t testing.TB, dir string) *Kubelet {
	t.Helper()
	k := &Kubelet{dir: dir, clients: map[string]pluginapi.DevicePluginClient{}, devices: map[string][]*pluginapi.Device{}, Updates: make(chan Update, 64)}
	k.serve(t)
	t.Cleanup(func() { k.srv.Stop() })
	return k
}

func (k *Kubelet) serve(t testing.TB) {
	l, err := net.Listen("unix", filepath.Join(k.dir, "kubelet.sock"))
	if err != nil {
		t.Fatalf("fake kubelet: %v", err)
	}
	k.srv = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
}

// Register is called by plugins.
func (k *Kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c := pluginapi.NewDevicePluginClient(conn)
	k.mu.Lock()
	k.regs = append(k.regs, r)
	k.clients[r.ResourceName] = c
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
			k.devices[r.ResourceName] = resp.Devices
			k.mu.Unlock()
			select {
			case k.Updates <- Update{Resource: r.ResourceName, Devices: resp.Devices}:
			default:
			}
		}
	}()
	return &pluginapi.Empty{}, nil
}

// Restart does to the plugin folder what a kubelet restart does: stop
// serving, delete every socket, serve a new kubelet.sock. Registrations
// are kept so tests can count them.
func (k *Kubelet) Restart(t testing.TB) {
	k.srv.Stop()
	ents, _ := os.ReadDir(k.dir)
	for _, e := range ents {
		_ = os.Remove(filepath.Join(k.dir, e.Name()))
	}
	k.mu.Lock()
	k.clients = map[string]pluginapi.DevicePluginClient{}
	k.devices = map[string][]*pluginapi.Device{}
	k.mu.Unlock()
	k.serve(t)
}

// Registrations returns the register requests received so far.
func (k *Kubelet) Registrations() []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*pluginapi.RegisterRequest(nil), k.regs...)
}

// Plugin returns the client of the plugin serving resource, or nil.
func (k *Kubelet) Plugin(resource string) pluginapi.DevicePluginClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.clients[resource]
}

// Devices returns the last device list of resource.
func (k *Kubelet) Devices(resource string) []*pluginapi.Device {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.devices[resource]
}

// Allocate plays the device manager for one container of size devices:
// ask the plugin for a preference among the healthy slots, then Allocate
// what it preferred. It returns the response and the slot IDs used.
func (k *Kubelet) Allocate(ctx context.Context, resource string, size int) (*pluginapi.ContainerAllocateResponse, []string, error) {
	c := k.Plugin(resource)
	if c == nil {
		return nil, nil, fmt.Errorf("no plugin registered for %s", resource)
	}
	var available []string
	for _, d := range k.Devices(resource) {
		if d.Health == pluginapi.Healthy {
			available = append(available, d.ID)
		}
	}
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
