package webhooks

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/webhook"
	"k8s.io/apiserver/pkg/authentication/user"
	cradmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// kindsConfig: these tests are about conversion, on objects Kueue would
// not manage; the unmanaged-GPU policy for the job kinds is
// TestJobKindsUnmanagedGPUs.
var kindsConfig = Config{UnmanagedGPUs: mutation.UnmanagedGPUsConfig{Policy: mutation.UnmanagedAllow}}

func resourceQ(s string) resource.Quantity { return resource.MustParse(s) }

func gpuTemplate(ann map[string]string, gpus string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Annotations: ann},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"},
			Containers: []corev1.Container{{Name: "c", Image: "i", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				v1alpha1.ResourceNvidiaGPU: resourceQ(gpus)}}}}},
	}
}

func cpuTemplate() corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceCPU: resourceQ("1")}}}}}}
}

func testJobSet(ann map[string]string, suspend bool, ts ...corev1.PodTemplateSpec) *jobset.JobSet {
	j := &jobset.JobSet{TypeMeta: metav1.TypeMeta{APIVersion: jobset.GroupVersion.String(), Kind: "JobSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "js", Namespace: "ns", Annotations: ann}}
	j.Spec.Suspend = &suspend
	for i, t := range ts {
		j.Spec.ReplicatedJobs = append(j.Spec.ReplicatedJobs, jobset.ReplicatedJob{Name: []string{"driver", "workers"}[i], Replicas: 2,
			Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: t}}})
	}
	return j
}

func handle(t *testing.T, path string, op admissionv1.Operation, obj, old any) cradmission.Response {
	t.Helper()
	m, err := mutation.New(kindsConfig)
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, nil)[path]
	if h == nil {
		t.Fatalf("no handler at %s", path)
	}
	return h.Handle(context.Background(), request(t, op, obj, old))
}

func TestJobSetWebhook(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	js := testJobSet(mem, true, cpuTemplate(), gpuTemplate(nil, "2"))
	req := request(t, admissionv1.Create, js, nil)
	m, _ := mutation.New(kindsConfig)
	resp := Handlers(m, nil)[PathMutateJobSet].Handle(context.Background(), req)
	if !resp.Allowed {
		t.Fatalf("denied: %+v", resp.Result)
	}
	got := &jobset.JobSet{}
	apply(t, req, resp, got)
	w := got.Spec.ReplicatedJobs[1].Template.Spec.Template
	if d := cmp.Diff(corev1.ResourceList{v1alpha1.ResourceVGPU: resourceQ("2"), v1alpha1.ResourceGPUMemory: resourceQ("40960")}, w.Spec.Containers[0].Resources.Requests); d != "" {
		t.Errorf("workers requests, what Kueue counts (-want +got):\n%s", d)
	}
	if w.Annotations[v1alpha1.AnnotationInjected] != m.Fingerprint() || w.Annotations[v1alpha1.AnnotationGPUMemory] != "20Gi" {
		t.Errorf("workers annotations %v", w.Annotations)
	}
	if d := cmp.Diff(js.Spec.ReplicatedJobs[0], got.Spec.ReplicatedJobs[0]); d != "" {
		t.Errorf("CPU-only driver changed:\n%s", d)
	}
	for _, p := range resp.Patches {
		if !strings.HasPrefix(p.Path, "/spec/replicatedJobs/1/template/spec/template") {
			t.Errorf("patch outside the converted template: %s %s", p.Operation, p.Path)
		}
	}
	// Reinvocation and the validating webhook see a fixed point.
	raw, _ := json.Marshal(got)
	again := cradmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: "ns", Object: kruntime.RawExtension{Raw: raw}}}
	if r := Handlers(m, nil)[PathMutateJobSet].Handle(context.Background(), again); !r.Allowed || len(r.Patches) != 0 {
		t.Errorf("second pass: allowed %v, patches %v", r.Allowed, r.Patches)
	}
	if r := Handlers(m, nil)[PathValidateJobSet].Handle(context.Background(), again); !r.Allowed {
		t.Errorf("converted JobSet refused: %v", r.Result)
	}
	if r := handle(t, PathValidateJobSet, admissionv1.Create, js, nil); r.Allowed || !strings.Contains(r.Result.Message, "replicatedJobs[workers].template") {
		t.Errorf("unconverted JobSet: %+v", r.Result)
	}
}

