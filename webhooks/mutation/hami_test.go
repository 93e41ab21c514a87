package mutation

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

const (
	hmem = v1alpha1.AnnotationHAMiGPUMem
	hpct = v1alpha1.AnnotationHAMiGPUMemPercentage
	hcor = v1alpha1.AnnotationHAMiGPUCores
)

func hamiMutator(t *testing.T, cfg Config) *Mutator {
	t.Helper()
	cfg.Resources = ResourcesHAMi
	return mustNew(t, cfg)
}

// noGpupackHook fails when a container got any of gpupack's hook: its
// resources, mounts or volumes, or (on a GPU container) an owned env key. In
// hami mode HAMi's device plugin does all of that at Allocate.
func noGpupackHook(t *testing.T, s *corev1.PodSpec) {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Name == VolumeHook || v.Name == VolumeSharedCache {
			t.Errorf("volume %s injected in hami mode", v.Name)
		}
	}
	for _, c := range s.Containers {
		for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for _, r := range gpupackResources {
				if _, ok := rl[r]; ok {
					t.Errorf("container %q: %s written in hami mode", c.Name, r)
				}
			}
		}
		for _, vm := range c.VolumeMounts {
			if vm.Name == VolumeHook || vm.Name == VolumeSharedCache {
				t.Errorf("container %q: mount %s injected in hami mode", c.Name, vm.MountPath)
			}
		}
		if _, isGPU := c.Resources.Limits[gpu]; !isGPU {
			continue
		}
		for _, e := range c.Env {
			if owned(e.Name) {
				t.Errorf("container %q: %s=%s set in hami mode", c.Name, e.Name, e.Value)
			}
		}
	}
}

// fixedPoint: a second pass changes nothing and warns nothing, and the
// validating webhook (which re-runs the mutation on a copy) accepts it.
func fixedPointPod(t *testing.T, m *Mutator, p *corev1.Pod) {
	t.Helper()
	again := p.DeepCopy()
	if w, err := m.Pod(again, PodContext{}); err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(p, again) {
		t.Errorf("second Pod pass: warn %q err %v diff %s", w, err, cmp.Diff(p, again))
	}
	if err := m.ValidatePod(p); err != nil {
		t.Errorf("ValidatePod after mutation: %v", err)
	}
}

