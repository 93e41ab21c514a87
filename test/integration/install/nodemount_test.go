package install

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestNodeAccountingMountPropagates: gpupack-node mounts a small tmpfs on
// each container's accounting folder (issue 14: the tenant-writable folder
// otherwise fills the node's disk); the runtime, in the host's mount
// namespace, sees that tmpfs only if the accounting hostPath propagates
// Bidirectional from gpupack-node's container, which needs privileged.
func TestNodeAccountingMountPropagates(t *testing.T) {
	for name, objs := range map[string]func() []*unstructured.Unstructured{
		"kustomize": func() []*unstructured.Unstructured { return Kustomize(t, "manifests/overlays/default") },
		"helm":      func() []*unstructured.Unstructured { return Helm(t) },
	} {
		t.Run(name, func(t *testing.T) {
			var ds appsv1.DaemonSet
			u := find(t, objs(), "DaemonSet", "gpupack-node")
			into(t, u, &ds)
			args := containerArgs(t, u)
			dir, ok := flagValue(args, "accounting-dir")
			if !ok {
				t.Fatalf("gpupack-node has no --accounting-dir: %v", args)
			}
			if v, ok := flagValue(args, "accounting-tmpfs"); ok && v != "true" {
				t.Errorf("--accounting-tmpfs=%s", v)
			}
			c := ds.Spec.Template.Spec.Containers[0]
			if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				t.Errorf("gpupack-node is not privileged: Bidirectional propagation is refused")
			}
			found := false
			for _, m := range c.VolumeMounts {
				if m.MountPath != dir {
					continue
				}
				found = true
				if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
					t.Errorf("the accounting dir %s is mounted with propagation %v, want Bidirectional", dir, m.MountPropagation)
				}
			}
			if !found {
				t.Errorf("no volume mount at the accounting dir %s", dir)
			}
		})
	}
}
