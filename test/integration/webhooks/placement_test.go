package webhooks

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// TestPyTorchJobPlacedOnPlan is the whole path: a fractional PyTorchJob is
// converted, admitted by Kueue with the gang-fit check, its pods are created
// (the test plays the training operator: pods from the admitted replica
// template, with its labels and owner) with the hook injected and gated,
// pinned by the ungater to the planned nodes with gpupack.io/devices, and
// bound by the real kube-scheduler.
func TestPyTorchJobPlacedOnPlan(t *testing.T) {
	env := framework.Start(t, framework.Options{Scheduler: true})
	for _, n := range []string{"n1", "n2"} {
		env.MustCreate(t, framework.MakeNode(n).GPUs(2, framework.H100).Obj())
		env.WaitForNodeReady(t, n)
	}
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))
	_, serve := startWebhooks(t, env, webhooks.Config{},
		func(mgr ctrl.Manager) error { return admissioncheck.Setup(mgr, admissioncheck.Options{}) }, placement.Setup)
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 4, framework.H100).AdmissionChecks("gang-fit").Obj())
	ns := env.Namespace(t, "team")
	env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "cq"))

	job := framework.MakePyTorchJob("ft", ns, "lq", 3, 1).WorkersOnly().Annotation(v1alpha1.AnnotationGPUMemory, "20Gi").Obj()
	env.MustCreate(t, job)
	env.Eventually(t, 60*time.Second, "PyTorchJob unsuspended by Kueue", func() (bool, string) {
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return false, err.Error()
		}
		s := job.Spec.RunPolicy.Suspend
		return s != nil && !*s, "still suspended"
	})
	// What the training operator does, as its own user: one pod per
	// replica from the (Kueue-updated) template, labelled with its type and
	// index. The template carries the injection and, since Kueue wrote the
	// plan into it, the placement gate: the pods skip the pod webhook.
	tmpl := job.Spec.PyTorchReplicaSpecs[kftraining.PyTorchJobReplicaTypeWorker].Template
	if !hasGate(&tmpl.Spec, v1alpha1.SchedulingGatePlacement) || tmpl.Annotations[v1alpha1.AnnotationInjected] != serve.TemplateFingerprint {
		t.Fatalf("started template: gates %v annotations %v", tmpl.Spec.SchedulingGates, tmpl.Annotations)
	}
	operator, err := client.New(env.UserConfig(t, framework.UserTrainingOperator, "system:masters"), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	before := podMutations(t)
	for i := 0; i < 3; i++ {
		p := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
		p.Name, p.Namespace = fmt.Sprintf("ft-worker-%d", i), ns
		p.Labels = map[string]string{"training.kubeflow.org/job-name": "ft", kftraining.ReplicaTypeLabel: "worker", kftraining.ReplicaIndexLabel: fmt.Sprint(i)}
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(job, kftraining.GroupVersion.WithKind(kftraining.PyTorchJobKind))}
		if err := operator.Create(env.Ctx, p); err != nil {
			t.Fatal(err)
		}
		if p.Annotations[v1alpha1.AnnotationPlan] == "" {
			t.Fatalf("pod %s has no %s: Kueue's podSetUpdates missing from the template", p.Name, v1alpha1.AnnotationPlan)
		}
	}
	if d := podMutations(t) - before; d != 0 {
		t.Errorf("the pod webhook answered %v times for the operator's pods", d)
	}

	var pods []corev1.Pod
	env.Eventually(t, 120*time.Second, "3 pods pinned, ungated and bound", func() (bool, string) {
		var list corev1.PodList
		if err := env.Client.List(env.Ctx, &list, client.InNamespace(ns), client.MatchingLabels{"training.kubeflow.org/job-name": "ft"}); err != nil {
			return false, err.Error()
		}
		pods = list.Items
		if len(pods) != 3 {
			wl, _ := env.WorkloadOf(ns, "ft", "PyTorchJob")
			if wl != nil {
				return false, fmt.Sprintf("%d pods; %s", len(pods), framework.DescribeWorkload(wl))
			}
			return false, fmt.Sprintf("%d pods", len(pods))
		}
		for _, p := range pods {
			if p.Spec.NodeName == "" || p.Annotations[v1alpha1.AnnotationDevices] == "" || len(p.Spec.SchedulingGates) > 0 {
				return false, fmt.Sprintf("pod %s: node %q devices %q gates %v", p.Name, p.Spec.NodeName, p.Annotations[v1alpha1.AnnotationDevices], p.Spec.SchedulingGates)
			}
		}
		return true, ""
	})

	plan := &v1alpha1.GPUPlan{}
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: pods[0].Annotations[v1alpha1.AnnotationPlan]}, plan); err != nil {
		t.Fatalf("plan: %v", err)
	}
	want := map[string]string{} // "<node> <devices>" per slot
	for _, a := range plan.Spec.Assignments {
		want[fmt.Sprintf("%s/%d", a.PodSet, a.Index)] = a.Node + " " + placement.Devices(a)
	}
	got := map[string]string{}
	for _, p := range pods {
		key := fmt.Sprintf("worker/%s", p.Labels["training.kubeflow.org/replica-index"])
		got[key] = p.Spec.NodeName + " " + p.Annotations[v1alpha1.AnnotationDevices]
		if len(p.Spec.Volumes) != 0 || len(p.Spec.Containers[0].Env) != 0 {
			t.Errorf("pod %s: volumes %v env %v, want none (the device plugin delivers hook and limits)", p.Name, p.Spec.Volumes, p.Spec.Containers[0].Env)
		}
		if q := p.Spec.Containers[0].Resources.Requests[v1alpha1.ResourceGPUMemory]; q.Value() != 20480 {
			t.Errorf("pod %s: gpu-memory request %s", p.Name, q.String())
		}
	}
	if fmt.Sprint(want) != fmt.Sprint(got) {
		t.Errorf("pods by replica index = %v, want the plan's %v", got, want)
	}
	t.Logf("placed: %v", got)
	if len(plan.Status.Bindings) != 3 || plan.Status.Phase != v1alpha1.PlanPlaced {
		t.Errorf("plan status: phase %s bindings %v", plan.Status.Phase, plan.Status.Bindings)
	}
}
