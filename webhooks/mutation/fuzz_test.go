package mutation

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// FuzzPodMutation: for any request annotations and tenant env, mutation
// never panics, a mutated pod is a fixed point (a second pass changes
// nothing and warns nothing), it passes validation, and no GPU container
// keeps a tenant value of an owned key.
func FuzzPodMutation(f *testing.F) {
	f.Add("20Gi", "30", "", "1", "/evil.so", "80g", "true", "NVIDIA-H100-80GB-HBM3")
	f.Add("", "", "50", "2", "", "", "", "NVIDIA L4")
	f.Add("3000", "", "", "0", "", "1m", "", "")
	f.Fuzz(func(t *testing.T, mem, cores, pct, gpus, preload, limit, ckpt, model string) {
		p := makePod("p")
		set := func(k, v string) {
			if v != "" {
				p.ann(k, v)
			}
		}
		set(v1alpha1.AnnotationGPUMemory, mem)
		set(v1alpha1.AnnotationGPUCores, cores)
		set(v1alpha1.AnnotationHAMiGPUMemPercentage, pct)
		set(v1alpha1.AnnotationCheckpoint, ckpt)
		if model != "" {
			p.nodeSelector(flavors.LabelGPUProduct, model)
		}
		c := makeCtr("c")
		if gpus != "" {
			if len(gpus) > 3 {
				return
			}
			for _, ch := range gpus {
				if ch < '0' || ch > '9' {
					return
				}
			}
			c.gpus(gpus)
		}
		if preload != "" {
			c.env(v1alpha1.EnvLDPreload, preload)
		}
		if limit != "" {
			c.env(v1alpha1.EnvMemoryLimit, limit)
		}
		p.ctr(c.obj())
		m := mustNew(t, Config{})
		pod := p.obj()
		if _, err := m.Pod(pod, PodContext{}); err != nil {
			return
		}
		assertFixedPoint(t, m, pod)
		hasGPU := false
		for _, r := range []corev1.ResourceName{v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU} {
			if q, ok := pod.Spec.Containers[0].Resources.Limits[r]; ok && !q.IsZero() {
				hasGPU = true
			}
		}
		for _, e := range pod.Spec.Containers[0].Env {
			if hasGPU && owned(e.Name) {
				t.Fatalf("owned %s=%s survived on a GPU container (the webhook sets none)", e.Name, e.Value)
			}
		}
	})
}

// assertFixedPoint checks that mutating a mutated pod again changes nothing,
// warns nothing, and that the validating webhook accepts it.
func assertFixedPoint(t *testing.T, m *Mutator, pod *corev1.Pod) {
	t.Helper()
	again := pod.DeepCopy()
	w, err := m.Pod(again, PodContext{})
	if err != nil || len(w) != 0 || !equality.Semantic.DeepEqual(pod, again) {
		t.Fatalf("second pass: warn %q err %v diff %s", w, err, cmp.Diff(pod, again))
	}
	if err := m.ValidatePod(pod); err != nil {
		t.Fatalf("mutated pod fails validation: %v", err)
	}
}

// FuzzPodSecurity: for any mount path, volume name, capability and the
// container that carries them (GPU, CPU sidecar, init, restartable
// sidecar), an admitted GPU pod keeps no gpupack-named volume or mount, no
// mount at or under a gpupack path (but gpupack's own), no capability
// beyond Pod Security baseline, and is a fixed point.
func FuzzPodSecurity(f *testing.F) {
	f.Add("/etc/gpupack/limits", "mine", "NET_BIND_SERVICE", uint8(0))
	f.Add("/etc//gpupack/../gpupack", "data", "", uint8(1))
	f.Add("/hook", VolumeHook, "cap_sys_admin", uint8(2))
	f.Add("/run/gpupack/x", VolumeSharedCache, "CHOWN", uint8(3))
	f.Add("/usr/local/gpupack-old", "x", "SYS_PTRACE", uint8(1))
	f.Add("relative/etc/gpupack", "x", "", uint8(0))
	f.Fuzz(func(t *testing.T, mountPath, volume, capability string, where uint8) {
		if volume == "" || mountPath == "" {
			return
		}
		always := corev1.ContainerRestartPolicyAlways
		gpuC, cpuC, initC, side := makeCtr("gpu").gpus("1").obj(), makeCtr("cpu").obj(), makeCtr("init").obj(), makeCtr("side").obj()
		side.RestartPolicy = &always
		target := []*corev1.Container{&gpuC, &cpuC, &initC, &side}[where%4]
		target.VolumeMounts = []corev1.VolumeMount{{Name: volume, MountPath: mountPath}}
		if capability != "" {
			target.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{corev1.Capability(capability)}}}
		}
		p := makePod("p").ann(v1alpha1.AnnotationGPUMemory, "1000").nodeSelector(flavors.LabelGPUProduct, "NVIDIA-H100-80GB-HBM3").ctr(gpuC).ctr(cpuC).obj()
		p.Spec.InitContainers = []corev1.Container{initC, side}
		p.Spec.Volumes = []corev1.Volume{{Name: volume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		m := mustNew(t, Config{})
		if _, err := m.Pod(p, PodContext{}); err != nil {
			return
		}
		assertFixedPoint(t, m, p)
		for _, v := range p.Spec.Volumes {
			if ownedVolume(v.Name) {
				t.Fatalf("volume %q kept", v.Name)
			}
		}
		for _, kc := range allContainers(&p.Spec) {
			for _, vm := range kc.c.VolumeMounts {
				if ownedVolume(vm.Name) {
					t.Fatalf("%s %q mounts %q", kc.kind, kc.c.Name, vm.Name)
				}
				for _, g := range m.guardedPaths() {
					if under(vm.MountPath, g) && !ownMount(vm) {
						t.Fatalf("%s %q mounts %s under %s", kc.kind, kc.c.Name, vm.MountPath, g)
					}
				}
			}
			if sc := kc.c.SecurityContext; sc != nil && sc.Capabilities != nil {
				for _, c := range sc.Capabilities.Add {
					if !baselineCapabilities[capName(c)] {
						t.Fatalf("%s %q keeps capability %s", kc.kind, kc.c.Name, c)
					}
				}
			}
		}
	})
}
