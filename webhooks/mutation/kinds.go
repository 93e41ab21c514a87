package mutation

// Job kinds beyond batch Job and PyTorchJob: JobSet, LeaderWorkerSet and
// apps/v1 Deployment / StatefulSet (and, in kinds_operators.go, RayJob,
// RayCluster, MPIJob and Trainer v2's kinds). Each is a list of pod templates
// (Templates) and goes through the same per-template conversion as a
// PyTorchJob replica (template + injectTemplate): job-level annotations as
// defaults, HAMi names accepted, gpupack.io/* resources (or HAMi's, in hami
// mode) written at apply time so Kueue counts them, the same denials with
// messages that name the template, and the injection marker (SyncTemplate).

import (
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// Template is one pod template of a job: Where names it in messages, Path is
// its JSON pointer in the object (for patches), T is the template itself.
type Template struct {
	Where string
	Path  string
	T     *corev1.PodTemplateSpec
	// Defaults are the job-level annotations for this template (the
	// object's, and for a JobSet the replicated Job template's on top).
	Defaults map[string]string
	// PodController is "StatefulSet" for a StatefulSet's and an LWS's
	// templates: their pods are a StatefulSet's, which Kueue's pod
	// integration takes. "" for a job's pods, and for a Deployment's
	// (ReplicaSet pods have no fast path: every one meets the pod webhook).
	PodController string
}

// JobSetTemplates are the pod templates of a JobSet: every
// replicatedJobs[].template.spec.template. A replicated Job template's own
// request annotations override the JobSet's, group by group (memory, cores,
// checkpoint), as a Job's do for its pod template.
func JobSetTemplates(j *jobset.JobSet) []Template {
	out := make([]Template, 0, len(j.Spec.ReplicatedJobs))
	for i := range j.Spec.ReplicatedJobs {
		rj := &j.Spec.ReplicatedJobs[i]
		out = append(out, Template{
			Where:    "replicatedJobs[" + rj.Name + "].template",
			Path:     "/spec/replicatedJobs/" + strconv.Itoa(i) + "/template/spec/template",
			T:        &rj.Template.Spec.Template,
			Defaults: layered(j.Annotations, rj.Template.Annotations),
		})
	}
	return out
}

// LeaderWorkerSetTemplates are leaderWorkerTemplate.leaderTemplate (when set)
// and leaderWorkerTemplate.workerTemplate.
func LeaderWorkerSetTemplates(l *lws.LeaderWorkerSet) []Template {
	var out []Template
	lwt := &l.Spec.LeaderWorkerTemplate
	if lwt.LeaderTemplate != nil {
		out = append(out, Template{Where: "leaderWorkerTemplate.leaderTemplate", Path: "/spec/leaderWorkerTemplate/leaderTemplate", T: lwt.LeaderTemplate, Defaults: nonNil(l.Annotations), PodController: "StatefulSet"})
	}
	return append(out, Template{Where: "leaderWorkerTemplate.workerTemplate", Path: "/spec/leaderWorkerTemplate/workerTemplate", T: &lwt.WorkerTemplate, Defaults: nonNil(l.Annotations), PodController: "StatefulSet"})
}

// DeploymentTemplates is a Deployment's spec.template.
func DeploymentTemplates(d *appsv1.Deployment) []Template {
	return []Template{{Where: "pod template", Path: "/spec/template", T: &d.Spec.Template, Defaults: nonNil(d.Annotations)}}
}

// StatefulSetTemplates is a StatefulSet's spec.template.
func StatefulSetTemplates(s *appsv1.StatefulSet) []Template {
	return []Template{{Where: "pod template", Path: "/spec/template", T: &s.Spec.Template, Defaults: nonNil(s.Annotations), PodController: "StatefulSet"}}
}

// layered returns outer with inner's request groups on top: a group (memory,
// cores, checkpoint) set in inner replaces outer's whole group, so the two
// levels never mix into a combination neither wrote.
func layered(outer, inner map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range outer {
		out[k] = v
	}
	for _, keys := range [][]string{memoryKeys, coresKeys, checkpointKeys} {
		if !hasAny(inner, keys) {
			continue
		}
		for _, k := range keys {
			delete(out, k)
			if v, ok := inner[k]; ok {
				out[k] = v
			}
		}
	}
	return out
}

// Templates mutates the pod templates of one job in place, as PyTorchJob
// does its replicas. jobAnn are the object's own annotations (the job-level
// "asks for GPUs" check).
func (m *Mutator) Templates(jobAnn map[string]string, ts []Template) ([]string, error) {
	var warn []string
	anyGPU := false
	for _, t := range ts {
		r, err := m.template(t.Where, t.Defaults, t.T)
		if err != nil {
			return warn, err
		}
		warn = append(warn, r.warn...)
		w, err := m.injectTemplate(t.Where, t.Defaults, t.T, r.reqs, t.PodController)
		warn = append(warn, w...)
		if err != nil {
			return warn, err
		}
		anyGPU = anyGPU || r.anyGPU
	}
	return warn, jobLevelNeedsGPU(jobAnn, anyGPU)
}

// ValidateTemplates checks a job's templates as ValidatePyTorchJob does:
// mutating a copy must succeed and change no container.
func (m *Mutator) ValidateTemplates(jobAnn map[string]string, ts []Template) error {
	cps := make([]Template, len(ts))
	for i, t := range ts {
		cps[i] = t
		cps[i].T = t.T.DeepCopy()
	}
	if _, err := m.Templates(jobAnn, cps); err != nil {
		return err
	}
	for i, t := range ts {
		if err := sameContainers(t.Where, t.T.Spec.Containers, cps[i].T.Spec.Containers); err != nil {
			return err
		}
	}
	return nil
}

// SyncTemplates is SyncPyTorchJob for any job's templates: on an update of a
// job whose templates are frozen while it runs (a JobSet), only the
// placement gate and the injection marker follow Kueue's podSetUpdates.
func (m *Mutator) SyncTemplates(ts []Template) {
	for _, t := range ts {
		m.syncTemplate(t.Defaults, t.T, t.PodController)
	}
}

// ValidateFrozenTemplatesUpdate is ValidatePyTorchJobUpdate for a job whose
// templates only change while it is suspended (a JobSet): no new owned env
// on a GPU container, and no edit of a request annotation unless the job was
// suspended — then the new templates must validate.
func (m *Mutator) ValidateFrozenTemplatesUpdate(oldAnn, curAnn map[string]string, old, cur []Template, wasSuspended bool) error {
	olds := map[string]*corev1.PodTemplateSpec{}
	oldAnns := map[string]map[string]string{}
	for _, t := range old {
		olds[t.Where], oldAnns[t.Where] = t.T, t.T.Annotations
	}
	for _, t := range cur {
		if err := m.ownedEnvAdded(t.Where, t.Defaults, olds[t.Where], t.T); err != nil {
			return err
		}
	}
	k, ok := changed(oldAnn, curAnn)
	for _, t := range cur {
		if ok {
			break
		}
		k, ok = changed(oldAnns[t.Where], t.T.Annotations)
	}
	if !ok {
		return nil
	}
	if !wasSuspended {
		return runningMsg(k)
	}
	return m.ValidateTemplates(curAnn, cur)
}

// JobSet mutates a jobset.x-k8s.io/v1alpha2 JobSet in place.
func (m *Mutator) JobSet(j *jobset.JobSet) ([]string, error) {
	return m.Templates(j.Annotations, JobSetTemplates(j))
}

// LeaderWorkerSet mutates a leaderworkerset.x-k8s.io/v1 LeaderWorkerSet in place.
func (m *Mutator) LeaderWorkerSet(l *lws.LeaderWorkerSet) ([]string, error) {
	return m.Templates(l.Annotations, LeaderWorkerSetTemplates(l))
}

// Deployment mutates an apps/v1 Deployment in place.
func (m *Mutator) Deployment(d *appsv1.Deployment) ([]string, error) {
	return m.Templates(d.Annotations, DeploymentTemplates(d))
}

// StatefulSet mutates an apps/v1 StatefulSet in place.
func (m *Mutator) StatefulSet(s *appsv1.StatefulSet) ([]string, error) {
	return m.Templates(s.Annotations, StatefulSetTemplates(s))
}

// KindTemplates returns the templates and annotations of an object of one of
// the job kinds above or in kinds_operators.go (typed; a TrainJob has no pod
// template: see Mutator.TrainJob), or an error naming what it is.
func KindTemplates(obj any) (map[string]string, []Template, error) {
	switch o := obj.(type) {
	case *jobset.JobSet:
		return o.Annotations, JobSetTemplates(o), nil
	case *lws.LeaderWorkerSet:
		return o.Annotations, LeaderWorkerSetTemplates(o), nil
	case *appsv1.Deployment:
		return o.Annotations, DeploymentTemplates(o), nil
	case *appsv1.StatefulSet:
		return o.Annotations, StatefulSetTemplates(o), nil
	case *ray.RayJob:
		return o.Annotations, RayJobTemplates(o), nil
	case *ray.RayCluster:
		return o.Annotations, RayClusterTemplates(o), nil
	case *mpi.MPIJob:
		return o.Annotations, MPIJobTemplates(o), nil
	case *trainer.TrainingRuntime:
		return o.Annotations, TrainingRuntimeTemplates(o), nil
	case *trainer.ClusterTrainingRuntime:
		return o.Annotations, ClusterTrainingRuntimeTemplates(o), nil
	}
	return nil, nil, fmt.Errorf("%T is not a job kind gpupack converts", obj)
}
