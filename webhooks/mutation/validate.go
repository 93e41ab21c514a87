package mutation

import (
	"encoding/json"
	"fmt"
	"sort"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/gpureq"
)

// The validating webhooks re-run the mutation on a copy: every rule lives in
// one place, and an object the mutating webhook did not reach (skipped, or
// changed by a later webhook) is caught because mutating it again would
// change it.

// ValidatePod checks a Pod at creation.
func (m *Mutator) ValidatePod(p *corev1.Pod) error { return m.ValidatePodIn(p, PodContext{}) }

// ValidatePodIn is ValidatePod for a pod whose job the caller has looked
// up (pc.JobID: the pod webhook sets GPUPACK_JOB_ID from it).
func (m *Mutator) ValidatePodIn(p *corev1.Pod, pc PodContext) error {
	cp := p.DeepCopy()
	if _, err := m.Pod(cp, PodContext{JobID: pc.JobID}); err != nil {
		return err
	}
	return sameContainers("pod", p.Spec.Containers, cp.Spec.Containers)
}

// ValidateJob checks a batch/v1 Job at creation.
func (m *Mutator) ValidateJob(j *batchv1.Job) error {
	cp := j.DeepCopy()
	if _, err := m.Job(cp); err != nil {
		return err
	}
	return sameContainers("pod template", j.Spec.Template.Spec.Containers, cp.Spec.Template.Spec.Containers)
}

// ValidatePyTorchJob checks a PyTorchJob at creation.
func (m *Mutator) ValidatePyTorchJob(j *kftraining.PyTorchJob) error {
	cp := j.DeepCopy()
	if _, err := m.PyTorchJob(cp); err != nil {
		return err
	}
	for _, rt := range replicaTypes(j) {
		a, b := j.Spec.PyTorchReplicaSpecs[rt], cp.Spec.PyTorchReplicaSpecs[rt]
		if a == nil || b == nil {
			continue
		}
		if err := sameContainers("replica "+string(rt), a.Template.Spec.Containers, b.Template.Spec.Containers); err != nil {
			return err
		}
	}
	return nil
}

func replicaTypes(j *kftraining.PyTorchJob) []kftraining.ReplicaType {
	out := make([]kftraining.ReplicaType, 0, len(j.Spec.PyTorchReplicaSpecs))
	for rt := range j.Spec.PyTorchReplicaSpecs {
		out = append(out, rt)
	}
	sort.Slice(out, func(i, k int) bool { return out[i] < out[k] })
	return out
}

func sameContainers(where string, got, want []corev1.Container) error {
	for i := range got {
		g, w := got[i], want[i]
		var what string
		switch {
		case !equality.Semantic.DeepEqual(g.Resources, w.Resources):
			what = "GPU resources are not converted"
		case !equality.Semantic.DeepEqual(g.Env, w.Env):
			what = "environment differs from what gpupack injects"
		case !equality.Semantic.DeepEqual(g.VolumeMounts, w.VolumeMounts):
			what = "GPU hook mounts are missing or changed"
		case !equality.Semantic.DeepEqual(g.Command, w.Command) || !equality.Semantic.DeepEqual(g.Args, w.Args):
			what = "command is not wrapped by gpupack-ckpt"
		default:
			continue
		}
		return fmt.Errorf("%s: container %q: %s (was the gpupack mutating webhook skipped or undone by another webhook?)", where, g.Name, what)
	}
	return nil
}

// requestAnnotations are the keys whose edits are refused on running jobs.
func requestAnnotations(ann map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range gpureq.RequestKeys {
		if v, ok := ann[k]; ok {
			out[k] = v
		}
	}
	return out
}

func changed(a, b map[string]string) (string, bool) {
	ra, rb := requestAnnotations(a), requestAnnotations(b)
	for _, k := range gpureq.RequestKeys {
		va, oka := ra[k]
		vb, okb := rb[k]
		if oka != okb || va != vb {
			return k, true
		}
	}
	return "", false
}

// ValidatePodUpdate refuses edits of the request annotations on a pod: its
// resources (and so its limits) cannot change any more.
//
// gpupack.io/checkpoint cannot change either: it decides whether the
// coordinator counts the pod's disruptions (a drain, a non-Kueue
// preemption, a delete) and bounds their grace; a tenant removing it from a
// running pod would step outside that (review 16, H3).
func (m *Mutator) ValidatePodUpdate(old, cur *corev1.Pod) error {
	if k, ok := changed(old.Annotations, cur.Annotations); ok {
		return fmt.Errorf("annotation %s cannot change on an existing pod; delete and recreate it (or change its job)", k)
	}
	o, ook := old.Annotations[v1alpha1.AnnotationCheckpoint]
	c, cok := cur.Annotations[v1alpha1.AnnotationCheckpoint]
	if o != c || ook != cok {
		return fmt.Errorf("annotation %s cannot change on an existing pod; delete and recreate it (or change its job)", v1alpha1.AnnotationCheckpoint)
	}
	return nil
}