// A field this build's JobSet types do not know (a newer CRD) survives the
// patch: only the converted templates are rewritten.
func TestJobSetWebhookKeepsUnknownFields(t *testing.T) {
	js := testJobSet(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, true, gpuTemplate(nil, "1"), cpuTemplate())
	raw, _ := json.Marshal(js)
	var doc map[string]any
	_ = json.Unmarshal(raw, &doc)
	doc["spec"].(map[string]any)["futureField"] = map[string]any{"x": 1}
	doc["spec"].(map[string]any)["replicatedJobs"].([]any)[0].(map[string]any)["futureToo"] = "y"
	// A newer pod field in a template gpupack does not convert is not
	// dropped by re-encoding it.
	cpuSpec := doc["spec"].(map[string]any)["replicatedJobs"].([]any)[1].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	cpuSpec["futurePodField"] = true
	raw, _ = json.Marshal(doc)
	req := cradmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: "ns", Object: kruntime.RawExtension{Raw: raw}}}
	m, _ := mutation.New(kindsConfig)
	resp := Handlers(m, nil)[PathMutateJobSet].Handle(context.Background(), req)
	if !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("allowed %v, %d patches", resp.Allowed, len(resp.Patches))
	}
	var out map[string]any
	apply(t, req, resp, &out)
	spec := out["spec"].(map[string]any)
	if spec["futureField"] == nil || spec["replicatedJobs"].([]any)[0].(map[string]any)["futureToo"] != "y" ||
		spec["replicatedJobs"].([]any)[1].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["futurePodField"] != true {
		t.Errorf("unknown fields dropped: %v", spec)
	}
}

func TestJobSetWebhookUpdate(t *testing.T) {
	m, _ := mutation.New(kindsConfig)
	js := testJobSet(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, false, gpuTemplate(nil, "1"))
	if _, err := m.JobSet(js); err != nil {
		t.Fatal(err)
	}
	// Kueue starts it with its podSetUpdates: the plan reaches the template,
	// the gate follows, nothing else changes.
	started := js.DeepCopy()
	started.Spec.ReplicatedJobs[0].Template.Spec.Template.Annotations[v1alpha1.AnnotationPlan] = "wl-plan"
	req := request(t, admissionv1.Update, started, js)
	resp := Handlers(m, nil)[PathMutateJobSet].Handle(context.Background(), req)
	got := &jobset.JobSet{}
	apply(t, req, resp, got)
	if g := got.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.SchedulingGates; len(g) != 1 || g[0].Name != v1alpha1.SchedulingGatePlacement {
		t.Errorf("gates %v", g)
	}
	for _, p := range resp.Patches {
		if !strings.Contains(p.Path, "schedulingGates") && !strings.Contains(p.Path, "annotations") {
			t.Errorf("update patch outside annotations and gates: %s %s", p.Operation, p.Path)
		}
	}
	// A JobSet created before gpupack (unconverted): Kueue's update must
	// not touch its containers (JobSet templates are immutable; a refused
	// update would leave Kueue unable to start or stop it).
	legacy := testJobSet(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, true, gpuTemplate(map[string]string{v1alpha1.AnnotationPlan: "wl-plan"}, "1"))
	lreq := request(t, admissionv1.Update, legacy, legacy)
	lresp := Handlers(m, nil)[PathMutateJobSet].Handle(context.Background(), lreq)
	for _, p := range lresp.Patches {
		if !strings.Contains(p.Path, "schedulingGates") && !strings.Contains(p.Path, "annotations") {
			t.Errorf("update of an unconverted JobSet patches %s %s", p.Operation, p.Path)
		}
	}
	edited := js.DeepCopy()
	edited.Annotations[v1alpha1.AnnotationGPUMemory] = "40Gi"
	if r := handle(t, PathValidateJobSet, admissionv1.Update, edited, js); r.Allowed || !strings.Contains(r.Result.Message, "cannot change while the job runs") {
		t.Errorf("request edit on a running JobSet: %+v", r.Result)
	}
}

