// Package volcano tests the Volcano / Kueue topology bridge against a real
// kube-apiserver with Volcano's CRDs and the real Kueue manager, with the
// real gang-fit check admitting the workloads. No Volcano scheduler runs:
// the test writes the PodGroup status Volcano would write.
//
// One control plane and one manager serve every step (controller-runtime
// refuses a controller name twice per process), each job in its own
// namespace.
package volcano

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/google/go-cmp/cmp"
	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanoscheduling "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	volcanotopology "volcano.sh/apis/pkg/apis/topology/v1alpha1"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/topology"
	"github.com/gpupack/gpupack/admissioncheck/volcano"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/test/framework"
)

const (
	spine = framework.LabelSpine
	leaf  = framework.LabelLeaf
	nvl   = v1alpha1.LabelNVLinkDomain
	queue = "gpu-jobs"
)

var levels = []string{spine, leaf, nvl}

// gpuNode is an 8-GPU H100 node at spine s, leaf l, NVLink domain d.
func gpuNode(name, s, l, d string) *corev1.Node {
	return framework.MakeNode(name).GPUs(8, framework.H100).Label(spine, s).Label(leaf, l).Label(nvl, d).Obj()
}

type bridge struct {
	env *framework.Env
}

func TestVolcanoBridge(t *testing.T) {
	env := framework.Start(t, framework.Options{})
	b := &bridge{env: env}
	// spine s1 → leaf l1 → {d1: n1 n2, d2: n3}, leaf l2 → {d3: n4};
	// spine s2 → leaf l3 → {d4: n5}.
	for _, n := range []*corev1.Node{
		gpuNode("n1", "s1", "l1", "d1"), gpuNode("n2", "s1", "l1", "d1"), gpuNode("n3", "s1", "l1", "d2"),
		gpuNode("n4", "s1", "l2", "d3"), gpuNode("n5", "s2", "l3", "d4"),
	} {
		b.addNode(t, n)
	}
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"}, Spec: v1alpha1.GangFitParametersSpec{
		TopologyLevels: levels,
		RequiredLevel:  leaf,
		RetryBackoff:   v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)},
		Volcano:        &v1alpha1.VolcanoSettings{Queue: queue, UnschedulablePatienceSeconds: ptr.To[int32](2)},
	}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))
	env.MustCreate(t, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "training"}, Value: 1000})
	env.StartManager(t, func(mgr ctrl.Manager) error {
		if err := admissioncheck.Setup(mgr, admissioncheck.Options{}); err != nil {
			return err
		}
		if err := volcano.Setup(mgr, volcano.Options{}); err != nil {
			return err
		}
		if err := preemption.SetupWithManager(mgr, preemption.Options{Slack: 5 * time.Second}); err != nil {
			return err
		}
		return topology.Setup(mgr, topology.Options{})
	})
	env.WaitForAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 40, framework.H100).AdmissionChecks("gang-fit").Obj())

	t.Run("topology", b.testTopology)
	t.Run("one PodGroup per admitted gang, gone when it finishes", b.testPodGroupFinish)
	t.Run("PodGroup gone when the workload is evicted", b.testPodGroupEvicted)
	t.Run("Unschedulable past patience turns the check to Retry", b.testUnschedulable)
	t.Run("Volcano's evictor runs the checkpoint protocol (v1.12: delete)", func(t *testing.T) { b.testEvictor(t, false) })
	t.Run("Volcano's evictor runs the checkpoint protocol (v1.13+: DisruptionTarget, delete)", func(t *testing.T) { b.testEvictor(t, true) })
}

// addNode creates a node and, as the node lifecycle controller would once
// the kubelet reports Ready (none runs here), lifts the node.kubernetes.io
// taints the API server puts on a new node.
func (b *bridge) addNode(t *testing.T, n *corev1.Node) {
	t.Helper()
	env := b.env
	env.MustCreate(t, n)
	var cur corev1.Node
	if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(n), &cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	var keep []corev1.Taint
	for _, tn := range cur.Spec.Taints {
		if !strings.HasPrefix(tn.Key, "node.kubernetes.io/") {
			keep = append(keep, tn)
		}
	}
	cur.Spec.Taints = keep
	if err := env.Client.Patch(env.Ctx, &cur, patch); err != nil {
		t.Fatal(err)
	}
}

