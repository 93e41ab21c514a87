package webhooks

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	cradmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

func testRayJob(ann map[string]string, suspend bool, head corev1.PodTemplateSpec, workers ...corev1.PodTemplateSpec) *ray.RayJob {
	j := &ray.RayJob{TypeMeta: metav1.TypeMeta{APIVersion: ray.GroupVersion.String(), Kind: "RayJob"}, ObjectMeta: metav1.ObjectMeta{Name: "rj", Namespace: "ns", Annotations: ann}}
	j.Spec.Suspend = suspend
	j.Spec.RayClusterSpec = &ray.RayClusterSpec{HeadGroupSpec: ray.HeadGroupSpec{Template: head}}
	for i, w := range workers {
		j.Spec.RayClusterSpec.WorkerGroupSpecs = append(j.Spec.RayClusterSpec.WorkerGroupSpecs, ray.WorkerGroupSpec{GroupName: []string{"a", "b"}[i], Template: w})
	}
	return j
}

func testRayCluster(ann map[string]string, head corev1.PodTemplateSpec, workers ...corev1.PodTemplateSpec) *ray.RayCluster {
	j := testRayJob(nil, true, head, workers...)
	return &ray.RayCluster{TypeMeta: metav1.TypeMeta{APIVersion: ray.GroupVersion.String(), Kind: "RayCluster"}, ObjectMeta: metav1.ObjectMeta{Name: "rc", Namespace: "ns", Annotations: ann}, Spec: *j.Spec.RayClusterSpec}
}

func testMPIJob(ann map[string]string, suspend bool, launcher, worker corev1.PodTemplateSpec) *mpi.MPIJob {
	j := &mpi.MPIJob{TypeMeta: metav1.TypeMeta{APIVersion: mpi.SchemeGroupVersion.String(), Kind: mpi.Kind}, ObjectMeta: metav1.ObjectMeta{Name: "mpi", Namespace: "ns", Annotations: ann}}
	j.Spec.RunPolicy.Suspend = &suspend
	j.Spec.MPIReplicaSpecs = map[mpi.MPIReplicaType]*mpi.ReplicaSpec{
		mpi.MPIReplicaTypeLauncher: {Replicas: ptr.To[int32](1), Template: launcher},
		mpi.MPIReplicaTypeWorker:   {Replicas: ptr.To[int32](2), Template: worker},
	}
	return j
}

func testRuntimeSpec(ts ...corev1.PodTemplateSpec) trainer.TrainingRuntimeSpec {
	var s trainer.TrainingRuntimeSpec
	for i, t := range ts {
		s.Template.Spec.ReplicatedJobs = append(s.Template.Spec.ReplicatedJobs, jobset.ReplicatedJob{Name: []string{"dataset-initializer", "node"}[i], Replicas: 1,
			Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: t}}})
	}
	return s
}

func testTrainingRuntime(ann map[string]string, ts ...corev1.PodTemplateSpec) *trainer.TrainingRuntime {
	return &trainer.TrainingRuntime{TypeMeta: metav1.TypeMeta{APIVersion: trainer.GroupVersion.String(), Kind: trainer.TrainingRuntimeKind},
		ObjectMeta: metav1.ObjectMeta{Name: "torch", Namespace: "ns", Annotations: ann}, Spec: testRuntimeSpec(ts...)}
}

func testClusterTrainingRuntime(ann map[string]string, ts ...corev1.PodTemplateSpec) *trainer.ClusterTrainingRuntime {
	return &trainer.ClusterTrainingRuntime{TypeMeta: metav1.TypeMeta{APIVersion: trainer.GroupVersion.String(), Kind: trainer.ClusterTrainingRuntimeKind},
		ObjectMeta: metav1.ObjectMeta{Name: "torch-distributed", Annotations: ann}, Spec: testRuntimeSpec(ts...)}
}