func TestHAMiModePod(t *testing.T) {
	h100Alloc := flavors.Allocatable(81559) // 71903
	cases := []struct {
		name    string
		cfg     Config
		pod     *corev1.Pod
		want    corev1.ResourceList // limits (and requests) of container 0
		reqs    corev1.ResourceList // requests when not want
		warn    string              // "" = none
		wantErr string
	}{
		{
			name: "gpupack annotations with cores",
			pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "20Gi").ann(v1alpha1.AnnotationGPUCores, "30").
				ctr(makeCtr("c").gpus("2").limit("cpu", "4").obj()).obj(),
			want: rl(gpu, "2", hmem, "20480", hcor, "30", "cpu", "4"),
			reqs: rl(gpu, "2", hmem, "20480", hcor, "30"),
		},
		{
			name: "HAMi annotations",
			pod:  makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(hmem, "10240").ctr(makeCtr("c").gpus("1").obj()).obj(),
			want: rl(gpu, "1", hmem, "10240"),
		},
		{
			name: "HAMi resources in limits only get requests too",
			pod:  makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ctr(makeCtr("c").gpus("1").limit(hmem, "3000").limit(hcor, "50").obj()).obj(),
			want: rl(gpu, "1", hmem, "3000", hcor, "50"),
		},
		{
			name: "HAMi resources override the annotations, as in HAMi",
			pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "20Gi").
				ctr(makeCtr("c").gpus("1").limit(hmem, "3000").obj()).obj(),
			want: rl(gpu, "1", hmem, "3000"),
		},
		{
			name: "percentage annotation with a known model becomes MiB",
			pod:  makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(hpct, "50").ctr(makeCtr("c").gpus("1").obj()).obj(),
			want: rl(gpu, "1", hmem, itoa((h100Alloc*50+99)/100)),
		},
		{
			name: "percentage resource with the default model becomes MiB",
			cfg:  Config{DefaultGPUModel: "NVIDIA L4"},
			pod:  makePod("p").ctr(makeCtr("c").gpus("1").limit(hpct, "10").obj()).obj(),
			want: rl(gpu, "1", hmem, itoa((flavors.Allocatable(23034)*10+99)/100)),
		},
		{
			name: "percentage without a model stays a percentage for HAMi",
			pod:  makePod("p").ann(hpct, "25").ann(v1alpha1.AnnotationGPUCores, "40").ctr(makeCtr("c").gpus("1").obj()).obj(),
			want: rl(gpu, "1", hpct, "25", hcor, "40"),
			warn: "no GPU model is known",
		},
		{
			name: "no model warns once",
			pod:  makePod("p").ann(v1alpha1.AnnotationGPUMemory, "8000").ctr(makeCtr("c").gpus("1").obj()).obj(),
			want: rl(gpu, "1", hmem, "8000"),
			warn: "no GPU model is known",
		},
		{
			name: "gpupack form (written in gpupack mode) is rewritten as HAMi's",
			pod: makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "20Gi").
				ctr(makeCtr("c").limit(vgpu, "2").limit(gmem, "40960").limit(gcor, "60").obj()).obj(),
			want: rl(gpu, "2", hmem, "20480", hcor, "30"),
		},
		{
			name: "whole GPUs stay nvidia.com/gpu only",
			pod:  makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ctr(makeCtr("c").gpus("8").obj()).obj(),
			want: rl(gpu, "8"),
			reqs: corev1.ResourceList{}, // untouched: the apiserver defaults them
		},
		// The denials are gpupack mode's.
		{
			name:    "memory above the 90% line",
			pod:     makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "79Gi").ctr(makeCtr("c").gpus("1").obj()).obj(),
			wantErr: "more than the 71903 MiB a pod may take on one NVIDIA-H100-80GB-HBM3",
		},
		{
			name:    "HAMi resource above the 90% line",
			pod:     makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ctr(makeCtr("c").gpus("1").limit(hmem, "80000").obj()).obj(),
			wantErr: "ask for at most 71903Mi",
		},
		{
			name:    "cores without memory",
			pod:     makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ctr(makeCtr("c").gpus("1").limit(hcor, "30").obj()).obj(),
			wantErr: "exclusive",
		},
		{
			name:    "memory without a GPU",
			pod:     makePod("p").ann(v1alpha1.AnnotationGPUMemory, "1Gi").ctr(makeCtr("c").limit("cpu", "1").obj()).obj(),
			wantErr: "no container asks for nvidia.com/gpu",
		},
		{
			name:    "privileged",
			pod:     makePod("p").ann(v1alpha1.AnnotationGPUMemory, "1Gi").ctr(makeCtr("c").gpus("1").privileged().obj()).obj(),
			wantErr: "is privileged",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := hamiMutator(t, tc.cfg)
			p := tc.pod.DeepCopy()
			warn, err := m.Pod(p, PodContext{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Pod: err = %v, want %q", err, tc.wantErr)
				}
				if err := m.ValidatePod(tc.pod); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("ValidatePod: err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := p.Spec.Containers[0]
			if d := cmp.Diff(tc.want, c.Resources.Limits); d != "" {
				t.Errorf("limits (-want +got):\n%s", d)
			}
			reqs := tc.reqs
			if reqs == nil {
				reqs = tc.want
			}
			if d := cmp.Diff(reqs, c.Resources.Requests, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("requests (-want +got):\n%s", d)
			}
			switch {
			case tc.warn == "" && len(warn) != 0:
				t.Errorf("unexpected warnings %q", warn)
			case tc.warn != "" && (len(warn) != 1 || !strings.Contains(warn[0], tc.warn)):
				t.Errorf("warn = %q, want one with %q", warn, tc.warn)
			}
			if len(c.Env) != 0 || len(c.VolumeMounts) != 0 || len(p.Spec.Volumes) != 0 {
				t.Errorf("hook injected: env %v, mounts %v, volumes %v", c.Env, c.VolumeMounts, p.Spec.Volumes)
			}
			noGpupackHook(t, &p.Spec)
			fixedPointPod(t, m, p)
		})
	}
}

