package security

// Outside review 14 (issue 14, finding 6, round 2): new angles on the
// plan-slot and quota promises, as a hostile tenant with `edit`, on the
// real apiserver with the shipped RBAC and policies. Each test asserts
// the promise; a failure starting "BROKEN" is the finding.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// kubeRayUser is KubeRay's operator (unmanagedGPUs.ownerControllers),
// which creates a RayCluster's pods from its group templates.
const kubeRayUser = "system:serviceaccount:ray-system:kuberay-operator"

// rayFrameworks mirror a Kueue that runs its Ray integrations.
var rayFrameworks = []string{"batch/job", "kubeflow.org/pytorchjob", "ray.io/rayjob", "ray.io/raycluster"}

// grantRay lets user create KubeRay's objects in ns, as KubeRay's chart
// (or a platform team running KubeRay) grants its tenants.
func grantRay(t *testing.T, c *cluster, ns, user string) {
	t.Helper()
	name := "ray-edit-" + user
	c.env.MustCreate(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"ray.io"}, Resources: []string{"rayjobs", "rayclusters"}, Verbs: []string{"*"}}}})
	c.env.MustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}})
}

// rayInstall applies what an installation with KubeRay adds: the
// manager's Ray roles (manifests/components/job-kinds/ray*), and pod
// create for KubeRay's operator (its own chart grants it). It returns
// KubeRay's operator as a client.
func rayInstall(t *testing.T, c *cluster) client.Client {
	t.Helper()
	env := c.env
	applyObjects(t, env, "manifests/components/job-kinds/raycluster/rbac.yaml", "manifests/components/job-kinds/rayjob/rbac.yaml")
	env.MustCreate(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kuberay-operator-pods"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"*"}}}})
	env.MustCreate(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kuberay-operator-pods"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kuberay-operator-pods"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "kuberay-operator", Namespace: "ray-system"}}})
	return c.as(t, kubeRayUser, []string{"system:serviceaccounts", "system:serviceaccounts:ray-system", "system:authenticated"}, nil)
}

// decoyRayJob is alice's own CPU-only RayJob (queued): the object her
// RayCluster names as its controller.
func decoyRayJob(ns, queue string) *ray.RayJob {
	tmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray", Image: "rayproject/ray",
		Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m")}}}}}
	return &ray.RayJob{
		ObjectMeta: metav1.ObjectMeta{Name: "decoy", Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": queue}},
		Spec: ray.RayJobSpec{SubmissionMode: ray.InteractiveMode, JobId: "decoy-job", ShutdownAfterJobFinishes: true,
			RayClusterSpec: &ray.RayClusterSpec{HeadGroupSpec: ray.HeadGroupSpec{RayStartParams: map[string]string{}, Template: tmpl}}},
	}
}

// alicesRayCluster: a RayCluster alice creates herself, controlled (she
// says) by ctl, whose group "worker" asks for worker's resources.
func alicesRayCluster(ns string, labels map[string]string, ctl metav1.OwnerReference, worker corev1.PodTemplateSpec) *ray.RayCluster {
	head := corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray", Image: "rayproject/ray"}}}}
	return &ray.RayCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "alices-rc", Namespace: ns, Labels: labels, OwnerReferences: []metav1.OwnerReference{ctl}},
		Spec: ray.RayClusterSpec{HeadGroupSpec: ray.HeadGroupSpec{RayStartParams: map[string]string{}, Template: head},
			WorkerGroupSpecs: []ray.WorkerGroupSpec{{GroupName: "worker", Replicas: ptr.To[int32](1), MinReplicas: ptr.To[int32](1), MaxReplicas: ptr.To[int32](1),
				RayStartParams: map[string]string{}, Template: worker}}},
	}
}