func testTrainJob(ann map[string]string, suspend bool, limits corev1.ResourceList) *trainer.TrainJob {
	j := &trainer.TrainJob{TypeMeta: metav1.TypeMeta{APIVersion: trainer.GroupVersion.String(), Kind: trainer.TrainJobKind},
		ObjectMeta: metav1.ObjectMeta{Name: "tj", Namespace: "ns", Annotations: ann}}
	j.Spec.RuntimeRef = trainer.RuntimeRef{Name: "torch-distributed"}
	j.Spec.Suspend = &suspend
	if limits != nil {
		j.Spec.Trainer = &trainer.Trainer{NumNodes: ptr.To[int32](2), ResourcesPerNode: &corev1.ResourceRequirements{Limits: limits}}
	}
	return j
}

// Every template kind: converted on create, the patch stays inside the GPU
// templates, a second pass is a fixed point, the validator refuses the
// unconverted object naming the template and admits the converted one.
func TestOperatorKindWebhooks(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	for _, tc := range []struct {
		name             string
		mutate, validate string
		obj              any
		into             func() any
		gpuPaths         []string // JSON pointers of the GPU templates
		where            string   // the template an unconverted object's denial names
	}{
		{"RayJob", PathMutateRayJob, PathValidateRayJob, testRayJob(mem, true, cpuTemplate(), gpuTemplate(nil, "1"), gpuTemplate(nil, "2")), func() any { return &ray.RayJob{} },
			[]string{"/spec/rayClusterSpec/workerGroupSpecs/0/template", "/spec/rayClusterSpec/workerGroupSpecs/1/template"}, "rayClusterSpec.workerGroupSpecs[a].template"},
		{"RayCluster", PathMutateRayCluster, PathValidateRayCluster, testRayCluster(mem, gpuTemplate(nil, "1")), func() any { return &ray.RayCluster{} },
			[]string{"/spec/headGroupSpec/template"}, "headGroupSpec.template"},
		{"MPIJob", PathMutateMPIJob, PathValidateMPIJob, testMPIJob(mem, true, cpuTemplate(), gpuTemplate(nil, "1")), func() any { return &mpi.MPIJob{} },
			[]string{"/spec/mpiReplicaSpecs/Worker/template"}, "mpiReplicaSpecs[Worker].template"},
		{"TrainingRuntime", PathMutateTrainingRuntime, PathValidateTrainingRuntime, testTrainingRuntime(mem, cpuTemplate(), gpuTemplate(nil, "1")), func() any { return &trainer.TrainingRuntime{} },
			[]string{"/spec/template/spec/replicatedJobs/1/template/spec/template"}, "template.spec.replicatedJobs[node].template"},
		{"ClusterTrainingRuntime", PathMutateClusterTrainingRT, PathValidateClusterTrainingRT, testClusterTrainingRuntime(mem, cpuTemplate(), gpuTemplate(nil, "1")), func() any { return &trainer.ClusterTrainingRuntime{} },
			[]string{"/spec/template/spec/replicatedJobs/1/template/spec/template"}, "template.spec.replicatedJobs[node].template"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := mutation.New(kindsConfig) // (these kinds meet the unmanaged-GPU policy at creation too)
			req := request(t, admissionv1.Create, tc.obj, nil)
			resp := Handlers(m, nil)[tc.mutate].Handle(context.Background(), req)
			if !resp.Allowed || len(resp.Patches) == 0 {
				t.Fatalf("allowed %v, %d patches: %v", resp.Allowed, len(resp.Patches), resp.Result)
			}
			for _, p := range resp.Patches {
				inside := false
				for _, g := range tc.gpuPaths {
					inside = inside || strings.HasPrefix(p.Path, g)
				}
				if !inside {
					t.Errorf("patch outside the GPU templates: %s %s", p.Operation, p.Path)
				}
			}
			var doc map[string]any
			apply(t, req, resp, &doc)
			for _, g := range tc.gpuPaths {
				parent, key, ok := pointer(doc, g)
				if !ok {
					t.Fatalf("%s missing", g)
				}
				tm := get(parent, key).(map[string]any)
				c := tm["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
				req := c["resources"].(map[string]any)["requests"].(map[string]any)
				if req[string(v1alpha1.ResourceVGPU)] == nil || req[string(v1alpha1.ResourceGPUMemory)] == nil || req[string(v1alpha1.ResourceNvidiaGPU)] != nil {
					t.Errorf("%s requests %v, want gpupack.io/* for Kueue to count", g, req)
				}
				if tm["metadata"].(map[string]any)["annotations"].(map[string]any)[v1alpha1.AnnotationInjected] != m.Fingerprint() {
					t.Errorf("%s: no marker", g)
				}
			}
			raw, _ := json.Marshal(doc)
			again := cradmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: "ns", Object: kruntime.RawExtension{Raw: raw}}}
			if r := Handlers(m, nil)[tc.mutate].Handle(context.Background(), again); !r.Allowed || len(r.Patches) != 0 {
				t.Errorf("second pass: allowed %v, patches %v", r.Allowed, r.Patches)
			}
			if r := Handlers(m, nil)[tc.validate].Handle(context.Background(), again); !r.Allowed {
				t.Errorf("converted %s refused: %v", tc.name, r.Result)
			}
			if r := handle(t, tc.validate, admissionv1.Create, tc.obj, nil); r.Allowed || !strings.Contains(r.Result.Message, tc.where) {
				t.Errorf("unconverted %s: %+v", tc.name, r.Result)
			}
		})
	}
}

