package webhooks

import (
	"context"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// The pod webhook's match conditions, compiled and evaluated by the
// apiserver's own code (k8s.io/apiserver's webhook accessor and matcher),
// offline: which pods reach gpupack, and what deciding that costs the
// apiserver for every pod created in the cluster.

func podMatcher(t testing.TB, o ServeOptions) matchconditions.Matcher {
	t.Helper()
	mwc, _ := WebhookConfigurations(o)
	for i := range mwc.Webhooks {
		if mwc.Webhooks[i].Name == PodMutatingWebhookName {
			return webhook.NewMutatingWebhookAccessor("uid", mwc.Name, &mwc.Webhooks[i]).GetCompiledMatcher(celCompiler())
		}
	}
	t.Fatal("no pod webhook")
	return nil
}

func celCompiler() plugincel.ConditionCompiler {
	return plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
}

// With ValidatePodCreate the validating webhook sees fast-path pods too
// (after every mutating webhook) and refuses one another webhook changed.
func TestValidatePodCreateSeesFastPathPods(t *testing.T) {
	o, err := DefaultServeOptions().WithFastPath(Config{})
	if err != nil {
		t.Fatal(err)
	}
	o.ValidatePodCreate = true
	_, vwc := WebhookConfigurations(o)
	pods := makeMatchPods(t)
	for i := range vwc.Webhooks {
		w := &vwc.Webhooks[i]
		if w.Name != "vpod.gpupack.io" {
			continue
		}
		m := webhook.NewValidatingWebhookAccessor("uid", vwc.Name, w).GetCompiledMatcher(celCompiler())
		if r := m.Match(context.Background(), podCreate(pods.job.DeepCopy(), "system:kube-controller-manager"), nil, nil); r.Error != nil || !r.Matches {
			t.Fatalf("validating webhook skips the fast-path pod: %+v", r)
		}
		mu, err := mutation.New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := mu.ValidatePod(pods.job.DeepCopy()); err != nil {
			t.Errorf("fast-path pod refused: %v", err)
		}
		changed := pods.job.DeepCopy()
		changed.Spec.Containers[0].Env = append(changed.Spec.Containers[0].Env, corev1.EnvVar{Name: v1alpha1.EnvLDPreload, Value: "/profiler.so"})
		if err := mu.ValidatePod(changed); err == nil {
			t.Error("a fast-path pod another webhook gave LD_PRELOAD is admitted")
		}
		return
	}
	t.Fatal("no validating pod webhook")
}

// podCreate is a pod creation as admission sees it, with a fresh lazy
// object (the apiserver makes one per request).
func podCreate(p *corev1.Pod, username string) *admission.VersionedAttributes {
	kind := corev1.SchemeGroupVersion.WithKind("Pod")
	attr := admission.NewAttributesRecord(p, nil, kind, p.Namespace, p.Name, corev1.SchemeGroupVersion.WithResource("pods"), "",
		admission.Create, &metav1.CreateOptions{}, false, &user.DefaultInfo{Name: username})
	va := &admission.VersionedAttributes{Attributes: attr, VersionedKind: kind}
	va.VersionedObject.Set(p)
	return va
}

type matchPods struct{ cpu, bare, job, jobNoGate, jobNoPlan *corev1.Pod }

func makeMatchPods(t testing.TB) matchPods {
	t.Helper()
	gpu := corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1"), corev1.ResourceCPU: resource.MustParse("2")}}
	cpu := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}}}}
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"},
			Containers: []corev1.Container{{Name: "trainer", Image: "trainer", Resources: gpu}}}}
	m, err := mutation.New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ns", UID: "job-uid", Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationPlan: "x"}}}
	j.Spec.Template.Spec = *bare.Spec.DeepCopy()
	j.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationPlan: "plan-1"} // as Kueue starts it
	if _, err := m.Job(j); err != nil {
		t.Fatal(err)
	}
	job := &corev1.Pod{ObjectMeta: *j.Spec.Template.ObjectMeta.DeepCopy(), Spec: *j.Spec.Template.Spec.DeepCopy()}
	job.Name, job.Namespace = "train-0-x", "ns"
	job.Labels = map[string]string{"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": "0"}
	job.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))}
	noGate := job.DeepCopy()
	noGate.Spec.SchedulingGates = nil
	// A fractional pod from a marked template without a plan (a job Kueue
	// does not place with gang-fit): it must reach the webhook, which
	// denies it (finding 1).
	noPlan := noGate.DeepCopy()
	delete(noPlan.Annotations, v1alpha1.AnnotationPlan)
	return matchPods{cpu, bare, job, noGate, noPlan}
}

