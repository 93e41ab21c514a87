package webhooks

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	cradmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// selectorOn returns cfg with Kueue's managedJobsNamespaceSelector set to
// namespaces labelled key=yes.
func selectorOn(cfg mutation.Config, key string) mutation.Config {
	cfg.Kueue.ManagedJobsNamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{key: "yes"}}
	return cfg
}

func wholeGPUPod(ns string, gpus string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "greedy", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse(gpus)}}}}},
	}
}

// TestUnmanagedGPUs (finding 2): GPU pods and jobs Kueue will not manage
// are denied by default, with the reason and what to do; a namespace
// opts out with a label; the policy and Kueue's settings are configurable.
func TestUnmanagedGPUs(t *testing.T) {
	ctx := context.Background()
	yes := true
	queued := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "queued", Namespace: "ns", UID: "u-queued", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	plain := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "ns", UID: "u-plain"}}
	optOut := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab", Labels: map[string]string{mutation.NamespaceLabelUnmanagedGPUs: "allow"}}}
	ml := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-ml", Labels: map[string]string{"kueue-managed": "yes"}}}
	objs := []kruntime.Object{queued, plain, optOut, ml, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kueue-system"}}}
	owned := func(p *corev1.Pod, kind, apiVersion, name, uid string) *corev1.Pod {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID("u-" + uid), Controller: &yes}}
		return p
	}
	labelled := func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{mutation.LabelQueueName: "q"}; return p }
	planned := func(p *corev1.Pod) *corev1.Pod {
		p.Annotations = map[string]string{v1alpha1.AnnotationPlan: "plan-1"}
		return p
	}
	withPods := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "pod"}}}
	cases := []struct {
		name string
		cfg  mutation.Config
		pod  *corev1.Pod
		deny string // "" = allowed
	}{
		{"whole GPUs, no queue name", mutation.Config{}, wholeGPUPod("ns", "8"),
			`pod greedy asks for GPUs but Kueue will not manage it (no kueue.x-k8s.io/queue-name label, and Kueue's "pod" integration is not in gpupack's kueue.frameworks)`},
		{"whole GPUs, namespace opted out", mutation.Config{}, wholeGPUPod("lab", "8"), ""},
		{"whole GPUs, policy Allow", mutation.Config{UnmanagedGPUs: mutation.UnmanagedGPUsConfig{Policy: mutation.UnmanagedAllow}}, wholeGPUPod("ns", "8"), ""},
		{"queue label without Kueue's pod integration", mutation.Config{}, labelled(wholeGPUPod("ns", "8")),
			`Kueue's "pod" integration is not in gpupack's kueue.frameworks`},
		{"queue label with Kueue's pod integration", withPods, labelled(wholeGPUPod("ns", "8")), ""},
		{"manageJobsWithoutQueueName with pods", mutation.Config{Kueue: mutation.KueueConfig{ManageJobsWithoutQueueName: true, Frameworks: []string{"pod"}}}, wholeGPUPod("ns", "8"), ""},
		{"owned by a queued Job", mutation.Config{}, owned(wholeGPUPod("ns", "1"), "Job", "batch/v1", "queued", "queued"), ""},
		{"owned by an unqueued Job", mutation.Config{}, owned(wholeGPUPod("ns", "1"), "Job", "batch/v1", "plain", "plain"),
			"nor its owner Job plain (no kueue.x-k8s.io/queue-name label)"},
		{"forged owner reference (wrong UID)", mutation.Config{}, owned(wholeGPUPod("ns", "1"), "Job", "batch/v1", "queued", "other"),
			"names UID u-other, which is not that object"},
		{"owner that does not exist", mutation.Config{}, owned(wholeGPUPod("ns", "1"), "Job", "batch/v1", "ghost", "ghost"), "cannot be read"},
		{"owner of a kind Kueue does not run", mutation.Config{}, owned(wholeGPUPod("ns", "1"), "ReplicaSet", "apps/v1", "rs", "rs"),
			"its owner ReplicaSet rs is not a kind Kueue manages here"},
		{"a planned pod waits behind the placement gate", mutation.Config{}, owned(planned(wholeGPUPod("ns", "1")), "Job", "batch/v1", "queued", "queued"), ""},
		// Kueue manages nothing in a namespace its
		// managedJobsNamespaceSelector does not select: a queued pod
		// there is never gated, an unqueued Job runs even under
		// manageJobsWithoutQueueName.
		{"queue label in a namespace Kueue's default selector excludes", withPods, labelled(wholeGPUPod("kueue-system", "8")),
			"Kueue manages nothing in namespace kueue-system"},
		{"queue label, namespace not selected by a label selector", selectorOn(withPods, "kueue-managed"), labelled(wholeGPUPod("ns", "8")),
			"Kueue manages nothing in namespace ns"},
		{"queue label, namespace selected by a label selector", selectorOn(withPods, "kueue-managed"), labelled(wholeGPUPod("team-ml", "8")), ""},
		{"manageJobsWithoutQueueName, namespace not selected", selectorOn(mutation.Config{Kueue: mutation.KueueConfig{ManageJobsWithoutQueueName: true, Frameworks: []string{"pod"}}}, "kueue-managed"),
			wholeGPUPod("ns", "8"), "Kueue manages nothing in namespace ns"},
		{"owned by a queued Job, namespace not selected", selectorOn(mutation.Config{}, "kueue-managed"), owned(wholeGPUPod("ns", "1"), "Job", "batch/v1", "queued", "queued"),
			"Kueue manages nothing in namespace ns"},
		{"namespace not selected but opted out of the policy", selectorOn(withPods, "kueue-managed"), labelled(wholeGPUPod("lab", "8")), ""},
		{"a namespace that cannot be read is not selected", selectorOn(withPods, "kueue-managed"), labelled(wholeGPUPod("gone", "8")),
			"namespace gone cannot be read"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := handlers(t, tc.cfg, objs...)
			resp := h[PathMutatePod].Handle(ctx, request(t, admissionv1.Create, tc.pod, nil))
			if tc.deny == "" {
				if !resp.Allowed {
					t.Fatalf("denied: %v", resp.Result.Message)
				}
				return
			}
			if resp.Allowed || !strings.Contains(resp.Result.Message, tc.deny) {
				t.Fatalf("allowed=%v %q, want denied with %q", resp.Allowed, resp.Result, tc.deny)
			}
			if !strings.Contains(resp.Result.Message, "gpupack.io/unmanaged-gpus=allow") {
				t.Errorf("message does not say how to opt out: %s", resp.Result.Message)
			}
		})
	}

	t.Run("jobs", func(t *testing.T) {
		job := func(labels map[string]string) *batchv1.Job {
			j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns", Labels: labels}}
			j.Spec.Template.Spec.Containers = []corev1.Container{{Name: "c", Image: "i", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("8")}}}}
			return j
		}
		h := handlers(t, mutation.Config{}, objs...)
		if resp := h[PathMutateJob].Handle(ctx, request(t, admissionv1.Create, job(nil), nil)); resp.Allowed || !strings.Contains(resp.Result.Message, "Job j asks for GPUs but Kueue will not manage it") {
			t.Errorf("unqueued GPU Job: allowed=%v %v", resp.Allowed, resp.Result)
		}
		if resp := h[PathMutateJob].Handle(ctx, request(t, admissionv1.Create, job(map[string]string{mutation.LabelQueueName: "q"}), nil)); !resp.Allowed {
			t.Errorf("queued GPU Job denied: %v", resp.Result)
		}
		if resp := h[PathMutateJob].Handle(ctx, request(t, admissionv1.Update, job(nil), job(map[string]string{mutation.LabelQueueName: "q"}))); resp.Allowed {
			t.Error("removing the queue label of a GPU Job allowed")
		}
		cpu := job(nil)
		cpu.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		if resp := h[PathMutateJob].Handle(ctx, request(t, admissionv1.Create, cpu, nil)); !resp.Allowed {
			t.Errorf("CPU Job denied: %v", resp.Result)
		}
		all := handlers(t, mutation.Config{Kueue: mutation.KueueConfig{ManageJobsWithoutQueueName: true}}, objs...)
		if resp := all[PathMutateJob].Handle(ctx, request(t, admissionv1.Create, job(nil), nil)); !resp.Allowed {
			t.Errorf("manageJobsWithoutQueueName: unqueued GPU Job denied: %v", resp.Result)
		}
	})
}