// RayJob, RayCluster and MPIJob are frozen while they run, as a JobSet:
// Kueue's plan reaches the template and the gate follows, nothing else is
// patched, and a request edit on a running job is refused. A runtime's
// update is converted (it applies to the next TrainJobs).
func TestOperatorKindUpdates(t *testing.T) {
	m, _ := mutation.New(Config{})
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	rj := testRayJob(mem, false, gpuTemplate(nil, "1"))
	if _, err := m.RayJob(rj); err != nil {
		t.Fatal(err)
	}
	started := rj.DeepCopy()
	started.Spec.RayClusterSpec.HeadGroupSpec.Template.Annotations[v1alpha1.AnnotationPlan] = "wl-plan"
	req := request(t, admissionv1.Update, started, rj)
	resp := Handlers(m, nil)[PathMutateRayJob].Handle(context.Background(), req)
	got := &ray.RayJob{}
	apply(t, req, resp, got)
	if g := got.Spec.RayClusterSpec.HeadGroupSpec.Template.Spec.SchedulingGates; len(g) != 1 || g[0].Name != v1alpha1.SchedulingGatePlacement {
		t.Errorf("RayJob head gates %v", g)
	}
	for _, p := range resp.Patches {
		if !strings.Contains(p.Path, "schedulingGates") && !strings.Contains(p.Path, "annotations") {
			t.Errorf("update patch outside annotations and gates: %s %s", p.Operation, p.Path)
		}
	}
	edited := rj.DeepCopy()
	edited.Annotations[v1alpha1.AnnotationGPUMemory] = "40Gi"
	if r := handle(t, PathValidateRayJob, admissionv1.Update, edited, rj); r.Allowed || !strings.Contains(r.Result.Message, "cannot change while the job runs") {
		t.Errorf("request edit on a running RayJob: %+v", r.Result)
	}
	mj := testMPIJob(mem, false, cpuTemplate(), gpuTemplate(nil, "1"))
	if _, err := m.MPIJob(mj); err != nil {
		t.Fatal(err)
	}
	medit := mj.DeepCopy()
	medit.Spec.MPIReplicaSpecs[mpi.MPIReplicaTypeWorker].Template.Annotations[v1alpha1.AnnotationGPUMemory] = "40Gi"
	if r := handle(t, PathValidateMPIJob, admissionv1.Update, medit, mj); r.Allowed || !strings.Contains(r.Result.Message, "cannot change while the job runs") {
		t.Errorf("request edit on a running MPIJob: %+v", r.Result)
	}
	msusp := mj.DeepCopy()
	msusp.Spec.RunPolicy.Suspend = ptr.To(true)
	medit.Spec.RunPolicy.Suspend = ptr.To(true)
	if r := handle(t, PathValidateMPIJob, admissionv1.Update, medit, msusp); r.Allowed || !strings.Contains(r.Result.Message, "mpiReplicaSpecs[Worker].template") {
		t.Errorf("unconverted request edit on a suspended MPIJob must still validate: %+v", r.Result)
	}
	rc := testRayCluster(mem, gpuTemplate(nil, "1"))
	if _, err := m.RayCluster(rc); err != nil {
		t.Fatal(err)
	}
	redit := rc.DeepCopy()
	redit.Spec.HeadGroupSpec.Template.Annotations[v1alpha1.AnnotationGPUMemory] = "40Gi"
	if r := handle(t, PathValidateRayCluster, admissionv1.Update, redit, rc); r.Allowed {
		t.Errorf("request edit on a running RayCluster admitted")
	}
	rt := testTrainingRuntime(mem, gpuTemplate(nil, "1"))
	rreq := request(t, admissionv1.Update, rt, rt)
	if r := Handlers(m, nil)[PathMutateTrainingRuntime].Handle(context.Background(), rreq); !r.Allowed || len(r.Patches) == 0 {
		t.Errorf("runtime update not converted: allowed %v, %d patches", r.Allowed, len(r.Patches))
	}
}