// kubeRaysWorkerPod is the worker pod KubeRay makes from rc's group
// "worker" (template labels and annotations, its own labels, rc as
// controller).
func kubeRaysWorkerPod(rc *ray.RayCluster, name string) *corev1.Pod {
	tm := rc.Spec.WorkerGroupSpecs[0].Template
	labels := map[string]string{"ray.io/node-type": "worker", "ray.io/group": "worker", "ray.io/cluster": rc.Name}
	for k, v := range tm.Labels {
		labels[k] = v
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rc.Namespace, Labels: labels, Annotations: tm.Annotations,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rc, ray.GroupVersion.WithKind("RayCluster"))}},
		Spec: *tm.Spec.DeepCopy()}
}

// TestForgedRayJobOwnerOfARayClusterTakesNoSlot (review 14, F1): the
// owner walk (owners.AncestorRefs) ends at the controller a RayCluster (or
// a JobSet, a Job) names, unread. alice's RayCluster names as its
// controller "RayJob decoy" (her own RayJob, which Kueue finds by name)
// with the UID of the victim's batch Job. Its template carries the
// victim's plan: here because the cluster served RayClusters before
// gpupack's RayCluster entry existed (--job-kinds=auto picks up a CRD at
// the manager's next start; a re-applied static manifest or a --job-kinds
// list without RayCluster does the same). KubeRay (trusted) makes the
// worker pod. Defences: the pod webhook takes the RayCluster as Kueue
// does, as the child of the RayJob it names (not managed by its own queue
// label), and refuses the pod since that RayJob is another object; the
// ungater matches the Workload's owner on group, kind, name and UID
// (owners.Belongs), never on a bare UID — TestForgedRayJobOwnerAddedLater
// attacks that one alone.
func TestForgedRayJobOwnerOfARayClusterTakesNoSlot(t *testing.T) {
	c := startClusterCfg(t, framework.Options{NoKueue: true, OperatorCRDs: true}, nil,
		webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: rayFrameworks}})
	env, ctx := c.env, c.env.Ctx
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	kuberay := rayInstall(t, c)
	c.startUngater(t)
	ns := c.open
	grantRay(t, c, ns, "alice")
	const plan = "victim"
	victimJob, err := c.alice.(*throughJob).jobOf(ctx, ns, plan)
	if err != nil {
		t.Fatal(err)
	}
	c.createPlan(t, gangPlan(ns, plan, []string{"GPU-victim-0"}))

	decoy := decoyRayJob(ns, "gpu")
	if err := c.aliceSelf.Create(ctx, decoy); err != nil {
		t.Fatalf("alice's decoy RayJob: %v", err)
	}
	forged := metav1.OwnerReference{APIVersion: "ray.io/v1", Kind: "RayJob", Name: decoy.Name, UID: victimJob.UID, Controller: ptr.To(true)}
	w := gpuPod(ns, "x")
	w.Annotations[v1alpha1.AnnotationPlan] = plan
	rc := alicesRayCluster(ns, map[string]string{"kueue.x-k8s.io/queue-name": "gpu"}, forged,
		corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: w.Annotations}, Spec: w.Spec})
	if err := c.aliceSelf.Create(ctx, rc); err != nil {
		t.Logf("alice's RayCluster refused (held): %v", err)
		return
	}
	pod := kubeRaysWorkerPod(rc, "alices-rc-worker-0")
	if err := kuberay.Create(ctx, pod); err != nil {
		t.Logf("KubeRay's worker pod with the victim's plan refused (held): %v", err)
		return
	}
	notPlaced(t, c, pod, "GPU-victim-0:4096", 20*time.Second)
	pl := &v1alpha1.GPUPlan{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: plan}, pl); err == nil {
		for _, b := range pl.Status.Bindings {
			if b.PodUID == pod.UID {
				t.Errorf("BROKEN: the victim's plan binds alice's pod: %+v", b)
			}
		}
	}
}