// The same pods in gpupack mode are converted to gpupack.io/*: HAMi form is
// gpupack mode's input, as before, and each mode is its own fixed point.
func TestHAMiFormInGpupackMode(t *testing.T) {
	p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ctr(makeCtr("c").gpus("2").limit(hmem, "20480").limit(hcor, "30").obj()).obj()
	p.Spec.Containers[0].Resources.Requests = p.Spec.Containers[0].Resources.Limits.DeepCopy()
	gp, hm := mustNew(t, Config{}), hamiMutator(t, Config{})
	if err := hm.ValidatePod(p); err != nil {
		t.Errorf("hami mode refuses HAMi form: %v", err)
	}
	if err := gp.ValidatePod(p); err == nil || !strings.Contains(err.Error(), "not converted") {
		t.Errorf("gpupack mode accepts unconverted HAMi form: %v", err)
	}
	if _, err := gp.Pod(p, PodContext{}); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(rl(vgpu, "2", gmem, "40960", gcor, "60"), p.Spec.Containers[0].Resources.Limits); d != "" {
		t.Errorf("gpupack mode limits (-want +got):\n%s", d)
	}
	if err := hm.ValidatePod(p); err == nil || !strings.Contains(err.Error(), "not converted") {
		t.Errorf("hami mode accepts gpupack form: %v", err)
	}
}

func TestHAMiModeOwnedEnv(t *testing.T) {
	tenant := func() *corev1.Pod {
		return makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "20Gi").ann(v1alpha1.AnnotationGPUCores, "30").
			ctr(makeCtr("gpu").gpus("1").
				env(v1alpha1.EnvLDPreload, "/evil.so").
				env(v1alpha1.EnvMemoryLimit, "20480m"). // what gpupack mode would set: still HAMi's to set here
				env("CUDA_DEVICE_MEMORY_LIMIT_0", "80g").
				env(v1alpha1.EnvSMLimit, "100").
				env("CUDA_DEVICE_SM_LIMIT_0", "100").
				env(v1alpha1.EnvSharedCache, "/tmp/mine.cache").
				env(v1alpha1.EnvDisableControl, "true").
				env(v1alpha1.EnvVisibleDevices, "all").
				env(EnvPodUID, "x").
				env(v1alpha1.EnvContextReserve, "0").
				env(v1alpha1.EnvSMPeriod, "100000").
				env("KEEP", "1").obj()).
			ctr(makeCtr("whole").gpus("1").env(v1alpha1.EnvVisibleDevices, "all").obj()).
			ctr(makeCtr("cpu").env(v1alpha1.EnvLDPreload, "/mine.so").obj()).obj()
	}
	const owned = 11
	t.Run("Strip", func(t *testing.T) {
		m := hamiMutator(t, Config{})
		p := tenant()
		warn, err := m.Pod(p, PodContext{})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff([]corev1.EnvVar{{Name: "KEEP", Value: "1"}}, p.Spec.Containers[0].Env); d != "" {
			t.Errorf("shared-GPU container env (-want +got):\n%s", d)
		}
		if len(p.Spec.Containers[1].Env) != 0 {
			t.Errorf("whole-GPU container env = %v", p.Spec.Containers[1].Env)
		}
		if d := cmp.Diff([]corev1.EnvVar{{Name: v1alpha1.EnvLDPreload, Value: "/mine.so"}}, p.Spec.Containers[2].Env); d != "" {
			t.Errorf("non-GPU container touched (-want +got):\n%s", d)
		}
		if len(warn) != owned+1 {
			t.Errorf("%d warnings, want one per removed key (%d): %q", len(warn), owned+1, warn)
		}
		all := strings.Join(warn, "\n")
		for _, k := range []string{v1alpha1.EnvLDPreload, v1alpha1.EnvMemoryLimit, v1alpha1.EnvDisableControl, v1alpha1.EnvVisibleDevices} {
			if !strings.Contains(all, `container "gpu": removed `+k+";") {
				t.Errorf("no warning for %s: %q", k, warn)
			}
		}
		noGpupackHook(t, &p.Spec)
		fixedPointPod(t, m, p)
		// A value another webhook (re-)adds after gpupack is caught.
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: v1alpha1.EnvDisableControl, Value: "true"})
		if err := m.ValidatePod(p); err == nil || !strings.Contains(err.Error(), "environment differs") {
			t.Errorf("env added after mutation: %v", err)
		}
	})
	t.Run("Deny", func(t *testing.T) {
		m := hamiMutator(t, Config{EnvPolicy: EnvPolicyDeny})
		if _, err := m.Pod(tenant(), PodContext{}); err == nil || !strings.Contains(err.Error(), "sets LD_PRELOAD, which gpupack owns") {
			t.Errorf("deny policy: err = %v", err)
		}
		whole := makePod("p").ctr(makeCtr("whole").gpus("1").env(v1alpha1.EnvMemoryLimit, "1g").obj()).obj()
		if _, err := m.Pod(whole, PodContext{}); err == nil || !strings.Contains(err.Error(), "sets CUDA_DEVICE_MEMORY_LIMIT") {
			t.Errorf("deny policy, whole GPU: err = %v", err)
		}
	})
}

