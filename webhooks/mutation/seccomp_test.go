package mutation

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

func seccomp(t corev1.SeccompProfileType) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: t}}
	if t == corev1.SeccompProfileTypeLocalhost {
		sc.SeccompProfile.LocalhostProfile = ptrTo("profiles/gpu.json")
	}
	return sc
}

func ptrTo[T any](v T) *T { return &v }

func podSeccomp(t corev1.SeccompProfileType) *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{SeccompProfile: seccomp(t).SeccompProfile}
}

// A GPU pod that names no seccomp profile gets RuntimeDefault on the pod
// (which its containers and later ephemeral containers inherit); one that
// names a confining profile keeps it; CPU pods are untouched. So is a job
// template, whose pods then need nothing from the pod webhook.
func TestSeccompDefaulted(t *testing.T) {
	rd := podSeccomp(corev1.SeccompProfileTypeRuntimeDefault)
	for _, mode := range []string{ResourcesGpupack, ResourcesHAMi} {
		m := mustNew(t, Config{Resources: mode})
		for _, tc := range []struct {
			name string
			in   *corev1.PodSecurityContext
			want *corev1.PodSecurityContext
		}{
			{"none", nil, rd},
			{"other settings kept", &corev1.PodSecurityContext{RunAsUser: ptrTo[int64](1000)}, &corev1.PodSecurityContext{RunAsUser: ptrTo[int64](1000), SeccompProfile: rd.SeccompProfile}},
			{"Localhost kept", podSeccomp(corev1.SeccompProfileTypeLocalhost), podSeccomp(corev1.SeccompProfileTypeLocalhost)},
			{"RuntimeDefault kept", rd, rd},
		} {
			for _, whole := range []bool{false, true} {
				c := makeCtr("gpu").gpus("1").obj()
				p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1Gi").ctr(c).obj()
				if whole {
					p.Annotations = nil
				}
				p.Spec.SecurityContext = tc.in.DeepCopy()
				if _, err := m.Pod(p, PodContext{}); err != nil {
					t.Fatalf("%s %s: %v", mode, tc.name, err)
				}
				if d := cmp.Diff(tc.want, p.Spec.SecurityContext); d != "" {
					t.Errorf("%s %s (whole %v): pod securityContext (-want +got):\n%s", mode, tc.name, whole, d)
				}
				again := p.DeepCopy()
				if _, err := m.Pod(again, PodContext{}); err != nil || !cmp.Equal(p, again) {
					t.Errorf("%s %s: a second pass changed the pod (err %v)", mode, tc.name, err)
				}
			}
		}
		j := makeJob(nil, template(map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi"}, makeCtr("gpu").gpus("1").obj()))
		j.Spec.Template.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: h100}
		if _, err := m.Job(j); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(rd, j.Spec.Template.Spec.SecurityContext); d != "" {
			t.Errorf("%s: job template securityContext (-want +got):\n%s", mode, d)
		}
		if j.Spec.Template.Annotations[v1alpha1.AnnotationInjected] == "" {
			t.Errorf("%s: job template not marked: its pods would need the pod webhook", mode)
		}
	}
	cpu := makePod("p").ctr(makeCtr("cpu").obj()).obj()
	if _, err := mustNew(t, Config{}).Pod(cpu, PodContext{}); err != nil || cpu.Spec.SecurityContext != nil {
		t.Errorf("CPU pod: securityContext %v, err %v", cpu.Spec.SecurityContext, err)
	}
}

// seccomp Unconfined anywhere in a GPU pod — the pod, a GPU or CPU
// container, an init container, a sidecar — is refused, in pods, job
// templates and job template updates; Localhost is fine.
func TestSeccompUnconfinedDenied(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	unconfined := seccomp(corev1.SeccompProfileTypeUnconfined)
	for _, mode := range []string{ResourcesGpupack, ResourcesHAMi} {
		m := mustNew(t, Config{Resources: mode})
		build := func(where string, sc *corev1.SecurityContext) *corev1.Pod {
			gpuC, cpuC, initC, side := makeCtr("gpu").gpus("1").obj(), makeCtr("cpu").obj(), makeCtr("init").obj(), makeCtr("sidecar").obj()
			side.RestartPolicy = &always
			p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1Gi").obj()
			switch where {
			case "pod":
				p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: sc.SeccompProfile}
			case "gpu":
				gpuC = withSC(gpuC, sc)
			case "cpu":
				cpuC = withSC(cpuC, sc)
			case "init":
				initC = withSC(initC, sc)
			case "sidecar":
				side = withSC(side, sc)
			}
			p.Spec.Containers = []corev1.Container{gpuC, cpuC}
			p.Spec.InitContainers = []corev1.Container{initC, side}
			return p
		}
		for _, where := range []string{"pod", "gpu", "cpu", "init", "sidecar"} {
			want := `"` + where + `" sets securityContext.seccompProfile Unconfined`
			if where == "pod" {
				want = "the pod asks for GPUs and sets securityContext.seccompProfile Unconfined"
			}
			p := build(where, unconfined)
			if _, err := m.Pod(p.DeepCopy(), PodContext{}); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "RuntimeDefault") {
				t.Errorf("%s: Unconfined in %s: err = %v", mode, where, err)
			}
			j := makeJob(nil, corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec})
			if _, err := m.Job(j); err == nil || !strings.Contains(err.Error(), "pod template: ") || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: Unconfined in a Job template's %s: err = %v", mode, where, err)
			}
			ok := makeJob(nil, corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: *build("", nil).Spec.DeepCopy()})
			bad := ok.DeepCopy()
			bad.Spec.Template.Spec = p.Spec
			if err := m.ValidateJobUpdate(ok, bad); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: an update bringing Unconfined into a Job template's %s: err = %v", mode, where, err)
			}
			if _, err := m.Pod(build(where, seccomp(corev1.SeccompProfileTypeLocalhost)), PodContext{}); err != nil {
				t.Errorf("%s: Localhost in %s: %v", mode, where, err)
			}
		}
		// A CPU pod may run unconfined: gpupack has nothing to guard there.
		cpu := makePod("p").ctr(withSC(makeCtr("cpu").obj(), unconfined)).obj()
		if _, err := m.Pod(cpu, PodContext{}); err != nil {
			t.Errorf("%s: unconfined CPU pod: %v", mode, err)
		}
		win := build("", nil)
		win.Spec.OS = &corev1.PodOS{Name: corev1.Windows}
		if _, err := m.Pod(win, PodContext{}); err == nil || !strings.Contains(err.Error(), "Linux pods only") {
			t.Errorf("%s: Windows GPU pod: err = %v", mode, err)
		}
	}
}