// TestForgedRayJobOwnerAddedLaterTakesNoSlot attacks the ungater's rule
// alone (owners.Belongs, review 14 F1), under churn: alice's RayCluster,
// queue-labelled and with no controller when KubeRay makes its worker pod
// (so the pod webhook takes it as managed by its own label), then gets
// the controller reference "RayJob decoy" with the victim Job's UID, and
// alice touches her pod so that the ungater looks again. The pod's
// lineage then ends in that reference: its UID is the victim Workload's
// owner's, its group, kind and name are not.
func TestForgedRayJobOwnerAddedLaterTakesNoSlot(t *testing.T) {
	c := startClusterCfg(t, framework.Options{NoKueue: true, OperatorCRDs: true}, nil,
		webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: rayFrameworks}})
	env, ctx := c.env, c.env.Ctx
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	kuberay := rayInstall(t, c)
	c.startUngater(t)
	ns := c.open
	grantRay(t, c, ns, "alice")
	const plan = "victim"
	victimJob, err := c.alice.(*throughJob).jobOf(ctx, ns, plan)
	if err != nil {
		t.Fatal(err)
	}
	c.createPlan(t, gangPlan(ns, plan, []string{"GPU-victim-0"}))
	decoy := decoyRayJob(ns, "gpu")
	if err := c.aliceSelf.Create(ctx, decoy); err != nil {
		t.Fatalf("alice's decoy RayJob: %v", err)
	}
	w := gpuPod(ns, "x")
	w.Annotations[v1alpha1.AnnotationPlan] = plan
	rc := alicesRayCluster(ns, map[string]string{"kueue.x-k8s.io/queue-name": "gpu"}, metav1.OwnerReference{},
		corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: w.Annotations}, Spec: w.Spec})
	rc.OwnerReferences = nil
	if err := c.aliceSelf.Create(ctx, rc); err != nil {
		t.Fatalf("alice's RayCluster: %v", err)
	}
	pod := kubeRaysWorkerPod(rc, "alices-rc-worker-0")
	if err := kuberay.Create(ctx, pod); err != nil {
		t.Fatalf("KubeRay's worker pod of a queue-labelled RayCluster: %v", err)
	}
	forged := metav1.OwnerReference{APIVersion: "ray.io/v1", Kind: "RayJob", Name: decoy.Name, UID: victimJob.UID, Controller: ptr.To(true)}
	cur := &ray.RayCluster{}
	if err := c.aliceSelf.Get(ctx, client.ObjectKeyFromObject(rc), cur); err != nil {
		t.Fatal(err)
	}
	cur.OwnerReferences = []metav1.OwnerReference{forged}
	// The policy gpupack-job-plan refuses this (a planned RayCluster's
	// owners are frozen): that layer is checked in jobplan_test.go. To
	// attack the ungater alone, its binding goes first.
	if err := c.aliceSelf.Update(ctx, cur.DeepCopy()); err == nil || !strings.Contains(err.Error(), "gpupack-job-plan") {
		t.Errorf("alice's owner change on her planned RayCluster: err %v, want gpupack-job-plan's denial", err)
	}
	if err := env.Client.Delete(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "gpupack-job-plan"}}); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "the owner change once gpupack-job-plan is unbound", func() (bool, string) {
		if err := c.aliceSelf.Get(ctx, client.ObjectKeyFromObject(rc), cur); err != nil {
			return false, err.Error()
		}
		cur.OwnerReferences = []metav1.OwnerReference{forged}
		err := c.aliceSelf.Update(ctx, cur)
		return err == nil, fmt.Sprint(err)
	})
	p := &corev1.Pod{}
	if err := c.aliceSelf.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
		t.Fatal(err)
	}
	// An annotation of her own (a planned pod's labels are frozen:
	// review 11 F2) wakes the ungater.
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations["touch"] = "1"
	if err := c.aliceSelf.Update(ctx, p); err != nil {
		t.Fatalf("alice touching her pod: %v", err)
	}
	notPlaced(t, c, pod, "GPU-victim-0:4096", 20*time.Second)
	pl := &v1alpha1.GPUPlan{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: plan}, pl); err == nil {
		for _, b := range pl.Status.Bindings {
			if b.PodUID == pod.UID {
				t.Errorf("BROKEN: the victim's plan binds alice's pod: %+v", b)
			}
		}
	}
}

