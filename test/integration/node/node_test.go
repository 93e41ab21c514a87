// Package node runs gpupack-node's agent (with go-nvml's mocked DGX/NVL
// hardware standing in for the driver) against a real kube-apiserver: the
// inventory it publishes, a GPU health change, capacity the kubelet reset,
// a plan-bound Allocate (CDI devices, mounts, limits file), a forged
// annotation refused, and a bypass that ends in a kill and a pod delete.
package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/agent"
	"github.com/gpupack/gpupack/devicehook/node/bypass"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin/kubelettest"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
)

const nodeName = "gpu-node-1"

func startAgent(t *testing.T, env *framework.Env, hw *nvmlfake.Node, policy bypass.Policy, pluginDir string) (*agent.Agent, string, agent.Options) {
	t.Helper()
	proc := t.TempDir()
	o := agent.DefaultOptions()
	o.NodeName, o.SlotsPerGPU = nodeName, 4
	o.DevicePlugin, o.PluginDir = pluginDir != "", pluginDir
	o.MetricsAddr = ""
	// The toolkit config as a package installs it: unsafe for gpupack.
	o.ToolkitConfig = filepath.Join("..", "..", "..", "devicehook", "node", "toolkit", "testdata", "default.toml")
	o.ProcRoot, o.CacheDir, o.LimitsDir = proc, t.TempDir(), t.TempDir()
	// The tmpfs on each accounting dir would be mounted in this machine's
	// mount namespace; it is tested in a private one
	// (deviceplugin.TestAccountingDirIsBounded).
	o.AccountingTmpfs = false
	o.Dynamic = dynamic.NewForConfigOrDie(env.Config)
	// NVML's PIDs are the fake's; never signal a real process of this machine.
	o.Killer = &recordingKiller{}
	o.BypassPolicy, o.BypassInterval, o.PublishInterval = policy, 100*time.Millisecond, 200*time.Millisecond
	a := agent.New(o, hw, env.Clientset)
	ctx, cancel := context.WithCancel(env.Ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	return a, proc, o
}

// bindPlan stores a GPUPlan whose slot on nodeName is bound to pod's UID,
// as the manager's ungater leaves it, with gpus ("<uuid>:<MiB>[,…]").
func bindPlan(t *testing.T, env *framework.Env, pod *corev1.Pod, gpus string, cores int32) {
	t.Helper()
	devs, err := v1alpha1.ParseDevices(gpus)
	if err != nil {
		t.Fatal(err)
	}
	a := v1alpha1.PodAssignment{PodSet: "main", Index: 0, Node: nodeName}
	for _, d := range devs {
		a.GPUs = append(a.GPUs, v1alpha1.GPUAssignment{UUID: d.UUID, MemoryMiB: d.MemoryMiB, Cores: cores})
	}
	plan := &v1alpha1.GPUPlan{
		ObjectMeta: metav1.ObjectMeta{Name: "plan-" + pod.Name, Namespace: pod.Namespace},
		Spec:       v1alpha1.GPUPlanSpec{WorkloadName: pod.Name, PodCount: 1, GPUCount: int32(len(devs)), Assignments: []v1alpha1.PodAssignment{a}},
	}
	env.MustCreate(t, plan)
	plan.Status = v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlaced, PlacedPods: 1, Bindings: []v1alpha1.SlotBinding{{PodSet: "main", Index: 0, PodName: pod.Name, PodUID: pod.UID}}}
	if err := env.Client.Status().Update(env.Ctx, plan); err != nil {
		t.Fatal(err)
	}
}

func getNode(env *framework.Env) (*corev1.Node, error) {
	return env.Clientset.CoreV1().Nodes().Get(env.Ctx, nodeName, metav1.GetOptions{})
}

func capacity(n *corev1.Node, name string) int64 {
	q := n.Status.Capacity[corev1.ResourceName(name)]
	return q.Value()
}