// ---- topology ----

// hn is a HyperNode as the test expects it: tier, level, domain, members.
type hn struct {
	Tier    int
	Level   string
	Domain  string
	Members []string // node names at tier 1, "level=domain" of children above
}

func (b *bridge) hyperNodes(t *testing.T) (map[string]hn, map[string]string) {
	t.Helper()
	var list volcanotopology.HyperNodeList
	if err := b.env.Client.List(b.env.Ctx, &list); err != nil {
		t.Fatal(err)
	}
	byName := map[string]volcanotopology.HyperNode{}
	for _, h := range list.Items {
		byName[h.Name] = h
	}
	got := map[string]hn{}
	rvs := map[string]string{}
	for _, h := range list.Items {
		e := hn{Tier: h.Spec.Tier, Level: h.Annotations[topology.AnnotationLevel], Domain: h.Annotations[topology.AnnotationDomain]}
		if h.Spec.TierName != e.Level {
			t.Errorf("HyperNode %s: tierName %q, level %q", h.Name, h.Spec.TierName, e.Level)
		}
		for _, m := range h.Spec.Members {
			if m.Selector.ExactMatch == nil {
				t.Fatalf("HyperNode %s: member without exactMatch: %+v", h.Name, m)
			}
			name := m.Selector.ExactMatch.Name
			switch m.Type {
			case volcanotopology.MemberTypeNode:
				e.Members = append(e.Members, name)
			case volcanotopology.MemberTypeHyperNode:
				c, ok := byName[name]
				if !ok {
					e.Members = append(e.Members, "missing:"+name)
					continue
				}
				e.Members = append(e.Members, c.Annotations[topology.AnnotationLevel]+"="+c.Annotations[topology.AnnotationDomain])
			}
		}
		sort.Strings(e.Members)
		key := e.Level + "=" + e.Domain
		got[key] = e
		rvs[key] = h.ResourceVersion
	}
	return got, rvs
}

func (b *bridge) waitHyperNodes(t *testing.T, what string, want map[string]hn) map[string]string {
	t.Helper()
	var rvs map[string]string
	b.env.Eventually(t, 30*time.Second, what, func() (bool, string) {
		var got map[string]hn
		got, rvs = b.hyperNodes(t)
		d := cmp.Diff(want, got)
		return d == "", d
	})
	return rvs
}

func (b *bridge) kueueTopology(t *testing.T) (*kueue.Topology, error) {
	t.Helper()
	var tp kueue.Topology
	err := b.env.Client.Get(b.env.Ctx, client.ObjectKey{Name: topology.DefaultTopologyName}, &tp)
	return &tp, err
}