// startKueueCluster is the security suite's control plane with the real
// Kueue of fw, gpupack's webhooks mirroring it (entries for kinds), a
// ResourceFlavor "gpu" and a ClusterQueue "cq" with gpus GPUs (and the
// gang-fit check when check), LocalQueue "lq" in c.open.
func startKueueCluster(t *testing.T, fw framework.Options, check bool, gpus int64, kinds ...string) *cluster {
	t.Helper()
	c := startClusterCfg(t, fw, kinds, webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: fw.KueueFrameworks()}})
	env := c.env
	cq := framework.MakeClusterQueue("cq").GPUFlavor("gpu", gpus, framework.H100)
	if check {
		env.StartManager(t, func(mgr ctrl.Manager) error { return admissioncheck.Setup(mgr, admissioncheck.Options{}) })
		env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gang-fit"},
			Spec: v1alpha1.GangFitParametersSpec{RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](5)}}})
		env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gang-fit"))
		env.WaitForAdmissionCheckActive(t, "gang-fit")
		cq = cq.AdmissionChecks("gang-fit")
	}
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, cq.Obj())
	env.MustCreate(t, framework.MakeLocalQueue("lq", c.open, "cq"))
	return c
}

func wlAdmitted(wl *kueue.Workload) bool {
	return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted)
}

// TestTenantRayClusterUnderHerRayJobRunsNothingOutsideQuota (review 14,
// F2): alice makes a RayCluster herself, controlled by her own tiny CPU
// RayJob that Kueue admitted. Kueue v0.17 takes the RayCluster as that
// RayJob's child (FindAncestorJobManagedByKueue): it does not suspend it
// and never makes a Workload for it, and its pods are not Kueue's pod
// integration's. Were KubeRay's worker pod credited to the admitted
// RayJob, it would run with more whole GPUs than the ClusterQueue has.
// Defence: a RayCluster (as a RayJob, an MPIJob, a JobSet) meets the
// unmanaged-GPU policy at its own creation — under a Kueue-managed owner
// only a trusted controller may create it — and the pod walk passes a
// RayCluster up to its RayJob only where that check runs. (Real Kueue;
// KubeRay's pod create is made as its account, as the suite does for the
// Job controller.)
func TestTenantRayClusterUnderHerRayJobRunsNothingOutsideQuota(t *testing.T) {
	c := startKueueCluster(t, framework.Options{RayMPI: true}, false, 1, webhooks.KindRayJob, webhooks.KindRayCluster)
	env, ctx := c.env, c.env.Ctx
	ns := c.open
	kuberay := rayInstall(t, c)
	grantRay(t, c, ns, "alice")
	decoy := decoyRayJob(ns, "lq")
	if err := c.aliceSelf.Create(ctx, decoy); err != nil {
		t.Fatalf("alice's CPU RayJob: %v", err)
	}
	env.WaitForWorkloadOf(t, ns, decoy.Name, "RayJob", wlAdmitted)

	w := wholeGPUPod(ns, "x", "4") // the ClusterQueue has 1 GPU
	rc := alicesRayCluster(ns, nil, *metav1.NewControllerRef(decoy, ray.GroupVersion.WithKind("RayJob")), corev1.PodTemplateSpec{Spec: w.Spec})
	if err := c.aliceSelf.Create(ctx, rc); err != nil {
		t.Logf("alice's RayCluster under her RayJob refused (held): %v", err)
		return
	}
	// Kueue leaves it alone: no suspension, no Workload of its own.
	time.Sleep(5 * time.Second)
	cur := &ray.RayCluster{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(rc), cur); err != nil {
		t.Fatal(err)
	}
	own, _ := env.WorkloadOf(ns, rc.Name, "RayCluster")
	t.Logf("Kueue: RayCluster suspend=%v, own Workload %v", ptr.Deref(cur.Spec.Suspend, false), own != nil)
	if ptr.Deref(cur.Spec.Suspend, false) || own != nil {
		t.Logf("Kueue suspends or counts alice's RayCluster (held)")
		return
	}
	pod := kubeRaysWorkerPod(cur, "alices-rc-worker-0")
	if err := kuberay.Create(ctx, pod); err != nil {
		t.Logf("KubeRay's 4-GPU worker pod refused (held): %v", err)
		return
	}
	var gates []string
	for _, g := range pod.Spec.SchedulingGates {
		gates = append(gates, g.Name)
	}
	var wls kueue.WorkloadList
	_ = env.Client.List(ctx, &wls, client.InNamespace(ns))
	var counted []string
	for i := range wls.Items {
		for _, ps := range wls.Items[i].Spec.PodSets {
			for _, ct := range ps.Template.Spec.Containers {
				if q, ok := ct.Resources.Limits[v1alpha1.ResourceNvidiaGPU]; ok {
					counted = append(counted, fmt.Sprintf("%s/%s: %s", wls.Items[i].Name, ps.Name, q.String()))
				}
			}
		}
	}
	t.Errorf("BROKEN: KubeRay's worker pod of alice's own RayCluster admitted with %s nvidia.com/gpu on a ClusterQueue of 1, gates %v; GPUs counted by Kueue: %v",
		pod.Spec.Containers[0].Resources.Limits.Name(v1alpha1.ResourceNvidiaGPU, "").String(), gates, counted)
}

