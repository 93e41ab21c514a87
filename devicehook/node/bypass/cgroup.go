// Package bypass watches what GPU processes really use, to catch memory the
// hook did not bound (static binaries, direct ioctl, a tenant that unset
// LD_PRELOAD): NVML's per-process memory → host PID → pod (via
// /proc/PID/cgroup) → compared with the pod's planned MiB on that GPU.
// Findings become an Event and a metric and, under the default policy
// enforce, a SIGKILL of the offending processes and a pod delete with grace
// period 0 (never the Eviction API, which a PDB or a webhook can hold).
//
// cgroup.go and decide.go are pure; region.go reads the hook's accounting
// files; watcher.go is the adapter to NVML and the API server.
package bypass

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// PodFromCgroup finds the pod UID in the contents of /proc/PID/cgroup. It
// understands the kubelet's layouts for cgroup v1 and v2, cgroupfs and
// systemd drivers:
//
//	…/kubepods/burstable/pod<uid>/<container>
//	…/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
func PodFromCgroup(content string) (types.UID, bool) {
	for _, line := range strings.Split(content, "\n") {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "kubepods") {
			continue
		}
		for _, seg := range strings.Split(parts[2], "/") {
			seg = strings.TrimSuffix(seg, ".slice")
			i := strings.LastIndex(seg, "pod")
			if i < 0 {
				continue
			}
			if uid, ok := normaliseUID(seg[i+3:]); ok {
				return uid, true
			}
		}
	}
	return "", false
}

// normaliseUID accepts a 36-character UUID with '-' or (systemd) '_'.
func normaliseUID(s string) (types.UID, bool) {
	if len(s) != 36 {
		return "", false
	}
	b := []byte(s)
	for i, c := range b {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' && c != '_' {
				return "", false
			}
			b[i] = '-'
		case (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'):
		default:
			return "", false
		}
	}
	return types.UID(b), true
}

// Resolver maps a host PID to the UID of its pod.
type Resolver interface {
	PodOf(pid uint32) (types.UID, bool, error)
}

// ProcResolver reads <Root>/<pid>/cgroup; Root is /proc, or the host's /proc
// mounted elsewhere, or a folder a test writes.
type ProcResolver struct{ Root string }

// PodOf returns the pod of pid; false (no error) for a process outside any
// pod, an error when the process cannot be read (it may have exited).
func (r ProcResolver) PodOf(pid uint32) (types.UID, bool, error) {
	b, err := os.ReadFile(filepath.Join(r.Root, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return "", false, fmt.Errorf("pid %d: %w", pid, err)
	}
	uid, ok := PodFromCgroup(string(b))
	return uid, ok, nil
}