func (b *bridge) testTopology(t *testing.T) {
	env := b.env
	tree := map[string]hn{
		spine + "=s1": {Tier: 3, Level: spine, Domain: "s1", Members: []string{leaf + "=l1", leaf + "=l2"}},
		spine + "=s2": {Tier: 3, Level: spine, Domain: "s2", Members: []string{leaf + "=l3"}},
		leaf + "=l1":  {Tier: 2, Level: leaf, Domain: "l1", Members: []string{nvl + "=d1", nvl + "=d2"}},
		leaf + "=l2":  {Tier: 2, Level: leaf, Domain: "l2", Members: []string{nvl + "=d3"}},
		leaf + "=l3":  {Tier: 2, Level: leaf, Domain: "l3", Members: []string{nvl + "=d4"}},
		nvl + "=d1":   {Tier: 1, Level: nvl, Domain: "d1", Members: []string{"n1", "n2"}},
		nvl + "=d2":   {Tier: 1, Level: nvl, Domain: "d2", Members: []string{"n3"}},
		nvl + "=d3":   {Tier: 1, Level: nvl, Domain: "d3", Members: []string{"n4"}},
		nvl + "=d4":   {Tier: 1, Level: nvl, Domain: "d4", Members: []string{"n5"}},
	}
	rvs := b.waitHyperNodes(t, "the HyperNode tree of 5 nodes", tree)
	// Kueue itself writes the Topology's metadata (a finalizer), so a
	// resourceVersion says nothing about us: gpupack only creates or
	// replaces it, which changes its UID, or would change its spec
	// (generation).
	var topoID string
	identity := func(tp *kueue.Topology) string { return fmt.Sprintf("%s/%d", tp.UID, tp.Generation) }
	env.Eventually(t, 30*time.Second, "the Kueue Topology", func() (bool, string) {
		tp, err := b.kueueTopology(t)
		if err != nil {
			return false, err.Error()
		}
		var got []string
		for _, l := range tp.Spec.Levels {
			got = append(got, l.NodeLabel)
		}
		topoID = identity(tp)
		d := cmp.Diff(levels, got)
		return d == "", d
	})

	// Re-running writes nothing: a label change the tree does not read
	// makes the reconciler run again; no object may change.
	b.labelNode(t, "n1", "team", "vision")
	time.Sleep(3 * time.Second)
	got, again := b.hyperNodes(t)
	if d := cmp.Diff(tree, got); d != "" {
		t.Fatalf("tree changed on a no-op run:\n%s", d)
	}
	if d := cmp.Diff(rvs, again); d != "" {
		t.Fatalf("a no-op run wrote HyperNodes (resourceVersions -before +after):\n%s", d)
	}
	if tp, err := b.kueueTopology(t); err != nil || identity(tp) != topoID {
		t.Fatalf("a no-op run rewrote the Kueue Topology (%v, uid/generation %s → %s)", err, topoID, identity(tp))
	}

	// A node joins leaf l3 in a new NVLink domain: one new tier-1
	// HyperNode, its leaf updated, nothing else written.
	b.addNode(t, gpuNode("n6", "s2", "l3", "d5"))
	tree[nvl+"=d5"] = hn{Tier: 1, Level: nvl, Domain: "d5", Members: []string{"n6"}}
	tree[leaf+"=l3"] = hn{Tier: 2, Level: leaf, Domain: "l3", Members: []string{nvl + "=d4", nvl + "=d5"}}
	after := b.waitHyperNodes(t, "n6 in the tree", tree)
	b.expectWritten(t, rvs, after, leaf+"=l3", nvl+"=d5")

	// n4 leaves: its NVLink domain and leaf empty out and go; spine s1
	// loses a child.
	if err := env.Client.Delete(env.Ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n4"}}); err != nil {
		t.Fatal(err)
	}
	delete(tree, nvl+"=d3")
	delete(tree, leaf+"=l2")
	tree[spine+"=s1"] = hn{Tier: 3, Level: spine, Domain: "s1", Members: []string{leaf + "=l1"}}
	final := b.waitHyperNodes(t, "n4 out of the tree", tree)
	b.expectWritten(t, after, final, spine+"=s1")
	if tp, err := b.kueueTopology(t); err != nil || identity(tp) != topoID {
		t.Fatalf("node changes rewrote the Kueue Topology (%v, uid/generation %s → %s)", err, topoID, identity(tp))
	}
}

// expectWritten checks that exactly the named HyperNodes were created or
// changed between two snapshots (deleted ones are checked by the tree).
func (b *bridge) expectWritten(t *testing.T, before, after map[string]string, names ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for k, rv := range after {
		changed := before[k] != rv
		if changed != want[k] {
			t.Errorf("HyperNode %s: written=%v, want %v", k, changed, want[k])
		}
	}
}