func TestRolloutKindWebhooks(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	l := &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns", Annotations: mem}}
	leader := gpuTemplate(nil, "1")
	l.Spec.LeaderWorkerTemplate.LeaderTemplate = &leader
	l.Spec.LeaderWorkerTemplate.WorkerTemplate = gpuTemplate(nil, "2")
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns", Annotations: mem}, Spec: appsv1.DeploymentSpec{Template: gpuTemplate(nil, "1")}}
	s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", Annotations: mem}, Spec: appsv1.StatefulSetSpec{Template: gpuTemplate(nil, "1")}}
	for _, tc := range []struct {
		name             string
		mutate, validate string
		obj              any
		into             func() any
		requests         func(any) []corev1.ResourceList
	}{
		{"LeaderWorkerSet", PathMutateLeaderWorkerSet, PathValidateLeaderWorkerSet, l, func() any { return &lws.LeaderWorkerSet{} }, func(o any) []corev1.ResourceList {
			x := o.(*lws.LeaderWorkerSet).Spec.LeaderWorkerTemplate
			return []corev1.ResourceList{x.LeaderTemplate.Spec.Containers[0].Resources.Requests, x.WorkerTemplate.Spec.Containers[0].Resources.Requests}
		}},
		{"Deployment", PathMutateDeployment, PathValidateDeployment, d, func() any { return &appsv1.Deployment{} }, func(o any) []corev1.ResourceList {
			return []corev1.ResourceList{o.(*appsv1.Deployment).Spec.Template.Spec.Containers[0].Resources.Requests}
		}},
		{"StatefulSet", PathMutateStatefulSet, PathValidateStatefulSet, s, func() any { return &appsv1.StatefulSet{} }, func(o any) []corev1.ResourceList {
			return []corev1.ResourceList{o.(*appsv1.StatefulSet).Spec.Template.Spec.Containers[0].Resources.Requests}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Create and update (a rollout: new templates) convert alike.
			for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
				req := request(t, op, tc.obj, tc.obj)
				m, _ := mutation.New(kindsConfig)
				resp := Handlers(m, nil)[tc.mutate].Handle(context.Background(), req)
				if !resp.Allowed {
					t.Fatalf("%s denied: %v", op, resp.Result)
				}
				got := tc.into()
				apply(t, req, resp, got)
				for i, r := range tc.requests(got) {
					if v, mem := r[v1alpha1.ResourceVGPU], r[v1alpha1.ResourceGPUMemory]; v.IsZero() || mem.Value() != 20480*v.Value() {
						t.Errorf("%s template %d: requests %v, want gpupack.io/* for Kueue to count", op, i, r)
					}
					if _, ok := r[v1alpha1.ResourceNvidiaGPU]; ok {
						t.Errorf("%s template %d: whole GPUs still requested: %v", op, i, r)
					}
				}
				if r := handle(t, tc.validate, op, tc.obj, tc.obj); r.Allowed {
					t.Errorf("%s: unconverted %s admitted", op, tc.name)
				}
				raw, _ := json.Marshal(got)
				conv := cradmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Namespace: "ns", Object: kruntime.RawExtension{Raw: raw}, OldObject: kruntime.RawExtension{Raw: raw}}}
				if r := Handlers(m, nil)[tc.validate].Handle(context.Background(), conv); !r.Allowed {
					t.Errorf("%s: converted %s refused: %v", op, tc.name, r.Result)
				}
			}
		})
	}
	bad := d.DeepCopy()
	bad.Annotations[v1alpha1.AnnotationGPUMemory] = "79Gi"
	if r := handle(t, PathMutateDeployment, admissionv1.Create, bad, nil); r.Allowed || !strings.Contains(r.Result.Message, "pod template: container \"c\" asks for") {
		t.Errorf("oversized Deployment: %+v", r.Result)
	}
}

