package colocation

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// Second outside review 2026-12-02, finding 1, end to end (real apiserver, Kueue with
// its pod integration, kube-scheduler, kwok, the shipped policies): a
// tenant's whole-GPU pods whose controller chain ends at her own queued,
// suspended Job (a) directly, carrying a queue label, created by her; (b)
// through a ReplicaSet of her own, created by the ReplicaSet controller;
// (c) with pod rights only: under her own queue-labelled CPU pod (Kueue
// treats a Pod owner as a pod-integration job).
// Kueue's pod webhook leaves both ungated (their ancestor is a managed
// Job); gpupack admits both and adds no gate. The Job never runs, so no
// quota is ever charged for them. Asserts the safe outcome (denied, or
// still gated after a minute); each case was admitted and bound before the fix.
func TestOwnerChainUnderPodIntegration(t *testing.T) {
	c := startCluster(t, nil)
	env := c.env
	// The tenant's queued Job (a queue nobody serves: it stays suspended).
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "waiting", Namespace: c.ns, Labels: map[string]string{placement.KueueQueueLabel: "nobody-serves-this"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: func() corev1.PodSpec {
			s := gpuPodSpec(1)
			s.RestartPolicy = corev1.RestartPolicyNever
			return s
		}()}}}
	env.MustCreate(t, job) // a tenant with edit creates Jobs; alice here has pod rights only
	ref := *metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))

	check := func(t *testing.T, what string, labels map[string]string) {
		t.Helper()
		// Free the node's 4 GPUs for the next case.
		defer func() {
			_ = env.Client.DeleteAllOf(env.Ctx, &appsv1.ReplicaSet{}, client.InNamespace(c.ns), client.MatchingLabels(labels))
			_ = env.Client.DeleteAllOf(env.Ctx, &corev1.Pod{}, client.InNamespace(c.ns), client.MatchingLabels(labels), client.GracePeriodSeconds(0))
			env.Eventually(t, 60*time.Second, what+": pods gone", func() (bool, string) {
				var pods corev1.PodList
				_ = env.Client.List(env.Ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels(labels))
				return len(pods.Items) == 0, fmt.Sprint(len(pods.Items))
			})
		}()
		env.Eventually(t, 90*time.Second, what+": pods exist", func() (bool, string) {
			var pods corev1.PodList
			_ = env.Client.List(env.Ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels(labels))
			return len(pods.Items) > 0, fmt.Sprint(len(pods.Items))
		})
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			var pods corev1.PodList
			_ = env.Client.List(env.Ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels(labels))
			for _, p := range pods.Items {
				if len(p.Spec.SchedulingGates) == 0 && p.Spec.NodeName != "" {
					j := &batchv1.Job{}
					_ = env.Client.Get(env.Ctx, client.ObjectKeyFromObject(job), j)
					t.Errorf("%s: pod %s bound to %s with %v, no scheduling gate, while the Job is suspended=%v: whole GPUs outside every quota",
						what, p.Name, p.Spec.NodeName, p.Spec.Containers[0].Resources.Limits, ptr.Deref(j.Spec.Suspend, false))
					return
				}
			}
			time.Sleep(2 * time.Second)
		}
	}

	t.Run("control: the same pod without the owner reference is gated", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "control", Namespace: c.ns,
			Labels: map[string]string{"attack": "control", placement.KueueQueueLabel: "lq"}}, Spec: gpuPodSpec(2)}
		if err := c.alice.Create(env.Ctx, p); err != nil {
			t.Fatal(err)
		}
		got := &corev1.Pod{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(p), got); err != nil {
			t.Fatal(err)
		}
		if len(got.Spec.SchedulingGates) == 0 {
			t.Fatalf("control pod stored without gates: the test setup does not gate queued pods at all")
		}
		t.Logf("control pod gates: %v", gates(got))
		_ = env.Client.Delete(env.Ctx, got)
	})
	t.Run("a tenant pod with a queue label under her queued Job", func(t *testing.T) {
		labels := map[string]string{"attack": "direct"}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "squat", Namespace: c.ns, OwnerReferences: []metav1.OwnerReference{ref},
			Labels: map[string]string{"attack": "direct", placement.KueueQueueLabel: "lq"}}, Spec: gpuPodSpec(2)}
		if err := c.alice.Create(env.Ctx, p); err != nil {
			t.Logf("denied (safe): %v", err)
			return
		}
		check(t, "direct", labels)
	})
	t.Run("a tenant pod with a queue label under her own queued CPU pod (pod rights only)", func(t *testing.T) {
		parent := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "parent", Namespace: c.ns,
			Labels: map[string]string{placement.KueueQueueLabel: "nobody-serves-this"}},
			Spec: corev1.PodSpec{Tolerations: []corev1.Toleration{framework.KwokToleration}, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if err := c.alice.Create(env.Ctx, parent); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{"attack": "pod-parent"}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "child", Namespace: c.ns,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(parent, corev1.SchemeGroupVersion.WithKind("Pod"))},
			Labels:          map[string]string{"attack": "pod-parent", placement.KueueQueueLabel: "lq"}}, Spec: gpuPodSpec(2)}
		if err := c.alice.Create(env.Ctx, p); err != nil {
			t.Logf("denied (safe): %v", err)
			return
		}
		check(t, "under a pod", labels)
	})
	t.Run("the ReplicaSet controller's pods of a tenant ReplicaSet under her queued Job", func(t *testing.T) {
		labels := map[string]string{"attack": "via-rs"}
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: c.ns, Labels: labels, OwnerReferences: []metav1.OwnerReference{ref}},
			Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: gpuPodSpec(2)}}}
		env.MustCreate(t, rs) // a tenant with edit creates ReplicaSets
		defer func() { _ = env.Client.Delete(env.Ctx, rs) }()
		// The safe outcome: the ReplicaSet controller's creates are refused
		// (FailedCreate naming gpupack's reason) and no pod exists.
		env.Eventually(t, 60*time.Second, "the ReplicaSet controller's pod refused", func() (bool, string) {
			var evs corev1.EventList
			_ = env.Client.List(env.Ctx, &evs, client.InNamespace(c.ns))
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == rs.Name && e.Reason == "FailedCreate" && strings.Contains(e.Message, "which does not make ReplicaSets") {
					return true, ""
				}
			}
			var pods corev1.PodList
			_ = env.Client.List(env.Ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels(labels))
			if len(pods.Items) > 0 {
				check(t, "via a ReplicaSet", labels)
				return true, ""
			}
			return false, "no FailedCreate event yet"
		})
	})
}