// PodUpdateRefusedKeys are the annotations ValidatePodUpdate refuses to
// change: the pod validating webhook's match condition sends it updates
// that change any of them.
var PodUpdateRefusedKeys = append(append([]string(nil), gpureq.RequestKeys...), v1alpha1.AnnotationCheckpoint)

func runningMsg(k string) error {
	return fmt.Errorf("annotation %s cannot change while the job runs; suspend the job first (or recreate it)", k)
}

// ValidateJobUpdate refuses edits of the request annotations on a job that
// is not suspended (Kueue keeps jobs suspended until admission).
func (m *Mutator) ValidateJobUpdate(old, cur *batchv1.Job) error {
	if err := m.ownedEnvAdded("pod template", nonNil(cur.Annotations), &old.Spec.Template, &cur.Spec.Template); err != nil {
		return err
	}
	if err := m.securityBroken("pod template", &old.Spec.Template, &cur.Spec.Template); err != nil {
		return err
	}
	k, ok := changed(old.Annotations, cur.Annotations)
	if !ok {
		k, ok = changed(old.Spec.Template.Annotations, cur.Spec.Template.Annotations)
	}
	if !ok {
		return nil
	}
	if old.Spec.Suspend == nil || !*old.Spec.Suspend {
		return runningMsg(k)
	}
	return m.ValidateJob(cur)
}

// ValidatePyTorchJobUpdate is ValidateJobUpdate for PyTorchJobs.
func (m *Mutator) ValidatePyTorchJobUpdate(old, cur *kftraining.PyTorchJob) error {
	for _, rt := range replicaTypes(cur) {
		o, c := old.Spec.PyTorchReplicaSpecs[rt], cur.Spec.PyTorchReplicaSpecs[rt]
		if c == nil {
			continue
		}
		var ot *corev1.PodTemplateSpec
		if o != nil {
			ot = &o.Template
		}
		if err := m.ownedEnvAdded("replica "+string(rt), nonNil(cur.Annotations), ot, &c.Template); err != nil {
			return err
		}
		if err := m.securityBroken("replica "+string(rt), ot, &c.Template); err != nil {
			return err
		}
	}
	k, ok := changed(old.Annotations, cur.Annotations)
	for _, rt := range replicaTypes(cur) {
		if ok {
			break
		}
		var oa map[string]string
		if o := old.Spec.PyTorchReplicaSpecs[rt]; o != nil {
			oa = o.Template.Annotations
		}
		var ca map[string]string
		if c := cur.Spec.PyTorchReplicaSpecs[rt]; c != nil {
			ca = c.Template.Annotations
		}
		k, ok = changed(oa, ca)
	}
	if !ok {
		return nil
	}
	if s := old.Spec.RunPolicy.Suspend; s == nil || !*s {
		return runningMsg(k)
	}
	return m.ValidatePyTorchJob(cur)
}

// ownedEnvAdded refuses an update that puts an owned env key (or a new
// value of one) on a GPU container of a job's template: the mutating
// webhook replaces them with gpupack's own when the job is created, and on
// updates it syncs only gates and the injection marker, so the edit is
// refused rather than left for the pods (where a denial leaves the job
// without pods). Keys already in the old template (gpupack's own, or a
// job created before templates were injected) do not block Kueue's and the
// operators' own updates.
func (m *Mutator) ownedEnvAdded(where string, jobAnn map[string]string, old, cur *corev1.PodTemplateSpec) error {
	cp := cur.DeepCopy()
	r, err := m.template(where, jobAnn, cp)
	if err != nil {
		return nil // the other checks report it
	}
	key := func(container string, e corev1.EnvVar) string {
		raw, _ := json.Marshal(e)
		return container + "\x00" + string(raw)
	}
	before := map[string]bool{}
	if old != nil {
		for _, c := range old.Spec.Containers {
			for _, e := range c.Env {
				before[key(c.Name, e)] = true
			}
		}
	}
	for i, req := range r.reqs {
		if req.Kind == gpureq.NoGPU {
			continue
		}
		c := cur.Spec.Containers[i]
		for _, e := range c.Env {
			if owned(e.Name) && !before[key(c.Name, e)] {
				return fmt.Errorf("%s: container %q sets %s, which gpupack owns on GPU containers; remove it", where, c.Name, e.Name)
			}
		}
	}
	return nil
}

// securityBroken refuses an update that makes a job's GPU template break
// the every-container rules (privilege, host namespaces, GPUs in init
// containers, mounts over gpupack's paths) when the old template met them:
// its pods would be denied one by one, where nobody reads the message, so
// whoever edits the job hears it now. A template that already broke them
// (created before this release) does not block Kueue's and the operators'
// own updates.
func (m *Mutator) securityBroken(where string, old, cur *corev1.PodTemplateSpec) error {
	check := func(t *corev1.PodTemplateSpec) error {
		if err := initContainersAskGPU(&t.Spec); err != nil {
			return err
		}
		if !m.isGPUPod(&corev1.Pod{Spec: t.Spec}) {
			return nil
		}
		return m.podSecurity(&t.Spec)
	}
	err := check(cur)
	if err == nil {
		return nil
	}
	if old != nil && check(old) != nil {
		return nil
	}
	return fmt.Errorf("%s: %w", where, err)
}
