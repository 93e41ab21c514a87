package mutatecli

import (
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// jobKindObject returns an empty object of a job kind the webhooks convert
// through mutation.KindTemplates (JobSet, LeaderWorkerSet, Deployment,
// StatefulSet, RayJob, RayCluster, MPIJob, TrainingRuntime,
// ClusterTrainingRuntime), or nil. A TrainJob has no template of its own
// (mutateDocument converts it with Mutator.TrainJob).
func jobKindObject(tm metav1.TypeMeta) runtime.Object {
	switch {
	case tm.APIVersion == jobset.GroupVersion.String() && tm.Kind == "JobSet":
		return &jobset.JobSet{}
	case tm.APIVersion == lws.GroupVersion.String() && tm.Kind == "LeaderWorkerSet":
		return &lws.LeaderWorkerSet{}
	case tm.APIVersion == "apps/v1" && tm.Kind == "Deployment":
		return &appsv1.Deployment{}
	case tm.APIVersion == "apps/v1" && tm.Kind == "StatefulSet":
		return &appsv1.StatefulSet{}
	case tm.APIVersion == ray.GroupVersion.String() && tm.Kind == "RayJob":
		return &ray.RayJob{}
	case tm.APIVersion == ray.GroupVersion.String() && tm.Kind == "RayCluster":
		return &ray.RayCluster{}
	case tm.APIVersion == mpi.SchemeGroupVersion.String() && tm.Kind == mpi.Kind:
		return &mpi.MPIJob{}
	case tm.APIVersion == trainer.GroupVersion.String() && tm.Kind == trainer.TrainingRuntimeKind:
		return &trainer.TrainingRuntime{}
	case tm.APIVersion == trainer.GroupVersion.String() && tm.Kind == trainer.ClusterTrainingRuntimeKind:
		return &trainer.ClusterTrainingRuntime{}
	}
	return nil
}

// isTrainJob reports a trainer.kubeflow.org/v1alpha1 TrainJob.
func isTrainJob(tm metav1.TypeMeta) bool {
	return tm.APIVersion == trainer.GroupVersion.String() && tm.Kind == trainer.TrainJobKind
}