func (b *bridge) labelNode(t *testing.T, name, k, v string) {
	t.Helper()
	var n corev1.Node
	if err := b.env.Client.Get(b.env.Ctx, client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Labels[k] = v
	if err := b.env.Client.Patch(b.env.Ctx, &n, patch); err != nil {
		t.Fatal(err)
	}
}

// ---- PodGroups ----

var quantityEq = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

func resourceQ(s string) resource.Quantity { return resource.MustParse(s) }

// volcanoJob is a PyTorchJob of 1 master + 3 workers, 2 GPUs each, whose
// templates name the Volcano scheduler and the "training" priority class.
func (b *bridge) volcanoJob(t *testing.T, ns, name string) *kftraining.PyTorchJob {
	t.Helper()
	b.env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "cq"))
	j := framework.MakePyTorchJob(name, ns, "lq", 3, 2).Obj()
	for _, rs := range j.Spec.PyTorchReplicaSpecs {
		rs.Template.Spec.SchedulerName = volcano.SchedulerName
		rs.Template.Spec.PriorityClassName = "training"
	}
	b.env.MustCreate(t, j)
	return j
}

func admitted(wl *kueue.Workload) bool {
	return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted)
}

func (b *bridge) podGroups(t *testing.T, ns string) []volcanoscheduling.PodGroup {
	t.Helper()
	var list volcanoscheduling.PodGroupList
	if err := b.env.Client.List(b.env.Ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// admittedWithPodGroup waits for the job's workload to be admitted and its
// PodGroup to exist, and checks every field against the admitted gang.
func (b *bridge) admittedWithPodGroup(t *testing.T, ns, job string) (*kueue.Workload, *volcanoscheduling.PodGroup) {
	t.Helper()
	env := b.env
	wl := env.WaitForWorkloadOf(t, ns, job, "PyTorchJob", func(w *kueue.Workload) bool {
		if !admitted(w) {
			return false
		}
		for _, c := range w.Status.AdmissionChecks {
			if c.State != kueue.CheckStateReady {
				return false // re-evaluation under way after a Retry
			}
		}
		return true
	})
	// The check's podSetUpdates put every pod set's pods into the group and
	// name their task, which Volcano keys minTaskMember by.
	for _, ps := range wl.Spec.PodSets {
		var upd *kueue.PodSetUpdate
		for i := range wl.Status.AdmissionChecks {
			for j := range wl.Status.AdmissionChecks[i].PodSetUpdates {
				if u := &wl.Status.AdmissionChecks[i].PodSetUpdates[j]; u.Name == ps.Name {
					upd = u
				}
			}
		}
		if upd == nil || upd.Annotations[volcano.AnnotationGroupName] != volcano.GroupName(wl) || upd.Annotations[volcano.AnnotationTaskSpec] != string(ps.Name) {
			t.Errorf("pod set %s: podSetUpdate %+v lacks the Volcano group %q / task annotations", ps.Name, upd, volcano.GroupName(wl))
		}
	}
	var pg volcanoscheduling.PodGroup
	env.Eventually(t, 30*time.Second, "the PodGroup of "+wl.Name, func() (bool, string) {
		pgs := b.podGroups(t, ns)
		if len(pgs) != 1 {
			return false, fmt.Sprintf("%d PodGroups", len(pgs))
		}
		pg = pgs[0]
		return true, ""
	})
	var plan v1alpha1.GPUPlan
	if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(wl), &plan); err != nil {
		t.Fatalf("GPUPlan of %s: %v", wl.Name, err)
	}
	if plan.Spec.Level != leaf {
		t.Fatalf("plan level %q, want %q (requiredLevel)", plan.Spec.Level, leaf)
	}
	want := volcanoscheduling.PodGroupSpec{
		MinMember:         4,
		MinTaskMember:     map[string]int32{"master": 1, "worker": 3},
		Queue:             queue,
		PriorityClassName: "training",
		MinResources: &corev1.ResourceList{
			corev1.ResourceCPU:         resourceQ("4"),
			corev1.ResourceMemory:      resourceQ("4Gi"),
			v1alpha1.ResourceNvidiaGPU: resourceQ("8"),
		},
		// leaf is tier 2 of spine → leaf → NVLink domain.
		NetworkTopology: &volcanoscheduling.NetworkTopologySpec{Mode: volcanoscheduling.HardNetworkTopologyMode, HighestTierAllowed: ptr.To(2)},
	}
	if d := cmp.Diff(want, pg.Spec, quantityEq); d != "" {
		t.Fatalf("PodGroup spec (-want +got):\n%s", d)
	}
	if pg.Name != volcano.GroupName(wl) {
		t.Fatalf("PodGroup %s, want %s", pg.Name, volcano.GroupName(wl))
	}
	if o := metav1.GetControllerOf(&pg); o == nil || o.UID != wl.UID || o.Kind != "Workload" {
		t.Fatalf("PodGroup owner %+v, want workload %s", o, wl.UID)
	}
	var q volcanoscheduling.Queue
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: queue}, &q); err != nil {
		t.Fatalf("Volcano queue %s: %v", queue, err)
	}
	if len(q.Spec.Capability) != 0 {
		t.Fatalf("queue %s has capability %v: Kueue must stay the only quota owner", queue, q.Spec.Capability)
	}
	return wl, &pg
}