func TestTrainJobWebhook(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	m, _ := mutation.New(Config{})
	tj := testTrainJob(mem, true, corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resourceQ("2"), corev1.ResourceCPU: resourceQ("8")})
	// A field this build's types do not know survives the patch.
	raw, _ := json.Marshal(tj)
	var doc map[string]any
	_ = json.Unmarshal(raw, &doc)
	doc["spec"].(map[string]any)["futureField"] = "kept"
	doc["spec"].(map[string]any)["trainer"].(map[string]any)["futureToo"] = "kept"
	raw, _ = json.Marshal(doc)
	req := cradmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: "ns", Object: kruntime.RawExtension{Raw: raw}}}
	resp := Handlers(m, nil)[PathMutateTrainJob].Handle(context.Background(), req)
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	for _, p := range resp.Patches {
		if !strings.HasPrefix(p.Path, "/spec/trainer/resourcesPerNode") {
			t.Errorf("patch outside resourcesPerNode: %s %s", p.Operation, p.Path)
		}
	}
	var out map[string]any
	apply(t, req, resp, &out)
	if out["spec"].(map[string]any)["futureField"] != "kept" || out["spec"].(map[string]any)["trainer"].(map[string]any)["futureToo"] != "kept" {
		t.Errorf("unknown fields dropped: %v", out["spec"])
	}
	got := &trainer.TrainJob{}
	b, _ := json.Marshal(out)
	_ = json.Unmarshal(b, got)
	if r := got.Spec.Trainer.ResourcesPerNode.Requests; r.Name(v1alpha1.ResourceVGPU, "").Value() != 2 || r.Name(v1alpha1.ResourceGPUMemory, "").Value() != 40960 {
		t.Errorf("requests %v, want what Kueue counts in gpupack.io/*", r)
	}
	conv := cradmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: "ns", Object: kruntime.RawExtension{Raw: b}}}
	if r := Handlers(m, nil)[PathMutateTrainJob].Handle(context.Background(), conv); !r.Allowed || len(r.Patches) != 0 {
		t.Errorf("second pass: %v %v", r.Allowed, r.Patches)
	}
	if r := Handlers(m, nil)[PathValidateTrainJob].Handle(context.Background(), conv); !r.Allowed {
		t.Errorf("converted TrainJob refused: %v", r.Result)
	}
	if r := handle(t, PathValidateTrainJob, admissionv1.Create, tj, nil); r.Allowed || !strings.Contains(r.Result.Message, "trainer.resourcesPerNode") {
		t.Errorf("unconverted TrainJob: %+v", r.Result)
	}
	if r := handle(t, PathMutateTrainJob, admissionv1.Create, testTrainJob(mem, true, corev1.ResourceList{corev1.ResourceCPU: resourceQ("8")}), nil); r.Allowed || !strings.Contains(r.Result.Message, "TrainJob: ") {
		t.Errorf("request without a GPU: %+v", r.Result)
	}
	// Kueue starting an (unconverted, pre-gpupack) TrainJob: no patch, admitted.
	legacy := testTrainJob(mem, true, corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resourceQ("1")})
	start := legacy.DeepCopy()
	start.Spec.Suspend = ptr.To(false)
	start.Spec.RuntimePatches = []trainer.RuntimePatch{{Manager: "kueue.x-k8s.io/manager"}}
	if r := handle(t, PathMutateTrainJob, admissionv1.Update, start, legacy); !r.Allowed || len(r.Patches) != 0 {
		t.Errorf("Kueue's update of a legacy TrainJob: %v %v", r.Allowed, r.Patches)
	}
	if r := handle(t, PathValidateTrainJob, admissionv1.Update, start, legacy); !r.Allowed {
		t.Errorf("Kueue's update of a legacy TrainJob refused: %v", r.Result)
	}
	// A new request on a suspended TrainJob is converted.
	edit := got.DeepCopy()
	edit.Spec.Trainer.ResourcesPerNode = &corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resourceQ("4")}}
	ereq := request(t, admissionv1.Update, edit, got)
	eresp := Handlers(m, nil)[PathMutateTrainJob].Handle(context.Background(), ereq)
	edited := &trainer.TrainJob{}
	apply(t, ereq, eresp, edited)
	if r := edited.Spec.Trainer.ResourcesPerNode.Limits; r.Name(v1alpha1.ResourceVGPU, "").Value() != 4 {
		t.Errorf("edited request not converted: %v", r)
	}
}

