package security

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// TestPlacementThroughPodStatus (outside review 2026-12-02, finding 3): the
// pods/status subresource keeps a pod's spec but takes its metadata, so
// every identity that may write pod status — Kueue's controller, every
// kubelet, a cluster admin — could rewrite gpupack.io/devices, the plan,
// gpupack.io/allocated-by and the checkpoint request past policy
// gpupack-placement, which matched "pods" only. A status write that leaves
// the annotations alone (what kubelets do, many times per pod) still goes
// through.
func TestPlacementThroughPodStatus(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	kueueUser := "system:serviceaccount:kueue-system:kueue-controller-manager"
	env.MustCreate(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-pod-status"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "pods/status"}, Verbs: []string{"get", "patch", "update"}}}})
	env.MustCreate(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-pod-status"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "test-pod-status"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: kueueUser}}})
	kueue := c.as(t, kueueUser, []string{"system:serviceaccounts", "system:authenticated"}, nil)

	p := gpuPod(c.open, "status-victim")
	if err := c.alice.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	dev := "GPU-00000000-0000-0000-0000-000000000001:70000"
	denied(t, "Kueue patching gpupack.io/devices on the pod", kueue.Patch(ctx, p.DeepCopy(), annPatch(v1alpha1.AnnotationDevices, dev)), "gpupack.io/devices")
	for who, cl := range map[string]client.Client{"Kueue's controller": kueue, "a cluster admin": env.Client} {
		for k, v := range map[string]string{
			v1alpha1.AnnotationDevices:           dev,
			"gpupack.io/allocated-by":            "gpupack-node/node-a",
			v1alpha1.AnnotationPlan:              "someone-elses-plan",
			v1alpha1.AnnotationCheckpointRequest: "2099-01-01T00:00:00Z",
		} {
			err := cl.Status().Patch(ctx, p.DeepCopy(), annPatch(k, v))
			cur := &corev1.Pod{}
			if gerr := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); gerr != nil {
				t.Fatal(gerr)
			}
			if err == nil || cur.Annotations[k] == v {
				t.Errorf("%s wrote %s=%q through pods/status (err %v)", who, k, v, err)
			}
		}
	}
	// The writes status exists for still pass.
	cur := &corev1.Pod{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
		t.Fatal(err)
	}
	cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: "example.com/Probe", Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
	if err := kueue.Status().Update(ctx, cur); err != nil {
		t.Fatalf("a status write that leaves the annotations alone: %v", err)
	}
}
