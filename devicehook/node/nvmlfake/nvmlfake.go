// Package nvmlfake completes go-nvml's mock servers (dgxh100, dgxb200) with
// the functions they leave unset and gpupack-node calls: memory v2,
// attributes, NUMA, row remapping, fabric info, NVLink state and running
// processes. Each device's answers live in a GPU struct the test changes
// while the agent runs (health, processes, fabric).
//
// It is test support shared by unit and integration tests, so it is an
// ordinary package; nothing in the product imports it.
package nvmlfake

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// NotAvailable is NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
const NotAvailable = ^uint64(0)

// GPU is the mutable state behind one mocked device.
type GPU struct {
	mu        sync.Mutex
	dev       *server.Device
	SMCount   uint32
	NUMA      int
	Links     int  // NVLink links reported; all enabled unless DownLinks
	DownLinks int  // how many of Links report disabled
	Lost      bool // memory info answers GPU_IS_LOST
	RemapFail bool
	// UncorrectableECC is the volatile uncorrected ECC error count.
	UncorrectableECC uint64
	Fabric           *nvml.GpuFabricInfo // nil: fabric not supported (HGX)
	// Processes are the compute processes now, by host PID (NVML never
	// reports the PID a container sees), UsedGpuMemory in bytes or
	// NotAvailable.
	Processes []nvml.ProcessInfo
	// Graphics and MPS are the processes GetGraphicsRunningProcesses and
	// GetMPSComputeRunningProcesses report (a Vulkan/EGL context, an MPS
	// client); a PID may be in several lists, with its memory in each (the
	// device's used memory counts it once).
	Graphics, MPS []nvml.ProcessInfo
	// UnlistedMiB is device memory in use that no process list shows (a
	// context the driver does not list, or a process that left the lists).
	UnlistedMiB uint64
	// SampleEvery > 0 makes the process list a sample, as the driver's is:
	// GetComputeRunningProcesses answers with the list as it was at every
	// SampleEvery-th call, so a process that started, grew or exited since
	// is seen late (or, if it lived between two samples, never).
	SampleEvery int
	// HideProcessMemory reports every process's UsedGpuMemory as
	// NotAvailable (as drivers do under MIG, WDDM or without
	// permission), while the device's memory info still counts it.
	HideProcessMemory bool
	sample            []nvml.ProcessInfo
	calls             int
}

// Set changes the GPU under its lock.
func (g *GPU) Set(f func(g *GPU)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f(g)
}

// UUID of the mocked device.
func (g *GPU) UUID() string { return g.dev.UUID }

// Device returns the go-nvml mock device.
func (g *GPU) Device() *server.Device { return g.dev }

// Node is one mocked host.
type Node struct {
	*server.Server
	GPUs []*GPU
	mu   sync.Mutex
	// Missing hides GPUs (by index) from DeviceGetHandleByIndex, as if they
	// fell off the bus.
	missing map[int]bool
}

// Hide makes DeviceGetHandleByIndex(i) fail (true) or succeed again (false).
func (n *Node) Hide(i int, hidden bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.missing[i] = hidden
}

// DGXH100 is an 8×H100 HGX box: NVLink through NVSwitch inside the node
// only (fabric not supported), 18 links per GPU, NUMA 0 for GPUs 0-3 and 1
// for 4-7, 132 SMs.
func DGXH100() *Node {
	n := wrap(dgxh100.New())
	for i, g := range n.GPUs {
		g.SMCount, g.NUMA, g.Links = 132, i/4, 18
	}
	return n
}

// NVLTray is a B200 NVL-style compute tray: gpus GPUs registered with an
// NVLink fabric (cluster UUID + clique), 18 links each, 148 SMs.
func NVLTray(gpus int, cluster [16]byte, clique uint32) *Node {
	srv := dgxb200.New()
	srv.Devices = srv.Devices[:gpus]
	n := wrap(srv)
	for i, g := range n.GPUs {
		g.SMCount, g.NUMA, g.Links = 148, i/2, 18
		g.Fabric = &nvml.GpuFabricInfo{ClusterUuid: cluster, CliqueId: clique, State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS)}
	}
	return n
}

// ClusterUUID builds a fabric cluster UUID whose bytes are all b.
func ClusterUUID(b byte) [16]byte {
	var u [16]byte
	for i := range u {
		u[i] = b
	}
	return u
}

func wrap(srv *server.Server) *Node {
	n := &Node{Server: srv, missing: map[int]bool{}}
	for _, d := range srv.Devices {
		dev := d.(*server.Device)
		g := &GPU{dev: dev}
		n.GPUs = append(n.GPUs, g)
		complete(g)
	}
	byIndex := srv.DeviceGetHandleByIndexFunc
	srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		n.mu.Lock()
		hidden := n.missing[i]
		n.mu.Unlock()
		if hidden {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return byIndex(i)
	}
	return n
}

// complete sets the device functions the go-nvml mocks leave nil.
func complete(g *GPU) {
	d := g.dev
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.Lost {
			return nvml.Memory_v2{}, nvml.ERROR_GPU_IS_LOST
		}
		perPID := map[uint32]uint64{}
		for _, list := range [][]nvml.ProcessInfo{g.Processes, g.Graphics, g.MPS} {
			for _, p := range list {
				if p.UsedGpuMemory != NotAvailable {
					perPID[p.Pid] = max(perPID[p.Pid], p.UsedGpuMemory)
				}
			}
		}
		used := g.UnlistedMiB << 20
		for _, b := range perPID {
			used += b
		}
		total := d.MemoryInfo.Total
		return nvml.Memory_v2{Total: total, Used: used, Free: total - min(used, total)}, nvml.SUCCESS
	}
	memV1 := d.GetMemoryInfoFunc
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		g.mu.Lock()
		lost := g.Lost
		g.mu.Unlock()
		if lost {
			return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
		}
		return memV1()
	}
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return nvml.DeviceAttributes{MultiprocessorCount: g.SMCount, MemorySizeMB: d.MemoryInfo.Total >> 20}, nvml.SUCCESS
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.NUMA, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return 0, 0, false, g.RemapFail, nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && c == nvml.VOLATILE_ECC {
			return g.UncorrectableECC, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.Fabric == nil {
			return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_NOT_SUPPORTED}, nvml.SUCCESS
		}
		return *g.Fabric, nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if link < 0 || link >= g.Links {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if link < g.DownLinks {
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		out := g.Processes
		if g.SampleEvery > 0 {
			if g.calls%g.SampleEvery == 0 {
				g.sample = append([]nvml.ProcessInfo(nil), g.Processes...)
			}
			g.calls++
			out = g.sample
		}
		return g.hide(out), nvml.SUCCESS
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.hide(g.Graphics), nvml.SUCCESS
	}
	d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.hide(g.MPS), nvml.SUCCESS
	}
}

// hide copies a process list, its memory NotAvailable under
// HideProcessMemory. g.mu is held.
func (g *GPU) hide(ps []nvml.ProcessInfo) []nvml.ProcessInfo {
	out := append([]nvml.ProcessInfo(nil), ps...)
	if g.HideProcessMemory {
		for i := range out {
			out[i].UsedGpuMemory = NotAvailable
		}
	}
	return out
}

// GPUByUUID finds a GPU of the node.
func (n *Node) GPUByUUID(uuid string) (*GPU, error) {
	for _, g := range n.GPUs {
		if g.UUID() == uuid {
			return g, nil
		}
	}
	return nil, fmt.Errorf("no GPU %s", uuid)
}
