package mutation

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// The rules of this file cover every container of a GPU pod — regular,
// init (including restartable sidecars) and ephemeral — because each one
// shares the pod's volumes and can be what a tenant uses to reach the GPU
// hook, the limits file or the node (docs/security.md).

// Paths inside a container that gpupack-node's device plugin mounts at
// Allocate (DESIGN.md "Trust boundary"): a tenant mount at or under one of
// them would shadow the hook, its preload file, the trusted limits file or
// the accounting directory, because kubelet applies pod-spec mounts after a
// device plugin's.
const (
	LimitsDir  = "/etc/gpupack"
	LimitsFile = LimitsDir + "/limits"
)

// guardedPaths are the container paths no tenant mount may be at or under
// (gpupack mode). /run/gpupack is listed beside /var/run/gpupack because
// most images make /var/run a symlink to /run.
func (m *Mutator) guardedPaths() []string {
	h := m.cfg.Hook
	out := []string{}
	for _, p := range []string{h.MountPath, etcPreload, LimitsDir, h.SharedCacheMountPath, "/var/run/gpupack", "/run/gpupack"} {
		p = path.Clean(p)
		dup := false
		for _, q := range out {
			dup = dup || q == p
		}
		if !dup && p != "/" {
			out = append(out, p)
		}
	}
	return out
}

// runtimeDevicePaths are where the NVIDIA container runtime reads a
// container's own choice of GPUs from mounts when the toolkit setting
// accept-nvidia-visible-devices-as-volume-mounts is on (gpupack-node
// reports that setting as unsafe; this keeps GPU pods off it in any mode).
var runtimeDevicePaths = []string{"/var/run/nvidia-container-devices", "/run/nvidia-container-devices"}

// ownedVolume reports the volume names gpupack reserves for the hook. Old
// releases added them (hostPath volumes); this one adds none in gpupack
// mode, so a pod or template carrying one lost it.
func ownedVolume(name string) bool { return name == VolumeHook || name == VolumeSharedCache }

// ownMount reports gpupack's own mounts (the checkpoint agent's): those may
// sit under a guarded path.
func ownMount(vm corev1.VolumeMount) bool {
	return (vm.Name == VolumePodInfo && path.Clean(vm.MountPath) == PodInfoDir) || (vm.Name == VolumeCkptBin && path.Clean(vm.MountPath) == CkptBinDir)
}

// under reports whether p is g or below it.
func under(p, g string) bool {
	p = path.Clean("/" + p)
	return p == g || strings.HasPrefix(p, g+"/")
}

// baselineCapabilities are the capabilities Pod Security "baseline" lets a
// container add (k8s.io/pod-security-admission, policy capabilities_baseline).
var baselineCapabilities = map[string]bool{
	"AUDIT_WRITE": true, "CHOWN": true, "DAC_OVERRIDE": true, "FOWNER": true, "FSETID": true, "KILL": true, "MKNOD": true,
	"NET_BIND_SERVICE": true, "SETFCAP": true, "SETGID": true, "SETPCAP": true, "SETUID": true, "SYS_CHROOT": true,
}

// capName normalises a capability as the container runtimes read it
// ("cap_sys_admin" and "SYS_ADMIN" are the same capability).
func capName(c corev1.Capability) string {
	return strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(string(c))), "CAP_")
}

// securityContextError returns why a container's security context can
// escape GPU isolation, or "".
func securityContextError(sc *corev1.SecurityContext) string {
	if sc == nil {
		return ""
	}
	if sc.Privileged != nil && *sc.Privileged {
		return "is privileged (a privileged container sees every GPU of the node and can unmount the GPU hook)"
	}
	if sc.Capabilities != nil {
		for _, c := range sc.Capabilities.Add {
			if !baselineCapabilities[capName(c)] {
				return fmt.Sprintf("adds capability %s, beyond the Pod Security baseline set (CAP_SYS_ADMIN can unmount the GPU hook, CAP_SYS_PTRACE can reach into other processes)", c)
			}
		}
	}
	if sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount {
		return "asks for procMount: Unmasked"
	}
	return ""
}

// kindedContainer is one container of a pod with what the messages call it.
type kindedContainer struct {
	kind string // "container", "init container", "ephemeral container"
	c    *corev1.Container
}

// allContainers lists every container of s, ephemeral ones as containers
// (only the fields they share matter here).
func allContainers(s *corev1.PodSpec) []kindedContainer {
	out := make([]kindedContainer, 0, len(s.Containers)+len(s.InitContainers)+len(s.EphemeralContainers))
	for i := range s.Containers {
		out = append(out, kindedContainer{"container", &s.Containers[i]})
	}
	for i := range s.InitContainers {
		kind := "init container"
		if p := s.InitContainers[i].RestartPolicy; p != nil && *p == corev1.ContainerRestartPolicyAlways {
			kind = "sidecar container"
		}
		out = append(out, kindedContainer{kind, &s.InitContainers[i]})
	}
	for i := range s.EphemeralContainers {
		c := corev1.Container(s.EphemeralContainers[i].EphemeralContainerCommon)
		out = append(out, kindedContainer{"ephemeral container", &c})
	}
	return out
}

