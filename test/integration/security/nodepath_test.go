package security

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/agent"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin/kubelettest"
	"github.com/gpupack/gpupack/devicehook/node/installer"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// Issue 14's node path, end to end: a tenant's GPU pod through the real
// apiserver (webhooks, policies, Pod Security baseline), pinned by the
// manager, bound to its GPUPlan slot; gpupack-node's real device plugin,
// reading pods and plans as gpupack-node's service account, answers the
// fake kubelet's Allocate; the real hook library then runs on the fake
// driver in a private mount namespace holding exactly the mounts that
// Allocate returned (limits file and /etc/ld.so.preload read-only), under
// a hostile environment.

const (
	pathNode = "node-a"
	limitMiB = 4096
)

// pathGPUs are node-a's four GPUs.
var pathGPUs = func() []v1alpha1.GPUInfo {
	var out []v1alpha1.GPUInfo
	for i := 0; i < 4; i++ {
		out = append(out, v1alpha1.GPUInfo{UUID: fmt.Sprintf("GPU-a0000000-0000-0000-0000-00000000000%d", i), Index: i,
			Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, SMCount: 132, NVLinkDomain: pathNode, NUMA: 0, Health: v1alpha1.GPUHealthy})
	}
	return out
}()

// hookBuild builds the hook library and the test driver (make -C
// devicehook) and returns the build folder.
func hookBuild(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(framework.RepoRoot(), "devicehook")
	cmd := exec.Command("make", "-s", "-C", dir, "build/"+v1alpha1.HookLibraryName, "build/hooktest")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make -C devicehook: %v\n%s", err, out)
	}
	return filepath.Join(dir, "build")
}

func requireUnshare(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1): the hook is run only in a private mount namespace")
	}
	if err := exec.Command("unshare", "-m", "-r", "true").Run(); err != nil {
		t.Skipf("no unprivileged mount namespaces here (%v)", err)
	}
}

// nodeConfig is gpupack-node's service account on node (its token bound to
// the node), as the agent runs.
func (c *cluster) nodeConfig(node string) *rest.Config {
	cfg := rest.CopyConfig(c.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: nodeUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:gpupack-system", "system:authenticated"},
		Extra:  map[string][]string{nodeClaim: {node}}}
	return cfg
}

// nodePlugin is gpupack-node's fractional device plugin for node, wired as
// the agent wires it: a pod informer on spec.nodeName, agent.WatchPlans,
// Events, hook delivery from hookDir, accounting and limits dirs.
type nodePlugin struct {
	plugin  *deviceplugin.Plugin
	kubelet *kubelettest.Kubelet
	limDir  string
	pods    deviceplugin.PodLister
	plans   deviceplugin.PlanLister
}

func startNodePlugin(t *testing.T, c *cluster, node, hookDir string) *nodePlugin {
	t.Helper()
	cfg := c.nodeConfig(node)
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithCancel(c.env.Ctx)
	pf := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	lister := pf.Core().V1().Pods().Lister()
	pf.Start(ctx.Done())
	pf.WaitForCacheSync(ctx.Done())
	plans := agent.WatchPlans(ctx, dynamic.NewForConfigOrDie(cfg))
	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	pluginDir, err := os.MkdirTemp("", "dp") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	np := &nodePlugin{kubelet: kubelettest.Start(t, pluginDir), limDir: t.TempDir()}
	np.pods, np.plans = deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return lister.List(labels.Everything()) }), plans
	np.plugin = deviceplugin.New(deviceplugin.Config{
		ResourceName: v1alpha1.ResourceVGPU, SlotsPerGPU: 4, NodeName: node, PluginDir: pluginDir, SocketName: "gpupack-vgpu.sock",
		HookDir: hookDir, MountPreload: true, CacheHostDir: t.TempDir(), LimitsDir: np.limDir, MemoryLimits: true,
		Unplanned: deviceplugin.UnplannedReject, Client: cs,
		Pods:     np.pods,
		Plans:    plans,
		Recorder: bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "gpupack-node", Host: node}),
		// A forged pod is refused after this long.
		AllocateWait: 2 * time.Second,
	})
	np.plugin.SetGPUs(pathGPUs)
	done := make(chan error, 1)
	go func() { done <- np.plugin.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("device plugin: %v", err)
		}
		bc.Shutdown()
		os.RemoveAll(pluginDir)
	})
	c.env.Eventually(t, 20*time.Second, "device plugin registered with all slots", func() (bool, string) {
		n := len(np.kubelet.Devices(v1alpha1.ResourceVGPU))
		return n == 16, fmt.Sprintf("%d slots", n)
	})
	return np
}

