package mutatecli

import (
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"
)

// jobKindObject returns an empty object of a job kind the webhooks convert
// through mutation.KindTemplates (JobSet, LeaderWorkerSet, Deployment,
// StatefulSet), or nil.
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
	}
	return nil
}
