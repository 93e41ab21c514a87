package mutation

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

func withSC(c corev1.Container, sc *corev1.SecurityContext) corev1.Container {
	c.SecurityContext = sc
	return c
}

func caps(names ...corev1.Capability) *corev1.SecurityContext {
	return &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: names}}
}

// Every container of a GPU pod (and of a job's GPU template) is held to
// the same privilege rules, whichever container asks for the GPU, in both
// resource modes.
func TestGPUPodPrivilegeDenied(t *testing.T) {
	yes := true
	unmasked := corev1.UnmaskedProcMount
	always := corev1.ContainerRestartPolicyAlways
	bad := map[string]*corev1.SecurityContext{
		"is privileged":                 {Privileged: &yes},
		"adds capability SYS_ADMIN":     caps("SYS_ADMIN"),
		"adds capability cap_sys_admin": caps("cap_sys_admin"),
		"adds capability ALL":           caps("ALL"),
		"adds capability SYS_PTRACE":    caps("NET_BIND_SERVICE", "SYS_PTRACE"),
		"asks for procMount: Unmasked":  {ProcMount: &unmasked},
	}
	for _, mode := range []string{ResourcesGpupack, ResourcesHAMi} {
		m := mustNew(t, Config{Resources: mode})
		for want, sc := range bad {
			for _, where := range []string{"gpu", "cpu", "init", "sidecar"} {
				gpuC, cpuC, initC, side := makeCtr("gpu").gpus("1").obj(), makeCtr("cpu").obj(), makeCtr("init").obj(), makeCtr("sidecar").obj()
				side.RestartPolicy = &always
				switch where {
				case "gpu":
					gpuC = withSC(gpuC, sc)
				case "cpu":
					cpuC = withSC(cpuC, sc)
				case "init":
					initC = withSC(initC, sc)
				case "sidecar":
					side = withSC(side, sc)
				}
				p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(gpuC).ctr(cpuC).obj()
				p.Spec.InitContainers = []corev1.Container{initC, side}
				_, err := m.Pod(p, PodContext{})
				if err == nil || !strings.Contains(err.Error(), `"`+where+`" `+want) {
					t.Errorf("%s: %s in %s: err = %v", mode, want, where, err)
				}
				j := makeJob(nil, corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec})
				if _, err := m.Job(j); err == nil || !strings.Contains(err.Error(), "pod template: ") {
					t.Errorf("%s: job template with %s in %s: err = %v", mode, want, where, err)
				}
			}
		}
		for name, set := range map[string]func(*corev1.PodSpec){
			"hostPID": func(s *corev1.PodSpec) { s.HostPID = true }, "hostIPC": func(s *corev1.PodSpec) { s.HostIPC = true },
			// Skipping the scheduler skips the placement gate and the plan.
			"spec.nodeName": func(s *corev1.PodSpec) { s.NodeName = "n1" },
		} {
			p := makePod("p").ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(makeCtr("gpu").gpus("1").obj()).obj()
			set(&p.Spec)
			if _, err := m.Pod(p, PodContext{}); err == nil || !strings.Contains(err.Error(), "sets "+name) {
				t.Errorf("%s: %s: err = %v", mode, name, err)
			}
		}
		// Baseline's own capabilities, and a whole-GPU pod alike.
		p := makePod("p").ctr(withSC(makeCtr("gpu").gpus("1").obj(), caps("NET_BIND_SERVICE", "CHOWN", "cap_kill"))).obj()
		if _, err := m.Pod(p, PodContext{}); err != nil {
			t.Errorf("%s: baseline capabilities: %v", mode, err)
		}
		// A CPU-only pod is not gpupack's business.
		p = makePod("p").ctr(withSC(makeCtr("cpu").obj(), caps("SYS_ADMIN"))).obj()
		p.Spec.HostPID = true
		if _, err := m.Pod(p, PodContext{}); err != nil {
			t.Errorf("%s: CPU pod: %v", mode, err)
		}
	}
}