// A tenant mount over /etc/ld.so.preload or HAMi-core's folder would shadow
// what HAMi's device plugin mounts there (kubelet applies pod-spec mounts
// last), so it goes, with a warning; gpupack adds no mount of its own.
func TestHAMiModeTenantHookMounts(t *testing.T) {
	m := hamiMutator(t, Config{Hook: HookConfig{HostPath: "/usr/local/vgpu", Library: "libvgpu.so"}})
	c := makeCtr("gpu").gpus("1").obj()
	c.VolumeMounts = []corev1.VolumeMount{
		{Name: "mine", MountPath: "/etc/ld.so.preload", SubPath: "empty"},
		{Name: "mine", MountPath: "/usr/local/vgpu/libvgpu.so", SubPath: "noop.so"},
		{Name: "data", MountPath: "/data"},
	}
	p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(c).obj()
	warn, err := m.Pod(p, PodContext{})
	if err != nil {
		t.Fatal(err)
	}
	if len(warn) != 2 || !strings.Contains(warn[0], "removed the mount at /etc/ld.so.preload") || !strings.Contains(warn[1], "/usr/local/vgpu/libvgpu.so") {
		t.Errorf("warn = %q", warn)
	}
	if d := cmp.Diff([]corev1.VolumeMount{{Name: "data", MountPath: "/data"}}, p.Spec.Containers[0].VolumeMounts); d != "" {
		t.Errorf("mounts (-want +got):\n%s", d)
	}
	noGpupackHook(t, &p.Spec)
	fixedPointPod(t, m, p)
}

// Checkpoint wrapping, the resume step and the placement gate are those of
// gpupack mode.
func TestHAMiModeCheckpointResumeGate(t *testing.T) {
	m := hamiMutator(t, Config{})
	p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "10Gi").
		ann(v1alpha1.AnnotationCheckpoint, "true").ann(v1alpha1.AnnotationPlan, "plan-1").
		ctr(makeCtr("trainer").gpus("1").obj()).ctr(makeCtr("logger").obj()).obj()
	if _, err := m.Pod(p, PodContext{ResumeStep: "1200"}); err != nil {
		t.Fatal(err)
	}
	tr := p.Spec.Containers[0]
	if len(tr.Command) == 0 || tr.Command[0] != CkptBinary || !strings.HasSuffix(strings.Join(tr.Command, " "), "-- python train.py") {
		t.Errorf("command = %q", tr.Command)
	}
	if d := cmp.Diff([]string{"python", "train.py"}, p.Spec.Containers[1].Command); d != "" {
		t.Errorf("non-GPU container wrapped (-want +got):\n%s", d)
	}
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != InitCkptInstall {
		t.Errorf("init containers = %+v", p.Spec.InitContainers)
	}
	env := map[string]string{}
	for _, e := range tr.Env {
		env[e.Name] = e.Value
	}
	if env[v1alpha1.EnvResumeStep] != "1200" {
		t.Errorf("%s = %q", v1alpha1.EnvResumeStep, env[v1alpha1.EnvResumeStep])
	}
	if d := cmp.Diff([]corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}, p.Spec.SchedulingGates); d != "" {
		t.Errorf("gates (-want +got):\n%s", d)
	}
	if d := cmp.Diff(rl(gpu, "1", hmem, "10240"), tr.Resources.Limits); d != "" {
		t.Errorf("limits (-want +got):\n%s", d)
	}
	noGpupackHook(t, &p.Spec)
	again := p.DeepCopy()
	if w, err := m.Pod(again, PodContext{ResumeStep: "1200"}); err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(p, again) {
		t.Errorf("second Pod pass: warn %q err %v diff %s", w, err, cmp.Diff(p, again))
	}
	if err := m.ValidatePod(p); err != nil {
		t.Errorf("ValidatePod: %v", err)
	}
}

