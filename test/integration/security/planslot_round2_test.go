package security

// Issue 14 finding 6, round 2: the attacks an outside review made on the
// plan-slot defences of round 1 (owners.Belongs, the plan-creator check),
// each as a hostile tenant on the real apiserver. Each must be refused at
// its first step; where a step is (wrongly) admitted the test goes on
// through the attack's chain and checks the slot and the GPU stay the
// victim's.

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/owners"
	"github.com/gpupack/gpupack/webhooks/placement"
)

func waitForEvent(t *testing.T, c *cluster, ns, pod, reason string) {
	t.Helper()
	env, ctx := c.env, c.env.Ctx
	env.Eventually(t, 40*time.Second, reason+" on "+pod, func() (bool, string) {
		evs, err := env.Clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == reason {
				return true, e.Message
			}
		}
		return false, strings.Join(seen, "; ")
	})
}

func waitPlaced(t *testing.T, c *cluster, p *corev1.Pod, devices string) {
	t.Helper()
	env, ctx := c.env, c.env.Ctx
	env.Eventually(t, 60*time.Second, p.Name+" placed on "+devices, func() (bool, string) {
		cur := &corev1.Pod{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
			return false, err.Error()
		}
		return !hasGate(cur) && cur.Annotations[v1alpha1.AnnotationDevices] == devices, "gated " + boolS(hasGate(cur)) + " devices " + cur.Annotations[v1alpha1.AnnotationDevices]
	})
}

func boolS(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// notPlaced fails if p is placed on devices within d.
func notPlaced(t *testing.T, c *cluster, p *corev1.Pod, devices string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		cur := &corev1.Pod{}
		if err := c.env.Client.Get(c.env.Ctx, client.ObjectKeyFromObject(p), cur); err == nil && !hasGate(cur) && cur.Annotations[v1alpha1.AnnotationDevices] == devices {
			t.Errorf("BROKEN: alice's pod %s placed on the victim's slot %s", p.Name, devices)
			return
		}
		time.Sleep(time.Second)
	}
}

// alicesJob is alice's own suspended CPU-only Job (no GPU, no queue: no
// gpupack webhook judges it), with owners.
func alicesJob(t *testing.T, c *cluster, ns, name string, refs ...metav1.OwnerReference) *batchv1.Job {
	t.Helper()
	own := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, OwnerReferences: refs},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
	if err := c.aliceSelf.Create(c.env.Ctx, own); err != nil {
		t.Fatalf("alice's suspended Job: %v", err)
	}
	return own
}

// templatePlan is a merge patch putting plan (and labels) into a Job's
// pod template.
func templatePlan(plan string, labels map[string]string) client.Patch {
	meta := map[string]any{"annotations": map[string]string{v1alpha1.AnnotationPlan: plan}}
	if labels != nil {
		meta["labels"] = labels
	}
	return mergePatch(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": meta}}})
}

// jobControllersPod is the pod the Job controller makes from j's template.
func jobControllersPod(j *batchv1.Job, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: j.Namespace, Labels: j.Spec.Template.Labels, Annotations: j.Spec.Template.Annotations,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))}},
		Spec: *j.Spec.Template.Spec.DeepCopy()}
}

func controllerRefTo(j *batchv1.Job) metav1.OwnerReference {
	ref := *metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))
	ref.BlockOwnerDeletion = nil
	return ref
}

// squatter: the pod of alice's own queued Job (made by the Job controller,
// so the creation check passes) naming the victim's plan, refused by the
// ungater (PlanNotForThisPod); the victim's plan and Job.
func squatter(t *testing.T, c *cluster, ns, plan string, gpu string) (*corev1.Pod, *batchv1.Job) {
	t.Helper()
	ctx := c.env.Ctx
	victimJob, err := c.alice.(*throughJob).jobOf(ctx, ns, plan)
	if err != nil {
		t.Fatal(err)
	}
	squat := alicesGroupPod(t, c, ns, plan, nil)
	c.createPlan(t, gangPlan(ns, plan, []string{gpu}))
	waitForEvent(t, c, ns, "squat", placement.EventPlanNotForPod)
	return squat, victimJob
}