func jobKindMatches(t *testing.T, kind string, obj kruntime.Object, gvr schema.GroupVersionResource) bool {
	t.Helper()
	mwc, _ := WebhookConfigurations(allKinds())
	for i := range mwc.Webhooks {
		if mwc.Webhooks[i].Name != jobKindWebhookName("m", kind) {
			continue
		}
		m := webhook.NewMutatingWebhookAccessor("uid", mwc.Name, &mwc.Webhooks[i]).GetCompiledMatcher(celCompiler())
		gvk := gvr.GroupVersion().WithKind(kind)
		attr := admission.NewAttributesRecord(obj, nil, gvk, "ns", "x", gvr, "", admission.Create, &metav1.CreateOptions{}, false, &user.DefaultInfo{Name: "alice"})
		va := &admission.VersionedAttributes{Attributes: attr, VersionedKind: gvk}
		va.VersionedObject.Set(obj)
		r := m.Match(context.Background(), va, nil, nil)
		if r.Error != nil {
			t.Fatalf("%s: %v", kind, r.Error)
		}
		return r.Matches
	}
	t.Fatalf("no webhook for %s", kind)
	return false
}

// The match conditions send gpupack GPU objects of each kind and nothing else.
func TestJobKindMatchConditions(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	apps := func(r string) schema.GroupVersionResource { return appsv1.SchemeGroupVersion.WithResource(r) }
	lwsOf := func(ann map[string]string, leader *corev1.PodTemplateSpec, worker corev1.PodTemplateSpec) *lws.LeaderWorkerSet {
		l := &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns", Annotations: ann}}
		l.Spec.LeaderWorkerTemplate.LeaderTemplate, l.Spec.LeaderWorkerTemplate.WorkerTemplate = leader, worker
		return l
	}
	gpuLeader := gpuTemplate(nil, "1")
	for _, tc := range []struct {
		name string
		kind string
		obj  kruntime.Object
		gvr  schema.GroupVersionResource
		want bool
	}{
		{"CPU JobSet", KindJobSet, testJobSet(nil, true, cpuTemplate(), cpuTemplate()), jobset.GroupVersion.WithResource("jobsets"), false},
		{"GPU in the second replicated Job", KindJobSet, testJobSet(nil, true, cpuTemplate(), gpuTemplate(nil, "1")), jobset.GroupVersion.WithResource("jobsets"), true},
		{"JobSet with a job-level request only", KindJobSet, testJobSet(mem, true, cpuTemplate()), jobset.GroupVersion.WithResource("jobsets"), true},
		{"JobSet without replicated Jobs", KindJobSet, testJobSet(nil, true), jobset.GroupVersion.WithResource("jobsets"), false},
		{"CPU LWS", KindLeaderWorkerSet, lwsOf(nil, nil, cpuTemplate()), lws.GroupVersion.WithResource("leaderworkersets"), false},
		{"GPU leader only", KindLeaderWorkerSet, lwsOf(nil, &gpuLeader, cpuTemplate()), lws.GroupVersion.WithResource("leaderworkersets"), true},
		{"template request on the worker", KindLeaderWorkerSet, lwsOf(nil, nil, corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: mem}, Spec: cpuTemplate().Spec}), lws.GroupVersion.WithResource("leaderworkersets"), true},
		{"CPU Deployment", KindDeployment, &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: cpuTemplate()}}, apps("deployments"), false},
		{"GPU Deployment", KindDeployment, &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: gpuTemplate(nil, "1")}}, apps("deployments"), true},
		{"CPU StatefulSet", KindStatefulSet, &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Template: cpuTemplate()}}, apps("statefulsets"), false},
		{"HAMi StatefulSet", KindStatefulSet, &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.AnnotationHAMiGPUMem: resourceQ("3000")}}}}}}}}, apps("statefulsets"), true},
	} {
		if got := jobKindMatches(t, tc.kind, tc.obj, tc.gvr); got != tc.want {
			t.Errorf("%s: matches %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestParseAndServedJobKinds(t *testing.T) {
	if k, err := ParseJobKinds("JobSet, Deployment,JobSet"); err != nil || !cmp.Equal(k, []string{KindJobSet, KindDeployment}) {
		t.Errorf("list: %v %v", k, err)
	}
	if k, err := ParseJobKinds("all"); err != nil || !cmp.Equal(k, AllJobKinds) {
		t.Errorf("all: %v %v", k, err)
	}
	if k, err := ParseJobKinds("none"); err != nil || k != nil {
		t.Errorf("none: %v %v", k, err)
	}
	if _, err := ParseJobKinds("SparkApplication"); err == nil || !strings.Contains(err.Error(), `unknown job kind "SparkApplication"`) {
		t.Errorf("unknown kind: %v", err)
	}
	// A cluster without the JobSet and LWS CRDs: only the apps kinds.
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(appsv1.SchemeGroupVersion.WithKind("Deployment"), meta.RESTScopeNamespace)
	mapper.Add(appsv1.SchemeGroupVersion.WithKind("StatefulSet"), meta.RESTScopeNamespace)
	if k, err := ServedJobKinds(mapper, AllJobKinds); err != nil || !cmp.Equal(k, []string{KindDeployment, KindStatefulSet}) {
		t.Errorf("served: %v %v", k, err)
	}
	mapper.Add(jobset.GroupVersion.WithKind("JobSet"), meta.RESTScopeNamespace)
	if k, err := ServedJobKinds(mapper, AllJobKinds); err != nil || !cmp.Equal(k, []string{KindJobSet, KindDeployment, KindStatefulSet}) {
		t.Errorf("served with JobSet: %v %v", k, err)
	}
}

func webhookNames[W any](ws []W, name func(W) string) []string {
	var out []string
	for _, w := range ws {
		out = append(out, name(w))
	}
	return out
}

func allKinds() ServeOptions {
	o := DefaultServeOptions()
	o.JobKinds = AllJobKinds
	return o
}

func TestSyncJobKinds(t *testing.T) {
	all := allKinds()
	mwc, vwc := WebhookConfigurations(all)
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig.CABundle = []byte("ca")
	}
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].ClientConfig.CABundle = []byte("ca")
	}
	if SyncJobKinds(mwc.DeepCopy(), vwc.DeepCopy(), all) {
		t.Error("the manifest as built needs no change")
	}
	// A cluster without JobSet and LWS: their entries go, the others stay.
	apps := all
	apps.JobKinds = []string{KindDeployment, KindStatefulSet}
	m2, v2 := mwc.DeepCopy(), vwc.DeepCopy()
	if !SyncJobKinds(m2, v2, apps) {
		t.Fatal("no change")
	}
	mname := func(w admissionregistrationv1.MutatingWebhook) string { return w.Name }
	vname := func(w admissionregistrationv1.ValidatingWebhook) string { return w.Name }
	want := []string{"mpod.gpupack.io", "mjob.gpupack.io", "mpytorchjob.gpupack.io", "mdeployment.gpupack.io", "mstatefulset.gpupack.io"}
	if d := cmp.Diff(want, webhookNames(m2.Webhooks, mname)); d != "" {
		t.Errorf("mutating (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"vpod.gpupack.io", "vjob.gpupack.io", "vpytorchjob.gpupack.io", "vdeployment.gpupack.io", "vstatefulset.gpupack.io"}, webhookNames(v2.Webhooks, vname)); d != "" {
		t.Errorf("validating (-want +got):\n%s", d)
	}
	if SyncJobKinds(m2, v2, apps) {
		t.Error("second sync changed something")
	}
	// JobSet's CRD installed: its entries come back with the CA.
	if !SyncJobKinds(m2, v2, all) {
		t.Fatal("no change")
	}
	for _, w := range m2.Webhooks {
		if string(w.ClientConfig.CABundle) != "ca" {
			t.Errorf("%s: caBundle %q", w.Name, w.ClientConfig.CABundle)
		}
	}
	if len(m2.Webhooks) != len(mwc.Webhooks) || len(v2.Webhooks) != len(vwc.Webhooks) {
		t.Errorf("entries %v", webhookNames(m2.Webhooks, mname))
	}
	// The static manifest has no job kinds: none served, nothing to do;
	// all served, every kind is added after the pod/job entries, untouched.
	none := DefaultServeOptions()
	static, _ := WebhookConfigurations(none)
	if SyncJobKinds(static, nil, none) {
		t.Error("changed an install without job kinds")
	}
	if !SyncJobKinds(static, nil, all) {
		t.Fatal("job kinds not added")
	}
	built, _ := WebhookConfigurations(all)
	if d := cmp.Diff(built, static); d != "" {
		t.Errorf("added entries differ from the built ones (-want +got):\n%s", d)
	}
}