func TestHAMiModeJobTemplates(t *testing.T) {
	m := hamiMutator(t, Config{})
	t.Run("PyTorchJob", func(t *testing.T) {
		j := makePyTorchJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30"}, map[string]corev1.PodTemplateSpec{
			"Master": template(nil, makeCtr("pytorch").limit("cpu", "1").obj()),
			"Worker": template(map[string]string{hmem: "10240"}, makeCtr("pytorch").gpus("2").obj(), makeCtr("sidecar").limit("cpu", "1").obj()),
		})
		orig := j.DeepCopy()
		if err := m.ValidatePyTorchJob(orig); err == nil || !strings.Contains(err.Error(), "not converted") {
			t.Errorf("unmutated PyTorchJob validated: %v", err)
		}
		warn, err := m.PyTorchJob(j)
		if err != nil {
			t.Fatal(err)
		}
		if len(warn) != 1 || !strings.Contains(warn[0], "replica Worker: no GPU model is known") {
			t.Errorf("warn = %q", warn)
		}
		master := j.Spec.PyTorchReplicaSpecs["Master"].Template
		if d := cmp.Diff(orig.Spec.PyTorchReplicaSpecs["Master"].Template, master); d != "" {
			t.Errorf("CPU-only master changed (-want +got):\n%s", d)
		}
		worker := j.Spec.PyTorchReplicaSpecs["Worker"].Template
		want := rl(gpu, "2", hmem, "10240", hcor, "30")
		if d := cmp.Diff(want, worker.Spec.Containers[0].Resources.Limits); d != "" {
			t.Errorf("worker limits: per GPU, not × 2 (-want +got):\n%s", d)
		}
		if d := cmp.Diff(want, worker.Spec.Containers[0].Resources.Requests); d != "" {
			t.Errorf("worker requests (-want +got):\n%s", d)
		}
		if d := cmp.Diff(rl("cpu", "1"), worker.Spec.Containers[1].Resources.Limits); d != "" {
			t.Errorf("sidecar (-want +got):\n%s", d)
		}
		if d := cmp.Diff(map[string]string{hmem: "10240", v1alpha1.AnnotationGPUCores: "30", v1alpha1.AnnotationInjected: m.Fingerprint()}, worker.Annotations); d != "" {
			t.Errorf("worker annotations carry the job's cores (-want +got):\n%s", d)
		}
		noGpupackHook(t, &worker.Spec)
		again := j.DeepCopy()
		if w, err := m.PyTorchJob(again); err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(j, again) {
			t.Errorf("second pass: warn %q err %v diff %s", w, err, cmp.Diff(j, again))
		}
		if err := m.ValidatePyTorchJob(j); err != nil {
			t.Errorf("ValidatePyTorchJob after mutation: %v", err)
		}
		// A pod made from the mutated template is already in its final form
		// (HAMi's device plugin, not gpupack, adds the hook) and warns nothing.
		p := &corev1.Pod{ObjectMeta: worker.ObjectMeta, Spec: worker.Spec}
		p.Name, p.Namespace = "pt-worker-0", "ns"
		before := p.DeepCopy()
		if w, err := m.Pod(p, PodContext{}); err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(before, p) {
			t.Errorf("pod from the template: warn %q err %v diff %s", w, err, cmp.Diff(before, p))
		}
	})
	t.Run("Job", func(t *testing.T) {
		j := makeJob(map[string]string{hpct: "25"}, template(map[string]string{}, makeCtr("c").gpus("1").env(v1alpha1.EnvLDPreload, "/evil.so").obj()))
		j.Spec.Template.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: h100}
		w, err := m.Job(j)
		if err != nil {
			t.Fatal(err)
		}
		c := j.Spec.Template.Spec.Containers[0]
		want := rl(gpu, "1", hmem, itoa((flavors.Allocatable(81559)*25+99)/100))
		if d := cmp.Diff(want, c.Resources.Limits); d != "" {
			t.Errorf("limits (-want +got):\n%s", d)
		}
		if d := cmp.Diff(want, c.Resources.Requests); d != "" {
			t.Errorf("requests (-want +got):\n%s", d)
		}
		// The tenant's env goes at the job's creation, with the warning.
		if len(c.Env) != 0 || len(w) != 1 || !strings.Contains(w[0], "pod template: container \"c\": removed LD_PRELOAD") {
			t.Errorf("job template env = %v, warnings %q", c.Env, w)
		}
		again := j.DeepCopy()
		if w, err := m.Job(again); err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(j, again) {
			t.Errorf("second pass: warn %q err %v diff %s", w, err, cmp.Diff(j, again))
		}
		if err := m.ValidateJob(j); err != nil {
			t.Errorf("ValidateJob after mutation: %v", err)
		}
		// Undone by hand (back to the percentage): refused.
		bad := j.DeepCopy()
		bc := &bad.Spec.Template.Spec.Containers[0]
		delete(bc.Resources.Limits, hmem)
		delete(bc.Resources.Requests, hmem)
		if err := m.ValidateJob(bad); err == nil || !strings.Contains(err.Error(), "not converted") {
			t.Errorf("ValidateJob on a template without gpumem: %v", err)
		}
	})
}