// gpuResourceNames are every resource that asks for a GPU or a share of one.
var gpuResourceNames = []corev1.ResourceName{v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores,
	v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage, v1alpha1.AnnotationHAMiGPUCores}

func asksGPU(c *corev1.Container) bool {
	for _, r := range gpuResourceNames {
		if _, ok := c.Resources.Limits[r]; ok {
			return true
		}
		if _, ok := c.Resources.Requests[r]; ok {
			return true
		}
	}
	return false
}

// initContainersAskGPU refuses GPUs in init containers and restartable
// sidecars: gpupack plans, converts and serves GPUs to regular containers
// only (the choice docs/webhooks.md explains).
func initContainersAskGPU(s *corev1.PodSpec) error {
	for i := range s.InitContainers {
		c := &s.InitContainers[i]
		if !asksGPU(c) {
			continue
		}
		kind := "init container"
		if p := c.RestartPolicy; p != nil && *p == corev1.ContainerRestartPolicyAlways {
			kind = "sidecar container (restartPolicy: Always)"
		}
		return fmt.Errorf("%s %q asks for GPUs; gpupack gives GPUs (and their memory limits) to regular containers only, so move the GPU work into a container of spec.containers", kind, c.Name)
	}
	return nil
}

// podSecurity refuses a GPU pod whose settings reach past its own GPUs:
// host namespaces, seccomp Unconfined (seccomp.go), and in any container
// privilege, capabilities beyond Pod Security baseline, an unmasked /proc,
// or a mount over gpupack's paths (gpupack mode).
func (m *Mutator) podSecurity(s *corev1.PodSpec) error {
	if s.HostPID {
		return fmt.Errorf("the pod asks for GPUs and sets hostPID; with the node's processes in view it could reach other tenants' GPU processes, so gpupack denies it")
	}
	if s.HostIPC {
		return fmt.Errorf("the pod asks for GPUs and sets hostIPC; gpupack denies it (the node's shared memory is not the pod's to use)")
	}
	if s.NodeName != "" {
		// The kubelet does not tell a device plugin which pod it allocates
		// for, so a pod that skips the scheduler (and with it the placement
		// gate and the plan) could be handed a planned pod's GPUs and limits.
		return fmt.Errorf("the pod asks for GPUs and sets spec.nodeName %q; GPU pods are placed by the scheduler after gpupack's plan, so remove nodeName (use a nodeSelector or node affinity)", s.NodeName)
	}
	if err := seccompError(s); err != nil {
		return err
	}
	guarded := m.guardedPaths()
	for _, kc := range allContainers(s) {
		if why := securityContextError(kc.c.SecurityContext); why != "" {
			return fmt.Errorf("%s %q %s; gpupack denies that in a pod that asks for GPUs", kc.kind, kc.c.Name, why)
		}
		if err := terminationMessageError(kc.kind, kc.c, m.terminationGuarded(guarded)); err != nil {
			return err
		}
		for _, vm := range kc.c.VolumeMounts {
			for _, g := range runtimeDevicePaths {
				if under(vm.MountPath, g) {
					return fmt.Errorf("%s %q mounts volume %q at %s; a mount under %s asks the NVIDIA container runtime for GPUs by name (accept-nvidia-visible-devices-as-volume-mounts), past gpupack's assignment, so gpupack denies it", kc.kind, kc.c.Name, vm.Name, vm.MountPath, g)
				}
			}
		}
		if m.cfg.hami() {
			continue // HAMi's paths are guarded on its GPU containers (guardHAMiHook)
		}
		for _, vm := range kc.c.VolumeMounts {
			if ownedVolume(vm.Name) || ownMount(vm) {
				continue // removed (or gpupack's own)
			}
			for _, g := range guarded {
				if under(vm.MountPath, g) {
					return fmt.Errorf("%s %q mounts volume %q at %s, where gpupack-node mounts the GPU hook, its limits or its accounting (%s); mount it elsewhere", kc.kind, kc.c.Name, vm.Name, vm.MountPath, g)
				}
			}
		}
		for _, d := range kc.c.VolumeDevices {
			for _, g := range guarded {
				if under(d.DevicePath, g) {
					return fmt.Errorf("%s %q puts device %q at %s, where gpupack-node mounts the GPU hook, its limits or its accounting (%s); use another path", kc.kind, kc.c.Name, d.Name, d.DevicePath, g)
				}
			}
		}
	}
	return nil
}

