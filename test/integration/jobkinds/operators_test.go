package jobkinds

import (
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// The operators' kinds (TrainJob, TrainingRuntime, ClusterTrainingRuntime,
// RayJob, RayCluster, MPIJob) against the real apiserver with their real
// CRDs (structural schemas, pruning, CEL rules): the examples under
// manifests/examples are converted at apply time by gpupack's webhooks, a
// ClusterTrainingRuntime (cluster-scoped) too, and an oversized request is
// refused naming the template. No Kueue integration or operator runs for
// these kinds here: what Kueue counts follows from the stored templates
// (Kueue's own unit tests build the pod sets from them).
func TestOperatorKindsConvertedAtApply(t *testing.T) {
	env := framework.Start(t, framework.Options{NoKueue: true, OperatorCRDs: true})
	// As where these kinds run under Kueue: its integrations for them on
	// (their objects are checked as Kueue's at creation).
	cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: append(append([]string(nil), mutation.DefaultKueueFrameworks...),
		"ray.io/rayjob", "ray.io/raycluster", "kubeflow.org/mpijob", "trainer.kubeflow.org/trainjob")}}
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error { return webhooks.Setup(mgr, cfg) }, opts)
	serve := webhooks.DefaultServeOptions()
	serve.JobKinds = []string{webhooks.KindTrainJob, webhooks.KindTrainingRuntime, webhooks.KindClusterTrainingRuntime,
		webhooks.KindRayJob, webhooks.KindRayCluster, webhooks.KindMPIJob}
	mwc, vwc := webhooks.WebhookConfigurations(serve)
	env.InstallWebhooks(t, opts, mwc, vwc)
	env.MustCreate(t, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "ml-team"}}})

	// path of the converted template's first container's resources, per example object.
	want := map[string][]string{
		"TrainingRuntime/torch-fractional": {"spec", "template", "spec", "replicatedJobs", "0", "template", "spec", "template"},
		"RayJob/tune-rayjob":               {"spec", "rayClusterSpec", "workerGroupSpecs", "0", "template"},
		"RayCluster/notebook-ray":          {"spec", "workerGroupSpecs", "0", "template"},
		"MPIJob/allreduce-mpijob":          {"spec", "mpiReplicaSpecs", "Worker", "template"},
	}
	wantMiB := map[string]int64{"TrainingRuntime/torch-fractional": 20480, "RayJob/tune-rayjob": 16384, "RayCluster/notebook-ray": 6144, "MPIJob/allreduce-mpijob": 10240}
	var objs []*unstructured.Unstructured // TrainingRuntime, TrainJob, RayJob, RayCluster, MPIJob
	for _, f := range []string{"trainjob-fractional", "rayjob-fractional", "raycluster-fractional", "mpijob-fractional"} {
		objs = append(objs, framework.ReadObjects(t, "manifests/examples/"+f+".yaml")...)
	}
	if len(objs) != 5 || objs[4].GetKind() != "MPIJob" {
		t.Fatalf("examples changed: %d objects", len(objs))
	}
	for _, o := range objs {
		key := o.GetKind() + "/" + o.GetName()
		if err := env.Client.Create(env.Ctx, o.DeepCopy()); err != nil {
			t.Fatalf("creating %s: %v", key, err)
		}
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(o.GroupVersionKind())
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(o), got); err != nil {
			t.Fatal(err)
		}
		path, ok := want[key]
		if !ok {
			continue // the TrainJob: no GPU of its own
		}
		tm := nested(t, got.Object, path)
		if tm == nil {
			t.Fatalf("%s: no template at %v", key, path)
		}
		if ann, _, _ := unstructured.NestedStringMap(tm, "metadata", "annotations"); ann["gpupack.io/injected"] == "" {
			t.Errorf("%s: stored template not marked: %v", key, ann)
		}
		ctrs, _, _ := unstructured.NestedSlice(tm, "spec", "containers")
		lim, _, _ := unstructured.NestedStringMap(ctrs[0].(map[string]any), "resources", "limits")
		req, _, _ := unstructured.NestedStringMap(ctrs[0].(map[string]any), "resources", "requests")
		for what, rl := range map[string]map[string]string{"limits": lim, "requests": req} {
			if rl["gpupack.io/vgpu"] != "1" || rl["gpupack.io/gpu-memory"] != strconv.FormatInt(wantMiB[key], 10) || rl["nvidia.com/gpu"] != "" {
				t.Errorf("%s: stored %s %v, want gpupack.io/vgpu 1 and gpupack.io/gpu-memory %d", key, what, rl, wantMiB[key])
			}
		}
	}

	// A TrainJob's own request converts its resourcesPerNode.
	tj := objs[1].DeepCopy()
	tj.SetName("own-request")
	tj.SetAnnotations(map[string]string{"gpupack.io/gpu-memory": "10Gi"})
	_ = unstructured.SetNestedField(tj.Object, map[string]any{"limits": map[string]any{"nvidia.com/gpu": "2"}}, "spec", "trainer", "resourcesPerNode")
	env.MustCreate(t, tj)
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(tj.GroupVersionKind())
	if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(tj), got); err != nil {
		t.Fatal(err)
	}
	if rl, _, _ := unstructured.NestedStringMap(got.Object, "spec", "trainer", "resourcesPerNode", "requests"); rl["gpupack.io/vgpu"] != "2" || rl["gpupack.io/gpu-memory"] != "20480" {
		t.Errorf("TrainJob resourcesPerNode requests %v, want gpupack.io/vgpu 2, gpupack.io/gpu-memory 20480", rl)
	}

	// A ClusterTrainingRuntime reaches the webhooks (cluster-scoped rule).
	ctr := objs[0].DeepCopy()
	ctr.SetKind("ClusterTrainingRuntime")
	ctr.SetNamespace("")
	ctr.SetName("torch-fractional-cluster")
	env.MustCreate(t, ctr)
	gotC := &unstructured.Unstructured{}
	gotC.SetGroupVersionKind(ctr.GroupVersionKind())
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: ctr.GetName()}, gotC); err != nil {
		t.Fatal(err)
	}
	tm := nested(t, gotC.Object, want["TrainingRuntime/torch-fractional"])
	ctrs, _, _ := unstructured.NestedSlice(tm, "spec", "containers")
	if lim, _, _ := unstructured.NestedStringMap(ctrs[0].(map[string]any), "resources", "limits"); lim["gpupack.io/gpu-memory"] != "20480" {
		t.Errorf("ClusterTrainingRuntime not converted: %v", lim)
	}

	// The same denial as for a PyTorchJob, naming the template.
	big := objs[4].DeepCopy() // the MPIJob
	big.SetName("too-big")
	big.SetAnnotations(map[string]string{"gpupack.io/gpu-memory": "79Gi"})
	err := env.Client.Create(env.Ctx, big)
	if err == nil || !strings.Contains(err.Error(), "mpiReplicaSpecs[Worker].template: container \"worker\" asks for 80896 MiB") {
		t.Errorf("oversized MPIJob: %v", err)
	}
}