func TestPodMatchConditions(t *testing.T) {
	fast, err := DefaultServeOptions().WithFastPath(Config{})
	if err != nil {
		t.Fatal(err)
	}
	pods := makeMatchPods(t)
	const kcm, tenant = "system:kube-controller-manager", "alice"
	for _, tc := range []struct {
		name  string
		o     ServeOptions
		pod   *corev1.Pod
		user  string
		calls bool
	}{
		{"CPU pod", fast, pods.cpu, tenant, false},
		{"CPU pod, no fast path", DefaultServeOptions(), pods.cpu, tenant, false},
		{"bare GPU pod", fast, pods.bare, tenant, true},
		{"job pod from the Job controller", fast, pods.job, kcm, false},
		{"job pod from the Job controller, no fast path", DefaultServeOptions(), pods.job, kcm, true},
		{"job pod copied by a tenant", fast, pods.job, tenant, true},
		{"job pod with a plan but no gate", fast, pods.jobNoGate, kcm, true},
		{"fractional job pod without a plan", fast, pods.jobNoPlan, kcm, true},
		// Every untrusted creation of a planned pod reaches the webhook,
		// which refuses the plan (issue 14, finding 6).
		{"a tenant's CPU-only pod naming a plan", fast, func() *corev1.Pod {
			p := pods.cpu.DeepCopy()
			p.Annotations = map[string]string{v1alpha1.AnnotationPlan: "plan-1"}
			return p
		}(), tenant, true},
		{"a tenant's planned pod with a GPU sidecar only", fast, func() *corev1.Pod {
			p := pods.cpu.DeepCopy()
			p.Annotations = map[string]string{v1alpha1.AnnotationPlan: "plan-1"}
			p.Spec.InitContainers = []corev1.Container{{Name: "side", Image: "i", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}
			return p
		}(), tenant, true},
	} {
		r := podMatcher(t, tc.o).Match(context.Background(), podCreate(tc.pod.DeepCopy(), tc.user), nil, nil)
		if r.Error != nil || r.Matches != tc.calls {
			t.Errorf("%s: matches %v (error %v), want %v", tc.name, r.Matches, r.Error, tc.calls)
		}
	}
}

// BenchmarkPodMatchConditions: the apiserver CPU per pod creation spent
// deciding whether to call gpupack's pod webhook.
func BenchmarkPodMatchConditions(b *testing.B) {
	fast, err := DefaultServeOptions().WithFastPath(Config{})
	if err != nil {
		b.Fatal(err)
	}
	pods := makeMatchPods(b)
	for _, bc := range []struct {
		name string
		o    ServeOptions
		pod  *corev1.Pod
		user string
	}{
		{"cpu-pod", fast, pods.cpu, "alice"},
		{"bare-gpu-pod", fast, pods.bare, "alice"},
		{"job-pod/fast-path", fast, pods.job, "system:kube-controller-manager"},
		{"job-pod/fast-path-off", DefaultServeOptions(), pods.job, "system:kube-controller-manager"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := podMatcher(b, bc.o)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if r := m.Match(ctx, podCreate(bc.pod, bc.user), nil, nil); r.Error != nil {
					b.Fatal(r.Error)
				}
			}
		})
	}
}

// The validating pod webhook, for updates: a plain update that edits no
// request annotation (the ungater lifting its gate) is not sent, and must
// not fail evaluating (an empty subResource is absent in CEL); ephemeral
// containers added to a GPU pod, and init-container-only GPU pods, are.
func TestValidatingPodUpdateConditions(t *testing.T) {
	_, vwc := WebhookConfigurations(DefaultServeOptions())
	var m matchconditions.Matcher
	for i := range vwc.Webhooks {
		if vwc.Webhooks[i].Name == "vpod.gpupack.io" {
			m = webhook.NewValidatingWebhookAccessor("uid", vwc.Name, &vwc.Webhooks[i]).GetCompiledMatcher(celCompiler())
		}
	}
	pods := makeMatchPods(t)
	update := func(p, old *corev1.Pod, sub string) *admission.VersionedAttributes {
		kind := corev1.SchemeGroupVersion.WithKind("Pod")
		attr := admission.NewAttributesRecord(p, old, kind, p.Namespace, p.Name, corev1.SchemeGroupVersion.WithResource("pods"), sub,
			admission.Update, &metav1.UpdateOptions{}, false, &user.DefaultInfo{Name: "alice"})
		va := &admission.VersionedAttributes{Attributes: attr, VersionedKind: kind}
		va.VersionedObject.Set(p)
		va.VersionedOldObject.Set(old)
		return va
	}
	old := pods.bare.DeepCopy()
	cur := old.DeepCopy()
	cur.Labels = map[string]string{"x": "y"}
	if r := m.Match(context.Background(), update(cur, old, ""), nil, nil); r.Error != nil || r.Matches {
		t.Errorf("relabelling a GPU pod: matches %v, error %v", r.Matches, r.Error)
	}
	// A tenant removing gpupack.io/checkpoint from a running GPU pod is sent
	// (the validator refuses it: review 16, H3).
	opted := old.DeepCopy()
	if opted.Annotations == nil {
		opted.Annotations = map[string]string{}
	}
	opted.Annotations[v1alpha1.AnnotationCheckpoint] = "true"
	removed := opted.DeepCopy()
	delete(removed.Annotations, v1alpha1.AnnotationCheckpoint)
	if r := m.Match(context.Background(), update(removed, opted, ""), nil, nil); r.Error != nil || !r.Matches {
		t.Errorf("removing %s from a GPU pod: matches %v, error %v", v1alpha1.AnnotationCheckpoint, r.Matches, r.Error)
	}
	dbg := old.DeepCopy()
	dbg.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "busybox"}}}
	if r := m.Match(context.Background(), update(dbg, old, "ephemeralcontainers"), nil, nil); r.Error != nil || !r.Matches {
		t.Errorf("debug container on a GPU pod: matches %v, error %v", r.Matches, r.Error)
	}
	cpuDbg := pods.cpu.DeepCopy()
	cpuDbg.Spec.EphemeralContainers = dbg.Spec.EphemeralContainers
	if r := m.Match(context.Background(), update(cpuDbg, pods.cpu, "ephemeralcontainers"), nil, nil); r.Error != nil || r.Matches {
		t.Errorf("debug container on a CPU pod: matches %v, error %v", r.Matches, r.Error)
	}
	// The mutating condition sees a GPU asked for only by a sidecar.
	side := pods.cpu.DeepCopy()
	always := corev1.ContainerRestartPolicyAlways
	side.Spec.InitContainers = []corev1.Container{{Name: "side", Image: "x", RestartPolicy: &always, Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}
	if r := podMatcher(t, DefaultServeOptions()).Match(context.Background(), podCreate(side, "alice"), nil, nil); r.Error != nil || !r.Matches {
		t.Errorf("GPU in a sidecar only: matches %v, error %v", r.Matches, r.Error)
	}
}

