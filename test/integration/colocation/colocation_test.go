package colocation

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// TestPodIntegration: a fractional Deployment through Kueue's pod
// integration is planned, pinned and bound; a tenant cannot steer a gated
// pod to a plan; Kueue may add the plan once, to a pod still gated by both.
func TestPodIntegration(t *testing.T) {
	c := startCluster(t, nil)
	env := c.env
	var planned []corev1.Pod

	t.Run("FractionalDeployment", func(t *testing.T) {
		labels := map[string]string{"app": "infer"}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "infer", Namespace: c.ns, Labels: map[string]string{placement.KueueQueueLabel: "lq"}},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
					Spec:       gpuPodSpec(1)}},
		}
		env.MustCreate(t, d)
		env.Eventually(t, 120*time.Second, "3 inference pods planned, pinned, ungated and bound", func() (bool, string) {
			var pods corev1.PodList
			_ = env.Client.List(env.Ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels(labels))
			planned = nil
			var states []string
			for _, p := range pods.Items {
				states = append(states, fmt.Sprintf("%s gates=%v plan=%q devices=%q node=%q", p.Name, gates(&p), p.Annotations[v1alpha1.AnnotationPlan], p.Annotations[v1alpha1.AnnotationDevices], p.Spec.NodeName))
				if len(p.Spec.SchedulingGates) == 0 && p.Annotations[v1alpha1.AnnotationPlan] != "" && p.Annotations[v1alpha1.AnnotationDevices] != "" && p.Spec.NodeName != "" {
					planned = append(planned, p)
				}
			}
			return len(planned) == 3, strings.Join(append(states, workloads(c)...), "; ")
		})
		for _, p := range planned {
			// Kueue counted the converted request, one Workload per pod.
			var wls kueue.WorkloadList
			_ = env.Client.List(env.Ctx, &wls, client.InNamespace(c.ns))
			var wl *kueue.Workload
			for i := range wls.Items {
				for _, o := range wls.Items[i].OwnerReferences {
					if o.UID == p.UID {
						wl = &wls.Items[i]
					}
				}
			}
			if wl == nil || !apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) {
				t.Fatalf("pod %s: no admitted Workload (%v)", p.Name, wl != nil)
			}
			q := wl.Spec.PodSets[0].Template.Spec.Containers[0].Resources.Requests[v1alpha1.ResourceGPUMemory]
			if q.Value() != 20480 {
				t.Errorf("pod %s: Workload requests %s %s, want 20480", p.Name, v1alpha1.ResourceGPUMemory, q.String())
			}
			// The plan binds this pod (by UID) to the GPUs it is pinned to.
			plan := &v1alpha1.GPUPlan{}
			if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: c.ns, Name: p.Annotations[v1alpha1.AnnotationPlan]}, plan); err != nil {
				t.Fatalf("pod %s: plan: %v", p.Name, err)
			}
			if len(plan.Status.Bindings) != 1 || plan.Status.Bindings[0].PodUID != p.UID {
				t.Errorf("pod %s: plan bindings %+v", p.Name, plan.Status.Bindings)
			}
			if want := placement.Devices(plan.Spec.Assignments[0]); p.Annotations[v1alpha1.AnnotationDevices] != want || p.Spec.NodeName != plan.Spec.Assignments[0].Node {
				t.Errorf("pod %s: devices %q on %s, plan says %q on %s", p.Name, p.Annotations[v1alpha1.AnnotationDevices], p.Spec.NodeName, want, plan.Spec.Assignments[0].Node)
			}
		}
	})

	t.Run("TenantCannotAddPlan", func(t *testing.T) {
		if len(planned) == 0 {
			t.Fatal("needs the Deployment's plans (subtest FractionalDeployment)")
		}
		victimPlan := planned[0].Annotations[v1alpha1.AnnotationPlan]
		// Eight GPUs on a four-GPU queue: Kueue never admits it, so it keeps both gates.
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "thief", Namespace: c.ns, Labels: map[string]string{placement.KueueQueueLabel: "lq"}}, Spec: gpuPodSpec(8)}
		if err := c.alice.Create(env.Ctx, p); err != nil {
			t.Fatal(err)
		}
		if g := strings.Join(gates(p), ","); !strings.Contains(g, v1alpha1.SchedulingGatePlacement) || !strings.Contains(g, placement.KueueAdmissionGate) {
			t.Fatalf("tenant's pod of the pod integration has gates %s, want Kueue's and gpupack's", g)
		}
		addPlan := func(cl client.Client, name, plan string) error {
			raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationPlan: plan}}})
			return cl.Patch(env.Ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}}, client.RawPatch(types.MergePatchType, raw))
		}
		err := addPlan(c.alice, "thief", victimPlan)
		if err == nil || !strings.Contains(err.Error(), "gpupack-placement") {
			t.Fatalf("tenant pointed its gated pod at plan %s: %v", victimPlan, err)
		}
		// Kueue may, once, while both gates are on (its podSetUpdates).
		kueueCl, err := client.New(env.UserConfig(t, framework.UserKueue, "system:masters"), client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		if err := addPlan(kueueCl, "thief", "thief-plan"); err != nil {
			t.Fatalf("Kueue adding the plan to a pod gated by both: %v", err)
		}
		if err := addPlan(kueueCl, "thief", victimPlan); err == nil || !strings.Contains(err.Error(), "gpupack-placement") {
			t.Fatalf("Kueue changed a pod's plan: %v", err)
		}
		// Not to a pod gpupack does not gate (a running one: the plan would never be applied).
		if err := addPlan(kueueCl, planned[1].Name, victimPlan); err == nil || !strings.Contains(err.Error(), "gpupack-placement") {
			t.Fatalf("Kueue changed the plan of an ungated pod: %v", err)
		}
		cpu := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: c.ns}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		env.MustCreate(t, cpu)
		if err := addPlan(kueueCl, "cpu", victimPlan); err == nil || !strings.Contains(err.Error(), "gpupack-placement") {
			t.Fatalf("Kueue added a plan to a pod without gpupack's gate: %v", err)
		}
	})

	// Kueue manages nothing in a namespace its managedJobsNamespaceSelector
	// leaves out: a pod there with a queue label is never gated, so a
	// whole-GPU one would run outside every quota. gpupack mirrors the
	// selector and holds such pods to the unmanaged-GPU policy.
	t.Run("NamespaceKueueDoesNotManage", func(t *testing.T) {
		env.MustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: unselectedNamespace}})
		env.MustCreate(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: unselectedNamespace},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}})
		env.MustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-pods", Namespace: unselectedNamespace},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pods"},
			Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}}})
		queued := func(ns, name string, spec corev1.PodSpec) *corev1.Pod {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{placement.KueueQueueLabel: "lq"}}, Spec: spec}
		}
		cpuSpec := corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}
		// Real Kueue: a queued CPU pod is gated in a selected namespace and
		// left alone in the other.
		inSelected, outside := queued(c.ns, "queued-cpu", cpuSpec), queued(unselectedNamespace, "queued-cpu", cpuSpec)
		for _, p := range []*corev1.Pod{inSelected, outside} {
			if err := c.alice.Create(env.Ctx, p); err != nil {
				t.Fatalf("queued CPU pod in %s: %v", p.Namespace, err)
			}
		}
		if g := strings.Join(gates(inSelected), ","); !strings.Contains(g, placement.KueueAdmissionGate) {
			t.Fatalf("queued pod in a namespace Kueue selects has gates %q, want Kueue's", g)
		}
		if g := gates(outside); len(g) != 0 {
			t.Fatalf("queued pod in %s has gates %v: Kueue manages it after all, the test proves nothing", unselectedNamespace, g)
		}
		// A tenant's queued whole-GPU pod there is refused, with the reason.
		err := c.alice.Create(env.Ctx, queued(unselectedNamespace, "greedy", gpuPodSpec(4)))
		if err == nil || !strings.Contains(err.Error(), "Kueue manages nothing in namespace "+unselectedNamespace) {
			t.Fatalf("whole-GPU pod with a queue label in a namespace Kueue does not manage: %v (want the unmanaged-GPU denial)", err)
		}
		// The same pod in a namespace Kueue selects is admitted, behind Kueue's gate
		// (eight GPUs on a four-GPU queue: Kueue never admits it).
		ok := queued(c.ns, "greedy", gpuPodSpec(8))
		if err := c.alice.Create(env.Ctx, ok); err != nil {
			t.Fatalf("queued whole-GPU pod in a namespace Kueue selects: %v", err)
		}
		for _, p := range []*corev1.Pod{inSelected, outside, ok} {
			_ = env.Client.Delete(env.Ctx, p)
		}
	})
}