// TestPodGroupJoinByAnotherUserTakesNoSlot (review 14 F3): Kueue makes
// every pod labelled with a plain pod group's name an owner of the group's
// Workload. Alice (edit in the namespace) creates her own pod with bob's
// group label, total count and role hash: Kueue counts it in bob's group,
// admits the group and gang-fit plans it — and were the pods' ownership of
// the Workload enough, the ungater would pin her pod (image alice/miner)
// to a slot of bob's plan. Defence: the pod webhook stamps each pod-group
// pod with its creator (gpupack.io/created-by, frozen by
// gpupack-placement) and the ungater places a member only when the
// group's members' stamps agree (owners.GroupSlot): no pod of the mixed
// group is placed, and an Event says why. Control: a group whose members
// are all bob's is placed.
func TestPodGroupJoinByAnotherUserTakesNoSlot(t *testing.T) {
	c := startKueueCluster(t, framework.Options{PodIntegration: true}, true, 4)
	env, ctx := c.env, c.env.Ctx
	ns := c.open
	env.CreateNode(t, framework.MakeNode("gpu-node-a").GPUs(4, framework.H100).Obj())
	c.startUngater(t)
	bob := c.bob(t, ns)
	member := func(group, name, image string, by client.Client, roleHash string, forged ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": group},
			Annotations: map[string]string{"kueue.x-k8s.io/pod-group-total-count": "2", v1alpha1.AnnotationGPUMemory: "4Gi"}},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{flavors.LabelGPUProduct: h100}, Tolerations: []corev1.Toleration{framework.KwokToleration},
				Containers: []corev1.Container{{Name: "c", Image: image, Command: []string{"run"},
					Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, "1")}}}}}
		if roleHash != "" {
			p.Annotations["kueue.x-k8s.io/role-hash"] = roleHash
		}
		for _, f := range forged {
			p.Annotations[v1alpha1.AnnotationCreatedBy] = f
		}
		if err := by.Create(ctx, p); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		return p
	}
	placed := func(name string) string {
		cur := &corev1.Pod{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cur); err == nil && !hasGate(cur) && cur.Annotations[v1alpha1.AnnotationDevices] != "" {
			return cur.Annotations[v1alpha1.AnnotationPlan] + " " + cur.Annotations[v1alpha1.AnnotationDevices]
		}
		return ""
	}
	state := func() string {
		var pods corev1.PodList
		_ = env.Client.List(ctx, &pods, client.InNamespace(ns))
		var out []string
		for _, p := range pods.Items {
			var gs []string
			for _, g := range p.Spec.SchedulingGates {
				gs = append(gs, g.Name)
			}
			out = append(out, fmt.Sprintf("%s gates=%v plan=%q devices=%q created-by=%q", p.Name, gs, p.Annotations[v1alpha1.AnnotationPlan], p.Annotations[v1alpha1.AnnotationDevices], p.Annotations[v1alpha1.AnnotationCreatedBy]))
		}
		var wls kueue.WorkloadList
		_ = env.Client.List(ctx, &wls, client.InNamespace(ns))
		for i := range wls.Items {
			out = append(out, framework.DescribeWorkload(&wls.Items[i]))
		}
		return strings.Join(out, "; ")
	}

	v0 := member("vgroup", "bob-0", "bob/trainer", bob, "")
	hash := v0.Annotations["kueue.x-k8s.io/role-hash"]
	if hash == "" {
		t.Fatalf("Kueue gave bob's pod no role hash: %v", v0.Annotations)
	}
	if got := v0.Annotations[v1alpha1.AnnotationCreatedBy]; got != "bob" {
		t.Errorf("bob's pod stamped %q, want bob", got)
	}
	// Alice writes bob's name as her pod's creator: the pod webhook
	// replaces it with hers.
	thief := member("vgroup", "thief", "alice/miner", c.aliceSelf, hash, "bob")
	if got := thief.Annotations[v1alpha1.AnnotationCreatedBy]; got != "alice" {
		t.Errorf("BROKEN: alice's pod stored with gpupack.io/created-by %q, want alice (the pod webhook's)", got)
	}
	// Control: bob's own group of two.
	member("bgroup", "bob-a", "bob/trainer", bob, "")
	member("bgroup", "bob-b", "bob/trainer", bob, "")

	// The ungater reaches its decision on the mixed group (an Event on
	// alice's pod), and bob's own group is placed.
	var why string
	env.Eventually(t, 90*time.Second, "the ungater's verdict on the mixed group, and bob's own group placed", func() (bool, string) {
		if p := placed("thief"); p != "" {
			t.Fatalf("BROKEN: alice's pod (image alice/miner) placed on a slot of bob's group's plan: %s; %s", p, state())
		}
		var evs corev1.EventList
		_ = env.Client.List(ctx, &evs, client.InNamespace(ns))
		why = ""
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "thief" && e.Reason == placement.EventGroupCreatorsDiffer {
				why = e.Message
			}
		}
		return why != "" && placed("bob-a") != "" && placed("bob-b") != "", state()
	})
	for _, want := range []string{"vgroup", `thief (created by "alice")`, `bob-0 (created by "bob")`} {
		if !strings.Contains(why, want) {
			t.Errorf("Event %q lacks %q", why, want)
		}
	}
	// And it stays so: no pod of the mixed group is placed, alice's
	// least of all; bob's is not pinned to her benefit either.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if p := placed("thief"); p != "" {
			t.Fatalf("BROKEN: alice's pod placed on a slot of bob's group's plan: %s; %s", p, state())
		}
		if p := placed("bob-0"); p != "" {
			t.Fatalf("BROKEN: bob's pod of the group alice joined placed (its group's slots then go to alice's pod too): %s; %s", p, state())
		}
	}
	t.Logf("held: %s", why)
}

