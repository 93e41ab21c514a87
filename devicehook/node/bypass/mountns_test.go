package bypass

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
)

// container is one locked OS thread in its own mount namespace and
// filesystem root: a stand-in for a container's process (what runc builds:
// a rootfs, binds into it, pivot_root), whose table the check reads at
// /proc/<pid>/task/<tid>/mountinfo. Steps run on that thread.
type container struct {
	tid   int
	steps chan func()
	done  chan error
}

func startContainer(t *testing.T) *container {
	t.Helper()
	c := &container{steps: make(chan func()), done: make(chan error)}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			ready <- fmt.Errorf("skip: unshare: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			ready <- fmt.Errorf("skip: make / private: %w", err)
			return
		}
		c.tid = unix.Gettid()
		ready <- nil
		for f := range c.steps {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("panic: %v", r)
					}
				}()
				f()
			}()
			c.done <- err
		}
	}()
	if err := <-ready; err != nil {
		if strings.HasPrefix(err.Error(), "skip: ") {
			t.Skipf("the mount check is tested in a private mount namespace, which needs root: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { close(c.steps) })
	return c
}

func (c *container) do(t *testing.T, f func() error) {
	t.Helper()
	var ferr error
	c.steps <- func() { ferr = f() }
	if err := <-c.done; err != nil {
		t.Fatal(err)
	}
	if ferr != nil {
		t.Fatal(ferr)
	}
}

func bind(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

func touch(p string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, nil, 0o644)
}

// TestMountCheckInMountNamespace (issue 14, second review finding 2): a real
// mount table. The "container" gets gpupack-node's binds as Allocate returns
// them (hook folder, /etc/ld.so.preload, /etc/gpupack/limits) in a rootfs it
// is chrooted into: the check passes. Then, as the review's pod does, a
// tenant file is bound at /x/y/gpupack/limits and /x/y/ld.so.preload with
// /x/y -> /etc an image symlink: the strings differ from gpupack's paths,
// the kernel resolves them onto /etc — the forged limits file is what the
// container reads, and the check names both paths. Through the watcher, the
// pod's GPU process is killed and the pod deleted (grace 0). Last, with
// the tenant's mounts gone, WriteLimits replaces the file (the mount's root
// reads //deleted): still passes.
func TestMountCheckInMountNamespace(t *testing.T) {
	const uid = "11111111-2222-3333-4444-555555555555"
	host := t.TempDir()
	limitsDir, hookDir := filepath.Join(host, "limits"), filepath.Join(host, "hook")
	rootfs := filepath.Join(host, "rootfs")
	limits, err := deviceplugin.WriteLimits(limitsDir, uid, "main", []byte("GPUPACK_MEMORY_LIMIT_0=10000m\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(hookDir, v1alpha1.HookLibraryName), filepath.Join(hookDir, "ld.so.preload"),
		filepath.Join(rootfs, "etc/ld.so.preload"), filepath.Join(rootfs, deviceplugin.LimitsMountPath), filepath.Join(rootfs, "tenant/limits"), filepath.Join(rootfs, "tenant/preload")} {
		if err := touch(f); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(rootfs, "tenant/limits"), []byte("GPUPACK_MEMORY_LIMIT_0=80000m\n"), 0o644)
	if err := os.MkdirAll(filepath.Join(rootfs, hookDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(rootfs, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(rootfs, "x/y")); err != nil { // the image's symlink
		t.Fatal(err)
	}

	c := startContainer(t)
	c.do(t, func() error {
		for _, b := range [][2]string{{rootfs, rootfs}, {hookDir, filepath.Join(rootfs, hookDir)},
			{filepath.Join(hookDir, "ld.so.preload"), filepath.Join(rootfs, "etc/ld.so.preload")},
			{limits, filepath.Join(rootfs, deviceplugin.LimitsMountPath)}} {
			if err := bind(b[0], b[1]); err != nil {
				return err
			}
		}
		if err := unix.Chroot(rootfs); err != nil {
			return err
		}
		return unix.Chdir("/")
	})
	mc := &MountCheck{ProcRoot: fmt.Sprintf("/proc/%d/task", os.Getpid()), LimitsDir: limitsDir, HookDir: hookDir, Preload: true}
	check := func() []string {
		t.Helper()
		self, err := mc.Self()
		if err != nil {
			t.Fatal(err)
		}
		vs, err := mc.Check(self, uint32(c.tid), uid, []string{"main"})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, v := range vs {
			t.Log(v)
			out = append(out, v.Path)
		}
		return out
	}
	if got := check(); len(got) != 0 {
		t.Fatalf("gpupack-node's own binds flagged: %v", got)
	}

	// The tenant's ConfigMap subPath and terminationMessagePath, through
	// the image symlink.
	c.do(t, func() error {
		if err := bind("/tenant/limits", "/x/y/gpupack/limits"); err != nil {
			return err
		}
		return bind("/tenant/preload", "/x/y/ld.so.preload")
	})
	seen, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/root/etc/gpupack/limits", os.Getpid(), c.tid))
	if err != nil || !strings.Contains(string(seen), "80000m") {
		t.Fatalf("the attack did not work as the review says (the container reads %q, %v): the test proves nothing", seen, err)
	}
	if d := cmp.Diff([]string{"/etc/ld.so.preload", deviceplugin.LimitsMountPath}, check()); d != "" {
		t.Errorf("violations (-want +got):\n%s", d)
	}

	// Through the watcher: the pod's GPU process is killed, the pod deleted.
	hw := nvmlfake.DGXH100()
	g0 := hw.GPUs[0].UUID()
	pod := gpuPod("a", uid, g0+":10000")
	proc := procRoot(t.TempDir())
	proc.writePID(t, uint32(c.tid), uid)
	hw.GPUs[0].Set(func(g *nvmlfake.GPU) {
		g.Processes = []nvml.ProcessInfo{{Pid: uint32(c.tid), UsedGpuMemory: 1000 << 20}}
	})
	cs, k, rec := fake.NewClientset(pod), &fakeKiller{}, record.NewFakeRecorder(100)
	w := New(Config{
		NodeName: "n1", NVML: hw, Resolver: ProcResolver{Root: string(proc)}, Mounts: mc,
		Pods:  deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{pod}, nil }),
		Plans: plansOf(pod), Killer: k, Client: cs, Recorder: rec, SlackMiB: 512,
	})
	f, err := w.Once(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 1 || f[0].Kind != metrics.KindMountOverride || f[0].Pod != types.UID(uid) {
		t.Fatalf("findings %+v, want one %s for the pod", f, metrics.KindMountOverride)
	}
	if d := cmp.Diff([]uint32{uint32(c.tid)}, k.killed); d != "" {
		t.Errorf("killed (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"ns/a grace=0"}, deletes(cs)); d != "" {
		t.Errorf("pod deletes (-want +got):\n%s", d)
	}
	var reason bool
	for len(rec.Events) > 0 {
		if e := <-rec.Events; strings.Contains(e, ReasonMountOverride) {
			reason = true
		}
	}
	if !reason {
		t.Errorf("no %s event", ReasonMountOverride)
	}

	// The tenant's mounts gone, an agent restart re-Allocates: the limits
	// file is replaced, the container keeps the old inode (its mount root
	// reads //deleted) — still gpupack-node's.
	c.do(t, func() error {
		for _, p := range []string{"/etc/gpupack/limits", "/etc/ld.so.preload"} {
			if err := unix.Unmount(p, 0); err != nil {
				return err
			}
		}
		return nil
	})
	if _, err := deviceplugin.WriteLimits(limitsDir, uid, "main", []byte("GPUPACK_MEMORY_LIMIT_0=10000m\n")); err != nil {
		t.Fatal(err)
	}
	if got := check(); len(got) != 0 {
		t.Fatalf("a limits file replaced since Allocate flagged: %v", got)
	}
}
