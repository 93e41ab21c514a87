package gangfit

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
)

// jobless is a Workload created directly (as a JobSet, MPIJob or RayJob
// integration would), asking for pods × 1 whole GPU.
func jobless(name, ns string, pods int32) *kueue.Workload {
	return &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: kueue.WorkloadSpec{QueueName: "lq", PodSets: []kueue.PodSet{{Name: kueue.DefaultPodSetName, Count: pods, Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, Containers: []corev1.Container{{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")},
				Limits:   corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}},
		}}}},
	}
}

// Issue 17 item 1, against the real manager cache: a Workload owned by a
// kind whose CRD is not installed (a JobSet) is decided, and so is every
// Workload after it. (Here the manager may read everything, so the cached
// Get of such a kind fails fast with NoKindMatch, which the old code
// survived too; the wedge — an installed kind outside the manager's RBAC,
// whose informer never syncs — is TestOwnerOfUnwatchedKindNeverWedges in
// package admissioncheck.)
func TestOwnerOfUninstalledKindDoesNotWedgeTheCheck(t *testing.T) {
	s := setup(t, framework.Options{}, v1alpha1.GangFitParametersSpec{}, 8, framework.MakeNode("n1").GPUs(8, framework.H100).Obj())
	env := s.env
	wl := jobless("js", s.ns, 1)
	wl.OwnerReferences = []metav1.OwnerReference{{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "js", UID: "0f0f0f0f-0000-0000-0000-000000000001", Controller: ptr.To(true)}}
	env.MustCreate(t, wl)
	env.Eventually(t, 60*time.Second, "the JobSet-owned workload admitted", func() (bool, string) {
		cur := &kueue.Workload{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(wl), cur); err != nil {
			return false, err.Error()
		}
		return admitted(cur), framework.DescribeWorkload(cur)
	})
	env.MustCreate(t, framework.MakePyTorchJob("after", s.ns, "lq", 1, 1).Obj())
	env.WaitForWorkloadOf(t, s.ns, "after", "PyTorchJob", admitted)
}

// Issue 17 item 2, against the real apiserver + Kueue: workload "wl" was
// evicted and re-admitted; its new plan (same name) holds 4 GPUs while its
// previous pods, still terminating, hold the other 4 and name plan "wl" in
// gpupack.io/plan. A 4-GPU workload must wait for those pods.
func TestReadmittedPlanDoesNotHideTerminatingPods(t *testing.T) {
	s := setup(t, framework.Options{}, v1alpha1.GangFitParametersSpec{}, 8, framework.MakeNode("n1").GPUs(8, framework.H100).Obj())
	env := s.env
	first := jobless("wl", s.ns, 4)
	env.MustCreate(t, first)
	env.Eventually(t, 60*time.Second, "wl admitted", func() (bool, string) {
		cur := &kueue.Workload{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(first), cur); err != nil {
			return false, err.Error()
		}
		return admitted(cur), framework.DescribeWorkload(cur) + fmt.Sprint(s.events(t, "wl", "BadGPURequest"), s.events(t, "wl", "GangCanNeverFit"))
	})
	plan := &v1alpha1.GPUPlan{}
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "wl"}, plan); err != nil {
		t.Fatal(err)
	}
	planned := map[string]bool{}
	for _, a := range plan.Spec.Assignments {
		planned[a.GPUs[0].UUID] = true
	}
	// The previous admission's pods on the other four GPUs, terminating
	// (a finalizer stands for the checkpoint being written).
	var old []*corev1.Pod
	for i := 0; i < 8 && len(old) < 4; i++ {
		uuid := fmt.Sprintf("GPU-n1-%d", i)
		if planned[uuid] {
			continue
		}
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("wl-old-%d", i), Namespace: s.ns, Finalizers: []string{"test.gpupack.io/checkpoint"},
				Annotations: map[string]string{v1alpha1.AnnotationDevices: uuid + ":71903", v1alpha1.AnnotationPlan: "wl"}},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "x",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}},
		}
		env.MustCreate(t, p)
		if err := env.Client.Delete(env.Ctx, p, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
		old = append(old, p)
	}
	second := jobless("other", s.ns, 4)
	env.MustCreate(t, second)
	env.Eventually(t, 60*time.Second, "other Pending on the old pods", func() (bool, string) {
		cur := &kueue.Workload{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(second), cur); err != nil {
			return false, err.Error()
		}
		st := checkState(cur)
		if admitted(cur) {
			t.Fatalf("other admitted onto GPUs the old pods still hold: %s", framework.DescribeWorkload(cur))
		}
		return st != nil && st.State == kueue.CheckStatePending && strings.Contains(st.Message, "terminating"), framework.DescribeWorkload(cur)
	})
	for _, p := range old {
		if err := env.Client.Patch(env.Ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
			t.Fatal(err)
		}
	}
	env.Eventually(t, 60*time.Second, "other admitted once the old pods are gone", func() (bool, string) {
		cur := &kueue.Workload{}
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(second), cur); err != nil {
			return false, err.Error()
		}
		return admitted(cur), framework.DescribeWorkload(cur)
	})
}