// A CPU-only job whose pod templates carry annotations (any: a sidecar
// injector's) asks for no GPU and must not reach gpupack — and the match
// condition must not fail on it either, or failurePolicy Fail refuses the
// job. A PyTorchJob's or MPIJob's replica types were iterated as k, the
// name the annotation check iterates annotation keys by: a template
// annotation made the condition index the replica specs by an annotation
// key ("no such key") and every such CPU job was refused.
func TestCPUJobsWithTemplateAnnotationsSkipTheWebhooks(t *testing.T) {
	o := DefaultServeOptions()
	o.JobKinds = AllJobKinds
	mwc, vwc := WebhookConfigurations(o)
	tmpl := map[string]any{"metadata": map[string]any{"annotations": map[string]any{"sidecar.istio.io/inject": "false"}},
		"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "busybox"}}}}
	replicas := map[string]any{"Launcher": map[string]any{"template": tmpl}, "Worker": map[string]any{"template": tmpl}}
	for _, tc := range []struct {
		kind, apiVersion, resource string
		spec                       map[string]any
	}{
		{"Job", "batch/v1", "jobs", map[string]any{"template": tmpl}},
		{"PyTorchJob", "kubeflow.org/v1", "pytorchjobs", map[string]any{"pytorchReplicaSpecs": map[string]any{"Master": map[string]any{"template": tmpl}, "Worker": map[string]any{"template": tmpl}}}},
		{"MPIJob", "kubeflow.org/v2beta1", "mpijobs", map[string]any{"mpiReplicaSpecs": replicas}},
	} {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": tc.apiVersion, "kind": tc.kind,
			"metadata": map[string]any{"name": "cpu", "namespace": "ns"}, "spec": tc.spec}}
		gvk := obj.GroupVersionKind()
		attr := admission.NewAttributesRecord(obj, nil, gvk, "ns", "cpu", gvk.GroupVersion().WithResource(tc.resource), "",
			admission.Create, &metav1.CreateOptions{}, false, &user.DefaultInfo{Name: "alice"})
		va := &admission.VersionedAttributes{Attributes: attr, VersionedKind: gvk}
		va.VersionedObject.Set(obj)
		name := strings.ToLower(tc.kind)
		found := 0
		for i := range mwc.Webhooks {
			if w := &mwc.Webhooks[i]; w.Name == "m"+name+".gpupack.io" {
				found++
				r := webhook.NewMutatingWebhookAccessor("uid", mwc.Name, w).GetCompiledMatcher(celCompiler()).Match(context.Background(), va, nil, nil)
				if r.Error != nil || r.Matches {
					t.Errorf("%s: a CPU-only %s with template annotations: matches %v, error %v", w.Name, tc.kind, r.Matches, r.Error)
				}
			}
		}
		for i := range vwc.Webhooks {
			if w := &vwc.Webhooks[i]; w.Name == "v"+name+".gpupack.io" {
				found++
				r := webhook.NewValidatingWebhookAccessor("uid", vwc.Name, w).GetCompiledMatcher(celCompiler()).Match(context.Background(), va, nil, nil)
				if r.Error != nil || r.Matches {
					t.Errorf("%s: a CPU-only %s with template annotations: matches %v, error %v", w.Name, tc.kind, r.Matches, r.Error)
				}
			}
		}
		if found != 2 {
			t.Errorf("%d webhooks for %s, want a mutating and a validating one", found, tc.kind)
		}
	}
}
