package mutation

// The job kinds of the operators Kueue v0.17 integrates besides JobSet and
// LWS: KubeRay's RayJob and RayCluster, the MPI operator's MPIJob, and
// Kubeflow Trainer v2 (TrainJob, with its TrainingRuntime and
// ClusterTrainingRuntime). Each is a list of pod templates converted as
// Templates does, except TrainJob, which has no pod template of its own.
//
// Where a TrainJob's fractional request lives. Kueue builds a TrainJob's
// Workload from the JobSet its (Cluster)TrainingRuntime's template makes,
// with the TrainJob's overrides applied (trainer.resourcesPerNode replaces
// the resources of the trainer's "node" container; the initializers and
// every other replicated Job are the runtime's as written). So the request
// is converted in two places, each where it is written:
//   - a (Cluster)TrainingRuntime's template is converted like a JobSet's
//     (every template.spec.replicatedJobs[NAME].template, the runtime's
//     annotations as defaults); its pods then carry gpupack.io/* and the
//     marker, and Kueue counts gpupack.io/* for every TrainJob using it;
//   - a TrainJob's trainer.resourcesPerNode is converted with the
//     TrainJob's own annotations as the request (HAMi's names accepted),
//     because that override is what Kueue counts for the trainer pods.
// The webhook reads nothing from the API, so it cannot see the runtime a
// TrainJob names: a request written on both (a fractional runtime and a
// TrainJob overriding resourcesPerNode with another request) is refused
// where the pods are made (the Job webhook finds the annotations and the
// resources disagree). Write the request in one of the two places.

import (
	"fmt"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// rayClusterTemplates are the head and worker group templates of a
// RayClusterSpec at JSON pointer base, named with prefix.
func rayClusterTemplates(prefix, base string, s *ray.RayClusterSpec, ann map[string]string) []Template {
	out := []Template{{Where: prefix + "headGroupSpec.template", Path: base + "/headGroupSpec/template", T: &s.HeadGroupSpec.Template, Defaults: nonNil(ann)}}
	for i := range s.WorkerGroupSpecs {
		g := &s.WorkerGroupSpecs[i]
		out = append(out, Template{
			Where:    prefix + "workerGroupSpecs[" + g.GroupName + "].template",
			Path:     base + "/workerGroupSpecs/" + strconv.Itoa(i) + "/template",
			T:        &g.Template,
			Defaults: nonNil(ann),
		})
	}
	return out
}

// RayClusterTemplates are spec.headGroupSpec.template and every
// spec.workerGroupSpecs[GROUP].template.
func RayClusterTemplates(c *ray.RayCluster) []Template {
	return rayClusterTemplates("", "/spec", &c.Spec, c.Annotations)
}

// RayJobTemplates are the templates of spec.rayClusterSpec (when the RayJob
// makes its own cluster) and spec.submitterPodTemplate (when set; Kueue
// counts the submitter as a pod set of its own).
func RayJobTemplates(j *ray.RayJob) []Template {
	var out []Template
	if j.Spec.RayClusterSpec != nil {
		out = rayClusterTemplates("rayClusterSpec.", "/spec/rayClusterSpec", j.Spec.RayClusterSpec, j.Annotations)
	}
	if j.Spec.SubmitterPodTemplate != nil {
		out = append(out, Template{Where: "submitterPodTemplate", Path: "/spec/submitterPodTemplate", T: j.Spec.SubmitterPodTemplate, Defaults: nonNil(j.Annotations)})
	}
	return out
}

// MPIJobTemplates are spec.mpiReplicaSpecs[TYPE].template, Launcher before
// Worker (sorted by type).
func MPIJobTemplates(j *mpi.MPIJob) []Template {
	types := make([]string, 0, len(j.Spec.MPIReplicaSpecs))
	for rt, rs := range j.Spec.MPIReplicaSpecs {
		if rs != nil {
			types = append(types, string(rt))
		}
	}
	sort.Strings(types)
	out := make([]Template, 0, len(types))
	for _, rt := range types {
		rs := j.Spec.MPIReplicaSpecs[mpi.MPIReplicaType(rt)]
		out = append(out, Template{Where: "mpiReplicaSpecs[" + rt + "].template", Path: "/spec/mpiReplicaSpecs/" + rt + "/template", T: &rs.Template, Defaults: nonNil(j.Annotations)})
	}
	return out
}

// trainingRuntimeTemplates are every template.spec.replicatedJobs[NAME].template
// of a (Cluster)TrainingRuntime's spec: the runtime's annotations, then the
// JobSet template's, then the replicated Job template's, group by group.
func trainingRuntimeTemplates(ann map[string]string, s *trainer.TrainingRuntimeSpec) []Template {
	outer := layered(ann, s.Template.Annotations)
	out := make([]Template, 0, len(s.Template.Spec.ReplicatedJobs))
	for i := range s.Template.Spec.ReplicatedJobs {
		rj := &s.Template.Spec.ReplicatedJobs[i]
		out = append(out, Template{
			Where:    "template.spec.replicatedJobs[" + rj.Name + "].template",
			Path:     "/spec/template/spec/replicatedJobs/" + strconv.Itoa(i) + "/template/spec/template",
			T:        &rj.Template.Spec.Template,
			Defaults: layered(outer, rj.Template.Annotations),
		})
	}
	return out
}

// TrainingRuntimeTemplates are a TrainingRuntime's JobSet pod templates.
func TrainingRuntimeTemplates(r *trainer.TrainingRuntime) []Template {
	return trainingRuntimeTemplates(r.Annotations, &r.Spec)
}

// ClusterTrainingRuntimeTemplates are a ClusterTrainingRuntime's JobSet pod templates.
func ClusterTrainingRuntimeTemplates(r *trainer.ClusterTrainingRuntime) []Template {
	return trainingRuntimeTemplates(r.Annotations, &r.Spec)
}

// RayJob mutates a ray.io/v1 RayJob in place.
func (m *Mutator) RayJob(j *ray.RayJob) ([]string, error) {
	return m.Templates(j.Annotations, RayJobTemplates(j))
}

// RayCluster mutates a ray.io/v1 RayCluster in place.
func (m *Mutator) RayCluster(c *ray.RayCluster) ([]string, error) {
	return m.Templates(c.Annotations, RayClusterTemplates(c))
}

// MPIJob mutates a kubeflow.org/v2beta1 MPIJob in place.
func (m *Mutator) MPIJob(j *mpi.MPIJob) ([]string, error) {
	return m.Templates(j.Annotations, MPIJobTemplates(j))
}

// TrainingRuntime mutates a trainer.kubeflow.org/v1alpha1 TrainingRuntime in place.
func (m *Mutator) TrainingRuntime(r *trainer.TrainingRuntime) ([]string, error) {
	return m.Templates(r.Annotations, TrainingRuntimeTemplates(r))
}

// ClusterTrainingRuntime mutates a ClusterTrainingRuntime in place.
func (m *Mutator) ClusterTrainingRuntime(r *trainer.ClusterTrainingRuntime) ([]string, error) {
	return m.Templates(r.Annotations, ClusterTrainingRuntimeTemplates(r))
}

// WhereTrainJobResources names a TrainJob's trainer.resourcesPerNode in messages.
const WhereTrainJobResources = "trainer.resourcesPerNode"

// TrainerContainer is the trainer container resourcesPerNode replaces the
// resources of (Kubeflow Trainer's constants.Node).
const TrainerContainer = "node"

// TrainJob converts a trainer.kubeflow.org/v1alpha1 TrainJob's
// trainer.resourcesPerNode in place, with the TrainJob's annotations as the
// request (see the top of this file): what Kueue counts for the trainer's
// pods. A request annotation on a TrainJob without a GPU in
// resourcesPerNode is refused: it would reach no pod.
func (m *Mutator) TrainJob(j *trainer.TrainJob) ([]string, error) {
	var rr *corev1.ResourceRequirements
	if j.Spec.Trainer != nil {
		rr = j.Spec.Trainer.ResourcesPerNode
	}
	ann := nonNil(j.Annotations)
	if rr == nil {
		return nil, trainJobNeedsGPU(ann, false)
	}
	t := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: TrainerContainer, Resources: *rr.DeepCopy()}}}}
	r, err := m.template(WhereTrainJobResources, ann, t)
	if err != nil {
		return r.warn, err
	}
	if err := trainJobNeedsGPU(ann, r.anyGPU); err != nil {
		return r.warn, err
	}
	if !equality.Semantic.DeepEqual(*rr, t.Spec.Containers[0].Resources) {
		*rr = t.Spec.Containers[0].Resources
	}
	return r.warn, nil
}

