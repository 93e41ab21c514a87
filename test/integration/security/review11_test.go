package security

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// TestPlannedPodLabelsFrozen (review 11 F2) on the real apiserver, with the
// shipped policies: alice (edit) relabelling her planned pod out of its
// Job's selector (batch.kubernetes.io/controller-uid) is refused by
// gpupack-placement — else the Job controller releases the pod, which then
// outlives its Job's Workload and holds its GPU after Kueue frees the
// quota. Adding or removing a label is refused too; an unplanned pod of
// hers keeps its labels hers.
func TestPlannedPodLabelsFrozen(t *testing.T) {
	c := startCluster(t)
	c.waitForPolicies(t)
	env, ctx, ns := c.env, c.env.Ctx, c.open
	planned := cpuPod(ns, "a-x")
	planned.Labels = map[string]string{"batch.kubernetes.io/controller-uid": "u-a", "controller-uid": "u-a", "batch.kubernetes.io/job-name": "a"}
	planned.Annotations = map[string]string{v1alpha1.AnnotationPlan: "a-plan"}
	env.MustCreate(t, planned) // as an admin: a planned pod's creation is a trusted controller's
	plain := cpuPod(ns, "b")
	plain.Labels = map[string]string{"app": "b"}
	if err := c.aliceSelf.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	relabel := func(name string, f func(map[string]string)) error {
		cur := &corev1.Pod{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cur); err != nil {
			t.Fatal(err)
		}
		old := cur.DeepCopy()
		f(cur.Labels)
		return c.aliceSelf.Patch(ctx, cur, client.MergeFrom(old))
	}
	const frozen = "the labels of a pod that carries gpupack.io/plan cannot be added, changed or removed"
	denied(t, "alice moving her planned pod out of its Job's selector", relabel("a-x", func(l map[string]string) {
		l["batch.kubernetes.io/controller-uid"], l["controller-uid"] = "x", "x"
	}), frozen)
	denied(t, "alice adding a label to her planned pod", relabel("a-x", func(l map[string]string) { l["debug"] = "true" }), frozen)
	denied(t, "alice removing her planned pod's job-name label", relabel("a-x", func(l map[string]string) { delete(l, "batch.kubernetes.io/job-name") }), frozen)
	if err := relabel("b", func(l map[string]string) { l["app"] = "c" }); err != nil {
		t.Errorf("alice relabelling her unplanned pod: %v", err)
	}
}
