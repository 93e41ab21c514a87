package mutation

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// TestTerminationMessagePathIsAMount (outside review 2026-12-02, finding
// 4): the kubelet bind-mounts a host file read-write at a container's
// terminationMessagePath, after every other mount of the container
// (device-plugin mounts included). At /etc/ld.so.preload it would replace
// the read-only preload with an empty writable file — no hook loaded, and
// nothing in env for the webhook to strip. So it is checked like a volume
// mount: in every container of a GPU pod (a CPU sidecar's mount namespace
// is its own, but the runtime's device paths are not), in ephemeral
// containers, and in HAMi mode against HAMi's hook paths.
func TestTerminationMessagePathIsAMount(t *testing.T) {
	gpuPod := func(c corev1.Container, sidecar *corev1.Container) *corev1.Pod {
		w := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100).ann(v1alpha1.AnnotationGPUMemory, "1000").ctr(c)
		if sidecar != nil {
			w.ctr(*sidecar)
		}
		return w.obj()
	}
	withPath := func(c corev1.Container, p string) corev1.Container { c.TerminationMessagePath = p; return c }
	gpu := makeCtr("gpu").gpus("1").obj()
	cpu := makeCtr("log").obj()
	cases := []struct {
		name string
		cfg  Config
		pod  *corev1.Pod
		deny string
	}{
		{"the default path", Config{}, gpuPod(withPath(gpu, "/dev/termination-log"), nil), ""},
		{"unset", Config{}, gpuPod(gpu, nil), ""},
		{"over the preload file", Config{}, gpuPod(withPath(gpu, "/etc/ld.so.preload"), nil), "terminationMessagePath /etc/ld.so.preload"},
		{"over the limits file", Config{}, gpuPod(withPath(gpu, "/etc/gpupack/limits"), nil), "/etc/gpupack"},
		{"over the hook library", Config{}, gpuPod(withPath(gpu, "/usr/local/gpupack/libgpupack-hook.so"), nil), "/usr/local/gpupack"},
		{"into the accounting folder", Config{}, gpuPod(withPath(gpu, "/var/run/gpupack/vgpu.cache"), nil), "/var/run/gpupack"},
		{"uncleaned path", Config{}, gpuPod(withPath(gpu, "/etc/x/../ld.so.preload"), nil), "ld.so.preload"},
		{"a CPU sidecar over the runtime's device requests", Config{}, gpuPod(gpu, ptr(withPath(cpu, "/var/run/nvidia-container-devices/all"))), "nvidia-container-devices"},
		{"a CPU sidecar over the preload file", Config{}, gpuPod(gpu, ptr(withPath(cpu, "/etc/ld.so.preload"))), "terminationMessagePath"},
		{"HAMi mode, over the preload file", Config{Resources: ResourcesHAMi}, gpuPod(withPath(gpu, "/etc/ld.so.preload"), nil), "terminationMessagePath"},
		{"HAMi mode, elsewhere", Config{Resources: ResourcesHAMi}, gpuPod(withPath(gpu, "/tmp/term"), nil), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.cfg)
			_, err := m.Pod(tc.pod, PodContext{})
			if tc.deny == "" {
				if err != nil {
					t.Fatalf("denied: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.deny) {
				t.Fatalf("err = %v, want a denial naming %q", err, tc.deny)
			}
		})
	}
	// kubectl debug: an ephemeral container is denied the same.
	m := mustNew(t, Config{})
	p := gpuPod(gpu, nil)
	p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "dbg", Image: "busybox", TerminationMessagePath: "/etc/ld.so.preload",
		SecurityContext: &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}}}}
	if err := m.ValidateEphemeralContainers(p); err == nil || !strings.Contains(err.Error(), "terminationMessagePath") {
		t.Fatalf("ephemeral container over the preload file: %v", err)
	}
}
