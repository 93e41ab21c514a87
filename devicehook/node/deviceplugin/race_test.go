package deviceplugin

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// Open finding 1: the gang-fit check decides from its informers and
// writes a GPUPlan; the node decides an unplanned whole-GPU allocation (a
// namespace that opted out of the unmanaged-GPU policy) from its own
// informers and records it on the pod. Each can miss the other's write
// for a moment. nvidia.com/gpu and gpupack.io/vgpu are two kubelet
// resources over the same GPUs, so the kubelet does not keep them apart:
// an unplanned whole GPU and a new plan's fractional pod landed on one GPU
// (the fractional pod's quoted memory was the unplanned pod's to take).

// lagging is a lister whose view the test moves by hand (an informer that
// has not caught up).
type lagging struct {
	mu    sync.Mutex
	pods  []*corev1.Pod
	plans []*v1alpha1.GPUPlan
}

func (l *lagging) List() ([]*corev1.Pod, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*corev1.Pod(nil), l.pods...), nil
}

func (l *lagging) Plans(string) ([]*v1alpha1.GPUPlan, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*v1alpha1.GPUPlan(nil), l.plans...), nil
}

func (l *lagging) set(pods []*corev1.Pod, plans []*v1alpha1.GPUPlan) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods, l.plans = pods, plans
}

// raceNode is one node's two plugins, as the agent wires them: one pod
// and plan informer (view) shared, one Ledger shared; fresh is what the
// API server holds (FreshPlans).
type raceNode struct {
	view        *lagging
	whole, frac *Plugin
	rec         *record.FakeRecorder
	fresh       []*v1alpha1.GPUPlan
}

func newRaceNode(t *testing.T, client *fake.Clientset, shareLedger, freshRead bool) *raceNode {
	t.Helper()
	n := &raceNode{view: &lagging{}, rec: record.NewFakeRecorder(20)}
	gpus := []v1alpha1.GPUInfo{{UUID: "GPU-a", Index: 0, MemoryMiB: 81920, Health: "Healthy"}, {UUID: "GPU-b", Index: 1, MemoryMiB: 81920, Health: "Healthy"}}
	var ledger *Ledger
	if shareLedger {
		ledger = NewLedger()
	}
	var fresh func(context.Context) ([]*v1alpha1.GPUPlan, error)
	if freshRead {
		fresh = func(context.Context) ([]*v1alpha1.GPUPlan, error) { return n.fresh, nil }
	}
	n.whole = New(Config{ResourceName: v1alpha1.ResourceNvidiaGPU, NodeName: "n1", Unplanned: UnplannedFreeGPUs, Pods: n.view, Plans: n.view,
		Client: client, AllocatableMiB: flavors.DefaultBuffer().Allocatable, AllocateWait: time.Millisecond, Ledger: ledger, FreshPlans: fresh, Recorder: n.rec})
	n.frac = New(Config{ResourceName: v1alpha1.ResourceVGPU, SlotsPerGPU: 4, NodeName: "n1", MemoryLimits: true, Pods: n.view, Plans: n.view,
		AllocateWait: time.Millisecond, Ledger: ledger, FreshPlans: fresh, Recorder: n.rec})
	n.whole.SetGPUs(gpus)
	n.frac.SetGPUs(gpus)
	return n
}

func allocate(p *Plugin, slot string) (*pluginapi.ContainerAllocateResponse, error) {
	r, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{slot}}}})
	if err != nil {
		return nil, err
	}
	return r.ContainerResponses[0], nil
}

func TestCheckNodeRace(t *testing.T) {
	// u: a whole-GPU pod of an opted-out namespace, no plan. w: the pod of
	// a plan the check made without counting u's record, on u's GPU.
	u := makePod("u").WholeGPU("main", 1).Obj()
	w := makePod("w").Devices("GPU-a:4096").Container("main", 1).Created(time.Minute).Obj()
	planW := planFor(w)

	t.Run("the node records the unplanned GPU first; the check plans it before it sees the record", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			// shared: the two plugins share one Ledger (the agent's wiring);
			// caughtUp: the pod informer shows u's record by the time w asks.
			shared, caughtUp bool
		}{{"one ledger, informer still stale", true, false}, {"informer caught up", false, true}} {
			t.Run(tc.name, func(t *testing.T) {
				client := fake.NewSimpleClientset(u.DeepCopy(), w.DeepCopy())
				n := newRaceNode(t, client, tc.shared, true)
				n.view.set([]*corev1.Pod{u}, nil)
				r, err := allocate(n.whole, "GPU-a::0")
				if err != nil {
					t.Fatalf("unplanned whole GPU: %v", err)
				}
				if r.CdiDevices[0].Name != CDIDeviceName("GPU-a") {
					t.Fatalf("u got %v", r.CdiDevices)
				}
				// The check's plan lands; w is pinned and bound to GPU-a.
				uSeen := u
				if tc.caughtUp {
					got, err := client.CoreV1().Pods("ns").Get(context.Background(), "u", metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					uSeen = got
				}
				n.fresh = planW
				n.view.set([]*corev1.Pod{uSeen, w}, planW)
				_, err = allocate(n.frac, "GPU-a::0")
				if err == nil {
					t.Fatal("the plan's fractional pod was served GPU-a, which the unplanned whole-GPU pod holds")
				}
				if !strings.Contains(err.Error(), "GPU GPU-a is held by pod ns/u, an unplanned whole-GPU allocation") {
					t.Errorf("err = %v, want it to name the unplanned holder", err)
				}
				if ev := drain(n.rec); !hasEvent(ev, "Warning "+ReasonHeldUnplanned) {
					t.Errorf("events %v, want a %s Warning", ev, ReasonHeldUnplanned)
				}
			})
		}
	})

	t.Run("the plan is written first; the node's informer has not shown it", func(t *testing.T) {
		client := fake.NewSimpleClientset(u.DeepCopy())
		n := newRaceNode(t, client, true, true)
		n.fresh = planW // in the API server, not in the informer
		n.view.set([]*corev1.Pod{u}, nil)
		_, err := allocate(n.whole, "GPU-a::0")
		if err == nil || !strings.Contains(err.Error(), "GPU GPU-a is named by GPUPlan ns/plan-w, which this node's informer did not show yet") {
			t.Fatalf("unplanned GPU-a while a plan the informer lags names it: err = %v, want a refusal naming the plan", err)
		}
		// GPU-b is named by no plan: served.
		if _, err := allocate(n.whole, "GPU-b::0"); err != nil {
			t.Errorf("GPU-b: %v", err)
		}
		// And the plan's pod then gets GPU-a.
		got, _ := client.CoreV1().Pods("ns").Get(context.Background(), "u", metav1.GetOptions{})
		n.view.set([]*corev1.Pod{got, w}, planW)
		if _, err := allocate(n.frac, "GPU-a::0"); err != nil {
			t.Errorf("the plan's pod on GPU-a: %v", err)
		}
	})
}