// TestFractionalPodNeedsAPlan (finding 1, at admission): every fractional
// pod is gated; one that can never get a plan is denied.
func TestFractionalPodNeedsAPlan(t *testing.T) {
	ctx := context.Background()
	unplanned := gpuPod("4Gi")
	delete(unplanned.Annotations, v1alpha1.AnnotationPlan)
	unplanned.OwnerReferences = nil
	h := handlers(t, mutation.Config{UnmanagedGPUs: mutation.UnmanagedGPUsConfig{Policy: mutation.UnmanagedAllow}})
	resp := h[PathMutatePod].Handle(ctx, request(t, admissionv1.Create, unplanned, nil))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "has no gpupack.io/plan and will not get one") {
		t.Fatalf("unplanned fractional pod: allowed=%v %v", resp.Allowed, resp.Result)
	}
	// Already converted (gpupack.io/vgpu written by hand) is no different.
	raw := unplanned.DeepCopy()
	delete(raw.Annotations, v1alpha1.AnnotationGPUMemory)
	raw.Spec.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceVGPU: resource.MustParse("1"), v1alpha1.ResourceGPUMemory: resource.MustParse("4096")}
	if resp := h[PathMutatePod].Handle(ctx, request(t, admissionv1.Create, raw, nil)); resp.Allowed {
		t.Error("unplanned gpupack.io/vgpu pod allowed")
	}
	for _, tc := range []struct {
		name string
		cfg  mutation.Config
		pod  *corev1.Pod
	}{
		{"planned", mutation.Config{}, gpuPod("4Gi")},
		{"Kueue's pod integration will admit it", mutation.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"pod"}}}, func() *corev1.Pod {
			p := unplanned.DeepCopy()
			p.Labels = map[string]string{mutation.LabelQueueName: "q"}
			return p
		}()},
	} {
		h := handlers(t, tc.cfg)
		req := request(t, admissionv1.Create, tc.pod, nil)
		resp := h[PathMutatePod].Handle(ctx, req)
		if !resp.Allowed {
			t.Fatalf("%s: denied: %v", tc.name, resp.Result)
		}
		var got corev1.Pod
		apply(t, req, resp, &got)
		gated := false
		for _, g := range got.Spec.SchedulingGates {
			gated = gated || g.Name == v1alpha1.SchedulingGatePlacement
		}
		if !gated {
			t.Errorf("%s: stored pod has no %s gate", tc.name, v1alpha1.SchedulingGatePlacement)
		}
	}
}

