package mutation

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

const (
	gpu  = v1alpha1.ResourceNvidiaGPU
	vgpu = v1alpha1.ResourceVGPU
	gmem = v1alpha1.ResourceGPUMemory
	gcor = v1alpha1.ResourceGPUCores
	h100 = "NVIDIA-H100-80GB-HBM3"
)

func mustNew(t *testing.T, cfg Config) *Mutator {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPyTorchJobConversion(t *testing.T) {
	m := mustNew(t, Config{})
	j := makePyTorchJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30"}, map[string]corev1.PodTemplateSpec{
		"Master": template(nil, makeCtr("pytorch").gpus("1").limit("cpu", "2").obj()),
		"Worker": template(map[string]string{v1alpha1.AnnotationHAMiGPUMem: "10240"}, makeCtr("pytorch").gpus("2").obj(), makeCtr("sidecar").limit("cpu", "1").obj()),
	})
	if _, err := m.PyTorchJob(j); err != nil {
		t.Fatal(err)
	}
	master := j.Spec.PyTorchReplicaSpecs["Master"].Template
	if d := cmp.Diff(rl(vgpu, "1", gmem, "20480", gcor, "30", "cpu", "2"), master.Spec.Containers[0].Resources.Limits); d != "" {
		t.Errorf("master limits (-want +got):\n%s", d)
	}
	if d := cmp.Diff(rl(vgpu, "1", gmem, "20480", gcor, "30"), master.Spec.Containers[0].Resources.Requests); d != "" {
		t.Errorf("master requests (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30", v1alpha1.AnnotationInjected: m.Fingerprint()}, master.Annotations); d != "" {
		t.Errorf("master template annotations carry the job defaults (-want +got):\n%s", d)
	}
	worker := j.Spec.PyTorchReplicaSpecs["Worker"].Template
	if d := cmp.Diff(rl(vgpu, "2", gmem, "20480", gcor, "60"), worker.Spec.Containers[0].Resources.Limits); d != "" {
		t.Errorf("worker limits: template overrides memory, job's cores stay (-want +got):\n%s", d)
	}
	if d := cmp.Diff(rl("cpu", "1"), worker.Spec.Containers[1].Resources.Limits); d != "" {
		t.Errorf("sidecar untouched (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]string{v1alpha1.AnnotationHAMiGPUMem: "10240", v1alpha1.AnnotationGPUCores: "30", v1alpha1.AnnotationInjected: m.Fingerprint()}, worker.Annotations); d != "" {
		t.Errorf("worker annotations (-want +got):\n%s", d)
	}
}

func TestWholeGPUStaysExclusive(t *testing.T) {
	m := mustNew(t, Config{})
	j := makeJob(nil, template(nil, makeCtr("c").gpus("8").obj()))
	orig := j.DeepCopy()
	if _, err := m.Job(j); err != nil {
		t.Fatal(err)
	}
	// Only marked (its pods need nothing more from the pod webhook) and
	// confined by seccomp.
	orig.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationInjected: m.Fingerprint()}
	orig.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	if d := cmp.Diff(orig, j); d != "" {
		t.Errorf("whole-GPU job changed (-want +got):\n%s", d)
	}
}

