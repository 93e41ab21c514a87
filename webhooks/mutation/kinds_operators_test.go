package mutation

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kptr "k8s.io/utils/ptr"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

type rayGroup struct {
	name string
	t    corev1.PodTemplateSpec
}

func makeRayCluster(ann map[string]string, head corev1.PodTemplateSpec, workers ...rayGroup) *ray.RayCluster {
	c := &ray.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: "rc", Namespace: "ns", Annotations: ann}}
	c.Spec.HeadGroupSpec.Template = head
	for _, w := range workers {
		c.Spec.WorkerGroupSpecs = append(c.Spec.WorkerGroupSpecs, ray.WorkerGroupSpec{GroupName: w.name, Replicas: kptr.To[int32](1), Template: w.t})
	}
	return c
}

func makeRayJob(ann map[string]string, submitter *corev1.PodTemplateSpec, head corev1.PodTemplateSpec, workers ...rayGroup) *ray.RayJob {
	j := &ray.RayJob{ObjectMeta: metav1.ObjectMeta{Name: "rj", Namespace: "ns", Annotations: ann}}
	j.Spec.RayClusterSpec = &makeRayCluster(nil, head, workers...).Spec
	j.Spec.SubmitterPodTemplate = submitter
	return j
}

func makeMPIJob(ann map[string]string, launcher *corev1.PodTemplateSpec, worker corev1.PodTemplateSpec) *mpi.MPIJob {
	j := &mpi.MPIJob{ObjectMeta: metav1.ObjectMeta{Name: "mpi", Namespace: "ns", Annotations: ann}}
	j.Spec.MPIReplicaSpecs = map[mpi.MPIReplicaType]*mpi.ReplicaSpec{mpi.MPIReplicaTypeWorker: {Replicas: kptr.To[int32](2), Template: worker}}
	if launcher != nil {
		j.Spec.MPIReplicaSpecs[mpi.MPIReplicaTypeLauncher] = &mpi.ReplicaSpec{Replicas: kptr.To[int32](1), Template: *launcher}
	}
	return j
}

func runtimeSpec(jobSetAnn map[string]string, rjs ...rjob) trainer.TrainingRuntimeSpec {
	var s trainer.TrainingRuntimeSpec
	s.Template.Annotations = jobSetAnn
	for _, r := range rjs {
		s.Template.Spec.ReplicatedJobs = append(s.Template.Spec.ReplicatedJobs, jobset.ReplicatedJob{Name: r.name, Replicas: 1,
			Template: batchv1.JobTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: r.ann}, Spec: batchv1.JobSpec{Template: r.t}}})
	}
	return s
}

func makeTrainingRuntime(ann, jobSetAnn map[string]string, rjs ...rjob) *trainer.TrainingRuntime {
	return &trainer.TrainingRuntime{ObjectMeta: metav1.ObjectMeta{Name: "torch", Namespace: "ns", Annotations: ann}, Spec: runtimeSpec(jobSetAnn, rjs...)}
}

func makeClusterTrainingRuntime(ann map[string]string, rjs ...rjob) *trainer.ClusterTrainingRuntime {
	return &trainer.ClusterTrainingRuntime{ObjectMeta: metav1.ObjectMeta{Name: "torch-distributed", Annotations: ann}, Spec: runtimeSpec(nil, rjs...)}
}

func makeTrainJob(ann map[string]string, resources *corev1.ResourceRequirements) *trainer.TrainJob {
	j := &trainer.TrainJob{ObjectMeta: metav1.ObjectMeta{Name: "tj", Namespace: "ns", Annotations: ann}}
	j.Spec.RuntimeRef = trainer.RuntimeRef{Name: "torch-distributed"}
	j.Spec.Suspend = kptr.To(true)
	if resources != nil {
		j.Spec.Trainer = &trainer.Trainer{NumNodes: kptr.To[int32](2), ResourcesPerNode: resources}
	}
	return j
}

func limits(kv ...string) *corev1.ResourceRequirements {
	return &corev1.ResourceRequirements{Limits: rl(kv...)}
}