func nested(t *testing.T, obj map[string]any, path []string) map[string]any {
	t.Helper()
	var cur any = obj
	for _, p := range path {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[p]
		case []any:
			i := int(p[0] - '0')
			if i >= len(c) {
				return nil
			}
			cur = c[i]
		default:
			return nil
		}
	}
	m, _ := cur.(map[string]any)
	return m
}

// Kueue counts what the webhooks wrote: with Kueue's ray.io/rayjob,
// ray.io/raycluster and kubeflow.org/mpijob integrations on, each example's
// Workload requests gpupack.io/* for its GPU pod set and nvidia.com/gpu for
// none.
func TestRayAndMPIJobsCountedByKueue(t *testing.T) {
	kueueOpts := framework.Options{RayMPI: true}
	env := framework.Start(t, kueueOpts)
	cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: kueueOpts.KueueFrameworks()},
		JobKinds: []string{webhooks.KindRayJob, webhooks.KindRayCluster, webhooks.KindMPIJob}}
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error { return webhooks.Setup(mgr, cfg) }, opts)
	serve := webhooks.DefaultServeOptions()
	serve.JobKinds = cfg.JobKinds
	mwc, vwc := webhooks.WebhookConfigurations(serve)
	env.InstallWebhooks(t, opts, mwc, vwc)
	env.MustCreate(t, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "ml-team"}}})
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 4, framework.H100).Obj())
	env.MustCreate(t, framework.MakeLocalQueue("gpu", "ml-team", "cq"))

	for _, tc := range []struct {
		file, kind, name string
		podSet           string
		mib              int64 // gpupack.io/gpu-memory per pod
	}{
		{"rayjob-fractional", "RayJob", "tune-rayjob", "gpu", 16384},
		{"raycluster-fractional", "RayCluster", "notebook-ray", "l4", 6144},
		{"mpijob-fractional", "MPIJob", "allreduce-mpijob", "worker", 10240},
	} {
		for _, o := range framework.ReadObjects(t, "manifests/examples/"+tc.file+".yaml") {
			env.MustCreate(t, o)
		}
		wl := env.WaitForWorkloadOf(t, "ml-team", tc.name, tc.kind, nil)
		found := false
		for _, ps := range wl.Spec.PodSets {
			req := ps.Template.Spec.Containers[0].Resources.Requests
			if _, ok := req[v1alpha1.ResourceNvidiaGPU]; ok {
				t.Errorf("%s: Kueue counts whole GPUs for pod set %s: %v", tc.kind, ps.Name, req)
			}
			if string(ps.Name) == tc.podSet {
				found = true
				if q := req[v1alpha1.ResourceGPUMemory]; q.Value() != tc.mib {
					t.Errorf("%s: pod set %s requests %v, want gpupack.io/gpu-memory %d", tc.kind, ps.Name, req, tc.mib)
				}
			}
		}
		if !found {
			t.Errorf("%s: no pod set %s in %+v", tc.kind, tc.podSet, wl.Spec.PodSets)
		}
	}
}
