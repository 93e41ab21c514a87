package mutation

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// Seccomp on GPU pods (docs/security.md, open finding 3). The hook reads
// its limits from the read-only file gpupack-node mounts at
// /etc/gpupack/limits, but a process that may create a nested user and
// mount namespace can bind a file of its own over that path there and run
// CUDA inside it. seccomp Unconfined — the Kubernetes default, which Pod
// Security baseline admits — lets it; the container runtime's default
// profile (RuntimeDefault) refuses unshare(CLONE_NEWUSER) and mount to a
// container without CAP_SYS_ADMIN (which GPU pods may not add). So every
// container of a GPU pod runs under RuntimeDefault or a Localhost profile:
// the webhook sets RuntimeDefault on the pod when it names no profile, and
// refuses Unconfined anywhere. The ValidatingAdmissionPolicy
// gpupack-seccomp (manifests/base/policy/seccomp.yaml) says the same after
// every mutating webhook has run, for pods gpupack's webhooks never saw.

// confinedProfile reports whether t keeps a container from making
// namespaces: the runtime's default profile, or one the node's
// administrator installed (Localhost).
func confinedProfile(t corev1.SeccompProfileType) bool {
	return t == corev1.SeccompProfileTypeRuntimeDefault || t == corev1.SeccompProfileTypeLocalhost
}

func profileType(p *corev1.SeccompProfile) corev1.SeccompProfileType {
	if p == nil {
		return ""
	}
	return p.Type
}

func podProfile(s *corev1.PodSpec) corev1.SeccompProfileType {
	if s.SecurityContext == nil {
		return ""
	}
	return profileType(s.SecurityContext.SeccompProfile)
}

func containerProfile(c *corev1.Container) corev1.SeccompProfileType {
	if c.SecurityContext == nil {
		return ""
	}
	return profileType(c.SecurityContext.SeccompProfile)
}

// seccompWhy is the reason given in every refusal.
const seccompWhy = "an unconfined process can create a user and mount namespace and mount a file of its own over the GPU memory limits at " + LimitsFile

// seccompError refuses a GPU pod (or template) that runs a container
// unconfined by its own or the pod's seccomp profile.
func seccompError(s *corev1.PodSpec) error {
	if s.OS != nil && s.OS.Name == corev1.Windows {
		return fmt.Errorf("the pod asks for GPUs and sets spec.os.name windows; gpupack's GPU isolation (and its seccomp requirement) is for Linux pods only")
	}
	if podProfile(s) == corev1.SeccompProfileTypeUnconfined {
		return fmt.Errorf("the pod asks for GPUs and sets securityContext.seccompProfile Unconfined; %s, so set type RuntimeDefault (or Localhost) or leave it unset for gpupack to set RuntimeDefault", seccompWhy)
	}
	for _, kc := range allContainers(s) {
		if containerProfile(kc.c) == corev1.SeccompProfileTypeUnconfined {
			return fmt.Errorf("%s %q sets securityContext.seccompProfile Unconfined in a pod that asks for GPUs; %s, so set type RuntimeDefault (or Localhost) or remove it", kc.kind, kc.c.Name, seccompWhy)
		}
	}
	return nil
}

// defaultSeccomp sets the pod's seccomp profile to RuntimeDefault when it
// names none, so that every container (and every ephemeral container added
// later) without a profile of its own is confined. seccompError refused
// Unconfined before. Re-running changes nothing.
func defaultSeccomp(s *corev1.PodSpec) {
	if podProfile(s) != "" {
		return
	}
	if s.SecurityContext == nil {
		s.SecurityContext = &corev1.PodSecurityContext{}
	}
	s.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
}

// ephemeralSeccompError refuses an ephemeral container that would run
// unconfined: its own profile, else the pod's (a pod created before
// gpupack set RuntimeDefault may have none).
func ephemeralSeccompError(pod *corev1.PodSpec, c *corev1.Container) error {
	t := containerProfile(c)
	if t == "" {
		t = podProfile(pod)
	}
	if confinedProfile(t) {
		return nil
	}
	if t == "" {
		return fmt.Errorf("ephemeral container %q would run without a seccomp profile (the pod names none), in a pod that asks for GPUs; %s, so set securityContext.seccompProfile type RuntimeDefault (kubectl debug --profile=restricted does)", c.Name, seccompWhy)
	}
	return fmt.Errorf("ephemeral container %q sets securityContext.seccompProfile %s in a pod that asks for GPUs; %s, so set type RuntimeDefault (or Localhost)", c.Name, t, seccompWhy)
}