// bob is a second tenant with edit in ns.
func (c *cluster) bob(t *testing.T, ns string) client.Client {
	t.Helper()
	c.env.MustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob-edit", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "bob"}}})
	bob, err := client.New(c.env.UserConfig(t, "bob"), client.Options{Scheme: c.env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return bob
}

// TestPodGroupCreatorStampForgedOrChanged (review 14 F3): the creator
// stamp is trusted only because policy gpupack-placement makes it true —
// at creation a present gpupack.io/created-by must be the requester's
// name (a CPU pod skips the pod webhook, which would otherwise overwrite
// it), and on an existing pod nobody, gpupack's manager included, adds,
// changes or removes it.
func TestPodGroupCreatorStampForgedOrChanged(t *testing.T) {
	c := startCluster(t)
	c.waitForPolicies(t)
	env, ctx := c.env, c.env.Ctx
	ns := c.open
	groupPod := func(name string, ann map[string]string) *corev1.Pod {
		p := cpuPod(ns, name)
		p.Labels = map[string]string{"kueue.x-k8s.io/pod-group-name": "vgroup"}
		p.Annotations = ann
		return p
	}
	const stampRule = "the annotation gpupack.io/created-by names the user who creates the pod: it must be alice"
	denied(t, "alice creating a pod stamped as bob's", c.aliceSelf.Create(ctx, groupPod("forged", map[string]string{v1alpha1.AnnotationCreatedBy: "bob"})), stampRule)
	denied(t, "alice creating a pod stamped empty", c.aliceSelf.Create(ctx, groupPod("empty", map[string]string{v1alpha1.AnnotationCreatedBy: ""})), stampRule)
	// (A GPU pod meets the pod webhook, which writes the true creator
	// over a forged one: TestPodGroupJoinByAnotherUserTakesNoSlot.)

	own := groupPod("own", map[string]string{v1alpha1.AnnotationCreatedBy: "alice"})
	if err := c.aliceSelf.Create(ctx, own); err != nil {
		t.Fatalf("alice's pod with her own stamp: %v", err)
	}
	bare := groupPod("bare", nil)
	if err := c.aliceSelf.Create(ctx, bare); err != nil {
		t.Fatalf("alice's pod with no stamp: %v", err)
	}
	const frozen = "the annotation gpupack.io/created-by cannot be added, changed or removed on an existing pod"
	edit := func(by client.Client, name string, f func(map[string]string)) error {
		cur := &corev1.Pod{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cur); err != nil {
			t.Fatal(err)
		}
		old := cur.DeepCopy()
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		f(cur.Annotations)
		return by.Patch(ctx, cur, client.MergeFrom(old))
	}
	// The manager's writes meet two policies that refuse them, and the
	// apiserver reports whichever it evaluated first: gpupack-placement's
	// stamp rule or gpupack-manager-pod-writes' list of the annotations the
	// manager may touch (which leaves the stamp out). Either holds.
	const managerOnly = "gpupack-manager may change only the annotations"
	for _, who := range []struct {
		name string
		cl   client.Client
	}{{"alice", c.aliceSelf}, {"gpupack's manager", c.manager(t)}} {
		check := func(what string, err error) {
			t.Helper()
			if who.name != "alice" && err != nil && strings.Contains(err.Error(), managerOnly) {
				return
			}
			denied(t, what, err, frozen)
		}
		check(who.name+" changing the stamp to bob", edit(who.cl, "own", func(a map[string]string) { a[v1alpha1.AnnotationCreatedBy] = "bob" }))
		check(who.name+" removing the stamp", edit(who.cl, "own", func(a map[string]string) { delete(a, v1alpha1.AnnotationCreatedBy) }))
		check(who.name+" adding a stamp", edit(who.cl, "bare", func(a map[string]string) { a[v1alpha1.AnnotationCreatedBy] = "alice" }))
	}
	// Through pods/status too (it takes metadata).
	cur := &corev1.Pod{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "own"}, cur); err != nil {
		t.Fatal(err)
	}
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[v1alpha1.AnnotationCreatedBy] = "bob"
	denied(t, "an admin changing the stamp through pods/status", env.Client.Status().Update(ctx, cur), frozen)
}