// GPUs in init containers and restartable sidecars are denied (gpupack
// plans and serves regular containers only), in pods and job templates.
func TestGPUsInInitContainersDenied(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	for _, mode := range []string{ResourcesGpupack, ResourcesHAMi} {
		m := mustNew(t, Config{Resources: mode})
		for _, tc := range []struct {
			name    string
			init    corev1.Container
			restart bool
			want    string
		}{
			{"init whole", makeCtr("warm").gpus("1").obj(), false, `init container "warm" asks for GPUs`},
			{"sidecar share", makeCtr("side").gpus("1").limit(v1alpha1.AnnotationHAMiGPUMem, "1000").obj(), true, `sidecar container (restartPolicy: Always) "side" asks for GPUs`},
			{"init vgpu", makeCtr("v").limit(v1alpha1.ResourceVGPU, "1").limit(v1alpha1.ResourceGPUMemory, "1000").obj(), false, `init container "v" asks for GPUs`},
		} {
			c := tc.init
			if tc.restart {
				c.RestartPolicy = &always
			}
			// With and without a GPU in the regular containers.
			for _, main := range []corev1.Container{makeCtr("main").obj(), makeCtr("main").gpus("1").obj()} {
				p := makePod("p").ctr(main).obj()
				p.Spec.InitContainers = []corev1.Container{c}
				if _, err := m.Pod(p, PodContext{}); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: %s: err = %v", mode, tc.name, err)
				}
				j := makeJob(nil, corev1.PodTemplateSpec{Spec: p.Spec})
				if _, err := m.Job(j); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: job %s: err = %v", mode, tc.name, err)
				}
			}
		}
	}
}

// A tenant's gpupack.io/devices on a GPU pod (or template) is removed at
// creation, with a warning; only the ungater writes it.
func TestTenantDevicesAnnotationStripped(t *testing.T) {
	m := mustNew(t, Config{})
	p := makePod("p").ann(v1alpha1.AnnotationDevices, "GPU-1:70000").ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(makeCtr("gpu").gpus("1").obj()).obj()
	warn, err := m.Pod(p, PodContext{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Annotations[v1alpha1.AnnotationDevices]; ok || len(warn) == 0 || !strings.Contains(strings.Join(warn, "\n"), "removed annotation gpupack.io/devices") {
		t.Errorf("annotations %v, warnings %q", p.Annotations, warn)
	}
	j := makeJob(nil, template(map[string]string{v1alpha1.AnnotationDevices: "GPU-1:70000"}, makeCtr("gpu").gpus("1").obj()))
	if _, err := m.Job(j); err != nil {
		t.Fatal(err)
	}
	if _, ok := j.Spec.Template.Annotations[v1alpha1.AnnotationDevices]; ok {
		t.Errorf("template kept %s", v1alpha1.AnnotationDevices)
	}
	if _, ok := j.Spec.Template.Annotations[v1alpha1.AnnotationInjected]; !ok {
		t.Errorf("the cleaned template is a fixed point and should be marked: %v", j.Spec.Template.Annotations)
	}
}

// NVIDIA_VISIBLE_DEVICES is stripped from every container of a GPU pod,
// GPU or not: where the NVIDIA toolkit still honours it, it would pick GPUs
// past the device plugin.
func TestVisibleDevicesStrippedEverywhere(t *testing.T) {
	m := mustNew(t, Config{})
	p := makePod("p").ctr(makeCtr("gpu").gpus("1").obj()).ctr(makeCtr("cpu").env(v1alpha1.EnvVisibleDevices, "all").env("KEEP", "1").obj()).obj()
	p.Spec.InitContainers = []corev1.Container{makeCtr("init").env(v1alpha1.EnvVisibleDevices, "all").obj()}
	warn, err := m.Pod(p, PodContext{})
	if err != nil {
		t.Fatal(err)
	}
	if len(warn) != 2 || len(p.Spec.Containers[1].Env) != 1 || p.Spec.InitContainers[0].Env != nil {
		t.Errorf("warn %q, cpu env %v, init env %v", warn, p.Spec.Containers[1].Env, p.Spec.InitContainers[0].Env)
	}
	deny := mustNew(t, Config{EnvPolicy: EnvPolicyDeny})
	p = makePod("p").ctr(makeCtr("gpu").gpus("1").obj()).ctr(makeCtr("cpu").env(v1alpha1.EnvVisibleDevices, "all").obj()).obj()
	if _, err := deny.Pod(p, PodContext{}); err == nil || !strings.Contains(err.Error(), "NVIDIA_VISIBLE_DEVICES") {
		t.Errorf("deny: %v", err)
	}
}

// Ephemeral containers (kubectl debug) in a GPU pod are denied privilege,
// capabilities beyond baseline, gpupack's volumes and paths, and owned env.
func TestEphemeralContainers(t *testing.T) {
	m := mustNew(t, Config{})
	yes := true
	base := func() *corev1.Pod {
		p := makePod("p").ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(makeCtr("gpu").limit(v1alpha1.ResourceVGPU, "1").limit(v1alpha1.ResourceGPUMemory, "1000").obj()).obj()
		defaultSeccomp(&p.Spec) // as the pod webhook stored it
		return p
	}
	for _, tc := range []struct {
		name string
		ec   corev1.EphemeralContainerCommon
		want string
	}{
		{"privileged", corev1.EphemeralContainerCommon{Name: "dbg", SecurityContext: &corev1.SecurityContext{Privileged: &yes}}, "is privileged"},
		{"sysadmin profile", corev1.EphemeralContainerCommon{Name: "dbg", SecurityContext: caps("SYS_PTRACE")}, "adds capability SYS_PTRACE"},
		{"hook volume", corev1.EphemeralContainerCommon{Name: "dbg", VolumeMounts: []corev1.VolumeMount{{Name: VolumeSharedCache, MountPath: "/x"}}}, "reserved for gpupack"},
		{"limits path", corev1.EphemeralContainerCommon{Name: "dbg", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/etc/gpupack"}}}, "at /etc/gpupack"},
		{"owned env", corev1.EphemeralContainerCommon{Name: "dbg", Env: []corev1.EnvVar{{Name: v1alpha1.EnvDisableControl, Value: "1"}}}, "sets CUDA_DISABLE_CONTROL"},
		{"seccomp Unconfined", corev1.EphemeralContainerCommon{Name: "dbg", SecurityContext: seccomp(corev1.SeccompProfileTypeUnconfined)}, `ephemeral container "dbg" sets securityContext.seccompProfile Unconfined`},
	} {
		p := base()
		p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: tc.ec}}
		if err := m.ValidateEphemeralContainers(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v", tc.name, err)
		}
	}
	p := base()
	p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "busybox"}}}
	if err := m.ValidateEphemeralContainers(p); err != nil {
		t.Errorf("plain debug container: %v", err)
	}
	// A GPU pod stored before gpupack set its seccomp profile: a debug
	// container without one of its own would run unconfined.
	old := base()
	old.Spec.SecurityContext = nil
	old.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "busybox"}}}
	if err := m.ValidateEphemeralContainers(old); err == nil || !strings.Contains(err.Error(), `ephemeral container "dbg" would run without a seccomp profile`) {
		t.Errorf("debug container in an unconfined pod: err = %v", err)
	}
	old.Spec.EphemeralContainers[0].SecurityContext = seccomp(corev1.SeccompProfileTypeRuntimeDefault)
	if err := m.ValidateEphemeralContainers(old); err != nil {
		t.Errorf("confined debug container in an unconfined pod: %v", err)
	}
	cpu := makePod("p").ctr(makeCtr("cpu").obj()).obj()
	cpu.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", SecurityContext: &corev1.SecurityContext{Privileged: &yes}}}}
	if err := m.ValidateEphemeralContainers(cpu); err != nil {
		t.Errorf("CPU pod: %v", err)
	}
}

