package deviceplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// regionBytes is the hook's region size (bypass.RegionSize; the agent
// passes that constant, this package cannot import bypass).
const regionBytes = 64 + 1024*192 + 16*64 + 1024*192

// inMountNamespace runs f on a thread of its own in a private mount
// namespace (nothing it mounts reaches the host); the thread ends with f.
// f may call t.Fatal (its goroutine exits; the deferred send still runs).
// Skips where the test may not make one (not root, no CAP_SYS_ADMIN).
func inMountNamespace(t *testing.T, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
			done <- err
		}()
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err = unix.Unshare(unix.CLONE_NEWNS); err != nil {
			err = fmt.Errorf("skip: unshare(CLONE_NEWNS): %w", err)
			return
		}
		if err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			err = fmt.Errorf("skip: make / private: %w", err)
			return
		}
		f()
	}()
	if err := <-done; err != nil {
		if strings.HasPrefix(err.Error(), "skip: ") {
			t.Skipf("accounting tmpfs is tested in a private mount namespace, which needs root: %v", err)
		}
		t.Fatal(err)
	}
}

// TestAccountingDirIsBounded (outside review, issue 14): the accounting
// folder is mounted read-write into the tenant's container; on the host
// disk nothing bounded it, and dd or a million files filled /var/lib
// (DiskPressure evicts the node's other pods). Allocate now answers with a
// tmpfs of a little over one region and a few inodes on it; the hook's
// region fits, anything more gets ENOSPC; a second Allocate (agent restart)
// keeps the one mount; the pod's GC unmounts it before removing the folder.
func TestAccountingDirIsBounded(t *testing.T) {
	root := t.TempDir()
	const uid = types.UID("11111111-2222-3333-4444-555555555555")
	p := New(Config{ResourceName: v1alpha1.ResourceVGPU, NodeName: "n1", CacheHostDir: root, AccountingRegionBytes: regionBytes})
	chunk := Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "a"}, PodUID: uid, Container: "main"}
	dir := ContainerCacheDir(root, uid, "main")
	inMountNamespace(t, func() {
		r, err := p.response(chunk)
		if err != nil {
			t.Errorf("Allocate: %v", err)
			return
		}
		var found bool
		for _, m := range r.Mounts {
			found = found || (m.ContainerPath == CacheMountPath && m.HostPath == dir && !m.ReadOnly)
		}
		if !found {
			t.Errorf("mounts %v lack %s at %s", r.Mounts, dir, CacheMountPath)
		}
		if n := mountsAt(t, dir); n != 1 {
			t.Errorf("%d mounts on %s, want one tmpfs", n, dir)
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC || fs.Flags&unix.ST_NOSUID == 0 || fs.Flags&unix.ST_NODEV == 0 || fs.Flags&unix.ST_NOEXEC == 0 {
			t.Errorf("statfs %s: type %#x flags %#x (%v), want tmpfs nosuid,nodev,noexec", dir, fs.Type, fs.Flags, err)
		}
		// What the hook does: create the region 0666 and reserve its blocks.
		region := filepath.Join(dir, CacheFileName)
		f, err := os.OpenFile(region, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Fallocate(int(f.Fd()), 0, 0, regionBytes); err != nil {
			t.Errorf("the hook's region does not fit: fallocate %d bytes: %v", regionBytes, err)
		}
		f.Close()
		// The tenant: one big file, then many small ones.
		big, err := os.Create(filepath.Join(dir, "fill"))
		if err != nil {
			t.Fatal(err)
		}
		var written int64
		buf := make([]byte, 64<<10)
		for written < 64<<20 {
			n, err := big.Write(buf)
			written += int64(n)
			if err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Errorf("write: %v, want ENOSPC", err)
				}
				break
			}
		}
		big.Close()
		if written >= 64<<20 || written > AccountingTmpfsBytes(regionBytes) {
			t.Errorf("the tenant wrote %d bytes next to the region, bound %d", written, AccountingTmpfsBytes(regionBytes))
		}
		var files int
		for files = 0; files < 10000; files++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", files)), nil, 0o644); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Errorf("create: %v, want ENOSPC", err)
				}
				break
			}
		}
		if files >= AccountingInodes {
			t.Errorf("the tenant made %d files, bound %d inodes", files, AccountingInodes)
		}
		// Allocate again for the same container (agent restarted, the
		// kubelet re-asks): the same one mount, its content kept.
		if _, err := p.response(chunk); err != nil {
			t.Errorf("second Allocate: %v", err)
		}
		if n := mountsAt(t, dir); n != 1 {
			t.Errorf("%d mounts on %s after a second Allocate, want 1", n, dir)
		}
		if _, err := os.Stat(region); err != nil {
			t.Errorf("region lost by the second Allocate: %v", err)
		}
		// The pod is gone: GC unmounts, then removes the pod's folder.
		if err := RemovePodAccounting(root, uid); err != nil {
			t.Errorf("RemovePodAccounting: %v", err)
		}
		if n := mountsAt(t, dir); n != 0 {
			t.Errorf("%d mounts left on %s after GC", n, dir)
		}
		if _, err := os.Stat(filepath.Join(root, string(uid))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pod folder after GC: %v, want gone", err)
		}
	})
}

// TestAccountingMountFailureFailsAllocate: when the tmpfs cannot be
// mounted, Allocate fails and says why; it never hands out the unbounded
// folder instead. A foreign mount on the folder is not taken for ours.
func TestAccountingMountFailureFailsAllocate(t *testing.T) {
	root := t.TempDir()
	const uid = types.UID("11111111-2222-3333-4444-555555555555")
	p := New(Config{ResourceName: v1alpha1.ResourceVGPU, NodeName: "n1", CacheHostDir: root, AccountingRegionBytes: regionBytes})
	chunk := Chunk{Pod: types.NamespacedName{Namespace: "ns", Name: "a"}, PodUID: uid, Container: "main"}
	dir := ContainerCacheDir(root, uid, "main")
	inMountNamespace(t, func() {
		// Something else is mounted there (a bind of another folder).
		other := t.TempDir()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(other, dir, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := p.response(chunk); err == nil || !strings.Contains(err.Error(), "not gpupack's tmpfs") {
			t.Errorf("Allocate over a foreign mount: %v, want refused", err)
		}
		if n := mountsAt(t, dir); n != 1 {
			t.Errorf("%d mounts on %s, want the foreign one only", n, dir)
		}
		if err := unix.Unmount(dir, 0); err != nil {
			t.Fatal(err)
		}
		// The folder is a file: the mount cannot be made.
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dir, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := p.response(chunk); err == nil || !strings.Contains(err.Error(), "bound the accounting dir") {
			t.Errorf("Allocate with an unmountable folder: %v, want a clear error", err)
		}
	})
}

// mountsAt counts the mounts at path in this thread's mount namespace.
func mountsAt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			n++
		}
	}
	return n
}