// kinds_test.go's tables run these kinds' own entry points too.
func mutateOperatorKind(m *Mutator, obj any) ([]string, error, bool) {
	switch o := obj.(type) {
	case *ray.RayJob:
		w, err := m.RayJob(o)
		return w, err, true
	case *ray.RayCluster:
		w, err := m.RayCluster(o)
		return w, err, true
	case *mpi.MPIJob:
		w, err := m.MPIJob(o)
		return w, err, true
	case *trainer.TrainingRuntime:
		w, err := m.TrainingRuntime(o)
		return w, err, true
	case *trainer.ClusterTrainingRuntime:
		w, err := m.ClusterTrainingRuntime(o)
		return w, err, true
	}
	return nil, nil, false
}

func deepCopyOperatorKind(obj any) any {
	switch o := obj.(type) {
	case *ray.RayJob:
		return o.DeepCopy()
	case *ray.RayCluster:
		return o.DeepCopy()
	case *mpi.MPIJob:
		return o.DeepCopy()
	case *trainer.TrainingRuntime:
		return o.DeepCopy()
	case *trainer.ClusterTrainingRuntime:
		return o.DeepCopy()
	}
	return nil
}

// A TrainJob's trainer.resourcesPerNode is what Kueue counts for its
// trainer pods: it is converted with the TrainJob's annotations.
func TestTrainJobConversion(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	cases := []struct {
		name string
		cfg  Config
		tj   *trainer.TrainJob
		want *corev1.ResourceRequirements // nil: no resourcesPerNode
	}{
		{"fractional from the TrainJob's annotations", Config{}, makeTrainJob(mem, limits(gpu, "2", "cpu", "4")),
			&corev1.ResourceRequirements{Limits: rl("cpu", "4", vgpu, "2", gmem, "40960"), Requests: rl(vgpu, "2", gmem, "40960")}},
		{"HAMi resources in resourcesPerNode", Config{}, makeTrainJob(nil, limits(gpu, "1", v1alpha1.AnnotationHAMiGPUMem, "3000", v1alpha1.AnnotationHAMiGPUCores, "30")),
			&corev1.ResourceRequirements{Limits: rl(vgpu, "1", gmem, "3000", gcor, "30"), Requests: rl(vgpu, "1", gmem, "3000", gcor, "30")}},
		{"HAMi's annotation on the TrainJob", Config{}, makeTrainJob(map[string]string{v1alpha1.AnnotationHAMiGPUMem: "10240"}, limits(gpu, "1")),
			&corev1.ResourceRequirements{Limits: rl(vgpu, "1", gmem, "10240"), Requests: rl(vgpu, "1", gmem, "10240")}},
		{"hami mode: HAMi's resources", Config{Resources: ResourcesHAMi}, makeTrainJob(mem, limits(gpu, "2")),
			&corev1.ResourceRequirements{Limits: rl(gpu, "2", v1alpha1.AnnotationHAMiGPUMem, "20480"), Requests: rl(gpu, "2", v1alpha1.AnnotationHAMiGPUMem, "20480")}},
		{"whole GPUs stay whole", Config{}, makeTrainJob(nil, limits(gpu, "8")), limits(gpu, "8")},
		{"CPU only", Config{}, makeTrainJob(nil, limits("cpu", "8")), limits("cpu", "8")},
		{"no trainer override: the runtime's template decides", Config{}, makeTrainJob(nil, nil), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.cfg)
			if _, err := m.TrainJob(tc.tj); err != nil {
				t.Fatal(err)
			}
			var got *corev1.ResourceRequirements
			if tc.tj.Spec.Trainer != nil {
				got = tc.tj.Spec.Trainer.ResourcesPerNode
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("resourcesPerNode (-want +got):\n%s", d)
			}
			again := tc.tj.DeepCopy()
			if _, err := m.TrainJob(again); err != nil || !equality.Semantic.DeepEqual(again, tc.tj) {
				t.Errorf("second pass: %v\n%s", err, cmp.Diff(tc.tj, again))
			}
			if err := m.ValidateTrainJob(tc.tj); err != nil {
				t.Errorf("converted TrainJob refused: %v", err)
			}
		})
	}
}