func (b *bridge) waitNoPodGroup(t *testing.T, ns, why string) {
	t.Helper()
	b.env.Eventually(t, 30*time.Second, "PodGroup deleted: "+why, func() (bool, string) {
		pgs := b.podGroups(t, ns)
		return len(pgs) == 0, fmt.Sprintf("%d PodGroups", len(pgs))
	})
}

func (b *bridge) testPodGroupFinish(t *testing.T) {
	env := b.env
	ns := env.Namespace(t, "finish")
	job := b.volcanoJob(t, ns, "train")
	b.admittedWithPodGroup(t, ns, job.Name)

	// Re-running writes nothing: the PodGroup keeps its resourceVersion.
	before := b.podGroups(t, ns)[0].ResourceVersion
	time.Sleep(2 * time.Second)
	if after := b.podGroups(t, ns)[0].ResourceVersion; after != before {
		t.Fatalf("PodGroup rewritten while nothing changed: rv %s → %s", before, after)
	}

	// The job succeeds (as the training operator would report it); Kueue
	// finishes the workload.
	var cur kftraining.PyTorchJob
	if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(job), &cur); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	cur.Status.Conditions = append(cur.Status.Conditions, kftraining.JobCondition{
		Type: kftraining.JobSucceeded, Status: corev1.ConditionTrue, Reason: "PyTorchJobSucceeded", Message: "done",
		LastUpdateTime: now, LastTransitionTime: now,
	})
	if err := env.Client.Status().Update(env.Ctx, &cur); err != nil {
		t.Fatal(err)
	}
	env.WaitForWorkloadOf(t, ns, job.Name, "PyTorchJob", func(wl *kueue.Workload) bool {
		return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished)
	})
	b.waitNoPodGroup(t, ns, "workload finished")
}

func (b *bridge) testPodGroupEvicted(t *testing.T) {
	env := b.env
	ns := env.Namespace(t, "evict")
	job := b.volcanoJob(t, ns, "train")
	wl, _ := b.admittedWithPodGroup(t, ns, job.Name)

	// Deactivating the workload makes Kueue evict it.
	patch := client.MergeFrom(wl.DeepCopy())
	wl.Spec.Active = ptr.To(false)
	if err := env.Client.Patch(env.Ctx, wl, patch); err != nil {
		t.Fatal(err)
	}
	env.WaitForWorkloadOf(t, ns, job.Name, "PyTorchJob", func(wl *kueue.Workload) bool {
		return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadEvicted)
	})
	b.waitNoPodGroup(t, ns, "workload evicted")
}