// The job kinds' entries, as the manager adds them with --job-kinds=all
// (for review, and for installs that manage webhook entries themselves).
func TestJobKindWebhookConfigurationsGolden(t *testing.T) {
	o := DefaultServeOptions()
	o.JobKinds = AllJobKinds
	mwc, vwc := WebhookConfigurations(o)
	base, _ := WebhookConfigurations(DefaultServeOptions())
	mwc.Webhooks = mwc.Webhooks[len(base.Webhooks):]
	vwc.Webhooks = vwc.Webhooks[len(base.Webhooks):]
	var b strings.Builder
	for _, obj := range []any{mwc, vwc} {
		y, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	golden := filepath.Join("deploy", "jobkinds-webhook-configurations.yaml")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), b.String()); d != "" {
		t.Errorf("%s is stale; run go test ./webhooks -run Golden -update (-want +got):\n%s", golden, d)
	}
	for _, w := range mwc.Webhooks {
		if !strings.HasPrefix(w.Name, "m") || len(w.Rules) != 1 || len(w.Rules[0].Operations) != 2 || w.ReinvocationPolicy != nil {
			t.Errorf("%s: rules %v", w.Name, w.Rules)
		}
	}
}

// The StatefulSet entries ship in the static manifests wherever the LWS or
// StatefulSet integration is enabled (the kustomize component
// job-kinds/statefulset-webhook, which both of those components include;
// Helm: jobKinds.integrations), so no StatefulSet is stored unseen before
// the manager starts or after a re-apply: the StatefulSet fast path
// (docs/webhooks.md#fast-path) rests on every template being admitted. The
// component is a strategic merge patch (webhooks merge by name), so
// including it twice adds each entry once.
func TestStatefulSetWebhookComponentGolden(t *testing.T) {
	o := DefaultServeOptions()
	o.JobKinds = []string{KindStatefulSet}
	mwc, vwc := WebhookConfigurations(o)
	mwc.Webhooks = mwc.Webhooks[len(targets):]
	vwc.Webhooks = vwc.Webhooks[len(targets):]
	mwc.Labels, vwc.Labels = nil, nil
	var b strings.Builder
	b.WriteString("# gpupack's StatefulSet webhook entries, as webhooks.WebhookConfigurations\n" +
		"# builds them with JobKinds [StatefulSet] (go test ./webhooks -run\n" +
		"# StatefulSetWebhookComponent -update writes this file). A strategic merge\n" +
		"# patch: webhooks merge by name, so the leaderworkerset and statefulset\n" +
		"# components may both include it.\n")
	for _, obj := range []any{mwc, vwc} {
		y, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	golden := filepath.Join("..", "manifests", "components", "job-kinds", "statefulset-webhook", "webhooks.yaml")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), b.String()); d != "" {
		t.Errorf("%s is stale; run go test ./webhooks -run StatefulSetWebhookComponent -update (-want +got):\n%s", golden, d)
	}
	if len(mwc.Webhooks) != 1 || mwc.Webhooks[0].Name != "mstatefulset.gpupack.io" || *mwc.Webhooks[0].FailurePolicy != "Fail" ||
		len(mwc.Webhooks[0].Rules[0].Operations) != 2 {
		t.Errorf("StatefulSet mutating entry: %+v", mwc.Webhooks)
	}
}
