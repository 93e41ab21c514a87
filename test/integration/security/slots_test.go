package security

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// Finding 2, same-namespace slot swaps: two planned pods of one namespace
// waiting on one node with the same GPU count could not be told apart by
// the device plugin (the kubelet's Allocate names device IDs, never the
// pod). Admitted in the other order they swapped slots. Here the real
// placement ungater (as gpupack's manager, under the shipped RBAC and
// policies) releases pods, a test scheduler binds what it releases, and a
// test kubelet admits the bound pods — in the order the test chooses, the
// youngest first too — by the real device plugin's Allocate, then writes
// status.startTime as a kubelet does after admission.

// startUngater runs the placement ungater as gpupack's manager service
// account (no system:masters: the shipped RBAC applies).
func (c *cluster) startUngater(t *testing.T) {
	t.Helper()
	admin := c.env.Config
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: managerUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:gpupack-system", "system:authenticated"}}
	c.env.Config = cfg
	c.env.StartManager(t, func(mgr ctrl.Manager) error { return placement.Setup(mgr) })
	c.env.Config = admin
}

// gangPod is a tenant's fractional pod of GPUPlan plan, slot worker[index].
func gangPod(ns, name, plan string, index int) *corev1.Pod {
	p := gpuPod(ns, name)
	p.Annotations[v1alpha1.AnnotationPlan] = plan
	p.Labels = map[string]string{"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": fmt.Sprint(index)}
	return p
}

// createPlan creates plan and, first, its Workload as Kueue would
// (workloadOf: the ungater binds only the pods of the plan's Workload).
func (c *cluster) createPlan(t *testing.T, plan *v1alpha1.GPUPlan) {
	t.Helper()
	c.workloadOf(t, plan)
	c.env.MustCreate(t, plan)
}

// gangPlan is the check's GPUPlan for pods, slot i on gpus[i] of node-a.
func gangPlan(ns, name string, gpus []string) *v1alpha1.GPUPlan {
	pl := &v1alpha1.GPUPlan{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.GPUPlanSpec{WorkloadName: name, PodCount: int32(len(gpus)), GPUCount: int32(len(gpus))}}
	for i, g := range gpus {
		pl.Spec.Assignments = append(pl.Spec.Assignments, v1alpha1.PodAssignment{PodSet: "worker", Index: int32(i), Node: pathNode,
			GPUs: []v1alpha1.GPUAssignment{{UUID: g, MemoryMiB: limitMiB, Cores: 30}}})
	}
	return pl
}

type admitOrder int

const (
	oldestFirst admitOrder = iota
	youngestFirst
)

// nodeRun is what the test scheduler and kubelet saw.
type nodeRun struct {
	// got is the GPU each pod's Allocate gave it (by CDI name), or its error.
	got map[string]string
	err map[string]error
	// admitted and released are when the test saw each pod admitted /
	// released by the ungater.
	admitted, released map[string]time.Time
	// together is the most pods ever bound and awaiting at once.
	together int
}