// gpupack mode: the device plugin delivers the hook and the limits, so a
// shared-GPU pod gets no hostPath volume, no mount and no hook env — only
// its converted resources — and stays admissible under Pod Security
// baseline. The preload setting no longer matters.
func TestPodGetsNoHostPathOrHookEnv(t *testing.T) {
	for _, preload := range []string{PreloadFile, PreloadEnv} {
		m := mustNew(t, Config{Hook: HookConfig{Preload: preload}})
		p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "10Gi").ann(v1alpha1.AnnotationGPUCores, "50").
			ctr(makeCtr("gpu").gpus("1").env("HOME", "/root").obj()).
			ctr(makeCtr("cpu").env(v1alpha1.EnvLDPreload, "/mine.so").obj()).obj()
		p.Spec.InitContainers = []corev1.Container{makeCtr("init").env(v1alpha1.EnvLDPreload, "/x.so").obj()}
		warn, err := m.Pod(p, PodContext{})
		if err != nil {
			t.Fatal(err)
		}
		if len(warn) != 0 {
			t.Errorf("%s: warnings: %q", preload, warn)
		}
		c := p.Spec.Containers[0]
		if d := cmp.Diff([]corev1.EnvVar{{Name: "HOME", Value: "/root"}}, c.Env); d != "" {
			t.Errorf("%s: env (-want +got):\n%s", preload, d)
		}
		if len(c.VolumeMounts) != 0 || len(p.Spec.Volumes) != 0 {
			t.Errorf("%s: mounts %v volumes %v, want none", preload, c.VolumeMounts, p.Spec.Volumes)
		}
		if d := cmp.Diff(rl(vgpu, "1", gmem, "10240", gcor, "50"), c.Resources.Limits); d != "" {
			t.Errorf("%s: limits (-want +got):\n%s", preload, d)
		}
		if d := cmp.Diff([]corev1.EnvVar{{Name: v1alpha1.EnvLDPreload, Value: "/mine.so"}}, p.Spec.Containers[1].Env); d != "" {
			t.Errorf("non-GPU container touched (-want +got):\n%s", d)
		}
		if d := cmp.Diff([]corev1.EnvVar{{Name: v1alpha1.EnvLDPreload, Value: "/x.so"}}, p.Spec.InitContainers[0].Env); d != "" {
			t.Errorf("init container touched (-want +got):\n%s", d)
		}
		if len(p.Spec.SchedulingGates) != 0 {
			t.Errorf("gate without plan: %v", p.Spec.SchedulingGates)
		}
	}
}