// TestPreemptorOutsideTheCheckWaitsForItsVictims: Kueue admits a
// whole-GPU inference pod through a ClusterQueue without the gang-fit check
// (so without a plan) by preempting an opted-in training Job. The
// preemptor waits at gpupack's placement gate exactly while its victim is
// in the coordinator's Checkpointing and Terminating phases — an Event
// names the victim's Workload and its deadline — and is then ungated (not
// pinned) and bound. A GPU pod of another queue that nobody preempted for
// is placed at once, while that victim still checkpoints.
func TestPreemptorOutsideTheCheckWaitsForItsVictims(t *testing.T) {
	c := startCluster(t, func(mgr ctrl.Manager) error {
		return preemption.SetupWithManager(mgr, preemption.Options{Slack: 5 * time.Second})
	})
	env := c.env
	env.CreateNode(t, framework.MakeNode("gpu-node-b").GPUs(4, framework.H100).Obj())
	for name, v := range map[string]int32{"low": 100, "high": 1000} {
		env.MustCreate(t, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: v})
	}
	env.MustCreate(t, framework.MakeClusterQueue("plain").GPUFlavor("gpu", 4, framework.H100).
		Preemption(kueue.ClusterQueuePreemption{WithinClusterQueue: kueue.PreemptionPolicyLowerPriority}).Obj())
	env.MustCreate(t, framework.MakeLocalQueue("plain", c.ns, "plain"))
	env.MustCreate(t, framework.MakeClusterQueue("side").GPUFlavor("gpu", 4, framework.H100).Obj())
	env.MustCreate(t, framework.MakeLocalQueue("side", c.ns, "side"))

	queued := func(name, queue, priority string, gpus int64) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, Labels: map[string]string{placement.KueueQueueLabel: queue}}, Spec: gpuPodSpec(gpus)}
		p.Spec.PriorityClassName = priority
		p.Spec.Containers[0].Command = []string{"python", "serve.py"}
		return p
	}
	bound := func(p *corev1.Pod) (bool, string) {
		_ = env.Client.Get(env.Ctx, client.ObjectKeyFromObject(p), p)
		return p.Spec.NodeName != "" && len(p.Spec.SchedulingGates) == 0, fmt.Sprintf("%s: gates %v node %q; %v", p.Name, gates(p), p.Spec.NodeName, workloads(c))
	}

	// The victim: an opted-in training Job on all 4 GPUs of a node (Kueue's
	// job integration releases its quota as soon as the Job is suspended,
	// while its pods still checkpoint); a finalizer stands for its
	// container, still running after the pod is deleted.
	trainJob := framework.MakeJob("train", c.ns, "plain", 1, 4).
		TemplateAnnotation(v1alpha1.AnnotationCheckpoint, "true").
		TemplateAnnotation(v1alpha1.AnnotationCheckpointTimeout, "2m").
		TemplateAnnotation(mutation.AnnotationCheckpointDir, "/ckpt").Obj()
	trainJob.Spec.Template.Finalizers = []string{"test.gpupack.io/container-running"}
	trainJob.Spec.Template.Spec.PriorityClassName = "low"
	trainJob.Spec.Template.Spec.Containers[0].Command = []string{"python", "train.py"}
	env.MustCreate(t, trainJob)
	train := &corev1.Pod{}
	env.Eventually(t, 90*time.Second, "victim admitted, its pod bound", func() (bool, string) {
		var pods corev1.PodList
		_ = env.Client.List(env.Ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels{"batch.kubernetes.io/job-name": "train"})
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d pods; %v", len(pods.Items), workloads(c))
		}
		*train = pods.Items[0]
		return bound(train)
	})
	_ = env.Client.Get(env.Ctx, client.ObjectKeyFromObject(trainJob), trainJob)
	var trainWL *kueue.Workload
	{
		var wls kueue.WorkloadList
		_ = env.Client.List(env.Ctx, &wls, client.InNamespace(c.ns))
		for i := range wls.Items {
			for _, o := range wls.Items[i].OwnerReferences {
				if o.UID == trainJob.UID {
					trainWL = &wls.Items[i]
				}
			}
		}
	}
	if trainWL == nil {
		t.Fatal("victim has no Workload")
	}
	record := func() (ladder.State, *kueue.Workload) {
		wl := &kueue.Workload{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(trainWL), wl); err != nil {
			return ladder.State{}, trainWL
		}
		st, _ := preemption.PreemptionState(wl)
		return st, wl
	}

	// The preemptor: Kueue preempts the victim for it.
	infer := queued("infer", "plain", "high", 2)
	env.MustCreate(t, infer)
	event := func(pod, reason string, contains ...string) (bool, string) {
		var evs corev1.EventList
		_ = env.Client.List(env.Ctx, &evs, client.InNamespace(c.ns))
		var seen []string
		for _, e := range evs.Items {
			if e.InvolvedObject.Name != pod || e.Reason != reason {
				continue
			}
			seen = append(seen, e.Message)
			ok := true
			for _, s := range contains {
				ok = ok && strings.Contains(e.Message, s)
			}
			if ok {
				return true, ""
			}
		}
		st, _ := record()
		return false, fmt.Sprintf("%s events %q; victim phase %q; %v", reason, seen, st.Phase, workloads(c))
	}
	victimName := "workload " + c.ns + "/" + trainWL.Name
	env.Eventually(t, 90*time.Second, "preemptor waits for its checkpointing victim", func() (bool, string) {
		st, _ := record()
		if st.Phase != ladder.PhaseCheckpointing {
			return false, fmt.Sprintf("victim phase %q; %v", st.Phase, workloads(c))
		}
		return event("infer", placement.EventWaitingForRelease, victimName+" (Checkpointing, deadline "+st.CheckpointDeadline.UTC().Format(time.RFC3339))
	})
	stillHeld := func(when string) {
		t.Helper()
		_ = env.Client.Get(env.Ctx, client.ObjectKeyFromObject(infer), infer)
		if infer.Spec.NodeName != "" || strings.Join(gates(infer), ",") != v1alpha1.SchedulingGatePlacement {
			t.Fatalf("%s: preemptor gates %v node %q, want held at gpupack's gate only", when, gates(infer), infer.Spec.NodeName)
		}
	}
	stillHeld("victim checkpointing")

	// A pod of another queue, admitted without preempting anyone: not
	// held by the victim's checkpoint.
	web := queued("web", "side", "", 2)
	env.MustCreate(t, web)
	env.Eventually(t, 90*time.Second, "bystander placed while the victim checkpoints", func() (bool, string) {
		ok, msg := bound(web)
		_, evs := event("web", placement.EventWaitingForRelease, "never")
		var owners []string
		var wls kueue.WorkloadList
		_ = env.Client.List(env.Ctx, &wls, client.InNamespace(c.ns))
		for _, w := range wls.Items {
			owners = append(owners, fmt.Sprintf("%s uid %s owners %v", w.Name, w.UID, w.OwnerReferences))
		}
		return ok, fmt.Sprintf("%s; web uid %s; %s; workloads %v", msg, web.UID, evs, owners)
	})
	if st, _ := record(); st.Phase != ladder.PhaseCheckpointing {
		t.Fatalf("victim left Checkpointing (%q) before the bystander was placed: the test proves nothing", st.Phase)
	}
	stillHeld("victim checkpointing, bystander placed")

	// The victim's agent reports its checkpoint: Terminating while its
	// container still runs; the preemptor still waits.
	raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationCheckpointStep: "1200"}}})
	if err := env.Client.Patch(env.Ctx, train, client.RawPatch(types.MergePatchType, raw)); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 60*time.Second, "preemptor waits for its terminating victim", func() (bool, string) {
		st, _ := record()
		if st.Phase != ladder.PhaseTerminating {
			return false, fmt.Sprintf("victim phase %q", st.Phase)
		}
		return event("infer", placement.EventWaitingForRelease, victimName+" (Terminating, force delete after")
	})
	stillHeld("victim terminating")

	// The container stops, the pod goes: ungated without a pin, bound.
	if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(train), train); err != nil {
		t.Fatal(err)
	}
	if train.DeletionTimestamp == nil {
		t.Fatal("victim's pod not deleted in Terminating")
	}
	train.Finalizers = nil
	if err := env.Client.Update(env.Ctx, train); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 60*time.Second, "preemptor ungated", func() (bool, string) {
		return event("infer", placement.EventReleased, "no workload preempted for it holds GPUs")
	})
	env.Eventually(t, 60*time.Second, "preemptor bound", func() (bool, string) { return bound(infer) })
	if infer.Annotations[v1alpha1.AnnotationDevices] != "" || infer.Spec.Affinity != nil {
		t.Errorf("unplanned preemptor pinned: devices %q affinity %v", infer.Annotations[v1alpha1.AnnotationDevices], infer.Spec.Affinity)
	}
	if ok, msg := event("web", placement.EventWaitingForRelease); ok {
		t.Errorf("the bystander was held: %s", msg)
	}
}