// TestPlannedPodOwnerRefSwapRefused (review: alice patched her planned
// pod's controller reference to the victim's Job and the ungater bound it
// to the victim's slot): the gpupack-placement policy refuses any change
// of a planned pod's owner references, with or without the victim Job's
// selector labels, or a second owner; the pod stays gated, so the
// kubelet's Allocate (which handed alice the victim's GPU in the review)
// never serves it a slot. The garbage collector may still remove them.
func TestPlannedPodOwnerRefSwapRefused(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	c.startUngater(t)
	ns := c.open
	squat, victimJob := squatter(t, c, ns, "victim", "GPU-victim-0")
	ref := controllerRefTo(victimJob)
	err := c.aliceSelf.Patch(ctx, squat, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{ref}}}))
	denied(t, "alice swapping her planned pod's controller to the victim's Job", err, "gpupack-placement")
	err = c.aliceSelf.Patch(ctx, squat, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{ref},
		"labels": map[string]string{"batch.kubernetes.io/controller-uid": string(victimJob.UID), "controller-uid": string(victimJob.UID), "job-name": victimJob.Name, "batch.kubernetes.io/job-name": victimJob.Name}}}))
	denied(t, "the same with the victim Job's selector labels", err, "gpupack-placement")
	second := ref
	second.Controller = nil
	err = c.aliceSelf.Patch(ctx, squat, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": append(squat.OwnerReferences, second)}}))
	denied(t, "alice adding the victim's Job as a second owner", err, "gpupack-placement")
	notPlaced(t, c, squat, "GPU-victim-0:4096", 5*time.Second)

	// The garbage collector removes a reference to a gone owner.
	gc := c.as(t, "system:serviceaccount:kube-system:generic-garbage-collector", []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, nil)
	if err := gc.Patch(ctx, squat, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{}}})); err != nil {
		t.Errorf("the garbage collector removing the planned pod's owner reference: %v", err)
	}
}

// TestPodGroupLabelRefused (review: alice labelled her planned pod with
// the victim pod group's name and took the group's slot): the label of a
// planned pod cannot change.
func TestPodGroupLabelRefused(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	c.startUngater(t)
	ns := c.open
	const group = "vgroup"
	victimGroup(t, c, ns, group)
	squat := alicesGroupPod(t, c, ns, group, nil)
	waitForEvent(t, c, ns, "squat", placement.EventPlanNotForPod)
	err := c.aliceSelf.Patch(ctx, squat, mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{owners.LabelPodGroup: group}}}))
	denied(t, "alice labelling her planned pod with the victim's pod group", err, "gpupack-placement")
	notPlaced(t, c, squat, "GPU-victim-0:4096", 5*time.Second)
}

// alicesGroupPod: the Job controller's pod of alice's queued Job, naming
// plan group, with labels added.
func alicesGroupPod(t *testing.T, c *cluster, ns, group string, labels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := c.env.Ctx
	own := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "alices", Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "gpu"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
	if err := c.aliceSelf.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	squat := gangPod(ns, "squat", group, 0)
	for k, v := range labels {
		squat.Labels[k] = v
	}
	squat.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(own, batchv1.SchemeGroupVersion.WithKind("Job"))}
	if err := c.alice.(*throughJob).controller.Create(ctx, squat); err != nil {
		t.Fatalf("job controller creating alice's pod: %v", err)
	}
	return squat
}

