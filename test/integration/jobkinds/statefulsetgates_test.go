package jobkinds

import (
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
)

// TestStatefulSetControllerCopiesSchedulingGates: the real
// kube-controller-manager's StatefulSet controller makes its pods with the
// template's schedulingGates (as the Job controller does), so a StatefulSet
// template that carries gpupack's placement gate gives gated pods — which
// the StatefulSet (LWS) fast path needs of the pods it lets skip the pod
// webhook (docs/webhooks.md#fast-path). No gpupack webhook here: this is the
// controller's behaviour only.
func TestStatefulSetControllerCopiesSchedulingGates(t *testing.T) {
	needController(t, "lws")
	env := framework.Start(t, framework.Options{NoKueue: true, Scheduler: true, LWS: true, LWSController: true})
	ns := env.Namespace(t, "sts-gates")
	env.MustCreate(t, framework.MakeNode("n1").GPUs(2, framework.H100).Obj())
	labels := map[string]string{"app": "gated"}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "gated", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2), PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				SchedulingGates: []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}},
				Tolerations:     []corev1.Toleration{framework.KwokToleration},
				Containers:      []corev1.Container{{Name: "c", Image: "server:test"}},
			}}}}
	env.MustCreate(t, sts)
	var pods corev1.PodList
	env.Eventually(t, 60*time.Second, "the StatefulSet controller makes 2 pods", func() (bool, string) {
		if err := env.Client.List(env.Ctx, &pods, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 2, fmt.Sprintf("%d pods", len(pods.Items))
	})
	for _, p := range pods.Items {
		gated := false
		for _, g := range p.Spec.SchedulingGates {
			gated = gated || g.Name == v1alpha1.SchedulingGatePlacement
		}
		owner := metav1.GetControllerOf(&p)
		if !gated || owner == nil || owner.Kind != "StatefulSet" || owner.APIVersion != "apps/v1" {
			t.Errorf("pod %s: gates %v, controller %v; want the template's %s gate and the StatefulSet as controller", p.Name, p.Spec.SchedulingGates, owner, v1alpha1.SchedulingGatePlacement)
		}
		if p.Spec.NodeName != "" {
			t.Errorf("pod %s is gated but bound to %s", p.Name, p.Spec.NodeName)
		}
	}
}