func (b *bridge) testUnschedulable(t *testing.T) {
	env := b.env
	ns := env.Namespace(t, "stuck")
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// Every Workload write is seen: Kueue resets a Retry check to Pending
	// within milliseconds, too fast to poll for.
	w, err := wc.Watch(env.Ctx, &kueue.WorkloadList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	job := b.volcanoJob(t, ns, "train")
	wl, pg := b.admittedWithPodGroup(t, ns, job.Name)

	// Volcano's gang plugin reports the gang it cannot place.
	volcanoMsg := "4/4 tasks in gang unschedulable: pod group is not ready, 4 Pending, 4 minAvailable; Pending: 4 Unschedulable"
	patch := client.MergeFrom(pg.DeepCopy())
	pg.Status.Phase = volcanoscheduling.PodGroupPending
	pg.Status.Conditions = []volcanoscheduling.PodGroupCondition{{
		Type: volcanoscheduling.PodGroupUnschedulableType, Status: corev1.ConditionTrue,
		LastTransitionTime: metav1.NewTime(time.Now().Add(-10 * time.Second)), TransitionID: "session-1",
		Reason: volcanoscheduling.NotEnoughResourcesReason, Message: volcanoMsg,
	}}
	if err := env.Client.Patch(env.Ctx, pg, patch); err != nil {
		t.Fatal(err)
	}

	var retry *kueue.AdmissionCheckState
	waitWatch(t, w, "the check to turn Retry", func(cur *kueue.Workload) bool {
		for i := range cur.Status.AdmissionChecks {
			if st := cur.Status.AdmissionChecks[i]; cur.UID == wl.UID && st.Name == "gang-fit" && st.State == kueue.CheckStateRetry {
				retry = st.DeepCopy()
			}
		}
		return retry != nil
	})
	if !strings.Contains(retry.Message, volcanoMsg) || !strings.Contains(retry.Message, volcanoscheduling.NotEnoughResourcesReason) {
		t.Fatalf("Retry message %q does not carry Volcano's %q", retry.Message, volcanoMsg)
	}
	if retry.RequeueAfterSeconds == nil {
		t.Fatalf("Retry without requeueAfterSeconds: %+v", retry)
	}

	// Kueue evicts and releases the quota; the PodGroup goes with the
	// admission. After the backoff the gang is admitted again with a
	// fresh PodGroup, which the stale condition does not send back.
	waitWatch(t, w, "Kueue to evict the workload", func(cur *kueue.Workload) bool {
		c := apimeta.FindStatusCondition(cur.Status.Conditions, kueue.WorkloadEvicted)
		return cur.UID == wl.UID && c != nil && c.Status == metav1.ConditionTrue && c.Reason == kueue.WorkloadEvictedByAdmissionCheck
	})
	env.Eventually(t, 30*time.Second, "the stale PodGroup deleted", func() (bool, string) {
		var cur volcanoscheduling.PodGroup
		err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(pg), &cur)
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		return err == nil && cur.UID != pg.UID, fmt.Sprint(err)
	})
	_, fresh := b.admittedWithPodGroup(t, ns, job.Name)
	if fresh.UID == pg.UID || len(fresh.Status.Conditions) != 0 {
		t.Fatalf("re-admitted with the old PodGroup: %+v", fresh.Status)
	}
	var evs corev1.EventList
	if err := env.Client.List(env.Ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs.Items {
		found = found || e.Reason == volcano.EventVolcanoUnschedulable && strings.Contains(e.Message, volcanoMsg)
	}
	if !found {
		t.Fatalf("no %s event with Volcano's message", volcano.EventVolcanoUnschedulable)
	}
	time.Sleep(3 * time.Second) // longer than the patience
	if cur := env.WaitForWorkloadOf(t, ns, job.Name, "PyTorchJob", nil); !admitted(cur) {
		t.Fatalf("a fresh PodGroup sent the workload back: %s", framework.DescribeWorkload(cur))
	}
}

// waitWatch reads workload events until cond holds for one.
func waitWatch(t *testing.T, w watch.Interface, what string, cond func(*kueue.Workload) bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("workload watch closed waiting for %s", what)
			}
			if cur, isWL := ev.Object.(*kueue.Workload); isWL && ev.Type != watch.Deleted && cond(cur) {
				return
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// ---- Volcano's evictor as a trigger ----

// volcanoEvict does to a pod what Volcano's scheduler does when its
// preempt or reclaim action evicts a task (pkg/scheduler/cache/cache.go,
// defaultEvictor.Evict): one status update — PodReady False, reason
// "Evict"; since v1.13 also DisruptionTarget True, reason
// PreemptionByScheduler — then a delete with no options. No Eviction API.
func (b *bridge) volcanoEvict(t *testing.T, p *corev1.Pod, disruptionTarget bool) {
	t.Helper()
	env := b.env
	cur, err := env.Clientset.CoreV1().Pods(p.Namespace).Get(env.Ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msg := "Pod is evicted, because of preempt"
	cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "Evict", Message: msg, LastTransitionTime: metav1.Now()})
	if disruptionTarget {
		cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: corev1.PodReasonPreemptionByScheduler, Message: volcano.SchedulerName + ": preempting to accommodate a higher priority pod", LastTransitionTime: metav1.Now()})
	}
	if _, err := env.Clientset.CoreV1().Pods(p.Namespace).UpdateStatus(env.Ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.Clientset.CoreV1().Pods(p.Namespace).Delete(env.Ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// testEvictor: Volcano evicts one opted-in rank of a running gang Kueue
// has admitted. The coordinator evicts the whole Workload through Kueue,
// asks every rank to checkpoint, and records the consistent step on the
// job once the ranks are gone. No Volcano scheduler (nor training
// operator, nor kubelet) runs: the test creates the job's pods, binds them
// as Volcano's binder does, reports them Running, answers the checkpoint
// requests as the agents would, and a finalizer stands for each running
// container.
func (b *bridge) testEvictor(t *testing.T, disruptionTarget bool) {
	env := b.env
	ns := env.Namespace(t, "evictor")
	job := b.volcanoJob(t, ns, "train")
	wl, pg := b.admittedWithPodGroup(t, ns, job.Name)
	var pj kftraining.PyTorchJob
	if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(job), &pj); err != nil {
		t.Fatal(err)
	}
	// The node is Ready, as its kubelet would report (no NotReady trigger).
	var node corev1.Node
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: "n1"}, &node); err != nil {
		t.Fatal(err)
	}
	if !apimetaNodeReady(&node) {
		node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()})
		if err := env.Client.Status().Update(env.Ctx, &node); err != nil {
			t.Fatal(err)
		}
	}
	const kubelet = "test.gpupack.io/container-running"
	var pods []*corev1.Pod
	for _, rank := range []struct{ typ, idx string }{{"master", "0"}, {"worker", "0"}, {"worker", "1"}, {"worker", "2"}} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train-" + rank.typ + "-" + rank.idx, Namespace: ns,
			Labels: map[string]string{"training.kubeflow.org/replica-type": rank.typ, "training.kubeflow.org/replica-index": rank.idx},
			Annotations: map[string]string{v1alpha1.AnnotationCheckpoint: "true", v1alpha1.AnnotationCheckpointTimeout: "60s",
				volcano.AnnotationGroupName: pg.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: kftraining.SchemeGroupVersion.String(), Kind: kftraining.PyTorchJobKind, Name: pj.Name, UID: pj.UID, Controller: ptr.To(true)}},
			Finalizers:      []string{kubelet}},
			Spec: corev1.PodSpec{SchedulerName: volcano.SchedulerName, TerminationGracePeriodSeconds: ptr.To[int64](70),
				Containers: []corev1.Container{{Name: "pytorch", Image: "train", Command: []string{"torchrun", "train.py"}}}}}
		env.MustCreate(t, p)
		if err := env.Clientset.CoreV1().Pods(ns).Bind(env.Ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns},
			Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cur, err := env.Clientset.CoreV1().Pods(ns).Get(env.Ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Phase = corev1.PodRunning
		cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		if cur, err = env.Clientset.CoreV1().Pods(ns).UpdateStatus(env.Ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, cur)
	}
	state := func() (ladder.State, *kueue.Workload) {
		var cur kueue.Workload
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(wl), &cur); err != nil {
			t.Fatal(err)
		}
		st, _ := preemption.PreemptionRecord(env.Ctx, env.Client, &cur)
		return st, &cur
	}
	// Nothing happens to a running gang.
	time.Sleep(2 * time.Second)
	if st, _ := state(); st.Phase != ladder.PhaseNone {
		t.Fatalf("running gang: preemption record %+v", st)
	}

	// Every Workload write is seen: with no training operator to report
	// the job active, Kueue releases the quota at once and re-admits the
	// workload (whose check then waits for the old ranks, or says Retry),
	// so the coordinator's Evicted condition may last milliseconds.
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(env.Ctx, &kueue.WorkloadList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	b.volcanoEvict(t, pods[2], disruptionTarget)
	want := preemption.ReasonPodDeleted
	if disruptionTarget {
		want = preemption.ReasonDisruptionTarget
	}
	var seen []string
	waitWatch(t, w, "the coordinator to evict the workload through Kueue", func(cur *kueue.Workload) bool {
		c := apimeta.FindStatusCondition(cur.Status.Conditions, kueue.WorkloadEvicted)
		if c == nil || cur.UID != wl.UID {
			return false
		}
		seen = append(seen, fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message))
		if c.Status == metav1.ConditionTrue && c.Reason != preemption.KueueEvictionReason {
			t.Fatalf("the workload was evicted by someone else first (%s/%s: %s); Evicted conditions seen: %q", c.Status, c.Reason, c.Message, seen)
		}
		return c.Status == metav1.ConditionTrue && strings.Contains(c.Message, want+" of pod "+pods[2].Name)
	})
	env.Eventually(t, 60*time.Second, "every rank asked", func() (bool, string) {
		st, _ := state()
		if st.Phase != ladder.PhaseCheckpointing || st.Reason != want || len(st.Ranks) != 4 {
			return false, fmt.Sprintf("record phase %q reason %q, %d ranks", st.Phase, st.Reason, len(st.Ranks))
		}
		for _, p := range pods {
			var cp corev1.Pod
			if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(p), &cp); err != nil || cp.Annotations[v1alpha1.AnnotationCheckpointRequest] == "" {
				return false, p.Name + " not asked yet"
			}
		}
		return true, ""
	})
	// Every rank's agent saves step 700 and reports it; the containers
	// stop once their pods are deleted.
	for _, p := range pods {
		raw := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"700"}}}`, v1alpha1.AnnotationCheckpointStep))
		if err := env.Client.Patch(env.Ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns}}, client.RawPatch(types.MergePatchType, raw)); err != nil {
			t.Fatal(err)
		}
	}
	env.Eventually(t, 90*time.Second, "ranks deleted, preemption Done with step 700 on the job", func() (bool, string) {
		left := 0
		for _, p := range pods {
			var cp corev1.Pod
			if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(p), &cp); err != nil {
				continue
			}
			left++
			if cp.DeletionTimestamp != nil && len(cp.Finalizers) > 0 {
				cp.Finalizers = nil
				_ = env.Client.Update(env.Ctx, &cp)
			}
		}
		st, _ := state()
		if st.Phase == ladder.PhaseDone {
			for uid, o := range st.Outcomes {
				if o != ladder.OutcomeSaved {
					t.Errorf("rank %s outcome %s, want Saved", uid, o)
				}
			}
		}
		// Done lasts only until Kueue re-admits the workload (the record is
		// then reset): its Event stays.
		var cur kftraining.PyTorchJob
		_ = env.Client.Get(env.Ctx, client.ObjectKeyFromObject(job), &cur)
		done := b.events(t, ns, wl.Name, preemption.EventDone)
		return left == 0 && done == 1 && cur.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint] == "700",
			fmt.Sprintf("record %q (outcomes %v), %d pods left, %d Done Events, job step %q", st.Phase, st.Outcomes, left, done, cur.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint])
	})
	if n := b.events(t, ns, wl.Name, preemption.EventEvictingWorkload); n != 1 {
		t.Errorf("%d %s Events on the workload, want 1", n, preemption.EventEvictingWorkload)
	}
}

// events counts the Events of one reason on an object of ns.
func (b *bridge) events(t *testing.T, ns, name, reason string) int {
	t.Helper()
	var evs corev1.EventList
	if err := b.env.Client.List(b.env.Ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			n++
		}
	}
	return n
}

func apimetaNodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