// stripOwnedVolumes removes the volumes named after gpupack's hook and
// every mount of them: this release delivers the hook through the device
// plugin, so such a volume is either left from an older release (a
// hostPath to the node's hook directory or accounting files) or a tenant's
// attempt to look like one. Either way no container may keep it. gpupack's
// own old hostPath volumes go silently.
func (m *Mutator) stripOwnedVolumes(s *corev1.PodSpec) []string {
	var warn []string
	kept := s.Volumes[:0:0]
	for _, v := range s.Volumes {
		if !ownedVolume(v.Name) {
			kept = append(kept, v)
			continue
		}
		if !m.legacyHookVolume(v) {
			warn = append(warn, fmt.Sprintf("removed volume %q; the name is reserved for gpupack's GPU hook", v.Name))
		}
	}
	if len(kept) != len(s.Volumes) {
		if len(kept) == 0 {
			kept = nil
		}
		s.Volumes = kept
	}
	strip := func(c *corev1.Container) {
		k := c.VolumeMounts[:0:0]
		for _, vm := range c.VolumeMounts {
			if !ownedVolume(vm.Name) {
				k = append(k, vm)
			}
		}
		if len(k) != len(c.VolumeMounts) {
			if len(k) == 0 {
				k = nil
			}
			c.VolumeMounts = k
		}
	}
	for i := range s.Containers {
		strip(&s.Containers[i])
	}
	for i := range s.InitContainers {
		strip(&s.InitContainers[i])
	}
	return warn
}

// legacyHookVolume reports a hostPath volume as gpupack's older releases
// wrote it.
func (m *Mutator) legacyHookVolume(v corev1.Volume) bool {
	hp := v.HostPath
	if hp == nil {
		return false
	}
	switch v.Name {
	case VolumeHook:
		return hp.Path == m.cfg.Hook.HostPath
	case VolumeSharedCache:
		return hp.Path == m.cfg.Hook.SharedCacheHostPath
	}
	return false
}

// terminationGuarded are the paths a container's terminationMessagePath
// may not be at or under: gpupack's (guarded, gpupack mode), HAMi's hook
// paths (hami mode), and the runtime's device-request paths (any mode).
func (m *Mutator) terminationGuarded(guarded []string) []string {
	out := append([]string(nil), runtimeDevicePaths...)
	if m.cfg.hami() {
		h := m.cfg.Hook
		return append(out, etcPreload, path.Clean(h.MountPath))
	}
	return append(out, guarded...)
}

// terminationMessageError: the kubelet bind-mounts a host file read-write
// at the container's terminationMessagePath, after every other mount
// (device-plugin mounts included), so at /etc/ld.so.preload it would
// replace the read-only preload with an empty writable file (no hook
// loaded) — a mount like any other, checked like volume mounts (outside
// review 2026-12-02, finding 4).
func terminationMessageError(kind string, c *corev1.Container, guarded []string) error {
	tp := c.TerminationMessagePath
	if tp == "" {
		return nil
	}
	for _, g := range guarded {
		if under(tp, g) {
			return fmt.Errorf("%s %q sets terminationMessagePath %s; the kubelet mounts that file over %s, where gpupack-node mounts the GPU hook, its limits or its accounting (or the runtime reads GPU requests); use the default /dev/termination-log", kind, c.Name, tp, g)
		}
	}
	return nil
}

// ValidateEphemeralContainers checks a pod's ephemeral containers (the
// pods/ephemeralcontainers subresource, `kubectl debug`): in a pod that
// asks for GPUs none may be privileged, add capabilities beyond Pod
// Security baseline, unmask /proc, run without a confining seccomp profile
// (its own, else the pod's), mount gpupack's volumes or paths, or set an
// environment key gpupack owns. They are denied rather than changed:
// the subresource is written by a person at a terminal, who sees the
// message.
func (m *Mutator) ValidateEphemeralContainers(p *corev1.Pod) error {
	if len(p.Spec.EphemeralContainers) == 0 || !m.isGPUPod(p) {
		return nil
	}
	guarded := m.guardedPaths()
	for i := range p.Spec.EphemeralContainers {
		c := corev1.Container(p.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		if why := securityContextError(c.SecurityContext); why != "" {
			return fmt.Errorf("ephemeral container %q %s; gpupack denies that in a pod that asks for GPUs", c.Name, why)
		}
		if err := ephemeralSeccompError(&p.Spec, &c); err != nil {
			return err
		}
		if err := terminationMessageError("ephemeral container", &c, m.terminationGuarded(guarded)); err != nil {
			return err
		}
		for _, vm := range c.VolumeMounts {
			if ownedVolume(vm.Name) {
				return fmt.Errorf("ephemeral container %q mounts volume %q, which is reserved for gpupack's GPU hook", c.Name, vm.Name)
			}
			for _, g := range guarded {
				if under(vm.MountPath, g) {
					return fmt.Errorf("ephemeral container %q mounts volume %q at %s, where gpupack-node mounts the GPU hook, its limits or its accounting (%s); mount it elsewhere", c.Name, vm.Name, vm.MountPath, g)
				}
			}
		}
		for _, e := range c.Env {
			if owned(e.Name) {
				return fmt.Errorf("ephemeral container %q sets %s, which gpupack owns in GPU pods; remove it", c.Name, e.Name)
			}
		}
	}
	return nil
}

// isGPUPod reports whether a pod asks for GPUs in any container.
func (m *Mutator) isGPUPod(p *corev1.Pod) bool {
	for _, kc := range allContainers(&p.Spec) {
		if asksGPU(kc.c) {
			return true
		}
	}
	return false
}