// drive plays the scheduler and the kubelet of node-a for pods until each
// is admitted or refused: every pod the ungater releases is bound; after
// settle without a new release, one bound pod is admitted (oldest or
// youngest first) through the device plugin, and gets status.startTime
// (or, refused, phase Failed) as the kubelet would write.
func (np *nodePlugin) drive(t *testing.T, c *cluster, pods []*corev1.Pod, order admitOrder, settle, timeout time.Duration) nodeRun {
	t.Helper()
	env, ctx := c.env, c.env.Ctx
	run := nodeRun{got: map[string]string{}, err: map[string]error{}, admitted: map[string]time.Time{}, released: map[string]time.Time{}}
	done := map[string]bool{}
	lastRelease := time.Now()
	deadline := time.Now().Add(timeout)
	for len(done) < len(pods) {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d of %d pods admitted or refused", timeout, len(done), len(pods))
		}
		var bound []*corev1.Pod
		for _, p := range pods {
			if done[p.Name] {
				continue
			}
			cur, err := env.Clientset.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if hasGate(cur) {
				continue
			}
			if cur.Spec.NodeName == "" {
				run.released[p.Name] = time.Now()
				lastRelease = time.Now()
				if err := env.Clientset.CoreV1().Pods(p.Namespace).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
					Target: corev1.ObjectReference{Kind: "Node", Name: pathNode}}, metav1.CreateOptions{}); err != nil {
					t.Fatalf("binding %s: %v", p.Name, err)
				}
				cur.Spec.NodeName = pathNode
			}
			bound = append(bound, cur)
		}
		if len(bound) == 0 || time.Since(lastRelease) < settle {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if len(bound) > run.together {
			run.together = len(bound)
		}
		sort.SliceStable(bound, func(i, j int) bool {
			return bound[i].CreationTimestamp.Before(&bound[j].CreationTimestamp) || bound[i].Name < bound[j].Name
		})
		target := bound[0]
		if order == youngestFirst {
			target = bound[len(bound)-1]
		}
		for _, b := range bound {
			np.waitBound(t, c, b) // the plugin sees every pod the kubelet could be asking for
		}
		r, _, err := np.kubelet.Allocate(ctx, v1alpha1.ResourceVGPU, 1)
		st := target.Status
		if err != nil {
			run.err[target.Name] = err
			st.Phase, st.Reason, st.Message = corev1.PodFailed, "UnexpectedAdmissionError", err.Error()
		} else {
			var cdi []string
			for _, d := range r.CdiDevices {
				cdi = append(cdi, d.Name)
			}
			run.got[target.Name] = strings.Join(cdi, ",")
		}
		now := metav1.Now()
		st.StartTime = &now
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := env.Clientset.CoreV1().Pods(target.Namespace).Get(ctx, target.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Status.StartTime, cur.Status.Phase, cur.Status.Reason, cur.Status.Message = st.StartTime, st.Phase, st.Reason, st.Message
			_, err = env.Clientset.CoreV1().Pods(target.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatalf("kubelet status of %s: %v", target.Name, err)
		}
		run.admitted[target.Name] = time.Now()
		done[target.Name] = true
	}
	return run
}

// plannedGPU is the GPU plan binds pod's UID to.
func plannedGPU(t *testing.T, c *cluster, ns, plan string, pod *corev1.Pod) string {
	t.Helper()
	pl := &v1alpha1.GPUPlan{}
	if err := c.env.Client.Get(c.env.Ctx, client.ObjectKey{Namespace: ns, Name: plan}, pl); err != nil {
		t.Fatal(err)
	}
	b, ok := deviceplugin.BindingOf(pod, []*v1alpha1.GPUPlan{pl})
	if !ok || len(b.GPUs) != 1 {
		t.Fatalf("%s: no binding in plan %s (%+v)", pod.Name, plan, pl.Status.Bindings)
	}
	return deviceplugin.CDIDeviceName(b.GPUs[0].UUID)
}