// placePod does what gpupack does to a tenant's planned pod: the tenant
// creates it (gated, through the webhooks), the manager stores its GPUPlan
// slot bound to the pod's UID (gpus) and pins it with devices, the
// scheduler binds it to the node.
func (c *cluster) placePod(t *testing.T, ns, name string, gpus []v1alpha1.GPUAssignment, devices string) *corev1.Pod {
	t.Helper()
	env, ctx := c.env, c.env.Ctx
	p := gpuPod(ns, name)
	p.Annotations[v1alpha1.AnnotationPlan] = "plan-" + name
	p.Spec.Containers[0].Resources.Limits = rl(v1alpha1.ResourceNvidiaGPU, strconv.Itoa(len(gpus)))
	if err := c.alice.Create(ctx, p); err != nil {
		t.Fatalf("tenant creating %s: %v", name, err)
	}
	if !hasGate(p) {
		t.Fatalf("%s: the webhook did not gate the planned pod", name)
	}
	plan := &v1alpha1.GPUPlan{
		ObjectMeta: metav1.ObjectMeta{Name: "plan-" + name, Namespace: ns},
		Spec: v1alpha1.GPUPlanSpec{WorkloadName: name, PodCount: 1, GPUCount: int32(len(gpus)),
			Assignments: []v1alpha1.PodAssignment{{PodSet: "main", Index: 0, Node: pathNode, GPUs: gpus}}},
	}
	env.MustCreate(t, plan)
	plan.Status = v1alpha1.GPUPlanStatus{Phase: v1alpha1.PlanPlaced, PlacedPods: 1,
		Bindings: []v1alpha1.SlotBinding{{PodSet: "main", Index: 0, PodName: name, PodUID: p.UID}}}
	if err := env.Client.Status().Update(ctx, plan); err != nil {
		t.Fatal(err)
	}
	mgr := c.manager(t)
	cur := &corev1.Pod{}
	if err := mgr.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
		t.Fatal(err)
	}
	placement.Pin(cur, pathNode, devices)
	if err := mgr.Update(ctx, cur); err != nil {
		t.Fatalf("the manager pinning %s: %v", name, err)
	}
	if err := env.Clientset.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Target: corev1.ObjectReference{Kind: "Node", Name: pathNode}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("binding %s: %v", name, err)
	}
	return cur
}

// waitBound waits until the plugin's own informers see pod bound to the
// node and its plan binding (the kubelet asks only after binding; the
// plugin's wait for a lagging informer is bounded and tested elsewhere).
func (np *nodePlugin) waitBound(t *testing.T, c *cluster, pod *corev1.Pod) {
	t.Helper()
	c.env.Eventually(t, 20*time.Second, pod.Name+" bound, as gpupack-node sees it", func() (bool, string) {
		pods, err := np.pods.List()
		if err != nil {
			return false, err.Error()
		}
		plans, err := np.plans.Plans("")
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			if p.UID == pod.UID && p.Spec.NodeName == pathNode {
				_, bound := deviceplugin.BindingOf(p, plans)
				return bound, "pod seen, plan binding not yet"
			}
		}
		return false, "pod not seen on the node"
	})
}