func TestTrainJobDenials(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	for _, tc := range []struct {
		name string
		tj   *trainer.TrainJob
		want []string
	}{
		{"request annotation, no GPU in resourcesPerNode", makeTrainJob(mem, limits("cpu", "4")), []string{"TrainJob: ", "trainer.resourcesPerNode asks for no nvidia.com/gpu", "TrainingRuntime's trainer template"}},
		{"request annotation, no resourcesPerNode", makeTrainJob(mem, nil), []string{"trainer.resourcesPerNode asks for no nvidia.com/gpu"}},
		{"bad memory", makeTrainJob(map[string]string{v1alpha1.AnnotationGPUMemory: "lots"}, limits(gpu, "1")), []string{"trainer.resourcesPerNode: "}},
		{"percentage without a model", makeTrainJob(map[string]string{v1alpha1.AnnotationHAMiGPUMemPercentage: "50"}, limits(gpu, "1")), []string{"trainer.resourcesPerNode: ", "needs a known GPU model"}},
		{"cores without memory", makeTrainJob(map[string]string{v1alpha1.AnnotationGPUCores: "30"}, limits(gpu, "1")), []string{"trainer.resourcesPerNode: ", "without gpupack.io/gpu-memory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, Config{})
			before := tc.tj.DeepCopy()
			_, err := m.TrainJob(tc.tj.DeepCopy())
			if err == nil {
				t.Fatal("allowed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if verr := m.ValidateTrainJob(tc.tj); verr == nil || verr.Error() != err.Error() {
				t.Errorf("validation says %v, mutation %v", verr, err)
			}
			if !equality.Semantic.DeepEqual(before, tc.tj) {
				t.Error("validation changed the object")
			}
		})
	}
	// Written by hand (or applied while the webhook was off): refused.
	m := mustNew(t, Config{})
	if err := m.ValidateTrainJob(makeTrainJob(mem, limits(gpu, "1"))); err == nil || !strings.Contains(err.Error(), "trainer.resourcesPerNode: GPU resources are not converted") {
		t.Errorf("unconverted TrainJob: %v", err)
	}
}

func TestTrainJobUpdate(t *testing.T) {
	m := mustNew(t, Config{})
	converted := func(suspend bool) *trainer.TrainJob {
		j := makeTrainJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, limits(gpu, "1"))
		j.Spec.Suspend = kptr.To(suspend)
		if _, err := m.TrainJob(j); err != nil {
			t.Fatal(err)
		}
		return j
	}
	running := converted(false)
	edited := running.DeepCopy()
	edited.Annotations[v1alpha1.AnnotationGPUMemory] = "40Gi"
	if err := m.ValidateTrainJobUpdate(running, edited, false); err == nil || !strings.Contains(err.Error(), "cannot change while the job runs") {
		t.Errorf("request edit on a running TrainJob: %v", err)
	}
	more := running.DeepCopy()
	more.Spec.Trainer.ResourcesPerNode = limits(vgpu, "4", gmem, "81920")
	if err := m.ValidateTrainJobUpdate(running, more, false); err == nil || !strings.Contains(err.Error(), "trainer.resourcesPerNode cannot change while the TrainJob runs") {
		t.Errorf("resources edit on a running TrainJob: %v", err)
	}
	// Kueue's runtime patch on a TrainJob made before gpupack: allowed.
	legacy := makeTrainJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, limits(gpu, "1"))
	patched := legacy.DeepCopy()
	patched.Spec.Suspend = kptr.To(false)
	patched.Spec.RuntimePatches = []trainer.RuntimePatch{{Manager: "kueue.x-k8s.io/manager"}}
	if err := m.ValidateTrainJobUpdate(legacy, patched, true); err != nil {
		t.Errorf("Kueue starting an unconverted TrainJob: %v", err)
	}
	// A suspended TrainJob's new request must validate.
	suspended := converted(true)
	raw := suspended.DeepCopy()
	raw.Annotations[v1alpha1.AnnotationGPUMemory] = "40Gi"
	if err := m.ValidateTrainJobUpdate(suspended, raw, true); err == nil || !strings.Contains(err.Error(), "trainer.resourcesPerNode") {
		t.Errorf("unconverted new request on a suspended TrainJob: %v", err)
	}
	if _, err := m.TrainJob(raw); err == nil {
		t.Error("the memory annotation and the converted resources disagree: the mutation must refuse, not pick one")
	}
}