// The match conditions send the new kinds' GPU objects and nothing else.
func TestOperatorKindMatchConditions(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	rayGVR := func(r string) schema.GroupVersionResource { return ray.GroupVersion.WithResource(r) }
	trGVR := func(r string) schema.GroupVersionResource { return trainer.GroupVersion.WithResource(r) }
	mpiGVR := mpi.SchemeGroupVersion.WithResource("mpijobs")
	noCluster := testRayJob(nil, true, cpuTemplate())
	noCluster.Spec.RayClusterSpec = nil
	gpuSubmitter := noCluster.DeepCopy()
	sub := gpuTemplate(nil, "1")
	gpuSubmitter.Spec.SubmitterPodTemplate = &sub
	for _, tc := range []struct {
		name string
		kind string
		obj  kruntime.Object
		gvr  schema.GroupVersionResource
		want bool
	}{
		{"CPU RayJob", KindRayJob, testRayJob(nil, true, cpuTemplate(), cpuTemplate()), rayGVR("rayjobs"), false},
		{"GPU in the second worker group", KindRayJob, testRayJob(nil, true, cpuTemplate(), cpuTemplate(), gpuTemplate(nil, "1")), rayGVR("rayjobs"), true},
		{"RayJob with a job-level request", KindRayJob, testRayJob(mem, true, cpuTemplate()), rayGVR("rayjobs"), true},
		{"RayJob on an existing cluster", KindRayJob, noCluster, rayGVR("rayjobs"), false},
		{"GPU submitter", KindRayJob, gpuSubmitter, rayGVR("rayjobs"), true},
		{"CPU RayCluster", KindRayCluster, testRayCluster(nil, cpuTemplate(), cpuTemplate()), rayGVR("rayclusters"), false},
		{"GPU head", KindRayCluster, testRayCluster(nil, gpuTemplate(nil, "1")), rayGVR("rayclusters"), true},
		{"CPU MPIJob", KindMPIJob, testMPIJob(nil, true, cpuTemplate(), cpuTemplate()), mpiGVR, false},
		{"GPU MPI workers", KindMPIJob, testMPIJob(nil, true, cpuTemplate(), gpuTemplate(nil, "1")), mpiGVR, true},
		{"CPU runtime", KindTrainingRuntime, testTrainingRuntime(nil, cpuTemplate(), cpuTemplate()), trGVR("trainingruntimes"), false},
		{"GPU trainer in a runtime", KindTrainingRuntime, testTrainingRuntime(nil, cpuTemplate(), gpuTemplate(nil, "1")), trGVR("trainingruntimes"), true},
		{"GPU cluster runtime", KindClusterTrainingRuntime, testClusterTrainingRuntime(nil, gpuTemplate(nil, "1")), trGVR("clustertrainingruntimes"), true},
		{"CPU cluster runtime", KindClusterTrainingRuntime, testClusterTrainingRuntime(nil, cpuTemplate()), trGVR("clustertrainingruntimes"), false},
		{"TrainJob without overrides", KindTrainJob, testTrainJob(nil, true, nil), trGVR("trainjobs"), false},
		{"CPU TrainJob", KindTrainJob, testTrainJob(nil, true, corev1.ResourceList{corev1.ResourceCPU: resourceQ("4")}), trGVR("trainjobs"), false},
		{"TrainJob with GPUs per node", KindTrainJob, testTrainJob(nil, true, corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resourceQ("1")}), trGVR("trainjobs"), true},
		{"TrainJob with HAMi memory per node", KindTrainJob, testTrainJob(nil, true, corev1.ResourceList{v1alpha1.AnnotationHAMiGPUMem: resourceQ("3000")}), trGVR("trainjobs"), true},
		{"TrainJob with a request annotation only", KindTrainJob, testTrainJob(mem, true, nil), trGVR("trainjobs"), true},
	} {
		if got := jobKindMatches(t, tc.kind, tc.obj, tc.gvr); got != tc.want {
			t.Errorf("%s: matches %v, want %v", tc.name, got, tc.want)
		}
	}
}

