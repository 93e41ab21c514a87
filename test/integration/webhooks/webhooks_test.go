// Package webhooks tests gpupack's fractional-GPU webhooks through a real
// kube-apiserver (the configurations, CEL matchConditions and
// failurePolicy are the apiserver's to apply) and the real Kueue manager.
package webhooks

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// startWebhooks serves gpupack's webhooks (and whatever also registers) from
// a manager in this process and installs their configurations, fast path
// included, in the apiserver; it returns the manager's stop and the serve
// options installed.
func startWebhooks(t *testing.T, env *framework.Env, cfg webhooks.Config, also ...func(ctrl.Manager) error) (func(), webhooks.ServeOptions) {
	t.Helper()
	opts := env.WebhookServer()
	stop := env.StartManager(t, func(mgr ctrl.Manager) error {
		for _, setup := range append([]func(ctrl.Manager) error{func(mgr ctrl.Manager) error { return webhooks.Setup(mgr, cfg) }}, also...) {
			if err := setup(mgr); err != nil {
				return err
			}
		}
		return nil
	}, opts)
	serve, err := webhooks.DefaultServeOptions().WithFastPath(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mwc, vwc := webhooks.WebhookConfigurations(serve)
	env.InstallWebhooks(t, opts, mwc, vwc)
	return stop, serve
}

type warnings struct {
	mu  sync.Mutex
	msg []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msg = append(w.msg, msg)
}

func gpuPod(ns, name string, ann map[string]string, c corev1.Container) *corev1.Pod {
	if c.Name == "" {
		c.Name = "c"
	}
	c.Image = "trainer:test"
	// A GPU pod carries the plan the gang-fit check gave its workload: a
	// fractional pod that can never get one is denied (and gated if it can).
	if _, gpu := c.Resources.Limits[v1alpha1.ResourceNvidiaGPU]; gpu {
		if ann == nil {
			ann = map[string]string{}
		}
		if _, ok := ann[v1alpha1.AnnotationPlan]; !ok {
			ann[v1alpha1.AnnotationPlan] = "plan-" + name
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"},
			Containers:   []corev1.Container{c},
		},
	}
}

func limits(kv ...string) corev1.ResourceRequirements {
	rl := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		rl[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return corev1.ResourceRequirements{Limits: rl}
}

func TestWebhooks(t *testing.T) {
	env := framework.Start(t, framework.Options{})
	stop, _ := startWebhooks(t, env, webhooks.Config{})
	ns := env.Namespace(t, "wh")
	ctx := env.Ctx
	// This suite keeps jobs out of Kueue on purpose (unqueued) to look at
	// the mutation alone: its namespace opts out of the unmanaged-GPU policy.
	nsObj := &corev1.Namespace{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels[mutation.NamespaceLabelUnmanagedGPUs] = "allow"
	if err := env.Client.Update(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	oneGPU := limits(v1alpha1.ResourceNvidiaGPU, "1")

	t.Run("denials", func(t *testing.T) {
		priv := corev1.Container{Resources: oneGPU, SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}
		badJob := unqueued(framework.MakeJob("bad-job", ns, "", 1, 1).TemplateAnnotation(v1alpha1.AnnotationGPUMemory, "lots").Obj())
		bigPT := framework.MakePyTorchJob("big-pt", ns, "lq", 2, 1).WorkersOnly().Annotation(v1alpha1.AnnotationGPUMemory, "79Gi").Obj()
		for _, rs := range bigPT.Spec.PyTorchReplicaSpecs {
			rs.Template.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"}
		}
		cases := []struct {
			name string
			obj  client.Object
			want string
		}{
			{"memory above the 90% line", gpuPod(ns, "d1", map[string]string{v1alpha1.AnnotationGPUMemory: "79Gi"}, corev1.Container{Resources: oneGPU}), "ask for at most 71903Mi"},
			{"cores outside 1-100", gpuPod(ns, "d2", map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi", v1alpha1.AnnotationGPUCores: "150"}, corev1.Container{Resources: oneGPU}), "outside 1–100"},
			{"unparsable quantity", gpuPod(ns, "d3", map[string]string{v1alpha1.AnnotationGPUMemory: "lots"}, corev1.Container{Resources: oneGPU}), "is not a quantity"},
			{"memory without nvidia.com/gpu", gpuPod(ns, "d4", map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi"}, corev1.Container{Resources: limits("cpu", "1")}), "no container asks for nvidia.com/gpu"},
			{"conflicting gpupack and HAMi", gpuPod(ns, "d5", map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi", v1alpha1.AnnotationHAMiGPUMem: "3000"}, corev1.Container{Resources: oneGPU}), "annotations conflict"},
			{"privileged GPU container", gpuPod(ns, "d6", nil, priv), "is privileged"},
			{"HAMi resource without GPU", gpuPod(ns, "d7", nil, corev1.Container{Resources: limits(v1alpha1.AnnotationHAMiGPUMem, "3000")}), "without nvidia.com/gpu"},
			{"bad Job template", badJob, "pod template: template annotation gpupack.io/gpu-memory"},
			{"PyTorchJob above the line", bigPT, "replica Worker: container \"pytorch\" asks for 80896 MiB per GPU"},
		}
		for _, tc := range cases {
			err := env.Client.Create(ctx, tc.obj)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: create error = %v, want one containing %q", tc.name, err, tc.want)
			}
		}

		// Edits of the request on running objects.
		run := unqueued(framework.MakeJob("running", ns, "", 1, 1).Obj())
		run.Spec.Suspend = ptr.To(false)
		run.Annotations[v1alpha1.AnnotationGPUMemory] = "1Gi"
		env.MustCreate(t, run)
		run.Annotations[v1alpha1.AnnotationGPUMemory] = "2Gi"
		if err := env.Client.Update(ctx, run); err == nil || !strings.Contains(err.Error(), "cannot change while the job runs") {
			t.Errorf("edit of a running job: %v", err)
		}
		// A tenant's hook env slipped into a PyTorchJob by an update (a
		// batch Job's template is immutable; a PyTorchJob's is not).
		pt := framework.MakePyTorchJob("edited", ns, "", 1, 1).WorkersOnly().Annotation(v1alpha1.AnnotationGPUMemory, "1Gi").Obj()
		delete(pt.Labels, "kueue.x-k8s.io/queue-name")
		env.MustCreate(t, pt)
		w := pt.Spec.PyTorchReplicaSpecs[kftraining.PyTorchJobReplicaTypeWorker]
		w.Template.Spec.Containers[0].Env = append(w.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "LD_PRELOAD", Value: "/evil.so"})
		if err := env.Client.Update(ctx, pt); err == nil || !strings.Contains(err.Error(), `replica Worker: container "pytorch" sets LD_PRELOAD, which gpupack owns`) {
			t.Errorf("LD_PRELOAD added to a PyTorchJob: %v", err)
		}
		p := gpuPod(ns, "edit", map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi"}, corev1.Container{Resources: oneGPU})
		env.MustCreate(t, p)
		p.Annotations[v1alpha1.AnnotationGPUMemory] = "2Gi"
		if err := env.Client.Update(ctx, p); err == nil || !strings.Contains(err.Error(), "cannot change on an existing pod") {
			t.Errorf("edit of a pod: %v", err)
		}
	})

	t.Run("tenant env never survives", func(t *testing.T) {
		cs, w := warningClient(t, env)
		c := corev1.Container{Resources: oneGPU, Env: []corev1.EnvVar{
			{Name: "LD_PRELOAD", Value: "/home/me/unlimited.so"}, {Name: "CUDA_DEVICE_MEMORY_LIMIT", Value: "80g"},
			{Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "80g"}, {Name: "CUDA_DISABLE_CONTROL", Value: "true"},
			{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}, {Name: "CUDA_DEVICE_SM_LIMIT", Value: "100"}, {Name: "KEEP", Value: "me"},
		}}
		in := gpuPod(ns, "tenant", map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30"}, c)
		got, err := cs.CoreV1().Pods(ns).Create(ctx, in, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		for _, e := range got.Spec.Containers[0].Env {
			if _, dup := env[e.Name]; dup {
				t.Errorf("env %s twice", e.Name)
			}
			env[e.Name] = e.Value
		}
		want := map[string]string{"KEEP": "me"}
		if fmt.Sprint(want) != fmt.Sprint(env) {
			t.Errorf("stored env = %v, want %v", env, want)
		}
		lim := got.Spec.Containers[0].Resources.Limits
		if q := lim[v1alpha1.ResourceGPUMemory]; q.Value() != 20480 {
			t.Errorf("gpu-memory limit = %s", q.String())
		}
		if _, ok := lim[v1alpha1.ResourceNvidiaGPU]; ok {
			t.Error("nvidia.com/gpu kept on a fractional pod")
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if all := strings.Join(w.msg, "\n"); !strings.Contains(all, "removed LD_PRELOAD") || !strings.Contains(all, "removed CUDA_DISABLE_CONTROL") {
			t.Errorf("kubectl warnings = %q", w.msg)
		}
	})

	t.Run("tenant env in a job template is answered at apply", func(t *testing.T) {
		cs, w := warningClient(t, env)
		j := unqueued(framework.MakeJob("tenant-job", ns, "", 1, 1).TemplateAnnotation(v1alpha1.AnnotationGPUMemory, "20Gi").Obj())
		j.Spec.Template.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"}
		c := &j.Spec.Template.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: "LD_PRELOAD", Value: "/home/me/unlimited.so"}, corev1.EnvVar{Name: "KEEP", Value: "me"})
		got, err := cs.BatchV1().Jobs(ns).Create(ctx, j, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range got.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "LD_PRELOAD" {
				t.Errorf("stored job template keeps LD_PRELOAD=%s", e.Value)
			}
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if all := strings.Join(w.msg, "\n"); !strings.Contains(all, `pod template: container "pytorch": removed LD_PRELOAD`) {
			t.Errorf("kubectl warnings = %q", w.msg)
		}
	})

	t.Run("pytorchjob workload counts gpu-memory", func(t *testing.T) {
		env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
		// Room for exactly two jobs of 2 × 20Gi.
		env.MustCreate(t, framework.MakeClusterQueue("cq").Flavor("gpu",
			framework.Quota{Resource: corev1.ResourceCPU, Nominal: "1000"}, framework.Quota{Resource: corev1.ResourceMemory, Nominal: "10Ti"},
			framework.Quota{Resource: v1alpha1.ResourceVGPU, Nominal: "100"}, framework.Quota{Resource: v1alpha1.ResourceGPUMemory, Nominal: "81920"},
			framework.Quota{Resource: v1alpha1.ResourceGPUCores, Nominal: "10000"}, framework.Quota{Resource: v1alpha1.ResourceNvidiaGPU, Nominal: "100"},
		).Obj())
		env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "cq"))
		for i := 0; i < 3; i++ {
			env.MustCreate(t, framework.MakePyTorchJob(fmt.Sprintf("pt-%d", i), ns, "lq", 2, 1).WorkersOnly().Annotation(v1alpha1.AnnotationGPUMemory, "20Gi").Obj())
		}
		wl := env.WaitForWorkloadOf(t, ns, "pt-0", "PyTorchJob", nil)
		if len(wl.Spec.PodSets) != 1 {
			t.Fatalf("pod sets = %d", len(wl.Spec.PodSets))
		}
		ps := wl.Spec.PodSets[0]
		req := ps.Template.Spec.Containers[0].Resources.Requests
		if q := req[v1alpha1.ResourceGPUMemory]; q.Value() != 20480 || ps.Count != 2 {
			t.Errorf("pod set %s: count %d, gpupack.io/gpu-memory %s, want 2 × 20480", ps.Name, ps.Count, q.String())
		}
		if q := req[v1alpha1.ResourceVGPU]; q.Value() != 1 {
			t.Errorf("gpupack.io/vgpu = %s", q.String())
		}
		expectQuotaFor(t, env, ns, 3, 2)
	})

	t.Run("checkpoint opt-in and resume step", func(t *testing.T) {
		owner := unqueued(framework.MakeJob("trainer", ns, "", 1, 1).Obj())
		owner.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint] = "4200"
		env.MustCreate(t, owner) // suspended: no pods of its own
		c := corev1.Container{Resources: oneGPU, Command: []string{"python", "train.py"}, Args: []string{"--resume"}}
		p := gpuPod(ns, "ckpt", map[string]string{v1alpha1.AnnotationGPUMemory: "10Gi", v1alpha1.AnnotationCheckpoint: "true", v1alpha1.AnnotationCheckpointTimeout: "2m"}, c)
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(owner, batchv1.SchemeGroupVersion.WithKind("Job"))}
		env.MustCreate(t, p)
		got := p.Spec
		if len(got.InitContainers) != 1 || got.InitContainers[0].Name != "gpupack-ckpt-install" {
			t.Errorf("init containers = %+v", got.InitContainers)
		}
		cmd := strings.Join(got.Containers[0].Command, " ")
		if !strings.HasPrefix(cmd, "/gpupack/bin/gpupack-ckpt --checkpoint-signal=SIGUSR1 --checkpoint-timeout=2m0s --grace=2m30s") || !strings.HasSuffix(cmd, "-- python train.py --resume") {
			t.Errorf("command = %q", cmd)
		}
		if got.TerminationGracePeriodSeconds == nil || *got.TerminationGracePeriodSeconds != 150 {
			t.Errorf("terminationGracePeriodSeconds = %v, want 150", got.TerminationGracePeriodSeconds)
		}
		step := ""
		for _, e := range got.Containers[0].Env {
			if e.Name == v1alpha1.EnvResumeStep {
				step = e.Value
			}
		}
		if step != "4200" {
			t.Errorf("%s = %q, want the owner's 4200", v1alpha1.EnvResumeStep, step)
		}
	})

	t.Run("webhook down", func(t *testing.T) {
		stop()
		gpu := gpuPod(ns, "while-down", map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi"}, corev1.Container{Resources: oneGPU})
		if err := env.Client.Create(ctx, gpu); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
			t.Errorf("GPU pod with the webhook down: %v, want rejection", err)
		}
		sys := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "system-pod", Namespace: "kube-system"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}
		if err := env.Client.Create(ctx, sys); err != nil {
			t.Errorf("kube-system pod with the webhook down: %v", err)
		}
		plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu-pod", Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause", Resources: limits("cpu", "1")}}}}
		if err := env.Client.Create(ctx, plain); err != nil {
			t.Errorf("non-GPU pod with the webhook down: %v", err)
		}
		cpuJob := unqueued(framework.MakeJob("cpu-job", ns, "", 1, 0).Obj())
		if err := env.Client.Create(ctx, cpuJob); err != nil {
			t.Errorf("non-GPU Job with the webhook down: %v", err)
		}
		gpuJob := unqueued(framework.MakeJob("gpu-job", ns, "", 1, 1).Obj())
		if err := env.Client.Create(ctx, gpuJob); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
			t.Errorf("GPU Job with the webhook down: %v, want rejection", err)
		}
		// Updates of a GPU pod reach the webhook only when they edit the
		// request: a relabel goes through while it is down, an edit does not.
		var p corev1.Pod
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "edit"}, &p); err != nil {
			t.Fatal(err)
		}
		p.Labels = map[string]string{"relabelled": "yes"}
		if err := env.Client.Update(ctx, &p); err != nil {
			t.Errorf("relabelling a GPU pod with the webhook down: %v", err)
		}
		p.Annotations[v1alpha1.AnnotationGPUMemory] = "2Gi"
		if err := env.Client.Update(ctx, &p); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
			t.Errorf("editing a GPU pod's request with the webhook down: %v, want rejection", err)
		}
	})
}

