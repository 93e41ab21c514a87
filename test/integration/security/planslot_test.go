package security

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// TestHandMadePodCannotTakeAnotherJobsSlot (outside review 2026-12-02,
// finding 6): within one namespace, alice (`edit`) makes a pod of her own
// carrying gpupack.io/plan of another job of her namespace — the victim's —
// with the replica labels the ungater matches. Before, the ungater bound
// it to the victim's slot and the victim's pod waited. Two layers:
//   - at creation only a trusted controller creating the pod for its
//     controlling owner (or a cluster admin) may write the plan: alice's
//     pod is refused, bare or naming the victim's Job as its controller;
//   - at binding (the creation check passed: the Job controller's
//     identity creates a pod of another Job, alice's, with the victim's
//     plan) the ungater binds only a pod that belongs to the plan's
//     Workload: her pod stays gated with PlanNotForThisPod, and the
//     victim's pod gets its slot.
//
// The real apiserver with the shipped RBAC and policies, gpupack's
// webhooks, and the real ungater as gpupack's manager service account;
// the Workload is written as Kueue writes it for the victim's Job (this
// suite runs no Kueue).
func TestHandMadePodCannotTakeAnotherJobsSlot(t *testing.T) {
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

	// Layer 1: alice herself.
	squat := gangPod(ns, "squat", plan, 0)
	bare := squat.DeepCopy()
	bare.Name = "squat-bare"
	denied(t, "alice's own pod naming the victim's plan", c.aliceSelf.Create(ctx, bare), "carries the annotation gpupack.io/plan")
	underVictim := squat.DeepCopy()
	underVictim.Name = "squat-under-victim"
	underVictim.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(victimJob, batchv1.SchemeGroupVersion.WithKind("Job"))}
	denied(t, "alice's pod naming the victim's plan and Job", c.aliceSelf.Create(ctx, underVictim), `created by "alice"`)

	// Layer 2: a trusted identity creates a pod of another Job (alice's
	// own, real, queued: a planned pod under a job Kueue does not manage
	// is refused at creation) that names the victim's plan, first, with
	// slot 0's labels.
	own := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "alices", Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "gpu"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
	if err := c.aliceSelf.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	squat.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(own, batchv1.SchemeGroupVersion.WithKind("Job"))}
	if err := c.alice.(*throughJob).controller.Create(ctx, squat); err != nil {
		t.Fatalf("the Job controller creating a pod of alice's Job with the victim's plan: %v", err)
	}
	c.createPlan(t, gangPlan(ns, plan, []string{"GPU-victim-0"}))
	env.Eventually(t, 30*time.Second, "PlanNotForThisPod on the squatting pod", func() (bool, string) {
		evs, err := env.Clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=squat"})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == placement.EventPlanNotForPod {
				return true, e.Message
			}
		}
		return false, strings.Join(seen, "; ")
	})
	victim := gangPod(ns, "victim-0", plan, 0)
	if err := c.alice.Create(ctx, victim); err != nil { // through the victim's Job
		t.Fatalf("the victim's pod: %v", err)
	}
	env.Eventually(t, 30*time.Second, "the victim's pod placed on its slot", func() (bool, string) {
		cur := &corev1.Pod{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(victim), cur); err != nil {
			return false, err.Error()
		}
		return !hasGate(cur) && cur.Annotations[v1alpha1.AnnotationDevices] == "GPU-victim-0:4096", "gated or devices " + cur.Annotations[v1alpha1.AnnotationDevices]
	})
	cur := &corev1.Pod{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(squat), cur); err != nil {
		t.Fatal(err)
	}
	if !hasGate(cur) || cur.Annotations[v1alpha1.AnnotationDevices] != "" {
		t.Errorf("squatting pod: gated %v devices %q, want gated, none", hasGate(cur), cur.Annotations[v1alpha1.AnnotationDevices])
	}
	pl := &v1alpha1.GPUPlan{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: plan}, pl); err != nil {
		t.Fatal(err)
	}
	if len(pl.Status.Bindings) != 1 || pl.Status.Bindings[0].PodUID != victim.UID {
		t.Errorf("plan bindings %+v, want only the victim's pod %s", pl.Status.Bindings, victim.UID)
	}
}