func TestSlotSwaps(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	np := startNodePlugin(t, c, pathNode, "")
	grace := placement.UnboundGrace
	placement.UnboundGrace = 3 * time.Second
	t.Cleanup(func() { placement.UnboundGrace = grace })
	c.startUngater(t)

	// create makes the tenant's pods of one plan (alice, `edit`).
	create := func(t *testing.T, ns, plan string, names []string, gpus []string) []*corev1.Pod {
		t.Helper()
		var pods []*corev1.Pod
		for i, n := range names {
			p := gangPod(ns, n, plan, i)
			if err := c.alice.Create(ctx, p); err != nil {
				t.Fatalf("tenant creating %s: %v", n, err)
			}
			if !hasGate(p) {
				t.Fatalf("%s: not gated", n)
			}
			pods = append(pods, p)
			time.Sleep(1100 * time.Millisecond) // creationTimestamp has seconds: make the order visible
		}
		c.createPlan(t, gangPlan(ns, plan, gpus))
		return pods
	}
	own := func(t *testing.T, run nodeRun, ns, plan string, pods []*corev1.Pod) {
		t.Helper()
		for _, p := range pods {
			if err := run.err[p.Name]; err != nil {
				t.Errorf("%s: Allocate refused: %v", p.Name, err)
				continue
			}
			if want := plannedGPU(t, c, ns, plan, p); run.got[p.Name] != want {
				t.Errorf("%s was handed %s; its plan slot is %s (a swap)", p.Name, run.got[p.Name], want)
			}
		}
		if run.together > 1 {
			t.Errorf("%d pods of one GPU count awaited their allocation on the node at once", run.together)
		}
	}

	g := func(i int) string { return pathGPUs[i].UUID }
	for _, tc := range []struct {
		name  string
		order admitOrder
	}{{"oldest admitted first", oldestFirst}, {"youngest admitted first", youngestFirst}} {
		t.Run("one namespace, "+tc.name, func(t *testing.T) {
			plan := fmt.Sprintf("swap-%d", tc.order)
			names := []string{plan + "-a", plan + "-b"}
			pods := create(t, c.baseline, plan, names, []string{g(0), g(1)})
			run := np.drive(t, c, pods, tc.order, time.Second, time.Minute)
			own(t, run, c.baseline, plan, pods)
		})
	}

	t.Run("two namespaces wait for each other, and are not told each other's names", func(t *testing.T) {
		a := create(t, c.baseline, "cross-a", []string{"cross-a"}, []string{g(2)})
		b := create(t, c.open, "cross-b", []string{"cross-b"}, []string{g(3)})
		var held *corev1.Pod
		env.Eventually(t, 30*time.Second, "one released, the other held back", func() (bool, string) {
			for _, p := range append(append([]*corev1.Pod(nil), a...), b...) {
				for _, e := range eventsOf(t, c, p, placement.EventWaitingForAllocation) {
					held = p
					other := "cross-a"
					if p.Name == other {
						other = "cross-b"
					}
					if strings.Contains(e.Message, other) {
						t.Errorf("%s is told another namespace's pod name: %q", p.Name, e.Message)
					}
					return true, ""
				}
			}
			return false, "no " + placement.EventWaitingForAllocation + " event yet"
		})
		run := np.drive(t, c, append(a, b...), youngestFirst, time.Second, time.Minute)
		own(t, run, c.baseline, "cross-a", a)
		own(t, run, c.open, "cross-b", b)
		if held == nil {
			t.Error("neither pod was held back")
		}
	})

	// The tenant cannot make its pod look admitted (pods/status is not
	// the tenant's), which would release the next pod of its key while its
	// own still awaits.
	t.Run("a tenant cannot write status.startTime", func(t *testing.T) {
		pods := create(t, c.open, "forge", []string{"forge"}, []string{g(0)})
		p, err := c.aliceCS.CoreV1().Pods(c.open).Get(ctx, pods[0].Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		now := metav1.Now()
		p.Status.StartTime = &now
		_, err = c.aliceCS.CoreV1().Pods(c.open).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("tenant UpdateStatus with startTime: err = %v, want Forbidden", err)
		}
		_, err = c.aliceCS.CoreV1().Pods(c.open).Patch(ctx, p.Name, types.MergePatchType, []byte(`{"status":{"startTime":"2026-01-01T00:00:00Z"}}`), metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) {
			t.Errorf("tenant patch of pods/status: err = %v, want Forbidden", err)
		}
		created := gpuPod(c.open, "forge-at-create")
		created.Status.StartTime = &now
		created.Status.Phase = corev1.PodRunning
		if err := c.alice.Create(ctx, created); err == nil {
			if created.Status.StartTime != nil || created.Status.Phase == corev1.PodRunning {
				t.Errorf("a status written at creation was kept: %+v", created.Status)
			}
		}
		np.drive(t, c, pods, oldestFirst, 0, time.Minute)
	})

	// A tenant's pod the scheduler cannot place holds nobody back.
	t.Run("an unschedulable tenant pod does not stall another namespace", func(t *testing.T) {
		stuck := create(t, c.open, "stuck", []string{"stuck"}, []string{g(1)})[0]
		env.Eventually(t, 30*time.Second, "stuck released", func() (bool, string) {
			cur, err := env.Clientset.CoreV1().Pods(c.open).Get(ctx, stuck.Name, metav1.GetOptions{})
			return err == nil && !hasGate(cur), "gated"
		})
		cur, err := env.Clientset.CoreV1().Pods(c.open).Get(ctx, stuck.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: untolerated taint", LastTransitionTime: metav1.Now()})
		if _, err := env.Clientset.CoreV1().Pods(c.open).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		victim := create(t, c.baseline, "victim", []string{"victim"}, []string{g(2)})
		run := np.drive(t, c, victim, oldestFirst, 0, time.Minute)
		own(t, run, c.baseline, "victim", victim)
		if err := env.Clientset.CoreV1().Pods(c.open).Delete(ctx, stuck.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	// A tenant's pod that names a scheduler nobody runs is never bound nor
	// marked unschedulable: it holds others back for UnboundGrace only.
	t.Run("a tenant pod no scheduler binds stalls another namespace for a grace only", func(t *testing.T) {
		p := gangPod(c.open, "nosched", "nosched", 0)
		p.Spec.SchedulerName = "nobody-runs-this"
		if err := c.alice.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c.createPlan(t, gangPlan(c.open, "nosched", []string{g(3)}))
		env.Eventually(t, 30*time.Second, "nosched released", func() (bool, string) {
			cur, err := env.Clientset.CoreV1().Pods(c.open).Get(ctx, p.Name, metav1.GetOptions{})
			return err == nil && !hasGate(cur), "gated"
		})
		start := time.Now()
		victim := create(t, c.baseline, "victim2", []string{"victim2"}, []string{g(0)})
		run := np.drive(t, c, victim, oldestFirst, 0, time.Minute)
		own(t, run, c.baseline, "victim2", victim)
		t.Logf("victim released %v after its creation, next to a pod no scheduler binds (grace %v)", run.released["victim2"].Sub(start).Round(100*time.Millisecond), placement.UnboundGrace)
		if err := env.Clientset.CoreV1().Pods(c.open).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	// Cost: 8 ranks × 1 GPU of one gang on one node are released one at a
	// time, each after the previous one's admission.
	t.Run("a gang of 8 on one node", func(t *testing.T) {
		var names, gpus []string
		for i := 0; i < 8; i++ {
			names = append(names, fmt.Sprintf("rank-%d", i))
			gpus = append(gpus, g(i%4))
		}
		var pods []*corev1.Pod
		for i, n := range names {
			p := gangPod(c.open, n, "gang8", i)
			if err := c.alice.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			pods = append(pods, p)
		}
		start := time.Now()
		c.createPlan(t, gangPlan(c.open, "gang8", gpus))
		run := np.drive(t, c, pods, youngestFirst, 0, 2*time.Minute)
		own(t, run, c.open, "gang8", pods)
		var last time.Time
		var gaps []time.Duration
		for _, p := range pods {
			if run.admitted[p.Name].After(last) {
				last = run.admitted[p.Name]
			}
		}
		// The wait each rank adds: from one admission to the next release.
		var order []string
		for n := range run.released {
			order = append(order, n)
		}
		sort.Slice(order, func(i, j int) bool { return run.released[order[i]].Before(run.released[order[j]]) })
		for i := 1; i < len(order); i++ {
			gaps = append(gaps, run.released[order[i]].Sub(run.admitted[order[i-1]]))
		}
		var sum time.Duration
		for _, d := range gaps {
			sum += d
		}
		t.Logf("8 ranks × 1 GPU on one node: plan created → last admission %v; admission → next release: mean %v over %d steps (%v)",
			last.Sub(start).Round(time.Millisecond), (sum / time.Duration(max(1, len(gaps)))).Round(time.Millisecond), len(gaps), gaps)
	})
}

// eventsOf lists pod's Events of reason.
func eventsOf(t *testing.T, c *cluster, p *corev1.Pod, reason string) []corev1.Event {
	t.Helper()
	list, err := c.env.Clientset.CoreV1().Events(p.Namespace).List(c.env.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == reason && e.InvolvedObject.UID == p.UID {
			out = append(out, e)
		}
	}
	return out
}
