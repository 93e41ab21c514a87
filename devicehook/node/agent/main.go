package agent

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpupack/gpupack/devicehook/node/bypass"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/inventory"
	"github.com/gpupack/gpupack/flavors"
)

// ParseFlags turns command-line arguments into Options and a kubeconfig
// path ("" = in-cluster).
func ParseFlags(args []string) (Options, string, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("gpupack-node", flag.ContinueOnError)
	klog.InitFlags(fs)
	var kubeconfig, policy string
	overhead, percent := int64(o.Buffer.DriverOverheadMiB), int(o.Buffer.BufferPercent)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.IntVar(&o.SlotsPerGPU, "slots-per-gpu", o.SlotsPerGPU, "gpupack.io/vgpu slots advertised per GPU (pods that may share one GPU)")
	fs.Int64Var(&overhead, "driver-overhead-mib", overhead, "per-GPU driver overhead kept out of allocatable (MiB)")
	fs.IntVar(&percent, "buffer-percent", percent, "per-GPU safety buffer kept out of allocatable (percent of physical)")
	fs.BoolVar(&o.DevicePlugin, "device-plugin", o.DevicePlugin, "serve the gpupack.io/vgpu device plugin")
	fs.BoolVar(&o.WholeGPU, "whole-gpu-resource", o.WholeGPU, "also serve nvidia.com/gpu (replaces the NVIDIA device plugin on this node)")
	fs.StringVar(&o.PluginDir, "device-plugin-dir", o.PluginDir, "kubelet device-plugin socket folder")
	fs.StringVar(&o.HookSource, "hook-source", o.HookSource, "libgpupack-hook.so inside this image to install; empty skips installing")
	fs.StringVar(&o.HookDir, "hook-dir", o.HookDir, "host folder the hook is installed into and mounted from")
	fs.BoolVar(&o.PluginMounts, "plugin-mounts", o.PluginMounts, "device plugin mounts the hook, /etc/ld.so.preload, the container's accounting dir and its limits file (false only with an old webhook that mounts hostPath volumes itself)")
	fs.StringVar(&o.CacheDir, "accounting-dir", o.CacheDir, "host root of per-pod accounting folders")
	fs.BoolVar(&o.AccountingTmpfs, "accounting-tmpfs", o.AccountingTmpfs, "mount a small tmpfs (a little over the hook's region, few inodes) on each container's accounting folder, and fail the Allocate when that fails; false leaves the tenant-writable folder unbounded on the host disk")
	fs.StringVar(&o.LimitsDir, "limits-dir", o.LimitsDir, "host root of the trusted per-container limits files (root-owned, never mounted writable)")
	reserve := o.ContextReserve.String()
	fs.StringVar(&reserve, "context-reserve", reserve, "GPUPACK_CONTEXT_RESERVE per GPU model: <model substring>=<size k/m/g>,…; * is the default")
	fs.BoolVar(&o.VisibleDevicesEnv, "visible-devices-env", o.VisibleDevicesEnv, "also set NVIDIA_VISIBLE_DEVICES in Allocate (only for a runtime without CDI; not a boundary)")
	fs.StringVar(&o.ToolkitConfig, "toolkit-config", o.ToolkitConfig, "NVIDIA container toolkit config checked at start; empty skips the check")
	fs.StringVar(&o.Version, "version-stamp", o.Version, "version written next to the installed hook")
	fs.StringVar(&o.ProcRoot, "proc-root", o.ProcRoot, "the host's /proc (run with hostPID, or mount it)")
	fs.StringVar(&policy, "bypass-policy", string(o.BypassPolicy), "what GPU memory over a container's plan costs the pod: warn (Event + metric), kill (and SIGKILL its processes) or enforce (and delete the pod with grace 0)")
	fs.DurationVar(&o.BypassInterval, "bypass-interval", o.BypassInterval, "how often GPU processes are checked")
	fs.Int64Var(&o.SlackMiB, "bypass-slack-mib", o.SlackMiB, "GPU memory tolerated above a container's plan, per container (CUDA contexts), never per process")
	fs.Int64Var(&o.SlackMiB, "bypass-allowance-mib", o.SlackMiB, "deprecated name of --bypass-slack-mib (now per container, not per process)")
	fs.Int64Var(&o.UnattributedMiB, "bypass-unattributed-mib", o.UnattributedMiB, "GPU memory in use that no NVML process list (compute, graphics, MPS) accounts for, tolerated per GPU (driver overhead) before a GPUMemoryUnattributed finding on the node")
	fs.DurationVar(&o.PublishInterval, "publish-interval", o.PublishInterval, "how often the inventory is re-checked (it is written only on change)")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, "Prometheus metrics address; empty disables")
	err := fs.Parse(args)
	if err != nil {
		return o, "", err
	}
	o.Buffer = flavors.NewBuffer(&overhead, ptr(int32(percent)))
	if o.ContextReserve, err = deviceplugin.ParseContextReserve(reserve); err != nil {
		return o, "", fmt.Errorf("--context-reserve: %w", err)
	}
	if o.BypassPolicy, err = bypass.ParsePolicy(policy); err != nil {
		return o, "", fmt.Errorf("--bypass-policy: %w", err)
	}
	if o.SlotsPerGPU < 1 {
		return o, "", fmt.Errorf("--slots-per-gpu=%d: want at least 1", o.SlotsPerGPU)
	}
	if o.NodeName == "" {
		return o, "", fmt.Errorf("--node-name is empty and $NODE_NAME is not set")
	}
	return o, kubeconfig, nil
}

func ptr[T any](v T) *T { return &v }

// Main runs gpupack-node with the real NVML library; it returns the exit code.
func Main(args []string) int {
	o, kubeconfig, err := ParseFlags(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpupack-node: kube config: %v\n", err)
		return 1
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpupack-node: client: %v\n", err)
		return 1
	}
	if o.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "gpupack-node: client: %v\n", err)
		return 1
	}
	o.Fabric = inventory.FabricVersioned
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := New(o, nvml.New(), client).Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