// victimGroup: a Kueue pod group's Workload (named after the group, owned
// by its member pod without a controller reference) and its plan.
func victimGroup(t *testing.T, c *cluster, ns, group string) *kueue.Workload {
	t.Helper()
	env := c.env
	vp := cpuPod(ns, group+"-member")
	vp.Labels = map[string]string{owners.LabelPodGroup: group}
	env.MustCreate(t, vp)
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: group, Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: vp.Name, UID: vp.UID}}},
		Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{Name: "worker", Count: 1, Template: corev1.PodTemplateSpec{Spec: vp.Spec}}}}}
	env.MustCreate(t, wl)
	pl := gangPlan(ns, group, []string{"GPU-victim-0"})
	pl.Spec.WorkloadUID = wl.UID
	env.MustCreate(t, pl)
	return wl
}

// TestPodGroupLabelIsNoMembership: a pod of alice's queued Job created (by
// the Job controller) with the victim group's plan and pod-group label is
// not a member: Kueue has not made it an owner of the group's Workload, so
// the ungater leaves it gated (owners.Belongs).
func TestPodGroupLabelIsNoMembership(t *testing.T) {
	c := startCluster(t)
	env := c.env
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	c.startUngater(t)
	ns := c.open
	const group = "vgroup"
	victimGroup(t, c, ns, group)
	squat := alicesGroupPod(t, c, ns, group, map[string]string{owners.LabelPodGroup: group})
	waitForEvent(t, c, ns, "squat", placement.EventPlanNotForPod)
	notPlaced(t, c, squat, "GPU-victim-0:4096", 5*time.Second)
}

// TestForgedJobOwnerRefused (review: alice's CPU-only suspended Job,
// created with a controller reference to the victim's Job, got the
// victim's plan in its template by an update; the Job controller's pod
// took the victim's slot): the gpupack-job-plan policy refuses the plan
// update, and owners' walk does not step from a Job to a Job.
func TestForgedJobOwnerRefused(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	c.startUngater(t)
	ns := c.open
	const plan = "victim"
	victimJob, err := c.alice.(*throughJob).jobOf(ctx, ns, plan)
	if err != nil {
		t.Fatal(err)
	}
	own := alicesJob(t, c, ns, "alices", controllerRefTo(victimJob))
	labels := map[string]string{"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}
	err = c.aliceSelf.Patch(ctx, own, templatePlan(plan, labels))
	denied(t, "alice adding the victim's plan to her Job's template", err, "gpupack-job-plan")
	if err != nil {
		return
	}
	// Admitted (the policy off): the rest of the chain must still fail.
	if err := c.aliceSelf.Patch(ctx, own, mergePatch(map[string]any{"spec": map[string]any{"suspend": false}})); err != nil {
		t.Fatalf("unsuspend: %v", err)
	}
	pod := jobControllersPod(own, "squat")
	if err := c.alice.(*throughJob).controller.Create(ctx, pod); err != nil {
		t.Logf("the Job controller's planned pod refused: %v", err)
		return
	}
	c.createPlan(t, gangPlan(ns, plan, []string{"GPU-victim-0"}))
	notPlaced(t, c, pod, "GPU-victim-0:4096", 20*time.Second)
}

// TestGPUJobUpdatesRefused (review: on alice's queued, suspended GPU Job
// an update added the victim's plan to the template, another a controller
// reference to the victim's Job): both refused, and so is such a Job
// created with that reference.
func TestGPUJobUpdatesRefused(t *testing.T) {
	c := startCluster(t)
	ctx := c.env.Ctx
	ns := c.open
	victimJob, err := c.alice.(*throughJob).jobOf(ctx, ns, "victim")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := gpuPod(ns, "x")
	delete(tmpl.Annotations, v1alpha1.AnnotationPlan)
	own := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "alices-gpu", Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "gpu"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: tmpl.Annotations}, Spec: tmpl.Spec}}}
	own.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	if err := c.aliceSelf.Create(ctx, own); err != nil {
		t.Fatalf("alice's queued GPU Job: %v", err)
	}
	denied(t, "the victim's plan into alice's GPU Job's template", c.aliceSelf.Patch(ctx, own, templatePlan("victim", nil)), "gpupack-job-plan")
	err = c.aliceSelf.Patch(ctx, own, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{controllerRefTo(victimJob)}}}))
	denied(t, "a controller reference to the victim's Job on alice's GPU Job", err, "Kueue will not manage it")
	forged := own.DeepCopy()
	forged.ResourceVersion, forged.UID, forged.Name, forged.Labels = "", "", "alices-gpu-forged", nil
	forged.OwnerReferences = []metav1.OwnerReference{controllerRefTo(victimJob)}
	forged.Spec.Selector, forged.Spec.Template.Labels = nil, nil
	denied(t, "a GPU Job created with a controller reference to the victim's Job", c.aliceSelf.Create(ctx, forged), "Kueue will not manage it")
}

