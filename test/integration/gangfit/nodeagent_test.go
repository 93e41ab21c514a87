package gangfit

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/agent"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
)

// The node agent (go-nvml, a DGX H100 mock) publishes the inventory, and
// the check plans on exactly those GPUs; a GPU the agent marks unhealthy is
// no longer planned on, so an 8-GPU gang waits until it recovers.
func TestCheckPlansOnNodeAgentInventory(t *testing.T) {
	bare := framework.MakeNode("dgx").Obj() // no inventory: the agent writes it
	s := setup(t, framework.Options{}, v1alpha1.GangFitParametersSpec{}, 8, bare)
	env := s.env
	hw := nvmlfake.DGXH100()
	publish := func() {
		t.Helper()
		if _, err := agent.Publish(env.Ctx, env.Clientset, hw, "dgx", flavors.DefaultBuffer(), 4); err != nil {
			t.Fatalf("node agent publish: %v", err)
		}
	}
	hw.GPUs[5].Set(func(g *nvmlfake.GPU) { g.RemapFail = true })
	publish()
	var node corev1.Node
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: "dgx"}, &node); err != nil {
		t.Fatal(err)
	}
	gpus, err := v1alpha1.ParseGPUs(node.Annotations[v1alpha1.AnnotationGPUs])
	if err != nil || len(gpus) != 8 || gpus[5].Health != v1alpha1.GPUUnhealthy {
		t.Fatalf("published inventory: %v %+v", err, gpus)
	}

	env.MustCreate(t, framework.MakePyTorchJob("eight", s.ns, "lq", 7, 1).Obj())
	env.Eventually(t, 30*time.Second, "8-GPU gang held: one GPU unhealthy", func() (bool, string) {
		wl := mustWorkload(t, s, "eight")
		for _, m := range s.events(t, wl.Name, admissioncheck.EventNoFit) {
			if strings.Contains(m, "unhealthy") {
				return true, ""
			}
		}
		return false, framework.DescribeWorkload(wl)
	})
	if wl := mustWorkload(t, s, "eight"); admitted(wl) {
		t.Fatalf("admitted onto an unhealthy GPU: %s", framework.DescribeWorkload(wl))
	}

	hw.GPUs[5].Set(func(g *nvmlfake.GPU) { g.RemapFail = false })
	publish()
	wl := env.WaitForWorkloadOf(t, s.ns, "eight", "PyTorchJob", admitted)
	var plan v1alpha1.GPUPlan
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: wl.Name}, &plan); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, g := range gpus {
		want[g.UUID] = true
	}
	seen := map[string]bool{}
	for _, a := range plan.Spec.Assignments {
		for _, g := range a.GPUs {
			if !want[g.UUID] || seen[g.UUID] || a.Node != "dgx" || !g.Exclusive {
				t.Errorf("planned %s on %s (exclusive %v): not a distinct GPU of the agent's inventory", g.UUID, a.Node, g.Exclusive)
			}
			seen[g.UUID] = true
		}
	}
	if len(seen) != 8 {
		t.Errorf("plan uses %d GPUs, want 8", len(seen))
	}
}