// TestJobKindsUnmanagedGPUs (open finding 4): JobSets, LeaderWorkerSets,
// Deployments and StatefulSets are held to the unmanaged-GPU policy when
// they are applied — the same rule (kueueView, CheckUnmanaged) as pods and
// Jobs — instead of only when their controllers create child Jobs or pods.
func TestJobKindsUnmanagedGPUs(t *testing.T) {
	ctx := context.Background()
	yes := true
	queuedLWS := &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "infer", Namespace: "ns", UID: "u-infer", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	objs := []kruntime.Object{queuedLWS, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab", Labels: map[string]string{mutation.NamespaceLabelUnmanagedGPUs: "allow"}}}}
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = lws.AddToScheme(s)
	reader := fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(objs...).Build()
	all := []string{"jobset.x-k8s.io/jobset", "leaderworkerset.x-k8s.io/leaderworkerset", "pod", "deployment", "statefulset"}
	hs := func(cfg mutation.Config) map[string]cradmission.Handler {
		m, err := mutation.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return Handlers(m, reader)
	}
	integrated := hs(mutation.Config{Kueue: mutation.KueueConfig{Frameworks: all}})

	type object interface {
		metav1.Object
		kruntime.Object
	}
	tmpl := gpuTemplate(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, "1")
	js := testJobSet(nil, true, tmpl)
	l := &lws.LeaderWorkerSet{TypeMeta: metav1.TypeMeta{APIVersion: lws.GroupVersion.String(), Kind: "LeaderWorkerSet"}, ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns"}}
	l.Spec.LeaderWorkerTemplate.WorkerTemplate = tmpl
	d := &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}, ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns"}, Spec: appsv1.DeploymentSpec{Template: tmpl}}
	st := &appsv1.StatefulSet{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"}, ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns"}, Spec: appsv1.StatefulSetSpec{Template: tmpl}}
	for _, tc := range []struct {
		kind, framework, path string
		obj                   object
		cpu                   func() object
	}{
		{"JobSet", "jobset.x-k8s.io/jobset", PathMutateJobSet, js, func() object { return testJobSet(nil, true, cpuTemplate()) }},
		{"LeaderWorkerSet", "leaderworkerset.x-k8s.io/leaderworkerset", PathMutateLeaderWorkerSet, l, func() object {
			c := l.DeepCopy()
			c.Spec.LeaderWorkerTemplate.WorkerTemplate = cpuTemplate()
			return c
		}},
		{"Deployment", "deployment", PathMutateDeployment, d, func() object { c := d.DeepCopy(); c.Spec.Template = cpuTemplate(); return c }},
		{"StatefulSet", "statefulset", PathMutateStatefulSet, st, func() object { c := st.DeepCopy(); c.Spec.Template = cpuTemplate(); return c }},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			with := func(f func(object)) object {
				o := tc.obj.DeepCopyObject().(object)
				f(o)
				return o
			}
			queued := func(o object) { o.SetLabels(map[string]string{mutation.LabelQueueName: "q"}) }
			run := func(h map[string]cradmission.Handler, op admissionv1.Operation, obj, old object) cradmission.Response {
				var oldAny any
				if old != nil {
					oldAny = old
				}
				return h[tc.path].Handle(ctx, request(t, op, obj, oldAny))
			}
			want := tc.kind + " " + tc.obj.GetName() + " asks for GPUs but Kueue will not manage it (no kueue.x-k8s.io/queue-name label)"
			if r := run(integrated, admissionv1.Create, tc.obj, nil); r.Allowed || !strings.Contains(r.Result.Message, want) || !strings.Contains(r.Result.Message, "gpupack.io/unmanaged-gpus=allow") {
				t.Errorf("no queue name: allowed=%v %v, want %q", r.Allowed, r.Result, want)
			}
			if r := run(integrated, admissionv1.Create, with(queued), nil); !r.Allowed {
				t.Errorf("queued: %v", r.Result)
			}
			notIntegrated := `Kueue's "` + tc.framework + `" integration is not in gpupack's kueue.frameworks`
			if r := run(hs(mutation.Config{}), admissionv1.Create, with(queued), nil); r.Allowed || !strings.Contains(r.Result.Message, notIntegrated) {
				t.Errorf("queued, but Kueue does not run the integration: allowed=%v %v", r.Allowed, r.Result)
			}
			if r := run(integrated, admissionv1.Create, with(func(o object) { o.SetNamespace("lab") }), nil); !r.Allowed {
				t.Errorf("in a namespace that opted out: %v", r.Result)
			}
			if r := run(hs(mutation.Config{UnmanagedGPUs: mutation.UnmanagedGPUsConfig{Policy: mutation.UnmanagedAllow}}), admissionv1.Create, tc.obj, nil); !r.Allowed {
				t.Errorf("policy Allow: %v", r.Result)
			}
			if r := run(integrated, admissionv1.Create, tc.cpu(), nil); !r.Allowed {
				t.Errorf("CPU only: %v", r.Result)
			}
			if r := run(integrated, admissionv1.Update, tc.obj, with(queued)); r.Allowed || !strings.Contains(r.Result.Message, tc.obj.GetName()+" asks for GPUs but Kueue will not manage it") {
				t.Errorf("removing the queue label: allowed=%v %v", r.Allowed, r.Result)
			}
			// Made by a controller for an owner Kueue manages (an LWS's
			// StatefulSet): managed through the owner, if it is that owner.
			ownedBy := func(uid string) object {
				return with(func(o object) {
					o.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: lws.GroupVersion.String(), Kind: "LeaderWorkerSet", Name: "infer", UID: types.UID(uid), Controller: &yes}})
				})
			}
			if r := run(integrated, admissionv1.Create, ownedBy("u-infer"), nil); !r.Allowed {
				t.Errorf("owned by a queued LeaderWorkerSet: %v", r.Result)
			}
			if r := run(integrated, admissionv1.Create, ownedBy("u-forged"), nil); r.Allowed || !strings.Contains(r.Result.Message, "which is not that object") {
				t.Errorf("forged owner reference: allowed=%v %v", r.Allowed, r.Result)
			}
		})
	}
}