// TestOptOutFullChainRefused (review: where an admin opted out of
// unmanaged-GPU refusal, alice's unqueued fractional GPU Job got the
// victim's plan by an update, was unsuspended, and its pod, re-parented,
// was handed the victim's GPU): the plan update is refused; were it not,
// the planned pod of her unqueued Job is refused at creation, opt-out or
// not.
func TestOptOutFullChainRefused(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	c.startUngater(t)
	ns := c.open
	nsObj := &corev1.Namespace{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["gpupack.io/unmanaged-gpus"] = "allow"
	if err := env.Client.Update(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	const plan = "victim"
	if _, err := c.alice.(*throughJob).jobOf(ctx, ns, plan); err != nil {
		t.Fatal(err)
	}
	tmpl := gpuPod(ns, "x")
	delete(tmpl.Annotations, v1alpha1.AnnotationPlan)
	own := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "alices-gpu", Namespace: ns},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: tmpl.Annotations}, Spec: tmpl.Spec}}}
	own.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	if err := c.aliceSelf.Create(ctx, own); err != nil {
		t.Fatalf("alice's fractional GPU Job in the opt-out namespace: %v", err)
	}
	err := c.aliceSelf.Patch(ctx, own, templatePlan(plan, map[string]string{"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}))
	denied(t, "the victim's plan into alice's unqueued GPU Job's template", err, "gpupack-job-plan")
	if err != nil {
		return
	}
	if err := c.aliceSelf.Patch(ctx, own, mergePatch(map[string]any{"spec": map[string]any{"suspend": false}})); err != nil {
		t.Fatalf("unsuspend: %v", err)
	}
	pod := jobControllersPod(own, "squat")
	denied(t, "the Job controller's planned pod of alice's unqueued Job", c.alice.(*throughJob).controller.Create(ctx, pod), "Kueue will not manage it")
}

// TestReplicaSetFullChainRefused (review: alice's unqueued GPU ReplicaSet
// carried the victim's plan in its template; the ReplicaSet controller's
// pod counted as managed for its plan, and, re-parented, was handed the
// victim's GPU): a plan makes no pod managed; the pod is refused.
func TestReplicaSetFullChainRefused(t *testing.T) {
	c := startCluster(t)
	ctx := c.env.Ctx
	ns := c.open
	tmpl := gpuPod(ns, "x")
	tmpl.Annotations[v1alpha1.AnnotationPlan] = "victim"
	sel := map[string]string{"app": "alice", "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "alices-rs", Namespace: ns},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}}}
	if err := c.aliceSelf.Create(ctx, rs); err != nil {
		t.Fatalf("alice's GPU ReplicaSet: %v", err)
	}
	rsCtl := c.as(t, "system:serviceaccount:kube-system:replicaset-controller", []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, nil)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "squat", Namespace: ns, Labels: rs.Spec.Template.Labels, Annotations: rs.Spec.Template.Annotations,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
		Spec: *rs.Spec.Template.Spec.DeepCopy()}
	denied(t, "the ReplicaSet controller's pod from alice's planned template", rsCtl.Create(ctx, pod), "Kueue will not manage it")
}