func TestNodePath(t *testing.T) {
	build := hookBuild(t)
	requireUnshare(t)
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})

	// gpupack-node installs the hook into its host folder (library and
	// ld.so.preload naming it), which Allocate then mounts.
	hookDir := t.TempDir()
	if _, err := installer.Install(filepath.Join(build, v1alpha1.HookLibraryName), hookDir, "nodepath-test"); err != nil {
		t.Fatal(err)
	}
	np := startNodePlugin(t, c, pathNode, hookDir)
	g1, g2, g3 := pathGPUs[1].UUID, pathGPUs[2].UUID, pathGPUs[3].UUID

	// The planned pod: one GPU, 4096 MiB, 30 % SM.
	trainer := c.placePod(t, c.baseline, "trainer", []v1alpha1.GPUAssignment{{UUID: g2, MemoryMiB: limitMiB, Cores: 30}}, fmt.Sprintf("%s:%d", g2, limitMiB))
	np.waitBound(t, c, trainer)
	r, ids, err := np.kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
	if err != nil {
		t.Fatalf("Allocate for the planned pod: %v", err)
	}
	if len(ids) != 1 || !strings.HasPrefix(ids[0], g2+"::") {
		t.Errorf("kubelet was steered to slots %v, want one slot of %s", ids, g2)
	}
	var cdi []string
	for _, d := range r.CdiDevices {
		cdi = append(cdi, d.Name)
	}
	if d := cmp.Diff([]string{"nvidia.com/gpu=" + g2}, cdi); d != "" {
		t.Errorf("CDI devices are not exactly the planned GPU (-want +got):\n%s", d)
	}
	if len(r.Envs) != 0 || len(r.Devices) != 0 {
		t.Errorf("Allocate also returned envs %v / device nodes %v; the GPU must come by CDI alone", r.Envs, r.Devices)
	}
	mounts := map[string]*pluginapi.Mount{}
	for _, m := range r.Mounts {
		mounts[m.ContainerPath] = m
	}
	lim := mounts[deviceplugin.LimitsMountPath]
	if lim == nil || !lim.ReadOnly {
		t.Fatalf("no read-only mount at %s in %v", deviceplugin.LimitsMountPath, r.Mounts)
	}
	if pre := mounts["/etc/ld.so.preload"]; pre == nil || !pre.ReadOnly {
		t.Errorf("no read-only /etc/ld.so.preload in %v", r.Mounts)
	}
	if hd := mounts[hookDir]; hd == nil || !hd.ReadOnly {
		t.Errorf("the hook folder is not mounted read-only: %v", r.Mounts)
	}
	if fi, err := os.Stat(lim.HostPath); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("limits file %s: %v, mode %v; want 0444", lim.HostPath, err, fi.Mode())
	}
	b, err := os.ReadFile(lim.HostPath)
	if err != nil {
		t.Fatal(err)
	}
	got, err := deviceplugin.ParseLimits(b)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"CUDA_DEVICE_MEMORY_LIMIT_0": fmt.Sprintf("%dm", limitMiB), "CUDA_DEVICE_SM_LIMIT_0": "30",
		"GPUPACK_DEVICE_UUID_0":           g2,
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/var/run/gpupack/vgpu.cache", "GPUPACK_CONTEXT_RESERVE": "512m"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("limits file, from the plan (-want +got):\n%s", d)
	}

	// The container: exactly those mounts, a hostile environment.
	t.Run("hook holds the plan's limit under a hostile environment", func(t *testing.T) {
		hooktest := filepath.Join(build, "hooktest")
		hostile := []map[string]string{
			{"CUDA_DISABLE_CONTROL": "1"},
			{"CUDA_DEVICE_MEMORY_LIMIT": "0"},
			{"CUDA_DEVICE_MEMORY_LIMIT_0": "64g"},
			// Everything at once, and the hook named nowhere but /etc/ld.so.preload.
			{"CUDA_DISABLE_CONTROL": "true", "CUDA_DEVICE_MEMORY_LIMIT": "0", "CUDA_DEVICE_MEMORY_LIMIT_0": "64g",
				"CUDA_DEVICE_SM_LIMIT": "100", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/dev/null", "LD_PRELOAD": ""},
			// LD_PRELOAD games: a library that does not exist, and the hook
			// loaded twice (by LD_PRELOAD and by /etc/ld.so.preload).
			{"CUDA_DISABLE_CONTROL": "1", "LD_PRELOAD": "/nonexistent/libnothing.so"},
			{"CUDA_DEVICE_MEMORY_LIMIT_0": "64g", "LD_PRELOAD": filepath.Join(hookDir, v1alpha1.HookLibraryName)},
		}
		for i, h := range hostile {
			for _, mode := range []string{"direct", "gpa"} {
				t.Run(fmt.Sprintf("%d/%s", i, mode), func(t *testing.T) {
					res, logs := inContainer(t, r.Mounts, r.CdiDevices, hooktest, h, mode, []int64{limitMiB + 1, 3072, 256})
					if n := res[0]; n != 0 {
						t.Errorf("env %v: one %d MiB allocation went through under the plan's %d MiB\n%s", h, limitMiB+1, limitMiB, logs)
					}
					if n := res[1]; n != 1 {
						t.Errorf("env %v: a 3072 MiB allocation under the %d MiB limit: %d succeeded, want 1\n%s", h, limitMiB, n, logs)
					}
					if n := res[2]; n*256 > limitMiB || n == 0 {
						t.Errorf("env %v: %d MiB allocated in 256 MiB chunks, want some and at most %d\n%s", h, n*256, limitMiB, logs)
					}
				})
			}
		}
	})

	// A pod whose gpupack.io/devices disagrees with its plan (written past
	// the API's defences: here by the manager's own identity, as a stale or
	// compromised writer would) gets an Allocate error, never the GPUs.
	t.Run("forged placement is refused", func(t *testing.T) {
		otherGPU := c.placePod(t, c.open, "forged-gpu", []v1alpha1.GPUAssignment{{UUID: g3, MemoryMiB: limitMiB, Cores: 30}}, fmt.Sprintf("%s:%d", g2, limitMiB))
		moreMiB := c.placePod(t, c.open, "forged-mib", []v1alpha1.GPUAssignment{{UUID: g1, MemoryMiB: limitMiB, Cores: 30}}, fmt.Sprintf("%s:70000", g1))
		np.waitBound(t, c, otherGPU)
		np.waitBound(t, c, moreMiB)
		_, _, err := np.kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
		for _, p := range []*corev1.Pod{otherGPU, moreMiB} {
			if err == nil || !strings.Contains(err.Error(), "pod "+p.Namespace+"/"+p.Name+": gpupack.io/devices=") || !strings.Contains(err.Error(), "disagrees with GPUPlan") {
				t.Errorf("Allocate: err = %v, want a refusal of %s naming its plan", err, p.Name)
			}
		}
		// A kubelet that picks the slots the forged annotations name.
		for _, slot := range []string{deviceplugin.SlotID(g2, 3), deviceplugin.SlotID(g1, 3), deviceplugin.SlotID(g3, 3)} {
			_, err := np.kubelet.Plugin(v1alpha1.ResourceVGPU).Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{slot}}}})
			if err == nil {
				t.Errorf("Allocate of slot %s was served with only forged pods waiting", slot)
			}
		}
		for _, p := range []*corev1.Pod{otherGPU, moreMiB} {
			if _, err := os.Stat(deviceplugin.LimitsFile(np.limDir, p.UID, "trainer")); err == nil {
				t.Errorf("a limits file was written for %s", p.Name)
			}
			env.Eventually(t, 20*time.Second, deviceplugin.ReasonPlanMismatch+" event on "+p.Name, func() (bool, string) {
				list, err := env.Clientset.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{})
				if err != nil {
					return false, err.Error()
				}
				for _, e := range list.Items {
					if e.Reason == deviceplugin.ReasonPlanMismatch && e.InvolvedObject.UID == p.UID {
						return true, ""
					}
				}
				return false, fmt.Sprintf("%d events in %s", len(list.Items), p.Namespace)
			})
		}
	})

	// Findings 1 and 3: an unplanned gpupack.io/vgpu pod must never be
	// handed a planned pod's slot, nor hold the kubelet. The tenant cannot
	// create one (the webhook denies it); one that gets past the webhook
	// (here: the administrator, in kube-system, which the webhooks do not
	// see, bound straight to the node) is refused at Allocate.
	t.Run("an unplanned pod is never handed a planned pod's slot", func(t *testing.T) {
		g0 := pathGPUs[0].UUID
		sneaky := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "sneaky", Namespace: "kube-system"},
			Spec: corev1.PodSpec{NodeName: pathNode, Containers: []corev1.Container{{Name: "trainer", Image: "trainer:test",
				Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceVGPU, "2", v1alpha1.ResourceGPUMemory, "8192")}}}},
		}
		tenantCopy := sneaky.DeepCopy()
		tenantCopy.Namespace, tenantCopy.Spec.NodeName = c.open, ""
		denied(t, "the tenant's unplanned gpupack.io/vgpu pod", c.alice.Create(ctx, tenantCopy), "has no gpupack.io/plan")
		env.MustCreate(t, sneaky)
		duo := c.placePod(t, c.open, "duo", []v1alpha1.GPUAssignment{{UUID: g0, MemoryMiB: limitMiB, Cores: 30}, {UUID: g1, MemoryMiB: limitMiB, Cores: 30}},
			fmt.Sprintf("%s:%d,%s:%d", g0, limitMiB, g1, limitMiB))
		np.waitBound(t, c, duo)
		np.waitSeen(t, c, sneaky, corev1.PodPending)
		_, _, err := np.kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 2)
		if err == nil || !strings.Contains(err.Error(), "could be for any of") || !strings.Contains(err.Error(), "kube-system/sneaky (no plan)") || !strings.Contains(err.Error(), c.open+"/duo (planned") {
			t.Fatalf("Allocate with an unplanned pod waiting next to a planned one: err = %v, want a refusal naming both", err)
		}
		for _, p := range []*corev1.Pod{sneaky, duo} {
			if _, err := os.Stat(deviceplugin.LimitsFile(np.limDir, p.UID, "trainer")); err == nil {
				t.Errorf("a limits file was written for %s", p.Name)
			}
			waitEvent(t, c, p, deviceplugin.ReasonAmbiguous)
		}
		// The kubelet fails the refused pod's admission. Whichever it was,
		// the planned pod then gets exactly its own GPUs.
		sneaky.Status.Phase = corev1.PodFailed
		if err := env.Client.Status().Update(ctx, sneaky); err != nil {
			t.Fatal(err)
		}
		np.waitSeen(t, c, sneaky, corev1.PodFailed)
		r, _, err := np.kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 2)
		if err != nil {
			t.Fatalf("Allocate for the planned pod once the unplanned one failed: %v", err)
		}
		var cdi []string
		for _, d := range r.CdiDevices {
			cdi = append(cdi, d.Name)
		}
		if d := cmp.Diff([]string{"nvidia.com/gpu=" + g0, "nvidia.com/gpu=" + g1}, cdi); d != "" {
			t.Errorf("CDI devices are not the planned pod's (-want +got):\n%s", d)
		}
		if _, err := os.Stat(deviceplugin.LimitsFile(np.limDir, duo.UID, "trainer")); err != nil {
			t.Errorf("the planned pod's limits file: %v", err)
		}
		// An unplanned pod alone is refused at once, with an Event.
		lone := sneaky.DeepCopy()
		lone.ObjectMeta = metav1.ObjectMeta{Name: "lone", Namespace: "kube-system"}
		lone.Status = corev1.PodStatus{}
		lone.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceVGPU, "3", v1alpha1.ResourceGPUMemory, "3")}
		env.MustCreate(t, lone)
		np.waitSeen(t, c, lone, corev1.PodPending)
		if _, _, err := np.kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 3); err == nil || !strings.Contains(err.Error(), "kube-system/lone, which no GPUPlan covers") {
			t.Errorf("Allocate for a lone unplanned pod: err = %v", err)
		}
		waitEvent(t, c, lone, deviceplugin.ReasonNoPlan)
	})
}

