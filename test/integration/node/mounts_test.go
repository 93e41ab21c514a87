package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupack/gpupack/devicehook/node/bypass"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
	"github.com/gpupack/gpupack/test/framework"
)

// TestNodeAgentMountOverride (issue 14, second review finding 2): a GPU
// process whose mount table shows a tenant file over /etc/gpupack/limits —
// as a subPath through an image symlink leaves it — is a GPUMountOverride
// on the pod, killed and deleted with grace 0 by the real agent; a process
// of another pod that sees gpupack-node's own bind is left alone. The
// tables are written into the agent's fake /proc, with the device and root
// this machine's mount table gives the agent's --limits-dir (the
// kernel-level part is bypass.TestMountCheckInMountNamespace).
func TestNodeAgentMountOverride(t *testing.T) {
	env := framework.Start(t, framework.Options{NoKueue: true})
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	hw := nvmlfake.DGXH100()
	_, proc, opts := startAgent(t, env, hw, bypass.PolicyEnforce, "")
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	self, err := bypass.ParseMountinfo(b)
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t, "team")
	g0, g1 := hw.GPUs[0].UUID(), hw.GPUs[1].UUID()
	table := func(pod *corev1.Pod, forged bool) string {
		limits, err := deviceplugin.WriteLimits(opts.LimitsDir, pod.UID, "main", []byte("x=1\n"))
		if err != nil {
			t.Fatal(err)
		}
		real, err := filepath.EvalSymlinks(limits)
		if err != nil {
			t.Fatal(err)
		}
		dev, root, ok := bypass.HostSide(self, real)
		if !ok {
			t.Fatal("no mount for the limits dir")
		}
		s := "1 0 0:99 / / rw - overlay overlay rw\n" + fmt.Sprintf("2 1 %s %s %s ro - ext4 /dev/x rw\n", dev, root, deviceplugin.LimitsMountPath)
		if forged {
			s += "3 2 0:98 /..data/limits /etc/gpupack/limits ro - tmpfs tmpfs rw\n"
		}
		return s
	}
	honest, forged := gpuPod("honest", ns, g1+":10000", 1), gpuPod("forged", ns, g0+":10000", 1)
	for i, p := range []*corev1.Pod{honest, forged} {
		env.MustCreate(t, p)
		bindPlan(t, env, p, []string{g1 + ":10000", g0 + ":10000"}[i], 0)
		pid := 5100 + i
		writeCgroup(t, proc, pid, p.UID)
		if err := os.WriteFile(filepath.Join(proc, fmt.Sprint(pid), "mountinfo"), []byte(table(p, p == forged)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hw.GPUs[1].Set(func(g *nvmlfake.GPU) { g.Processes = []nvml.ProcessInfo{{Pid: 5100, UsedGpuMemory: 1000 << 20}} })
	hw.GPUs[0].Set(func(g *nvmlfake.GPU) { g.Processes = []nvml.ProcessInfo{{Pid: 5101, UsedGpuMemory: 1000 << 20}} })
	defer func() {
		hw.GPUs[0].Set(func(g *nvmlfake.GPU) { g.Processes = nil })
		hw.GPUs[1].Set(func(g *nvmlfake.GPU) { g.Processes = nil })
	}()

	env.Eventually(t, 20*time.Second, bypass.ReasonMountOverride+" event on the forged pod", func() (bool, string) {
		evs := events(env, ns, bypass.ReasonMountOverride, forged.UID)
		if len(evs) == 0 {
			return false, "none"
		}
		return strings.Contains(evs[0].Message, "/etc/gpupack/limits"), evs[0].Message
	})
	env.Eventually(t, 20*time.Second, "forged pod deleted", func() (bool, string) {
		_, err := env.Clientset.CoreV1().Pods(ns).Get(env.Ctx, forged.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	for _, pid := range opts.Killer.(*recordingKiller).pids() {
		if pid != 5101 {
			t.Errorf("killed pid %d, want only 5101", pid)
		}
	}
	if evs := events(env, ns, bypass.ReasonMountOverride, honest.UID); len(evs) != 0 {
		t.Errorf("the honest pod flagged: %v", evs[0].Message)
	}
	if _, err := env.Clientset.CoreV1().Pods(ns).Get(env.Ctx, honest.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the honest pod: %v", err)
	}
}
