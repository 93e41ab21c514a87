package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/devicehook/node/bypass"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
)

// TestGCUnmountsAccountingTmpfs: the accounting GC of a gone pod unmounts
// the tmpfs on each of its container folders before removing them (a plain
// RemoveAll fails with EBUSY and leaves the mount and the folder for
// ever); a live pod's folder and mount stay. Runs in a private mount
// namespace (root only).
func TestGCUnmountsAccountingTmpfs(t *testing.T) {
	root := t.TempDir()
	o := DefaultOptions()
	o.NodeName, o.CacheDir, o.LimitsDir, o.ToolkitConfig = "n1", root, "", ""
	a := New(o, nil, nil)
	live := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "live", Namespace: "ns", UID: "live-uid"}}
	a.pods = deviceplugin.PodListerFunc(func() ([]*corev1.Pod, error) { return []*corev1.Pod{live}, nil })
	done := make(chan string, 1)
	go func() {
		msg := ""
		defer func() { done <- msg }()
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			msg = "skip: " + err.Error()
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			msg = "skip: " + err.Error()
			return
		}
		for _, uid := range []types.UID{"gone-uid", live.UID} {
			if err := deviceplugin.BoundAccountingDir(deviceplugin.ContainerCacheDir(root, uid, "main"), bypass.RegionSize); err != nil {
				msg = err.Error()
				return
			}
			old := time.Now().Add(-2 * time.Hour)
			if err := os.Chtimes(filepath.Join(root, string(uid)), old, old); err != nil {
				msg = err.Error()
				return
			}
		}
		a.gcAccounting()
		var bad []string
		if n := mounts(deviceplugin.ContainerCacheDir(root, "gone-uid", "main")); n != 0 {
			bad = append(bad, fmt.Sprintf("%d mounts left on the gone pod's folder", n))
		}
		if _, err := os.Stat(filepath.Join(root, "gone-uid")); !os.IsNotExist(err) {
			bad = append(bad, fmt.Sprintf("gone pod's folder: %v, want removed", err))
		}
		if n := mounts(deviceplugin.ContainerCacheDir(root, live.UID, "main")); n != 1 {
			bad = append(bad, fmt.Sprintf("%d mounts on the live pod's folder, want 1", n))
		}
		unix.Unmount(deviceplugin.ContainerCacheDir(root, live.UID, "main"), unix.MNT_DETACH)
		msg = strings.Join(bad, "; ")
	}()
	switch msg := <-done; {
	case strings.HasPrefix(msg, "skip: "):
		t.Skipf("the accounting tmpfs is tested in a private mount namespace, which needs root: %s", msg)
	case msg != "":
		t.Error(msg)
	}
}

func mounts(path string) int {
	b, _ := os.ReadFile("/proc/thread-self/mountinfo")
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			n++
		}
	}
	return n
}