// waitSeen waits until gpupack-node's own pod informer shows pod in phase.
func (np *nodePlugin) waitSeen(t *testing.T, c *cluster, pod *corev1.Pod, phase corev1.PodPhase) {
	t.Helper()
	c.env.Eventually(t, 20*time.Second, pod.Name+" "+string(phase)+", as gpupack-node sees it", func() (bool, string) {
		pods, err := np.pods.List()
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			if p.UID == pod.UID {
				return p.Status.Phase == phase, string(p.Status.Phase)
			}
		}
		return false, "not seen"
	})
}

// waitEvent waits for an Event of reason on pod.
func waitEvent(t *testing.T, c *cluster, p *corev1.Pod, reason string) {
	t.Helper()
	c.env.Eventually(t, 20*time.Second, reason+" event on "+p.Name, func() (bool, string) {
		list, err := c.env.Clientset.CoreV1().Events(p.Namespace).List(c.env.Ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.InvolvedObject.UID == p.UID {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events in %s", len(list.Items), p.Namespace)
	})
}

// inContainer runs hooktest MODE grab <MiB> for each size in a private
// mount namespace that has the Allocate response's mounts (bind mounts,
// read-only where the response says so) and no other gpupack state: /etc
// and /run are overlays, so nothing of this machine changes. It returns
// how many allocations of each size succeeded, and the hook's log.
func inContainer(t *testing.T, mounts []*pluginapi.Mount, cdi []*pluginapi.CDIDevice, hooktest string, hostile map[string]string, mode string, sizesMiB []int64) ([]int64, string) {
	t.Helper()
	dir := t.TempDir()
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, top := range []string{"/etc", "/run"} {
		base := filepath.Join(dir, strings.Trim(top, "/"))
		for _, d := range []string{"u", "w"} {
			if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&script, "mount -t overlay overlay -o lowerdir=%[1]s,upperdir=%[2]s/u,workdir=%[2]s/w %[1]s\n", top, base)
	}
	script.WriteString("rm -rf /etc/gpupack /etc/ld.so.preload /run/gpupack\n")
	// /etc/ld.so.preload last: every later command of the script would load the hook.
	mounts = append([]*pluginapi.Mount(nil), mounts...)
	pre := func(i int) bool { return mounts[i].ContainerPath == "/etc/ld.so.preload" }
	sort.SliceStable(mounts, func(i, j int) bool { return !pre(i) && pre(j) })
	for _, m := range mounts {
		fi, err := os.Stat(m.HostPath)
		if err != nil {
			t.Fatalf("mount %s: %v", m.HostPath, err)
		}
		cp := m.ContainerPath
		if fi.IsDir() {
			fmt.Fprintf(&script, "mkdir -p %s\n", cp)
		} else {
			fmt.Fprintf(&script, "mkdir -p %s\ntouch %s\n", filepath.Dir(cp), cp)
		}
		fmt.Fprintf(&script, "mount --bind %s %s\n", m.HostPath, cp)
		if m.ReadOnly {
			fmt.Fprintf(&script, "mount -o remount,bind,ro %[1]s\nif touch %[1]s 2>/dev/null && echo x >> %[1]s 2>/dev/null; then echo '%[1]s is writable' >&2; exit 97; fi\n", cp)
		}
	}
	script.WriteString("set +e\n")
	for _, s := range sizesMiB {
		fmt.Fprintf(&script, "echo size=%d; %s %s grab %d || echo failed=$?\n", s, hooktest, mode, s<<20)
	}
	cmd := exec.Command("unshare", "-m", "-r", "sh", "-c", script.String())
	// The host's environment minus anything that steers the hook or the
	// fake driver, then the tenant's.
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "GPUPACK_") || strings.HasPrefix(k, "FAKECUDA_") || k == "LD_PRELOAD" || k == "LD_LIBRARY_PATH" || k == "LIBCUDA_LOG_LEVEL" {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, "FAKECUDA_MEM="+strconv.FormatInt(80<<30, 10))
	// The GPUs the runtime exposes (the CDI devices Allocate named), as
	// the driver in the container reports them (cuDeviceGetUuid).
	var uuids []string
	for _, d := range cdi {
		uuids = append(uuids, strings.TrimPrefix(d.Name, "nvidia.com/gpu="))
	}
	cmd.Env = append(cmd.Env, "FAKECUDA_UUIDS="+strings.Join(uuids, ","))
	keys := make([]string, 0, len(hostile))
	for k := range hostile {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+hostile[k])
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 97 {
			t.Fatalf("a read-only mount is writable: %s", stderr.String())
		}
		t.Fatalf("mount namespace: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	got := make([]int64, len(sizesMiB))
	i := -1
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "size="):
			i++
		case strings.HasPrefix(line, "failed="):
			t.Fatalf("hooktest %s: %s\nstdout: %s\nstderr: %s", mode, line, out, stderr.String())
		case strings.HasPrefix(line, "n=") && i >= 0 && i < len(got):
			f := strings.Fields(line)[0]
			n, err := strconv.ParseInt(strings.TrimPrefix(f, "n="), 10, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			got[i] = n
		}
	}
	if i != len(sizesMiB)-1 {
		t.Fatalf("hooktest output incomplete:\n%s\nstderr: %s", out, stderr.String())
	}
	return got, stderr.String()
}