// ClusterTrainingRuntime is cluster-scoped: its rules say so (a Namespaced
// rule would never match it), every other kind stays Namespaced.
func TestJobKindRuleScopes(t *testing.T) {
	mwc, vwc := WebhookConfigurations(allKinds())
	check := func(name string, rules []admissionregistrationv1.RuleWithOperations) {
		want := admissionregistrationv1.NamespacedScope
		if name[1:] == "clustertrainingruntime.gpupack.io" {
			want = admissionregistrationv1.ClusterScope
		}
		if got := *rules[0].Scope; got != want {
			t.Errorf("%s: scope %s, want %s", name, got, want)
		}
	}
	for _, w := range mwc.Webhooks {
		check(w.Name, w.Rules)
	}
	for _, w := range vwc.Webhooks {
		check(w.Name, w.Rules)
	}
}

// --job-kinds=auto on a cluster with KubeRay only.
func TestServedOperatorKinds(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(ray.GroupVersion.WithKind("RayJob"), meta.RESTScopeNamespace)
	mapper.Add(ray.GroupVersion.WithKind("RayCluster"), meta.RESTScopeNamespace)
	// The training operator's kubeflow.org/v1 is not the MPI operator's v2beta1.
	mapper.Add(schema.GroupVersion{Group: "kubeflow.org", Version: "v1"}.WithKind("MPIJob"), meta.RESTScopeNamespace)
	k, err := ServedJobKinds(mapper, AllJobKinds)
	if err != nil || strings.Join(k, ",") != "RayJob,RayCluster" {
		t.Errorf("served %v %v", k, err)
	}
}