// An update that adds a privileged sidecar (or a GPU init container) to a
// job's GPU template is refused at the update, where someone reads the
// message; an update of a template that already broke the rules is not.
func TestJobUpdateBreakingSecurity(t *testing.T) {
	m := mustNew(t, Config{})
	yes := true
	always := corev1.ContainerRestartPolicyAlways
	old := makePyTorchJob(map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi"}, map[string]corev1.PodTemplateSpec{
		"Worker": template(nil, makeCtr("pytorch").gpus("1").obj())})
	old.Spec.RunPolicy.Suspend = &yes
	cur := old.DeepCopy()
	cur.Spec.PyTorchReplicaSpecs["Worker"].Template.Spec.InitContainers = []corev1.Container{{Name: "side", Image: "x", RestartPolicy: &always, SecurityContext: &corev1.SecurityContext{Privileged: &yes}}}
	if err := m.ValidatePyTorchJobUpdate(old, cur); err == nil || !strings.Contains(err.Error(), `replica Worker: sidecar container "side" is privileged`) {
		t.Errorf("privileged sidecar added: %v", err)
	}
	if err := m.ValidatePyTorchJobUpdate(cur, cur.DeepCopy()); err != nil {
		t.Errorf("an update of an already broken template: %v", err)
	}
	job := makeJob(nil, template(nil, makeCtr("c").gpus("1").obj()))
	gpuInit := job.DeepCopy()
	gpuInit.Spec.Template.Spec.InitContainers = []corev1.Container{makeCtr("warm").gpus("1").obj()}
	if err := m.ValidateJobUpdate(job, gpuInit); err == nil || !strings.Contains(err.Error(), `init container "warm" asks for GPUs`) {
		t.Errorf("GPU init container added: %v", err)
	}
}
