// Package jobkinds tests the job kinds beyond batch Job and PyTorchJob
// against a real kube-apiserver and the real Kueue manager (with its
// jobset.x-k8s.io/jobset integration): a fractional JobSet is converted at
// apply time by gpupack's webhooks, Kueue's Workload requests gpupack.io/*,
// and the gang-fit check holds it while it does not fit and admits one that
// does (this file: no JobSet controller, nothing needs its Jobs or pods).
//
// controllers_test.go and lws_test.go run the real JobSet and
// LeaderWorkerSet controllers (built by `make tools`; skipped without them
// outside CI) with kube-scheduler and kwok: pods made by the controllers,
// pinned by the ungater, preempted through the checkpoint protocol.
package jobkinds

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// fractionalJobSet is a JobSet of a CPU-only driver and `workers` worker
// pods, each asking for one GPU with the JobSet-level request mem — as a
// user writes it: nvidia.com/gpu only, no gpupack.io/* resources.
func fractionalJobSet(name, ns string, workers int32, mem string) *jobset.JobSet {
	ctr := func(res corev1.ResourceList) []corev1.Container {
		return []corev1.Container{{Name: "c", Image: "trainer:test", Resources: corev1.ResourceRequirements{Limits: res, Requests: res}}}
	}
	job := func(n int32, pod corev1.PodSpec) batchv1.JobTemplateSpec {
		pod.RestartPolicy = corev1.RestartPolicyNever
		pod.Tolerations = []corev1.Toleration{framework.KwokToleration}
		return batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Parallelism: &n, Completions: &n, Template: corev1.PodTemplateSpec{Spec: pod}}}
	}
	return &jobset.JobSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "lq"},
			Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: mem}},
		Spec: jobset.JobSetSpec{ReplicatedJobs: []jobset.ReplicatedJob{
			{Name: "driver", Replicas: 1, Template: job(1, corev1.PodSpec{Containers: ctr(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")})})},
			{Name: "workers", Replicas: 1, Template: job(workers, corev1.PodSpec{
				NodeSelector: map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"}, // as MakeNode labels it
				Containers:   ctr(corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}),
			})},
		}},
	}
}

func checkState(wl *kueue.Workload) *kueue.AdmissionCheckState {
	for i := range wl.Status.AdmissionChecks {
		if wl.Status.AdmissionChecks[i].Name == "gang-fit" {
			return &wl.Status.AdmissionChecks[i]
		}
	}
	return nil
}

func admitted(wl *kueue.Workload) bool {
	return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted)
}