// A Job that the JobSet controller makes for a TrainJob's JobSet, where
// Kueue runs the trainjob integration but not the jobset one: Kueue walks up
// through the JobSet (a kind it knows) to the queued TrainJob and manages
// the Job through it, so gpupack's view must too — the real Trainer and
// JobSet controllers' first Job was denied before (jobkinds
// TestTrainJobController…). Through an unqueued TrainJob, or a JobSet with
// no owner, the Job stays unmanaged and is denied, naming each owner.
func TestUnmanagedGPUsThroughAKindKueueKnowsButDoesNotRun(t *testing.T) {
	ctx := context.Background()
	yes := true
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = jobset.AddToScheme(s)
	_ = trainer.AddToScheme(s)
	ctrlBy := func(kind, apiVersion, name string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID("u-" + name), Controller: &yes}}
	}
	queued := &trainer.TrainJob{ObjectMeta: metav1.ObjectMeta{Name: "queued", Namespace: "ns", UID: "u-queued", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	plain := &trainer.TrainJob{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "ns", UID: "u-plain"}}
	jsQueued := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "js-queued", Namespace: "ns", UID: "u-js-queued", OwnerReferences: ctrlBy("TrainJob", "trainer.kubeflow.org/v1alpha1", "queued")}}
	jsPlain := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "js-plain", Namespace: "ns", UID: "u-js-plain", OwnerReferences: ctrlBy("TrainJob", "trainer.kubeflow.org/v1alpha1", "plain")}}
	jsAlone := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "js-alone", Namespace: "ns", UID: "u-js-alone"}}
	c := fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(queued, plain, jsQueued, jsPlain, jsAlone, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).Build()
	cfg := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "trainer.kubeflow.org/trainjob"}}, JobKinds: []string{KindJobSet}}
	m, err := mutation.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, c)
	job := func(owner string) *batchv1.Job {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: owner + "-node-0", Namespace: "ns", OwnerReferences: ctrlBy("JobSet", "jobset.x-k8s.io/v1alpha2", owner)}}
		j.Spec.Template.Spec.Containers = []corev1.Container{{Name: "c", Image: "i", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}
		return j
	}
	// Where JobSets have no webhook entry, nothing checked who made the
	// JobSet (a tenant's own, under her queued TrainJob): not walked
	// through (review 14, F2).
	cfg.JobKinds = nil
	unchecked, err := mutation.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if resp := Handlers(unchecked, c)[PathMutateJob].Handle(ctx, request(t, admissionv1.Create, job("js-queued"), nil)); resp.Allowed || !strings.Contains(resp.Result.Message, "JobSets have no gpupack webhook entry") {
		t.Errorf("Job of a queued TrainJob's JobSet, JobSets unchecked at creation: allowed=%v %v", resp.Allowed, resp.Result)
	}
	if resp := h[PathMutateJob].Handle(ctx, request(t, admissionv1.Create, job("js-queued"), nil)); !resp.Allowed {
		t.Errorf("Job of a queued TrainJob's JobSet denied: %v", resp.Result)
	}
	// A forged reference (the queued TrainJob's JobSet by name, another
	// UID) is not walked through.
	forged := job("js-queued")
	forged.OwnerReferences[0].UID = "u-other"
	if resp := h[PathMutateJob].Handle(ctx, request(t, admissionv1.Create, forged, nil)); resp.Allowed || !strings.Contains(resp.Result.Message, "its owner JobSet js-queued cannot be read or is not that object") {
		t.Errorf("Job with a forged JobSet owner reference: allowed=%v %v", resp.Allowed, resp.Result)
	}
	for owner, want := range map[string][]string{
		"js-plain": {"nor its owner JobSet js-plain (no kueue.x-k8s.io/queue-name label, and Kueue's \"jobset.x-k8s.io/jobset\" integration is not in gpupack's kueue.frameworks)", "nor its owner TrainJob plain (no kueue.x-k8s.io/queue-name label)"},
		"js-alone": {"nor its owner JobSet js-alone"},
	} {
		resp := h[PathMutateJob].Handle(ctx, request(t, admissionv1.Create, job(owner), nil))
		if resp.Allowed {
			t.Errorf("Job of JobSet %s allowed", owner)
			continue
		}
		for _, w := range want {
			if !strings.Contains(resp.Result.Message, w) {
				t.Errorf("Job of JobSet %s: %q does not say %q", owner, resp.Result.Message, w)
			}
		}
	}
}