// Pods and templates from an older release (hostPath volumes named
// gpupack-hook / gpupack-cache) and tenants imitating them lose the
// volumes and every mount of them, in every container.
func TestOwnedVolumesRemoved(t *testing.T) {
	m := mustNew(t, Config{})
	dir := corev1.HostPathDirectory
	legacy := []corev1.Volume{
		{Name: VolumeHook, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: v1alpha1.DefaultHookHostPath, Type: &dir}}},
		{Name: VolumeSharedCache, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: v1alpha1.DefaultSharedCacheDir}}},
	}
	tenant := []corev1.Volume{{Name: VolumeSharedCache, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/gpupack"}}},
		{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	for _, tc := range []struct {
		name  string
		vols  []corev1.Volume
		warns int
	}{{"legacy", legacy, 0}, {"tenant", tenant, 1}} {
		gpuC := makeCtr("gpu").gpus("1").obj()
		gpuC.VolumeMounts = []corev1.VolumeMount{{Name: VolumeHook, MountPath: "/usr/local/gpupack"}, {Name: VolumeSharedCache, MountPath: "/var/run/gpupack"}}
		side := makeCtr("side").obj()
		side.VolumeMounts = []corev1.VolumeMount{{Name: VolumeSharedCache, MountPath: "/steal"}, {Name: "data", MountPath: "/data"}}
		initC := makeCtr("init").obj()
		initC.VolumeMounts = []corev1.VolumeMount{{Name: VolumeHook, MountPath: "/hook"}}
		always := corev1.ContainerRestartPolicyAlways
		sidecar := makeCtr("sidecar").obj()
		sidecar.RestartPolicy = &always
		sidecar.VolumeMounts = []corev1.VolumeMount{{Name: VolumeSharedCache, MountPath: "/cache"}}
		p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(gpuC).ctr(side).obj()
		p.Spec.InitContainers = []corev1.Container{initC, sidecar}
		p.Spec.Volumes = append([]corev1.Volume(nil), tc.vols...)
		warn, err := m.Pod(p, PodContext{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(warn) != tc.warns {
			t.Errorf("%s: warnings %q, want %d", tc.name, warn, tc.warns)
		}
		for _, v := range p.Spec.Volumes {
			if ownedVolume(v.Name) {
				t.Errorf("%s: volume %q kept", tc.name, v.Name)
			}
		}
		for _, kc := range allContainers(&p.Spec) {
			for _, vm := range kc.c.VolumeMounts {
				if ownedVolume(vm.Name) {
					t.Errorf("%s: %s %q still mounts %q", tc.name, kc.kind, kc.c.Name, vm.Name)
				}
			}
		}
		if err := m.ValidatePod(p); err != nil {
			t.Errorf("%s: not a fixed point: %v", tc.name, err)
		}
	}
}

func TestOwnedEnv(t *testing.T) {
	tenant := func() *corev1.Pod {
		return makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(makeCtr("gpu").gpus("1").
			env(v1alpha1.EnvLDPreload, "/evil.so").env("CUDA_DEVICE_MEMORY_LIMIT_0", "80g").env(v1alpha1.EnvDisableControl, "true").
			env(v1alpha1.EnvVisibleDevices, "all").env(v1alpha1.EnvMemoryLimit, "1000m").env("KEEP", "1").obj()).obj()
	}
	m := mustNew(t, Config{})
	p := tenant()
	warn, err := m.Pod(p, PodContext{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range p.Spec.Containers[0].Env {
		names = append(names, e.Name+"="+e.Value)
	}
	want := []string{"KEEP=1"}
	if d := cmp.Diff(want, names); d != "" {
		t.Errorf("env (-want +got):\n%s", d)
	}
	if len(warn) != 5 || !strings.Contains(strings.Join(warn, "\n"), `removed LD_PRELOAD`) {
		t.Errorf("warnings = %q", warn)
	}

	deny := mustNew(t, Config{EnvPolicy: EnvPolicyDeny})
	if _, err := deny.Pod(tenant(), PodContext{}); err == nil || !strings.Contains(err.Error(), "sets LD_PRELOAD, which gpupack owns") {
		t.Errorf("deny policy: err = %v", err)
	}
	// Whole-GPU containers lose owned keys too, but get no hook.
	p = makePod("p").ctr(makeCtr("gpu").gpus("1").env(v1alpha1.EnvVisibleDevices, "all").obj()).obj()
	warn, err = m.Pod(p, PodContext{})
	if err != nil || len(p.Spec.Containers[0].Env) != 0 || len(warn) != 1 || len(p.Spec.Volumes) != 0 {
		t.Errorf("whole GPU: env %v, warn %q, volumes %v, err %v", p.Spec.Containers[0].Env, warn, p.Spec.Volumes, err)
	}
}

// No container of a GPU pod — regular, CPU sidecar, init, restartable
// sidecar — may mount over the paths where gpupack-node's device plugin
// mounts the hook, its preload file, the limits file or the accounting
// directory: kubelet applies pod-spec mounts after a device plugin's, so
// the tenant's would win. Paths are compared cleaned.
// A mount under /var/run/nvidia-container-devices picks GPUs by name when
// the toolkit accepts volume mounts: denied in every container, both modes.
func TestNvidiaDeviceVolumeMountDenied(t *testing.T) {
	for _, mode := range []string{ResourcesGpupack, ResourcesHAMi} {
		m := mustNew(t, Config{Resources: mode})
		for _, path := range []string{"/var/run/nvidia-container-devices/all", "/run/nvidia-container-devices/GPU-1", "/var/run/nvidia-container-devices"} {
			cpuC := makeCtr("cpu").obj()
			cpuC.VolumeMounts = []corev1.VolumeMount{{Name: "nv", MountPath: path}}
			p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(makeCtr("gpu").gpus("1").obj()).ctr(cpuC).obj()
			if _, err := m.Pod(p, PodContext{}); err == nil || !strings.Contains(err.Error(), "accept-nvidia-visible-devices-as-volume-mounts") {
				t.Errorf("%s: mount at %s: err = %v", mode, path, err)
			}
		}
	}
}

func TestTenantMountOverGpupackPathsDenied(t *testing.T) {
	m := mustNew(t, Config{})
	always := corev1.ContainerRestartPolicyAlways
	for _, path := range []string{"/etc/ld.so.preload", "/usr/local/gpupack", "/usr/local/gpupack/libgpupack-hook.so", "/etc/gpupack", "/etc/gpupack/limits",
		"/etc//gpupack/", "/var/run/gpupack", "/run/gpupack/x", "/etc/gpupack/podinfo"} {
		for _, where := range []string{"gpu", "cpu", "init", "sidecar"} {
			gpuC := makeCtr("gpu").gpus("1").obj()
			cpuC := makeCtr("cpu").obj()
			initC := makeCtr("init").obj()
			side := makeCtr("sidecar").obj()
			side.RestartPolicy = &always
			vm := corev1.VolumeMount{Name: "mine", MountPath: path}
			switch where {
			case "gpu":
				gpuC.VolumeMounts = []corev1.VolumeMount{vm}
			case "cpu":
				cpuC.VolumeMounts = []corev1.VolumeMount{vm}
			case "init":
				initC.VolumeMounts = []corev1.VolumeMount{vm}
			case "sidecar":
				side.VolumeMounts = []corev1.VolumeMount{vm}
			}
			p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(gpuC).ctr(cpuC).obj()
			p.Spec.InitContainers = []corev1.Container{initC, side}
			_, err := m.Pod(p, PodContext{})
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q mounts volume \"mine\" at %s", where, path)) {
				t.Errorf("mount at %s in %s: err = %v", path, where, err)
			}
		}
	}
	// Elsewhere (including a parent, which the runtime mounts first) is fine.
	c := makeCtr("gpu").gpus("1").obj()
	c.VolumeMounts = []corev1.VolumeMount{{Name: "a", MountPath: "/etc/gpupack-other"}, {Name: "b", MountPath: "/data"}, {Name: "c", MountPath: "/usr/local"}}
	p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(c).obj()
	if _, err := m.Pod(p, PodContext{}); err != nil {
		t.Errorf("mounts elsewhere: %v", err)
	}
}

// Mutating twice changes nothing and warns nothing; a pod made from a
// mutated job template comes out the same as a pod mutated directly.
func TestIdempotent(t *testing.T) {
	m := mustNew(t, Config{})
	j := makeJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationCheckpoint: "true"},
		template(map[string]string{v1alpha1.AnnotationPlan: "plan-1"}, makeCtr("gpu").gpus("2").env(v1alpha1.EnvLDPreload, "/evil.so").obj()))
	if _, err := m.Job(j); err != nil {
		t.Fatal(err)
	}
	again := j.DeepCopy()
	if w, err := m.Job(again); err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(j, again) {
		t.Errorf("second Job pass: warn %q err %v diff %s", w, err, cmp.Diff(j, again))
	}
	if err := m.ValidateJob(j); err != nil {
		t.Errorf("ValidateJob after mutation: %v", err)
	}
	p := &corev1.Pod{ObjectMeta: j.Spec.Template.ObjectMeta, Spec: j.Spec.Template.Spec}
	p.Name, p.Namespace = "p", "ns"
	if _, err := m.Pod(p, PodContext{ResumeStep: "1200"}); err != nil {
		t.Fatal(err)
	}
	p2 := p.DeepCopy()
	if w, err := m.Pod(p2, PodContext{ResumeStep: "1200"}); err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(p, p2) {
		t.Errorf("second Pod pass: warn %q err %v diff %s", w, err, cmp.Diff(p, p2))
	}
	if err := m.ValidatePod(p); err != nil {
		t.Errorf("ValidatePod after mutation: %v", err)
	}
	if d := cmp.Diff(rl(vgpu, "2", gmem, "40960"), p.Spec.Containers[0].Resources.Limits); d != "" {
		t.Errorf("pod limits (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}, p.Spec.SchedulingGates); d != "" {
		t.Errorf("gates (-want +got):\n%s", d)
	}
}

func TestValidateCatchesSkippedMutation(t *testing.T) {
	m := mustNew(t, Config{})
	p := makePod("p").ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(makeCtr("gpu").gpus("1").obj()).obj()
	if err := m.ValidatePod(p); err == nil || !strings.Contains(err.Error(), "not converted") {
		t.Errorf("unmutated pod: %v", err)
	}
	if _, err := m.Pod(p, PodContext{}); err != nil {
		t.Fatal(err)
	}
	p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: v1alpha1.EnvDisableControl, Value: "1"})
	if err := m.ValidatePod(p); err == nil || !strings.Contains(err.Error(), "environment differs") {
		t.Errorf("env added after mutation: %v", err)
	}
}

func TestModelAndPercent(t *testing.T) {
	h100Phys := int64(81559)
	alloc := flavors.Allocatable(h100Phys)
	cases := []struct {
		name    string
		cfg     Config
		pod     *corev1.Pod
		wantMiB int64
		wantErr string
		warn    string
	}{
		{name: "percent of allocatable", pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationHAMiGPUMemPercentage, "50").ctr(makeCtr("c").gpus("1").obj()).obj(), wantMiB: (alloc*50 + 99) / 100},
		{name: "percent 100 is the whole allocatable", pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationHAMiGPUMemPercentage, "100").ctr(makeCtr("c").gpus("1").obj()).obj(), wantMiB: alloc},
		{name: "percent via default model", cfg: Config{DefaultGPUModel: "NVIDIA L4"}, pod: makePod("p").ann(v1alpha1.AnnotationHAMiGPUMemPercentage, "10").ctr(makeCtr("c").gpus("1").obj()).obj(), wantMiB: (flavors.Allocatable(23034)*10 + 99) / 100},
		{name: "percent without model", pod: makePod("p").ann(v1alpha1.AnnotationHAMiGPUMemPercentage, "10").ctr(makeCtr("c").gpus("1").obj()).obj(), wantErr: "needs a known GPU model"},
		{name: "at the line", pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, itoa(alloc)).ctr(makeCtr("c").gpus("1").obj()).obj(), wantMiB: alloc},
		{name: "over the line", pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, itoa(alloc+1)).ctr(makeCtr("c").gpus("1").obj()).obj(), wantErr: "ask for at most " + itoa(alloc) + "Mi"},
		{name: "configured model", cfg: Config{GPUModels: []GPUModel{{Model: "Acme-X1", MemoryMiB: 10000}}}, pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, "Acme-X1").ann(v1alpha1.AnnotationGPUMemory, "8000").ctr(makeCtr("c").gpus("1").obj()).obj(), wantErr: "more than the 7500 MiB"},
		{name: "unknown model warns", pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, "Voodoo2").ann(v1alpha1.AnnotationGPUMemory, "8000").ctr(makeCtr("c").gpus("1").obj()).obj(), wantMiB: 8000, warn: "unknown to gpupack"},
		{name: "no model warns", pod: makePod("p").ann(v1alpha1.AnnotationGPUMemory, "8000").ctr(makeCtr("c").gpus("1").obj()).obj(), wantMiB: 8000, warn: "no GPU model is known"},
		{name: "custom buffer", cfg: Config{Buffer: BufferConfig{DriverOverheadMiB: ptr[int64](0), BufferPercent: ptr[int32](0)}}, pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, itoa(90*h100Phys/100)).ctr(makeCtr("c").gpus("1").obj()).obj(), wantMiB: 90 * h100Phys / 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.cfg)
			warn, err := m.Pod(tc.pod, PodContext{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := tc.pod.Spec.Containers[0].Resources.Limits[gmem]
			if got.Value() != tc.wantMiB {
				t.Errorf("gpu-memory = %s, want %d", got.String(), tc.wantMiB)
			}
			if tc.warn != "" && (len(warn) != 1 || !strings.Contains(warn[0], tc.warn)) {
				t.Errorf("warn = %q, want %q", warn, tc.warn)
			}
			if tc.warn == "" && len(warn) != 0 {
				t.Errorf("unexpected warnings %q", warn)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A job-level default reaches a CPU-only master without denying it, and is
// not copied onto it (its pods would then be denied).
func TestJobDefaultSkipsCPUReplicas(t *testing.T) {
	m := mustNew(t, Config{})
	j := makePyTorchJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, map[string]corev1.PodTemplateSpec{
		"Master": template(nil, makeCtr("pytorch").limit("cpu", "1").obj()),
		"Worker": template(nil, makeCtr("pytorch").gpus("1").obj()),
	})
	if _, err := m.PyTorchJob(j); err != nil {
		t.Fatal(err)
	}
	if ann := j.Spec.PyTorchReplicaSpecs["Master"].Template.Annotations; len(ann) != 0 {
		t.Errorf("master annotations = %v", ann)
	}
	if ann := j.Spec.PyTorchReplicaSpecs["Worker"].Template.Annotations; ann[v1alpha1.AnnotationGPUMemory] != "20Gi" {
		t.Errorf("worker annotations = %v", ann)
	}
	cpuOnly := makePyTorchJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, map[string]corev1.PodTemplateSpec{
		"Master": template(nil, makeCtr("pytorch").limit("cpu", "1").obj()),
	})
	if _, err := m.PyTorchJob(cpuOnly); err == nil || !strings.Contains(err.Error(), "no container asks for nvidia.com/gpu") {
		t.Errorf("job-level memory without any GPU: %v", err)
	}
}

func TestOwnedEnvIncludesDevicehookKnobs(t *testing.T) {
	for _, k := range []string{v1alpha1.EnvContextReserve, v1alpha1.EnvSMPeriod, v1alpha1.EnvLDPreload, "CUDA_DEVICE_MEMORY_LIMIT_3", "CUDA_DEVICE_SM_LIMIT_0"} {
		if !owned(k) {
			t.Errorf("%s is not owned by the webhook", k)
		}
	}
	for _, k := range []string{"PATH", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES_X"} {
		if owned(k) {
			t.Errorf("%s should be left to the tenant", k)
		}
	}
}

// Tenant values of the owned env keys in a job's template are handled when
// the job is applied (warning or denial to kubectl), not when its
// controller creates pods: a denial there would leave the job without pods.
func TestJobTemplateOwnedEnv(t *testing.T) {
	gpuCtr := func() corev1.Container {
		return makeCtr("trainer").gpus("1").env(v1alpha1.EnvLDPreload, "/evil.so").env(v1alpha1.EnvMemoryLimit, "80g").env("KEEP", "me").obj()
	}
	cpuCtr := makeCtr("logger").env(v1alpha1.EnvLDPreload, "/mine.so").obj()
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	h100Template := func(cs ...corev1.Container) corev1.PodTemplateSpec {
		t := template(nil, cs...)
		t.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: h100}
		return t
	}
	envOf := func(c corev1.Container) []string {
		var out []string
		for _, e := range c.Env {
			out = append(out, e.Name+"="+e.Value)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		obj   func() any
		where string
	}{
		{"Job", func() any { return makeJob(mem, h100Template(gpuCtr(), cpuCtr)) }, "pod template"},
		{"PyTorchJob", func() any {
			return makePyTorchJob(mem, map[string]corev1.PodTemplateSpec{"Master": h100Template(cpuCtr), "Worker": h100Template(gpuCtr(), cpuCtr)})
		}, "replica Worker"},
	} {
		t.Run(tc.name+"/Strip", func(t *testing.T) {
			m := mustNew(t, Config{})
			obj := tc.obj()
			warn, err := mutateAny(m, obj)
			if err != nil {
				t.Fatal(err)
			}
			tmpl := templateOf(obj, "Worker")
			if got := envOf(tmpl.Spec.Containers[0]); fmt.Sprint(got) != "[KEEP=me]" {
				t.Errorf("GPU container env %v, want KEEP alone", got)
			}
			if got := envOf(tmpl.Spec.Containers[1]); fmt.Sprint(got) != "[LD_PRELOAD=/mine.so]" {
				t.Errorf("CPU container env %v, want untouched", got)
			}
			want := []string{tc.where + `: container "trainer": removed LD_PRELOAD; gpupack owns it on GPU containers`,
				tc.where + `: container "trainer": removed CUDA_DEVICE_MEMORY_LIMIT; gpupack owns it on GPU containers`}
			if d := cmp.Diff(want, warn); d != "" {
				t.Errorf("warnings (-want +got):\n%s", d)
			}
			if w, err := mutateAny(m, obj); err != nil || len(w) != 0 {
				t.Errorf("second pass: warn %q err %v", w, err)
			}
		})
		t.Run(tc.name+"/Deny", func(t *testing.T) {
			m := mustNew(t, Config{EnvPolicy: EnvPolicyDeny})
			_, err := mutateAny(m, tc.obj())
			if err == nil || !strings.Contains(err.Error(), tc.where+`: container "trainer" sets LD_PRELOAD, which gpupack owns on GPU containers; remove it`) {
				t.Errorf("err = %v", err)
			}
		})
	}
}

func mutateAny(m *Mutator, obj any) ([]string, error) {
	switch o := obj.(type) {
	case *batchv1.Job:
		return m.Job(o)
	case *kftraining.PyTorchJob:
		return m.PyTorchJob(o)
	}
	panic(fmt.Sprintf("%T", obj))
}

func templateOf(obj any, replica string) *corev1.PodTemplateSpec {
	switch o := obj.(type) {
	case *batchv1.Job:
		return &o.Spec.Template
	case *kftraining.PyTorchJob:
		return &o.Spec.PyTorchReplicaSpecs[kftraining.ReplicaType(replica)].Template
	}
	panic(fmt.Sprintf("%T", obj))
}