func TestParseConfigResources(t *testing.T) {
	if c := Default(); c.Resources != ResourcesGpupack {
		t.Errorf("default resources = %q, want %q", c.Resources, ResourcesGpupack)
	}
	c, err := ParseConfig([]byte("resources: hami\n"))
	if err != nil || c.Resources != ResourcesHAMi {
		t.Fatalf("resources: hami → %q, %v", c.Resources, err)
	}
	for _, bad := range []string{"resources: HAMi\n", "resources: nvidia\n", "resources: [hami]\n"} {
		_, err := ParseConfig([]byte(bad))
		if err == nil {
			t.Errorf("ParseConfig(%q) accepted", bad)
			continue
		}
		if !strings.Contains(bad, "[") && !strings.Contains(err.Error(), "want gpupack or hami") {
			t.Errorf("ParseConfig(%q): %v; want the allowed values named", bad, err)
		}
	}
	if _, err := New(Config{Resources: "vgpu"}); err == nil || !strings.Contains(err.Error(), `resources "vgpu": want gpupack or hami`) {
		t.Errorf("New with a bad mode: %v", err)
	}
}

// FuzzPodMutationHAMi is FuzzPodMutation's invariants in hami mode: no
// panic, a fixed point that validates, no tenant value of an owned key on a
// GPU container, and nothing of gpupack's hook or resources.
func FuzzPodMutationHAMi(f *testing.F) {
	f.Add("20Gi", "30", "", "1", "/evil.so", "80g", "true", "NVIDIA-H100-80GB-HBM3", "")
	f.Add("", "", "50", "2", "", "", "", "", "")
	f.Add("", "", "", "2", "", "1m", "", "NVIDIA L4", "3000")
	f.Add("1Gi", "", "", "3", "", "", "", "", "1024")
	f.Fuzz(func(t *testing.T, mem, cores, pct, gpus, preload, limit, ckpt, model, hamiMem string) {
		p := makePod("p")
		set := func(k, v string) {
			if v != "" {
				p.ann(k, v)
			}
		}
		set(v1alpha1.AnnotationGPUMemory, mem)
		set(v1alpha1.AnnotationGPUCores, cores)
		set(hpct, pct)
		set(v1alpha1.AnnotationCheckpoint, ckpt)
		if model != "" {
			p.nodeSelector(flavors.LabelGPUProduct, model)
		}
		c := makeCtr("c")
		digits := func(s string) bool {
			if len(s) == 0 || len(s) > 6 {
				return false
			}
			for _, ch := range s {
				if ch < '0' || ch > '9' {
					return false
				}
			}
			return true
		}
		if gpus != "" {
			if len(gpus) > 3 || !digits(gpus) {
				return
			}
			c.gpus(gpus)
		}
		if hamiMem != "" {
			if !digits(hamiMem) {
				return
			}
			c.limit(hmem, hamiMem)
		}
		if preload != "" {
			c.env(v1alpha1.EnvLDPreload, preload)
		}
		if limit != "" {
			c.env(v1alpha1.EnvMemoryLimit, limit)
		}
		p.ctr(c.obj())
		m := hamiMutator(t, Config{})
		pod := p.obj()
		if _, err := m.Pod(pod, PodContext{}); err != nil {
			return
		}
		assertFixedPoint(t, m, pod)
		if q, ok := pod.Spec.Containers[0].Resources.Limits[gpu]; ok && !q.IsZero() {
			noGpupackHook(t, &pod.Spec)
		}
	})
}