// unqueued drops the queue label: a Job Kueue does not manage.
func unqueued(j *batchv1.Job) *batchv1.Job {
	delete(j.Labels, "kueue.x-k8s.io/queue-name")
	return j
}

// expectQuotaFor waits until exactly want of the PyTorchJobs pt-0 … pt-(n-1)
// hold quota, and checks that no more get it a little later.
func expectQuotaFor(t *testing.T, env *framework.Env, ns string, n, want int) {
	t.Helper()
	reserved := func() (int, string) {
		got, why := 0, ""
		for i := 0; i < n; i++ {
			w, err := env.WorkloadOf(ns, fmt.Sprintf("pt-%d", i), "PyTorchJob")
			if err != nil || w == nil {
				return -1, fmt.Sprint(err)
			}
			if apimeta.IsStatusConditionTrue(w.Status.Conditions, kueue.WorkloadQuotaReserved) {
				got++
			}
			why += framework.DescribeWorkload(w) + "; "
		}
		return got, why
	}
	env.Eventually(t, 60*time.Second, fmt.Sprintf("%d of %d jobs get quota", want, n), func() (bool, string) {
		got, why := reserved()
		return got == want, why
	})
	time.Sleep(2 * time.Second) // the others must stay out
	if got, why := reserved(); got != want {
		t.Errorf("%d jobs hold quota, want exactly %d: %s", got, want, why)
	}
	// Kueue starts the admitted ones: its update of each job (unsuspend,
	// pod set updates) passes gpupack's validating webhook.
	env.Eventually(t, 30*time.Second, fmt.Sprintf("%d jobs started by Kueue", want), func() (bool, string) {
		started := 0
		for i := 0; i < n; i++ {
			var pt kftraining.PyTorchJob
			if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("pt-%d", i)}, &pt); err != nil {
				return false, err.Error()
			}
			if s := pt.Spec.RunPolicy.Suspend; s != nil && !*s {
				started++
			}
		}
		return started == want, fmt.Sprintf("%d started", started)
	})
}

// warningClient is a clientset whose API warnings (what kubectl prints) are
// collected in the returned warnings.
func warningClient(t *testing.T, env *framework.Env) (*kubernetes.Clientset, *warnings) {
	t.Helper()
	w := &warnings{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = w
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs, w
}