// TestOwnerReferenceCountsOnlyFromItsController: a GPU object is managed
// through its controlling owner only when a controller the policy trusts
// created it. A tenant's own pod whose controller reference names the
// tenant's queued (suspended, waiting) Job — the Job exists with that UID —
// would otherwise run with whole GPUs outside every quota: Kueue never
// gates a Job's pods, and a suspended Job makes none of its own.
func TestOwnerReferenceCountsOnlyFromItsController(t *testing.T) {
	ctx := context.Background()
	yes := true
	queued := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "queued", Namespace: "ns", UID: "u-queued", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
	pod := wholeGPUPod("ns", "8")
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "queued", UID: "u-queued", Controller: &yes}}
	objs := []kruntime.Object{queued, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}}
	cases := []struct {
		name  string
		cfg   mutation.Config
		user  authenticationv1.UserInfo
		allow bool
	}{
		{"the Job controller", mutation.Config{}, authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:job-controller"}, true},
		{"kube-controller-manager's own identity", mutation.Config{}, authenticationv1.UserInfo{Username: "system:kube-controller-manager"}, true},
		{"a cluster admin", mutation.Config{}, authenticationv1.UserInfo{Username: "root", Groups: []string{"system:masters"}}, true},
		{"the tenant", mutation.Config{}, authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}, false},
		{"a tenant's service account", mutation.Config{}, authenticationv1.UserInfo{Username: "system:serviceaccount:ns:default", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:ns"}}, false},
		{"a controller the platform added", mutation.Config{UnmanagedGPUs: mutation.UnmanagedGPUsConfig{OwnerControllers: []string{"system:serviceaccount:ops:my-operator"}}},
			authenticationv1.UserInfo{Username: "system:serviceaccount:ops:my-operator"}, true},
		{"the Job controller, once the list names only another", mutation.Config{UnmanagedGPUs: mutation.UnmanagedGPUsConfig{OwnerControllers: []string{"system:serviceaccount:ops:my-operator"}}},
			authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:job-controller"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := handlers(t, tc.cfg, objs...)
			req := request(t, admissionv1.Create, pod, nil)
			req.UserInfo = tc.user
			resp := h[PathMutatePod].Handle(ctx, req)
			if resp.Allowed != tc.allow {
				t.Fatalf("allowed = %v, want %v: %v", resp.Allowed, tc.allow, resp.Result)
			}
			if !tc.allow && !strings.Contains(resp.Result.Message, "was created by \""+tc.user.Username+"\"") {
				t.Errorf("denial does not say who created it: %s", resp.Result.Message)
			}
		})
	}
}

