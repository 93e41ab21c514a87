package volcano

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

// wlWrapper builds Workloads so a test reads like its situation.
type wlWrapper struct{ kueue.Workload }

func makeWL(name string) *wlWrapper {
	return &wlWrapper{kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", UID: types.UID("uid-" + name)},
	}}
}

// podSet adds a pod set of count pods, each with one container asking for
// the given resources (requests only unless limitsOnly).
func (w *wlWrapper) podSet(name string, count int32, req corev1.ResourceList) *wlWrapper {
	w.Spec.PodSets = append(w.Spec.PodSets, kueue.PodSet{
		Name: kueue.PodSetReference(name), Count: count,
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Resources: corev1.ResourceRequirements{Requests: req},
		}}}},
	})
	return w
}

// last returns the pod spec of the last pod set, to tweak it.
func (w *wlWrapper) last() *corev1.PodSpec {
	return &w.Spec.PodSets[len(w.Spec.PodSets)-1].Template.Spec
}

func (w *wlWrapper) scheduler(name string) *wlWrapper {
	w.last().SchedulerName = name
	return w
}

func (w *wlWrapper) admitted(counts map[string]int32) *wlWrapper {
	adm := &kueue.Admission{ClusterQueue: "cq"}
	for _, ps := range w.Spec.PodSets {
		psa := kueue.PodSetAssignment{Name: ps.Name}
		if c, ok := counts[string(ps.Name)]; ok {
			psa.Count = ptr.To(c)
		}
		adm.PodSetAssignments = append(adm.PodSetAssignments, psa)
	}
	w.Status.Admission = adm
	w.cond(kueue.WorkloadQuotaReserved, true)
	w.cond(kueue.WorkloadAdmitted, true)
	return w
}

func (w *wlWrapper) cond(t string, v bool) *wlWrapper {
	s := metav1.ConditionFalse
	if v {
		s = metav1.ConditionTrue
	}
	apimeta.SetStatusCondition(&w.Status.Conditions, metav1.Condition{Type: t, Status: s, Reason: "Test", Message: "set by test"})
	return w
}

func (w *wlWrapper) check(name string, state kueue.CheckState, at time.Time) *wlWrapper {
	w.Status.AdmissionChecks = append(w.Status.AdmissionChecks, kueue.AdmissionCheckState{
		Name: kueue.AdmissionCheckReference(name), State: state, Message: "by test", LastTransitionTime: metav1.NewTime(at),
	})
	return w
}

func (w *wlWrapper) obj() *kueue.Workload { return w.Workload.DeepCopy() }

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}