func trainJobNeedsGPU(ann map[string]string, anyGPU bool) error {
	if !anyGPU && (hasAny(ann, memoryKeys) || hasAny(ann, coresKeys)) {
		return fmt.Errorf("TrainJob: %s/%s is set but %s asks for no %s; a TrainJob's annotations convert %s only (the runtime's pods never see them): add %s: 1 (or more) there, or put the request on the TrainingRuntime's trainer template", v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationGPUCores, WhereTrainJobResources, v1alpha1.ResourceNvidiaGPU, WhereTrainJobResources, v1alpha1.ResourceNvidiaGPU)
	}
	return nil
}

// ValidateTrainJob checks a TrainJob as ValidateTemplates does: converting
// a copy must succeed and leave resourcesPerNode as it is.
func (m *Mutator) ValidateTrainJob(j *trainer.TrainJob) error {
	cp := j.DeepCopy()
	if _, err := m.TrainJob(cp); err != nil {
		return err
	}
	if j.Spec.Trainer != nil && j.Spec.Trainer.ResourcesPerNode != nil &&
		!equality.Semantic.DeepEqual(*j.Spec.Trainer.ResourcesPerNode, *cp.Spec.Trainer.ResourcesPerNode) {
		return fmt.Errorf("%s: GPU resources are not converted; apply it through gpupack's mutating webhook (or gpupack mutate -f)", WhereTrainJobResources)
	}
	return nil
}

// ValidateTrainJobUpdate refuses a change of a TrainJob's request (its
// request annotations or resourcesPerNode) unless it was suspended; a
// changed request must then validate. An update that leaves the request
// alone (Kueue writing its runtime patch) is allowed as it is, so a TrainJob
// made before gpupack can still be started and stopped.
func (m *Mutator) ValidateTrainJobUpdate(old, cur *trainer.TrainJob, wasSuspended bool) error {
	k, ok := changed(old.Annotations, cur.Annotations)
	if !ok && !equality.Semantic.DeepEqual(trainJobResources(old), trainJobResources(cur)) {
		k, ok = WhereTrainJobResources, true
	}
	if !ok {
		return nil
	}
	if !wasSuspended {
		if k == WhereTrainJobResources {
			return fmt.Errorf("%s cannot change while the TrainJob runs; suspend it first (or recreate it)", k)
		}
		return runningMsg(k)
	}
	return m.ValidateTrainJob(cur)
}

func trainJobResources(j *trainer.TrainJob) *corev1.ResourceRequirements {
	if j.Spec.Trainer == nil {
		return nil
	}
	return j.Spec.Trainer.ResourcesPerNode
}