func events(env *framework.Env, ns, reason string, involved types.UID) []corev1.Event {
	list, err := env.Clientset.CoreV1().Events(ns).List(env.Ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == reason && (involved == "" || e.InvolvedObject.UID == involved) {
			out = append(out, e)
		}
	}
	return out
}

func TestNodeAgent(t *testing.T) {
	env := framework.Start(t, framework.Options{NoKueue: true})
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	hw := nvmlfake.DGXH100()
	pluginDir, err := os.MkdirTemp("", "dp") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pluginDir) })
	kubelet := kubelettest.Start(t, pluginDir)
	a, proc, opts := startAgent(t, env, hw, bypass.PolicyEnforce, pluginDir)
	alloc := flavors.DefaultBuffer().Allocatable(81920)

	t.Run("publishes inventory", func(t *testing.T) {
		env.Eventually(t, 20*time.Second, "inventory on the node", func() (bool, string) {
			n, err := getNode(env)
			if err != nil {
				return false, err.Error()
			}
			gpus, err := v1alpha1.ParseGPUs(n.Annotations[v1alpha1.AnnotationGPUs])
			if err != nil {
				return false, err.Error()
			}
			if len(gpus) != 8 || capacity(n, v1alpha1.ResourceGPUMemory) != 8*alloc {
				return false, fmt.Sprintf("%d GPUs, gpu-memory %d", len(gpus), capacity(n, v1alpha1.ResourceGPUMemory))
			}
			return true, ""
		})
		n, _ := getNode(env)
		gpus, _ := v1alpha1.ParseGPUs(n.Annotations[v1alpha1.AnnotationGPUs])
		for i, g := range gpus {
			want := v1alpha1.GPUInfo{UUID: hw.GPUs[i].UUID(), Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, SMCount: 132, NVLinkDomain: nodeName, NUMA: i / 4, Health: v1alpha1.GPUHealthy}
			if g != want {
				t.Errorf("GPU %d = %+v, want %+v", i, g, want)
			}
		}
		if got := n.Labels[v1alpha1.LabelNVLinkDomain]; got != nodeName {
			t.Errorf("nvlink-domain label = %q, want %q (HGX: NVLink ends at the node)", got, nodeName)
		}
		if v, c := capacity(n, v1alpha1.ResourceVGPU), capacity(n, v1alpha1.ResourceGPUCores); v != 32 || c != 800 {
			t.Errorf("vgpu %d, gpu-cores %d; want 32, 800", v, c)
		}
		// Nothing changes: the agent writes nothing more.
		rv := n.ResourceVersion
		time.Sleep(time.Second) // five publish intervals
		if n2, _ := getNode(env); n2.ResourceVersion != rv {
			t.Errorf("node rewritten without a change (resourceVersion %s → %s)", rv, n2.ResourceVersion)
		}
	})

	t.Run("unsafe toolkit settings are a node condition and an Event", func(t *testing.T) {
		n, _ := getNode(env)
		var cond *corev1.NodeCondition
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == agent.ConditionToolkitSafe {
				cond = &n.Status.Conditions[i]
			}
		}
		if cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != agent.ReasonToolkitUnsafe ||
			!strings.Contains(cond.Message, "accept-nvidia-visible-devices-envvar-when-unprivileged is not set") {
			t.Errorf("condition = %+v", cond)
		}
		env.Eventually(t, 20*time.Second, "ToolkitUnsafe event on the node", func() (bool, string) {
			for _, e := range events(env, "default", agent.ReasonToolkitUnsafe, "") {
				if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == nodeName {
					return true, ""
				}
			}
			return false, "none"
		})
	})

	t.Run("a GPU health change is reflected", func(t *testing.T) {
		hw.GPUs[3].Set(func(g *nvmlfake.GPU) { g.RemapFail = true })
		env.Eventually(t, 20*time.Second, "GPU 3 unhealthy", func() (bool, string) {
			n, _ := getNode(env)
			gpus, err := v1alpha1.ParseGPUs(n.Annotations[v1alpha1.AnnotationGPUs])
			if err != nil || len(gpus) != 8 {
				return false, fmt.Sprint(err)
			}
			if gpus[3].Health != v1alpha1.GPUUnhealthy || capacity(n, v1alpha1.ResourceGPUCores) != 700 || capacity(n, v1alpha1.ResourceGPUMemory) != 7*alloc {
				return false, fmt.Sprintf("GPU 3 %s, cores %d", gpus[3].Health, capacity(n, v1alpha1.ResourceGPUCores))
			}
			return true, ""
		})
		env.Eventually(t, 20*time.Second, "GPUUnhealthy event on the node", func() (bool, string) {
			evs := events(env, "default", "GPUUnhealthy", "")
			for _, e := range evs {
				if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == nodeName && strings.Contains(e.Message, "row remapping failed") {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d events", len(evs))
		})
		hw.GPUs[3].Set(func(g *nvmlfake.GPU) { g.RemapFail = false })
		env.Eventually(t, 20*time.Second, "GPU 3 healthy again", func() (bool, string) {
			n, _ := getNode(env)
			return capacity(n, v1alpha1.ResourceGPUCores) == 800, ""
		})
	})

	t.Run("capacity the kubelet reset is restored", func(t *testing.T) {
		n, _ := getNode(env)
		for _, r := range []string{v1alpha1.ResourceGPUMemory, v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUCores} {
			n.Status.Capacity[corev1.ResourceName(r)] = resource.MustParse("0")
			n.Status.Allocatable[corev1.ResourceName(r)] = resource.MustParse("0")
		}
		if _, err := env.Clientset.CoreV1().Nodes().UpdateStatus(env.Ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		env.Eventually(t, 20*time.Second, "capacity re-published", func() (bool, string) {
			n, _ := getNode(env)
			q := n.Status.Allocatable[v1alpha1.ResourceGPUMemory]
			return capacity(n, v1alpha1.ResourceGPUMemory) == 8*alloc && q.Value() == 8*alloc, ""
		})
	})

	t.Run("the device plugin hands a container its planned GPUs", func(t *testing.T) {
		env.Eventually(t, 20*time.Second, "plugin registered with all slots", func() (bool, string) {
			n := len(kubelet.Devices(v1alpha1.ResourceVGPU))
			return n == 32, fmt.Sprintf("%d slots", n)
		})
		ns := env.Namespace(t, "plugin")
		g5, g6 := hw.GPUs[5].UUID(), hw.GPUs[6].UUID()
		planned := gpuPod("planned", ns, g6+":30000,"+g5+":20000", 2)
		planned.Annotations[v1alpha1.AnnotationPlan] = "plan-planned" // as Kueue writes it from the check's podSetUpdates
		env.MustCreate(t, planned)
		bindPlan(t, env, planned, g6+":30000,"+g5+":20000", 25)
		// At once, as the kubelet would right after binding: the plugin
		// waits for its informers to see the pod and the plan.
		r, ids, err := kubelet.Allocate(env.Ctx, v1alpha1.ResourceVGPU, 2)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff([]string{g6 + "::0", g5 + "::0"}, ids); d != "" {
			t.Errorf("preferred slots (-want +got):\n%s", d)
		}
		if len(r.Envs) != 0 {
			t.Errorf("envs = %v, want none", r.Envs)
		}
		var cdi []string
		for _, d := range r.CdiDevices {
			cdi = append(cdi, d.Name)
		}
		if d := cmp.Diff([]string{"nvidia.com/gpu=" + g5, "nvidia.com/gpu=" + g6}, cdi); d != "" {
			t.Errorf("CDI devices (-want +got):\n%s", d)
		}
		limits := deviceplugin.LimitsFile(opts.LimitsDir, planned.UID, "main")
		mounts := map[string]string{}
		for _, m := range r.Mounts {
			mounts[m.ContainerPath] = fmt.Sprintf("%s ro=%v", m.HostPath, m.ReadOnly)
		}
		wantMounts := map[string]string{
			opts.HookDir:          opts.HookDir + " ro=true",
			"/etc/ld.so.preload":  opts.HookDir + "/ld.so.preload ro=true",
			"/var/run/gpupack":    deviceplugin.ContainerCacheDir(opts.CacheDir, planned.UID, "main") + " ro=false",
			"/etc/gpupack/limits": limits + " ro=true",
		}
		if d := cmp.Diff(wantMounts, mounts); d != "" {
			t.Errorf("mounts (-want +got):\n%s", d)
		}
		b, err := os.ReadFile(limits)
		if err != nil {
			t.Fatal(err)
		}
		got, err := deviceplugin.ParseLimits(b)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"CUDA_DEVICE_MEMORY_LIMIT_0": "20000m", "CUDA_DEVICE_SM_LIMIT_0": "25", "GPUPACK_DEVICE_UUID_0": g5,
			"CUDA_DEVICE_MEMORY_LIMIT_1": "30000m", "CUDA_DEVICE_SM_LIMIT_1": "25", "GPUPACK_DEVICE_UUID_1": g6,
			"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/var/run/gpupack/vgpu.cache", "GPUPACK_CONTEXT_RESERVE": "512m",
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("limits file (-want +got):\n%s", d)
		}

		env.MustCreate(t, gpuPod("unplanned", ns, "", 1))
		_, _, err = kubelet.Allocate(env.Ctx, v1alpha1.ResourceVGPU, 1)
		if err == nil || !strings.Contains(err.Error(), "which no GPUPlan covers") {
			t.Errorf("unplanned pod: err = %v, want a clear refusal", err)
		}
		env.Clientset.CoreV1().Pods(ns).Delete(env.Ctx, "unplanned", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})

		// A tenant writes gpupack.io/devices itself: 70000 MiB on GPU 7.
		forged := gpuPod("forged", ns, hw.GPUs[7].UUID()+":70000", 1)
		env.MustCreate(t, forged)
		_, _, err = kubelet.Allocate(env.Ctx, v1alpha1.ResourceVGPU, 1)
		if err == nil || !strings.Contains(err.Error(), "no GPUPlan binds pod UID "+string(forged.UID)) {
			t.Errorf("forged annotation: err = %v, want a refusal naming the missing binding", err)
		}
		env.Eventually(t, 20*time.Second, deviceplugin.ReasonPlanMismatch+" event on the forged pod", func() (bool, string) {
			return len(events(env, ns, deviceplugin.ReasonPlanMismatch, forged.UID)) > 0, "none"
		})
		if _, err := os.Stat(deviceplugin.LimitsFile(opts.LimitsDir, forged.UID, "main")); err == nil {
			t.Error("a limits file was written for the forged pod")
		}
		env.Clientset.CoreV1().Pods(ns).Delete(env.Ctx, "forged", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	})

	t.Run("a bypass ends in an Event, a metric, a kill and a pod delete with grace 0", func(t *testing.T) {
		ns := env.Namespace(t, "team")
		g0 := hw.GPUs[0].UUID()
		pod := gpuPod("static-binary", ns, g0+":10000", 1)
		env.MustCreate(t, pod)
		bindPlan(t, env, pod, g0+":10000", 0)
		// Process 4242 lives in the pod's cgroup and uses 20 GiB behind the hook.
		writeCgroup(t, proc, 4242, pod.UID)
		hw.GPUs[0].Set(func(g *nvmlfake.GPU) { g.Processes = []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 20000 << 20}} })

		env.Eventually(t, 20*time.Second, "GPUMemoryOverLimit event on the pod", func() (bool, string) {
			evs := events(env, ns, bypass.ReasonOverLimit, pod.UID)
			if len(evs) == 0 {
				return false, "none"
			}
			if !strings.Contains(evs[0].Message, "20000 MiB on GPU "+g0+", over the 10000 MiB planned") {
				return false, evs[0].Message
			}
			return true, ""
		})
		if v, err := metrics.Value(a.Registry(), "gpupack_node_bypass_detections_total", map[string]string{"kind": metrics.KindOverLimit}); err != nil || v < 1 {
			t.Errorf("bypass detections = %v, %v", v, err)
		}
		// Deleted with grace 0, not evicted: a PodDisruptionBudget that
		// allows no disruption does not hold it.
		env.Eventually(t, 20*time.Second, "pod deleted", func() (bool, string) {
			_, err := env.Clientset.CoreV1().Pods(ns).Get(env.Ctx, pod.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, ""
			}
			return false, fmt.Sprint(err)
		})
		if v, _ := metrics.Value(a.Registry(), "gpupack_node_bypass_actions_total", map[string]string{"action": "delete"}); v != 1 {
			t.Errorf("delete actions metric = %v, want 1", v)
		}
		if got := opts.Killer.(*recordingKiller).pids(); len(got) == 0 || got[0] != 4242 {
			t.Errorf("killed %v, want pid 4242", got)
		}
		env.Eventually(t, 20*time.Second, bypass.ReasonEnforced+" event", func() (bool, string) {
			return len(events(env, ns, bypass.ReasonEnforced, pod.UID)) > 0, "none"
		})
		hw.GPUs[0].Set(func(g *nvmlfake.GPU) { g.Processes = nil })
	})

	// agent.Publish is the one-pass entry point other suites call.
	t.Run("NVL trays are labelled by fabric clique", func(t *testing.T) {
		cluster := nvmlfake.ClusterUUID(0x5a)
		trays := []struct {
			name   string
			clique uint32
		}{{"tray-1", 1}, {"tray-2", 1}, {"tray-3", 2}}
		for _, tr := range trays {
			env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: tr.name}})
			if _, err := agent.Publish(env.Ctx, env.Clientset, nvmlfake.NVLTray(4, cluster, tr.clique), tr.name, flavors.DefaultBuffer(), 10); err != nil {
				t.Fatal(err)
			}
		}
		got := map[string]string{}
		for _, tr := range trays {
			n, err := env.Clientset.CoreV1().Nodes().Get(env.Ctx, tr.name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got[tr.name] = n.Labels[v1alpha1.LabelNVLinkDomain]
			if c := capacity(n, v1alpha1.ResourceVGPU); c != 40 {
				t.Errorf("%s vgpu capacity %d, want 40", tr.name, c)
			}
		}
		if got["tray-1"] != got["tray-2"] || got["tray-1"] == got["tray-3"] || !strings.HasSuffix(got["tray-3"], "-2") {
			t.Errorf("domains = %v; want tray-1 = tray-2 (clique 1) ≠ tray-3 (clique 2)", got)
		}
	})
}

// gpuPod is a pod bound to the agent's node asking for gpus vGPU slots,
// planned on devices ("" = no plan).
func gpuPod(name, ns, devices string, gpus int64) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "main", Image: "trainer", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceVGPU: *resource.NewQuantity(gpus, resource.DecimalSI)},
		}}}},
	}
	if devices != "" {
		p.Annotations[v1alpha1.AnnotationDevices] = devices
	}
	return p
}

func ptr[T any](v T) *T { return &v }

// recordingKiller stands in for SIGKILL.
type recordingKiller struct {
	mu     sync.Mutex
	killed []uint32
}

func (k *recordingKiller) Kill(pid uint32, verify func() bool) error {
	if !verify() {
		return fmt.Errorf("pid %d is not the pod's", pid)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed = append(k.killed, pid)
	return nil
}

func (k *recordingKiller) pids() []uint32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]uint32(nil), k.killed...)
}

func writeCgroup(t *testing.T, procRoot string, pid int, uid types.UID) {
	t.Helper()
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(string(uid), "-", "_") + ".slice/cri-containerd-abc.scope\n"
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
		t.Fatal(err)
	}
}