func TestFractionalJobSetConvertedCountedAndHeld(t *testing.T) {
	kueueOpts := framework.Options{JobSet: true}
	env := framework.Start(t, kueueOpts)
	env.CreateNode(t, framework.MakeNode("n1").GPUs(1, framework.H100).Obj())
	// A second GPU, busy: a job that does not fit now could fit later, so
	// the check holds it (Retry) rather than rejecting it. The holder is in
	// kube-system, which gpupack's webhooks exclude.
	env.CreateNode(t, framework.MakeNode("busy").GPUs(1, framework.H100).Obj())
	env.MustCreate(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "kube-system", Annotations: map[string]string{
			v1alpha1.AnnotationDevices: v1alpha1.FormatDevices([]v1alpha1.DeviceAssignment{{UUID: "GPU-busy-0", MemoryMiB: flavors.Allocatable(81559)}})}},
		Spec: corev1.PodSpec{NodeName: "busy", Containers: []corev1.Container{{Name: "c", Image: "x",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}},
	})
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"},
		Spec: v1alpha1.GangFitParametersSpec{RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)}}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))

	// gpupack's webhooks (JobSet entries only, as --job-kinds=JobSet adds
	// them) and the gang-fit check, in one manager.
	// Kueue here runs the JobSet integration (framework.Options{JobSet:
	// true}); gpupack's view of what Kueue manages must say so.
	cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: kueueOpts.KueueFrameworks()}}
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		if err := webhooks.Setup(mgr, cfg); err != nil {
			return err
		}
		return admissioncheck.Setup(mgr, admissioncheck.Options{})
	}, opts)
	serve, err := webhooks.DefaultServeOptions().WithFastPath(cfg)
	if err != nil {
		t.Fatal(err)
	}
	serve.JobKinds = []string{webhooks.KindJobSet}
	mwc, vwc := webhooks.WebhookConfigurations(serve)
	env.InstallWebhooks(t, opts, mwc, vwc)
	env.WaitForAdmissionCheckActive(t, "gang-fit")

	// Kueue's aggregate quota is for 4 GPUs; the nodes have two, one free.
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 4, framework.H100).AdmissionChecks("gang-fit").Obj())
	ns := env.Namespace(t, "team")
	env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "cq"))

	// 2 × 50 GiB: within Kueue's quota, but the free GPU cannot take both.
	env.MustCreate(t, fractionalJobSet("big", ns, 2, "50Gi"))
	var stored jobset.JobSet
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: "big"}, &stored); err != nil {
		t.Fatal(err)
	}
	w := stored.Spec.ReplicatedJobs[1].Template.Spec.Template
	lim := w.Spec.Containers[0].Resources.Limits
	if q := lim[v1alpha1.ResourceGPUMemory]; q.Value() != 51200 || lim[v1alpha1.ResourceVGPU] != resource.MustParse("1") {
		t.Errorf("stored workers template limits %v, want gpupack.io/vgpu 1 and gpupack.io/gpu-memory 51200", lim)
	}
	if _, ok := lim[v1alpha1.ResourceNvidiaGPU]; ok {
		t.Errorf("nvidia.com/gpu kept on a fractional JobSet: %v", lim)
	}
	if w.Annotations[v1alpha1.AnnotationInjected] == "" {
		t.Errorf("workers template not marked: %v", w.Annotations)
	}
	if d := stored.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Containers[0].Resources.Limits; len(d) != 1 {
		t.Errorf("driver limits changed: %v", d)
	}

	// Kueue counts gpupack.io/*: its Workload's worker pod set says so.
	wl := env.WaitForWorkloadOf(t, ns, "big", "JobSet", nil)
	var workers *kueue.PodSet
	for i := range wl.Spec.PodSets {
		if wl.Spec.PodSets[i].Name == "workers" {
			workers = &wl.Spec.PodSets[i]
		}
	}
	if workers == nil || workers.Count != 2 {
		t.Fatalf("Workload pod sets: %+v", wl.Spec.PodSets)
	}
	req := workers.Template.Spec.Containers[0].Resources.Requests
	if q := req[v1alpha1.ResourceGPUMemory]; q.Value() != 51200 {
		t.Errorf("Workload worker requests %v, want gpupack.io/gpu-memory 51200", req)
	}

	// The check holds it, saying why, and Kueue does not admit it.
	env.Eventually(t, 60*time.Second, "big JobSet held by the gang-fit check", func() (bool, string) {
		var evs corev1.EventList
		if err := env.Client.List(env.Ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == wl.Name && e.Reason == admissioncheck.EventNoFit && strings.Contains(e.Message, "51200") {
				return true, ""
			}
		}
		var seen []string
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == wl.Name {
				seen = append(seen, e.Reason+": "+e.Message)
			}
		}
		w, _ := env.WorkloadOf(ns, "big", "JobSet")
		return false, framework.DescribeWorkload(w) + "; events: " + strings.Join(seen, " | ")
	})
	if w, _ := env.WorkloadOf(ns, "big", "JobSet"); admitted(w) {
		t.Fatalf("2 x 50 GiB admitted onto one free 80 GiB GPU: %s", framework.DescribeWorkload(w))
	}

	// 2 × 30 GiB fits on the one GPU: admitted, with the plan in the
	// podSetUpdates, which reach the JobSet's template with the gate.
	env.MustCreate(t, fractionalJobSet("small", ns, 2, "30Gi"))
	small := env.WaitForWorkloadOf(t, ns, "small", "JobSet", admitted)
	st := checkState(small)
	var plan string
	for _, u := range st.PodSetUpdates {
		if u.Name == "workers" {
			plan = u.Annotations[v1alpha1.AnnotationPlan]
		}
	}
	if plan == "" {
		t.Fatalf("no plan for the workers: %+v", st)
	}
	env.Eventually(t, 30*time.Second, "plan and gate in the started JobSet's template", func() (bool, string) {
		var js jobset.JobSet
		if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: "small"}, &js); err != nil {
			return false, err.Error()
		}
		t := js.Spec.ReplicatedJobs[1].Template.Spec.Template
		gated := false
		for _, g := range t.Spec.SchedulingGates {
			gated = gated || g.Name == v1alpha1.SchedulingGatePlacement
		}
		return t.Annotations[v1alpha1.AnnotationPlan] == plan && gated && js.Spec.Suspend != nil && !*js.Spec.Suspend,
			"template annotations " + strings.Join(keys(t.Annotations), ",")
	})
	if w, _ := env.WorkloadOf(ns, "big", "JobSet"); admitted(w) {
		t.Errorf("big admitted after small: %s", framework.DescribeWorkload(w))
	}

	// The same denials as for a PyTorchJob, naming the template.
	err = env.Client.Create(env.Ctx, fractionalJobSet("huge", ns, 1, "79Gi"))
	if err == nil || !strings.Contains(err.Error(), "replicatedJobs[workers].template") {
		t.Errorf("oversized JobSet: %v", err)
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