// TestPosesAsChildDeniedWhateverThePolicy (review 9, F1): a GPU object
// whose controller is a Kueue-managed owner whose controller copies its
// templates into its children (a JobSet), while nobody gpupack trusts
// created it, is refused in a namespace that opted out of the
// unmanaged-GPU policy and under the policy Allow too: the JobSet
// controller adopts it and copies the owner's gpupack.io/plan into it, so
// its pods would take the victim's slots. The JobSet controller's own Job,
// a GPU object of no owner, and objects under owners that copy nothing
// (a pod under a Job, an owner reference that is not that object, an
// owner missing from the cache — review 10, F3 and F4) keep the policy's
// and the opt-out's answer.
func TestPosesAsChildDeniedWhateverThePolicy(t *testing.T) {
	ctx := context.Background()
	yes := true
	objs := []kruntime.Object{
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "bob", Namespace: "lab", UID: "u-bob", Labels: map[string]string{mutation.LabelQueueName: "q"}}},
		&jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "bob-js", Namespace: "lab", UID: "u-bob-js", Labels: map[string]string{mutation.LabelQueueName: "q"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab", Labels: map[string]string{mutation.NamespaceLabelUnmanagedGPUs: "allow"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
	}
	sc := kruntime.NewScheme()
	_ = corev1.AddToScheme(sc)
	_ = batchv1.AddToScheme(sc)
	_ = jobset.AddToScheme(sc)
	reader := fake.NewClientBuilder().WithScheme(sc).WithRuntimeObjects(objs...).Build()
	jobRef := func(uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "bob", UID: types.UID(uid), Controller: &yes}}
	}
	jobSetRef := []metav1.OwnerReference{{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "bob-js", UID: "u-bob-js", Controller: &yes}}
	pod := func(ns string, owners []metav1.OwnerReference) kruntime.Object {
		p := wholeGPUPod(ns, "1")
		p.OwnerReferences = owners
		return p
	}
	job := func(ns string, owners []metav1.OwnerReference) kruntime.Object {
		return &batchv1.Job{TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"}, ObjectMeta: metav1.ObjectMeta{Name: "alice", Namespace: ns, OwnerReferences: owners},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: wholeGPUPod(ns, "1").Spec}}}
	}
	alice := authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}
	jobSetController := authenticationv1.UserInfo{Username: "system:serviceaccount:jobset-system:jobset-controller-manager"}
	fws := []string{"batch/job", "jobset.x-k8s.io/jobset"}
	deny := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: fws}}
	allow := mutation.Config{Kueue: mutation.KueueConfig{Frameworks: fws}, UnmanagedGPUs: mutation.UnmanagedGPUsConfig{Policy: mutation.UnmanagedAllow}}
	for _, tc := range []struct {
		name string
		cfg  mutation.Config
		path string
		obj  kruntime.Object
		user authenticationv1.UserInfo
		deny string // "" = allowed
	}{
		{"Job under the victim's JobSet, opted-out namespace", deny, PathMutateJob, job("lab", jobSetRef), alice, `created by "alice"`},
		{"Job naming a JobSet of another namespace (none here), policy Allow", allow, PathMutateJob, job("ns", []metav1.OwnerReference{{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "bob-js", UID: "u-bob-js", Controller: &yes}}), alice, ""},
		{"Job under the victim's JobSet (same namespace), policy Allow", allow, PathMutateJob, job("lab", jobSetRef), alice, `created by "alice"`},
		{"the JobSet controller's Job, opted-out namespace", deny, PathMutateJob, job("lab", jobSetRef), jobSetController, ""},
		{"pod under the victim's queued Job, opted-out namespace (the Job controller copies nothing)", deny, PathMutatePod, pod("lab", jobRef("u-bob")), alice, ""},
		{"pod under a forged UID, opted-out namespace", deny, PathMutatePod, pod("lab", jobRef("u-other")), alice, ""},
		{"a GPU pod of no owner, opted-out namespace", deny, PathMutatePod, pod("lab", nil), alice, ""},
		{"a GPU Job of no owner, opted-out namespace", deny, PathMutateJob, job("lab", nil), alice, ""},
		{"a GPU pod of no owner, policy Allow", allow, PathMutatePod, pod("ns", nil), alice, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := mutation.New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			req := request(t, admissionv1.Create, tc.obj, nil)
			req.UserInfo = tc.user
			resp := Handlers(m, reader)[tc.path].Handle(ctx, req)
			if tc.deny == "" {
				if !resp.Allowed {
					t.Fatalf("denied: %v", resp.Result.Message)
				}
				return
			}
			if resp.Allowed || !strings.Contains(resp.Result.Message, tc.deny) || !strings.Contains(resp.Result.Message, "do not cover it") {
				t.Fatalf("allowed=%v %v, want denied with %q (and that the opt-out does not cover it)", resp.Allowed, resp.Result, tc.deny)
			}
		})
	}
}
