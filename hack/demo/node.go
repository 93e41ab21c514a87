package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/agent"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin/kubelettest"
	"github.com/gpupack/gpupack/devicehook/node/installer"
	"github.com/gpupack/gpupack/test/framework"
)

// nodeAnswer runs gpupack-node's device plugin (the real plugin code, fed
// by this API server's pods and GPUPlans, as the agent wires it) against
// the test kubelet for one node of the fractional pods, asks it for one
// container's GPU the way the kubelet does, and shows and checks what it
// answers: CDI devices, mounts, and the limits file it wrote.
func nodeAnswer(t *demoTB, env *framework.Env, pods []corev1.Pod) {
	say("")
	say("what gpupack-node's device plugin answers the kubelet for one of these pods:")
	node := pods[0].Spec.NodeName
	var n corev1.Node
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	gpus, err := v1alpha1.ParseGPUs(n.Annotations[v1alpha1.AnnotationGPUs])
	if err != nil {
		t.Fatalf("node %s inventory: %v", node, err)
	}
	ctx, cancel := context.WithCancel(env.Ctx)
	defer cancel()
	pf := informers.NewSharedInformerFactoryWithOptions(env.Clientset, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	lister := pf.Core().V1().Pods().Lister()
	pf.Start(ctx.Done())
	pf.WaitForCacheSync(ctx.Done())
	plans := agent.WatchPlans(ctx, dynamic.NewForConfigOrDie(env.Config))

	pluginDir, err := os.MkdirTemp("", "dp") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer os.RemoveAll(pluginDir)
	state := filepath.Join(t.dir, "gpupack-node")
	hookDir, limitsDir, cacheDir := filepath.Join(state, "hook"), filepath.Join(state, "limits"), filepath.Join(state, "cache")
	for _, d := range []string{hookDir, limitsDir, cacheDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("%v", err)
		}
	}
	// gpupack-node installs the hook library it delivers (built by `make devicehook`).
	if _, err := installer.Install(filepath.Join(framework.RepoRoot(), "devicehook", "build", v1alpha1.HookLibraryName), hookDir, "demo"); err != nil {
		say("  (hook library not installed: %v; the mounts are shown all the same)", err)
	}
	kubelet := kubelettest.Start(t, pluginDir)
	p := deviceplugin.New(deviceplugin.Config{
		ResourceName: v1alpha1.ResourceVGPU, SlotsPerGPU: 4, NodeName: node, PluginDir: pluginDir, SocketName: "gpupack-vgpu.sock",
		HookDir: hookDir, MountPreload: true, CacheHostDir: cacheDir, LimitsDir: limitsDir, MemoryLimits: true,
		Unplanned: deviceplugin.UnplannedReject, Client: env.Clientset,
		// The kubelet admits one pod at a time, and the plugin serves only
		// pods it has not admitted yet (no status.startTime): kwok has
		// admitted them all, so the plugin is shown pods[0] as the kubelet
		// sees a pod it is admitting, the others as they are.
		Pods: deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) {
			list, err := lister.List(labels.Everything())
			out := make([]*corev1.Pod, 0, len(list))
			for _, p := range list {
				if p.UID == pods[0].UID {
					p = p.DeepCopy()
					p.Status = corev1.PodStatus{Phase: corev1.PodPending}
				}
				out = append(out, p)
			}
			return out, err
		}),
		Plans: plans,
	})
	p.SetGPUs(gpus)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for len(kubelet.Devices(v1alpha1.ResourceVGPU)) != 4*len(gpus) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	// The kubelet asks for the GPU container of the pod it admits; the
	// plugin steers it to the slots of that pod's plan and answers for it.
	r, ids, err := kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
	if err != nil {
		expect(false, "the device plugin on %s answers the kubelet's Allocate: %v", node, err)
		return
	}
	expect(true, "the device plugin on %s answers the kubelet's Allocate", node)
	var lim string
	mounts := []string{}
	roOK := true
	for _, m := range r.Mounts {
		ro := map[bool]string{true: "ro", false: "rw"}[m.ReadOnly]
		mounts = append(mounts, fmt.Sprintf("%s <- %s (%s)", m.ContainerPath, strings.TrimPrefix(m.HostPath, state+"/"), ro))
		if m.ContainerPath == deviceplugin.LimitsMountPath {
			lim = m.HostPath
		}
		if (m.ContainerPath == deviceplugin.LimitsMountPath || m.ContainerPath == "/etc/ld.so.preload" || m.ContainerPath == hookDir) != m.ReadOnly {
			roOK = false
		}
	}
	// The limits file's folder is <limits>/<pod UID>/<container>: the pod.
	var pod *corev1.Pod
	for i := range pods {
		if lim != "" && strings.HasPrefix(lim, filepath.Join(limitsDir, string(pods[i].UID))+"/") {
			pod = &pods[i]
		}
	}
	if pod == nil {
		expect(false, "the answer is for one of the fractional pods (limits file %q)", lim)
		return
	}
	planned, _, perr := deviceplugin.Planned(pod, mustPlans(plans), node)
	var cdi, want []string
	for _, d := range r.CdiDevices {
		cdi = append(cdi, d.Name)
	}
	for _, g := range planned {
		want = append(want, deviceplugin.CDIDeviceName(g.UUID))
	}
	sort.Strings(cdi)
	sort.Strings(want)
	say("  pod %s (GPUPlan binding: %s), kubelet slots %v", pod.Name, pod.Annotations[v1alpha1.AnnotationDevices], ids)
	say("  CDI devices: %s", strings.Join(cdi, " "))
	say("  env: %v (none: the GPU comes by CDI, not NVIDIA_VISIBLE_DEVICES)", r.Envs)
	say("  mounts:")
	for _, m := range mounts {
		say("    %s", m)
	}
	b, err := os.ReadFile(lim)
	say("  %s as written by the plugin:", deviceplugin.LimitsMountPath)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		say("    | %s", line)
	}
	expect(perr == nil && len(want) > 0 && strings.Join(cdi, ",") == strings.Join(want, ","), "CDI devices are exactly the pod's planned GPUs %v", want)
	expect(len(r.Envs) == 0, "no device or limit env in the answer")
	expect(roOK && lim != "", "hook library, /etc/ld.so.preload and the limits file are mounted read-only")
	kv, kerr := deviceplugin.ParseLimits(b)
	wantKV := map[string]string{}
	for i, g := range planned {
		wantKV[fmt.Sprintf("%s_%d", v1alpha1.EnvMemoryLimit, i)] = fmt.Sprintf("%dm", g.MemoryMiB)
		if g.Cores > 0 && g.Cores < 100 {
			wantKV[fmt.Sprintf("%s_%d", v1alpha1.EnvSMLimit, i)] = fmt.Sprint(g.Cores)
		}
	}
	limOK := err == nil && kerr == nil && len(planned) > 0
	for k, v := range wantKV {
		limOK = limOK && kv[k] == v
	}
	expect(limOK, "the limits file holds the plan's MiB and SM share (%v)", wantKV)
}

func mustPlans(l deviceplugin.PlanLister) []*v1alpha1.GPUPlan {
	out, _ := l.Plans("")
	return out
}
