package webhooks

// The job kinds beyond batch Job and PyTorchJob: JobSet, LeaderWorkerSet,
// apps/v1 Deployment and StatefulSet, Kubeflow Trainer v2's TrainJob,
// TrainingRuntime and ClusterTrainingRuntime, KubeRay's RayJob and
// RayCluster, and the MPI operator's MPIJob. Their handlers decode the
// request with no CRD types in the manager's scheme, so they are always
// served; the only API reads are the unmanaged-GPU policy's (kueueView, for
// the kinds with a Kueue framework, on GPU objects Kueue will not manage by
// their own labels). Which kinds get webhook entries is ServeOptions.JobKinds,
// and the manager keeps the installed configurations to the kinds the
// cluster serves (SetupJobKinds), so a cluster without JobSet runs as before.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/webhooks/mutation"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// Paths of the job kinds' handlers.
const (
	PathMutateJobSet                = "/mutate-jobset-x-k8s-io-v1alpha2-jobset"
	PathValidateJobSet              = "/validate-jobset-x-k8s-io-v1alpha2-jobset"
	PathMutateLeaderWorkerSet       = "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset"
	PathValidateLeaderWorkerSet     = "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset"
	PathMutateDeployment            = "/mutate-apps-v1-deployment"
	PathValidateDeployment          = "/validate-apps-v1-deployment"
	PathMutateStatefulSet           = "/mutate-apps-v1-statefulset"
	PathValidateStatefulSet         = "/validate-apps-v1-statefulset"
	PathMutateTrainJob              = "/mutate-trainer-kubeflow-org-v1alpha1-trainjob"
	PathValidateTrainJob            = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
	PathMutateTrainingRuntime       = "/mutate-trainer-kubeflow-org-v1alpha1-trainingruntime"
	PathValidateTrainingRuntime     = "/validate-trainer-kubeflow-org-v1alpha1-trainingruntime"
	PathMutateClusterTrainingRT     = "/mutate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"
	PathValidateClusterTrainingRT   = "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"
	PathMutateRayJob                = "/mutate-ray-io-v1-rayjob"
	PathValidateRayJob              = "/validate-ray-io-v1-rayjob"
	PathMutateRayCluster            = "/mutate-ray-io-v1-raycluster"
	PathValidateRayCluster          = "/validate-ray-io-v1-raycluster"
	PathMutateMPIJob                = "/mutate-kubeflow-org-v2beta1-mpijob"
	PathValidateMPIJob              = "/validate-kubeflow-org-v2beta1-mpijob"
	KindJobSet, KindLeaderWorkerSet = "JobSet", "LeaderWorkerSet"
	KindDeployment, KindStatefulSet = "Deployment", "StatefulSet"
	KindTrainJob                    = "TrainJob"
	KindTrainingRuntime             = "TrainingRuntime"
	KindClusterTrainingRuntime      = "ClusterTrainingRuntime"
	KindRayJob, KindRayCluster      = "RayJob", "RayCluster"
	KindMPIJob                      = "MPIJob"
)

// AllJobKinds are the job kinds gpupack converts besides Job and PyTorchJob.
var AllJobKinds = []string{KindJobSet, KindLeaderWorkerSet, KindDeployment, KindStatefulSet,
	KindTrainJob, KindTrainingRuntime, KindClusterTrainingRuntime, KindRayJob, KindRayCluster, KindMPIJob}

// jobKind describes one kind: its resource, paths, how to decode it and how
// its templates behave on update.
type jobKind struct {
	target
	// templates decodes raw JSON and returns the object's annotations and
	// templates (pointers into the decoded object).
	templates func(raw []byte) (map[string]string, []mutation.Template, error)
	// suspended is set for kinds whose templates are frozen while they run
	// (a JobSet: only Kueue's podSetUpdates change them, while suspended):
	// updates only sync the gate and the marker, as for a PyTorchJob. The
	// other kinds roll their templates out at any time, so an update is
	// converted like a create.
	suspended func(raw []byte) bool
	// handlers, when set, replace the template handlers (a TrainJob has
	// no pod template of its own: trainjob.go).
	handlers func(m *mutation.Mutator) (mutate, validate admission.Handler)
	// unmanagedChecked: the unmanaged-GPU policy checks the object itself
	// at creation (and keepsManagement on update), as it does Jobs and
	// PyTorchJobs, so whoever applies it hears the denial instead of its
	// controller when it creates the pods or child Jobs.
	unmanagedChecked bool
}

// framework is the kind's name in Kueue's integrations.frameworks.
func (k jobKind) framework() string {
	return mutation.Framework(k.group+"/"+k.version, k.kind)
}

func suspendedBy[T any](f func(*T) bool) func([]byte) bool {
	return func(raw []byte) bool {
		o := new(T)
		return decode(raw, o) == nil && f(o)
	}
}

func decodeTemplates[T any](kinds func(*T) []mutation.Template, ann func(*T) map[string]string) func([]byte) (map[string]string, []mutation.Template, error) {
	return func(raw []byte) (map[string]string, []mutation.Template, error) {
		o := new(T)
		if err := decode(raw, o); err != nil {
			return nil, nil, err
		}
		return ann(o), kinds(o), nil
	}
}

var jobKinds = map[string]jobKind{
	KindJobSet: {
		target:           target{kind: KindJobSet, group: jobset.GroupVersion.Group, version: jobset.GroupVersion.Version, resource: "jobsets", mutate: PathMutateJobSet, validate: PathValidateJobSet},
		templates:        decodeTemplates(mutation.JobSetTemplates, func(j *jobset.JobSet) map[string]string { return j.Annotations }),
		suspended:        suspendedBy(func(j *jobset.JobSet) bool { return j.Spec.Suspend != nil && *j.Spec.Suspend }),
		unmanagedChecked: true,
	},
	KindLeaderWorkerSet: {
		target:           target{kind: KindLeaderWorkerSet, group: lws.GroupVersion.Group, version: lws.GroupVersion.Version, resource: "leaderworkersets", mutate: PathMutateLeaderWorkerSet, validate: PathValidateLeaderWorkerSet},
		templates:        decodeTemplates(mutation.LeaderWorkerSetTemplates, func(l *lws.LeaderWorkerSet) map[string]string { return l.Annotations }),
		unmanagedChecked: true,
	},
	KindDeployment: {
		target:           target{kind: KindDeployment, group: "apps", version: "v1", resource: "deployments", mutate: PathMutateDeployment, validate: PathValidateDeployment},
		templates:        decodeTemplates(mutation.DeploymentTemplates, func(d *appsv1.Deployment) map[string]string { return d.Annotations }),
		unmanagedChecked: true,
	},
	KindStatefulSet: {
		target:           target{kind: KindStatefulSet, group: "apps", version: "v1", resource: "statefulsets", mutate: PathMutateStatefulSet, validate: PathValidateStatefulSet},
		templates:        decodeTemplates(mutation.StatefulSetTemplates, func(s *appsv1.StatefulSet) map[string]string { return s.Annotations }),
		unmanagedChecked: true,
	},
	KindTrainJob: {
		target:   target{kind: KindTrainJob, group: trainer.GroupVersion.Group, version: trainer.GroupVersion.Version, resource: "trainjobs", mutate: PathMutateTrainJob, validate: PathValidateTrainJob},
		handlers: trainJobHandlers,
	},
	// A runtime's template is what every TrainJob naming it starts from: a
	// new template applies to the next TrainJobs, so updates convert.
	KindTrainingRuntime: {
		target:    target{kind: KindTrainingRuntime, group: trainer.GroupVersion.Group, version: trainer.GroupVersion.Version, resource: "trainingruntimes", mutate: PathMutateTrainingRuntime, validate: PathValidateTrainingRuntime},
		templates: decodeTemplates(mutation.TrainingRuntimeTemplates, func(r *trainer.TrainingRuntime) map[string]string { return r.Annotations }),
	},
	KindClusterTrainingRuntime: {
		target: target{kind: KindClusterTrainingRuntime, group: trainer.GroupVersion.Group, version: trainer.GroupVersion.Version, resource: "clustertrainingruntimes",
			mutate: PathMutateClusterTrainingRT, validate: PathValidateClusterTrainingRT, clusterScoped: true},
		templates: decodeTemplates(mutation.ClusterTrainingRuntimeTemplates, func(r *trainer.ClusterTrainingRuntime) map[string]string { return r.Annotations }),
	},
	KindRayJob: {
		target:           target{kind: KindRayJob, group: ray.GroupVersion.Group, version: ray.GroupVersion.Version, resource: "rayjobs", mutate: PathMutateRayJob, validate: PathValidateRayJob},
		templates:        decodeTemplates(mutation.RayJobTemplates, func(j *ray.RayJob) map[string]string { return j.Annotations }),
		suspended:        suspendedBy(func(j *ray.RayJob) bool { return j.Spec.Suspend }),
		unmanagedChecked: true,
	},
	KindRayCluster: {
		target:           target{kind: KindRayCluster, group: ray.GroupVersion.Group, version: ray.GroupVersion.Version, resource: "rayclusters", mutate: PathMutateRayCluster, validate: PathValidateRayCluster},
		templates:        decodeTemplates(mutation.RayClusterTemplates, func(c *ray.RayCluster) map[string]string { return c.Annotations }),
		suspended:        suspendedBy(func(c *ray.RayCluster) bool { return c.Spec.Suspend != nil && *c.Spec.Suspend }),
		unmanagedChecked: true,
	},
	KindMPIJob: {
		target:           target{kind: KindMPIJob, group: mpi.SchemeGroupVersion.Group, version: mpi.SchemeGroupVersion.Version, resource: "mpijobs", mutate: PathMutateMPIJob, validate: PathValidateMPIJob},
		templates:        decodeTemplates(mutation.MPIJobTemplates, func(j *mpi.MPIJob) map[string]string { return j.Annotations }),
		suspended:        suspendedBy(func(j *mpi.MPIJob) bool { return j.Spec.RunPolicy.Suspend != nil && *j.Spec.RunPolicy.Suspend }),
		unmanagedChecked: true,
	},
}

// ParseJobKinds reads a --job-kinds value: "all", "none" (or ""), or a
// comma-separated list of AllJobKinds.
func ParseJobKinds(s string) ([]string, error) {
	switch strings.TrimSpace(s) {
	case "", "none":
		return nil, nil
	case "all":
		return append([]string(nil), AllJobKinds...), nil
	}
	var out []string
	seen := map[string]bool{}
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if _, ok := jobKinds[k]; !ok {
			return nil, fmt.Errorf("unknown job kind %q (known: %s, or all / none / auto)", k, strings.Join(AllJobKinds, ", "))
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out, nil
}

// ServedJobKinds keeps the kinds of want whose resource the cluster serves
// (its CRD is installed): a webhook entry for a kind nobody serves would
// match nothing, and one for a CRD installed later would appear only at the
// manager's next start.
func ServedJobKinds(mapper meta.RESTMapper, want []string) ([]string, error) {
	var out []string
	for _, k := range want {
		jk, ok := jobKinds[k]
		if !ok {
			return nil, fmt.Errorf("unknown job kind %q", k)
		}
		_, err := mapper.RESTMapping(schema.GroupKind{Group: jk.group, Kind: jk.kind}, jk.version)
		switch {
		case err == nil:
			out = append(out, k)
		case meta.IsNoMatchError(err):
		default:
			return nil, fmt.Errorf("looking up %s: %w", k, err)
		}
	}
	return out, nil
}

// jobKindTargets are the webhook targets of kinds, in AllJobKinds order.
func jobKindTargets(kinds []string) []target {
	want := map[string]bool{}
	for _, k := range kinds {
		want[k] = true
	}
	var out []target
	for _, k := range AllJobKinds {
		if want[k] {
			out = append(out, jobKinds[k].target)
		}
	}
	return out
}

// jobKindIsGPU is isGPU for the job kinds: the object's annotations, or any
// of its templates.
func jobKindIsGPU(kind, v string) string {
	switch kind {
	case KindJobSet:
		rj := v + ".spec.replicatedJobs"
		t := "rj.template.spec.template"
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && has(%[3]s) && %[3]s.exists(rj, has(rj.template) && has(rj.template.spec) && has(%[4]s) && (%[5]s)))",
			v, annotated(v+".metadata"), rj, t, templateIsGPU(t))
	case KindLeaderWorkerSet:
		lwt := v + ".spec.leaderWorkerTemplate"
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && has(%[3]s) && ((has(%[3]s.leaderTemplate) && (%[4]s)) || (has(%[3]s.workerTemplate) && (%[5]s))))",
			v, annotated(v+".metadata"), lwt, templateIsGPU(lwt+".leaderTemplate"), templateIsGPU(lwt+".workerTemplate"))
	case KindDeployment, KindStatefulSet:
		return isGPU("Job", v) // spec.template, as a Job's
	case KindTrainingRuntime, KindClusterTrainingRuntime:
		rj := v + ".spec.template.spec.replicatedJobs"
		t := "rj.template.spec.template"
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && has(%[1]s.spec.template) && has(%[1]s.spec.template.spec) && has(%[3]s) && %[3]s.exists(rj, has(rj.template) && has(rj.template.spec) && has(%[4]s) && (%[5]s)))",
			v, annotated(v+".metadata"), rj, t, templateIsGPU(t))
	case KindTrainJob:
		tr := v + ".spec.trainer"
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && has(%[3]s) && has(%[3]s.resourcesPerNode) && (%[4]s))", v, annotated(v+".metadata"), tr, resourcesAskGPU(tr+".resourcesPerNode"))
	case KindRayCluster:
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && (%[3]s))", v, annotated(v+".metadata"), rayClusterIsGPU(v+".spec"))
	case KindRayJob:
		sub := v + ".spec.submitterPodTemplate"
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && ((has(%[1]s.spec.rayClusterSpec) && (%[3]s)) || (has(%[4]s) && (%[5]s))))",
			v, annotated(v+".metadata"), rayClusterIsGPU(v+".spec.rayClusterSpec"), sub, templateIsGPU(sub))
	case KindMPIJob:
		rs := v + ".spec.mpiReplicaSpecs"
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && has(%[3]s) && %[3]s.exists(rt, has(%[3]s[rt].template) && (%[4]s)))", v, annotated(v+".metadata"), rs, templateIsGPU(rs+"[rt].template"))
	}
	panic("unknown kind " + kind)
}

// rayClusterIsGPU: a RayClusterSpec (CEL expression) whose head or any
// worker group template asks for GPUs.
func rayClusterIsGPU(s string) string {
	head := s + ".headGroupSpec.template"
	g := "g.template"
	return fmt.Sprintf("(has(%[1]s.headGroupSpec) && has(%[2]s) && (%[3]s)) || (has(%[1]s.workerGroupSpecs) && %[1]s.workerGroupSpecs.exists(g, has(%[4]s) && (%[5]s)))",
		s, head, templateIsGPU(head), g, templateIsGPU(g))
}

// resourcesAskGPU: a ResourceRequirements (CEL expression) that names a GPU resource.
func resourcesAskGPU(r string) string {
	l := celList(gpuResources)
	return fmt.Sprintf("(has(%[1]s.limits) && %[2]s.exists(x, x in %[1]s.limits)) || (has(%[1]s.requests) && %[2]s.exists(x, x in %[1]s.requests))", r, l)
}

// kindHandlers are the job kinds' handlers by path, every kind.
func kindHandlers(m *mutation.Mutator, kv kueueView) map[string]admission.Handler {
	out := map[string]admission.Handler{}
	for _, k := range AllJobKinds {
		jk := jobKinds[k]
		var mh, vh admission.Handler = &kindMutator{m: m, k: jk, kv: kv}, &kindValidator{m: m, k: jk}
		if jk.handlers != nil {
			mh, vh = jk.handlers(m)
		}
		out[jk.mutate] = instrumented{"mutating", k, mh}
		out[jk.validate] = instrumented{"validating", k, vh}
	}
	return out
}

type kindMutator struct {
	m  *mutation.Mutator
	k  jobKind
	kv kueueView
}

// templatesAskGPU: some template's containers (init containers included)
// ask for a GPU resource.
func templatesAskGPU(ts []mutation.Template) bool {
	for _, t := range ts {
		if specAsksGPU(&t.T.Spec) {
			return true
		}
	}
	return false
}

// unmanaged applies the unmanaged-GPU policy to a GPU object of a kind
// that has a Kueue framework: at creation the object itself, on update a
// change that takes it out of Kueue's hands (keepsManagement). The rule
// is kueueView's and CheckUnmanaged's, as for pods, Jobs and PyTorchJobs.
func (h *kindMutator) unmanaged(ctx context.Context, req admission.Request, ts []mutation.Template) error {
	if !h.k.unmanagedChecked || !templatesAskGPU(ts) {
		return nil
	}
	obj := &metav1.PartialObjectMetadata{}
	if err := decode(req.Object.Raw, obj); err != nil {
		return err
	}
	if obj.Namespace == "" {
		obj.Namespace = req.Namespace
	}
	if req.Operation == admissionv1.Update {
		if err := h.kv.keepsManagement(ctx, req, obj, h.k.framework(), true); err != nil {
			return err
		}
		// An update that adds GPUs to its templates, changes its owner
		// references or its queue label is judged as a creation by the one
		// who makes it: a CPU StatefulSet under a tenant's queued pod would
		// otherwise get GPUs later (third review, finding 2), and one that
		// drops its own queue label would rest on an owner the creation
		// check never let her use (review 18, finding 1: its marked
		// template's pods skip the pod webhook, which would deny them).
		// The garbage collector removing owner references is not judged
		// (gcRemovesOwners, the Jobs' and PyTorchJobs' rule too).
		old := &metav1.PartialObjectMetadata{}
		_, oldTs, err := h.k.templates(req.OldObject.Raw)
		if err != nil || json.Unmarshal(req.OldObject.Raw, old) != nil || (templatesAskGPU(oldTs) && equality.Semantic.DeepEqual(old.OwnerReferences, obj.OwnerReferences) &&
			old.Labels[mutation.LabelQueueName] == obj.Labels[mutation.LabelQueueName]) {
			return nil
		}
		if templatesAskGPU(oldTs) && old.Labels[mutation.LabelQueueName] == obj.Labels[mutation.LabelQueueName] && gcRemovesOwners(req.UserInfo.Username, old, obj) {
			return nil
		}
		return h.kv.judgeAsCreation(ctx, req, old, obj, h.k.framework(), h.k.kind)
	}
	if u := h.kv.unmanaged(ctx, obj, h.k.framework(), &req.UserInfo); u != nil {
		return h.m.CheckUnmanaged(describeKind(h.k.kind, obj.Name), *u)
	}
	return nil
}

func (h *kindMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	ann, ts, err := h.k.templates(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if err := h.unmanaged(ctx, req, ts); err != nil {
		return admission.Denied(err.Error())
	}
	if req.Operation == admissionv1.Create {
		obj := &metav1.PartialObjectMetadata{}
		if err := decode(req.Object.Raw, obj); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		tmpls := make([]*corev1.PodTemplateSpec, 0, len(ts))
		for _, t := range ts {
			tmpls = append(tmpls, t.T)
		}
		if err := planAtCreation(h.m, req, describeKind(h.k.kind, obj.Name), obj, tmpls...); err != nil {
			return admission.Denied(err.Error())
		}
	}
	if req.Operation == admissionv1.Update && h.k.suspended != nil {
		h.m.SyncTemplates(ts)
		return kindTemplatesPatch(req.Object.Raw, ts, nil)
	}
	_, before, _ := h.k.templates(req.Object.Raw)
	warn, err := h.m.Templates(ann, ts)
	if err != nil {
		return denied(err, warn)
	}
	resp := kindTemplatesPatch(req.Object.Raw, ts, before)
	resp.Warnings = warn
	return resp
}

type kindValidator struct {
	m *mutation.Mutator
	k jobKind
}

func (h *kindValidator) Handle(_ context.Context, req admission.Request) admission.Response {
	ann, ts, err := h.k.templates(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	switch {
	case req.Operation == admissionv1.Create || (req.Operation == admissionv1.Update && h.k.suspended == nil):
		// A rollout kind's new templates are what its next pods get.
		err = h.m.ValidateTemplates(ann, ts)
	case req.Operation == admissionv1.Update:
		oldAnn, old, derr := h.k.templates(req.OldObject.Raw)
		if derr != nil {
			return admission.Errored(http.StatusBadRequest, derr)
		}
		err = h.m.ValidateFrozenTemplatesUpdate(oldAnn, ann, old, ts, h.k.suspended(req.OldObject.Raw))
	}
	if err != nil {
		return admission.Denied(err.Error())
	}
	return admission.Allowed("")
}

// kindTemplatesPatch answers with the changes to the templates at their
// JSON pointers (array indexes allowed), editing the request's own JSON so
// that fields this build's types do not know (a newer CRD) survive outside
// the templates. With before (the templates as decoded), each changed
// template is replaced whole; without, only its annotations and scheduling
// gates follow (a frozen template, as templatePatch does for a PyTorchJob).
func kindTemplatesPatch(raw []byte, ts, before []mutation.Template) admission.Response {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers stay as written: no float64 rounding, no spurious ops
	if err := dec.Decode(&doc); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	for i, t := range ts {
		parent, key, ok := pointer(doc, t.Path)
		if !ok {
			continue
		}
		if before != nil {
			if equality.Semantic.DeepEqual(before[i].T, t.T) {
				continue // untouched: no re-encoding, no spurious ops
			}
			b, err := json.Marshal(t.T)
			if err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
			var v any
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			if err := d.Decode(&v); err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
			set(parent, key, v)
			continue
		}
		if tm, ok := get(parent, key).(map[string]any); ok {
			syncTemplateJSON(tm, t.T.Annotations, t.T.Spec.SchedulingGates)
		}
	}
	after, err := json.Marshal(doc)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(raw, after)
}

// pointer resolves a JSON pointer to its parent (a map or a slice) and the
// last key; ok is false when a step is missing.
func pointer(doc any, ptr string) (parent any, key string, ok bool) {
	steps := strings.Split(strings.TrimPrefix(ptr, "/"), "/")
	node := doc
	for _, s := range steps[:len(steps)-1] {
		node = get(node, s)
		if node == nil {
			return nil, "", false
		}
	}
	last := steps[len(steps)-1]
	return node, last, get(node, last) != nil
}

func get(node any, key string) any {
	switch n := node.(type) {
	case map[string]any:
		return n[key]
	case []any:
		if i, err := strconv.Atoi(key); err == nil && i >= 0 && i < len(n) {
			return n[i]
		}
	}
	return nil
}

func set(node any, key string, v any) {
	switch n := node.(type) {
	case map[string]any:
		n[key] = v
	case []any:
		if i, err := strconv.Atoi(key); err == nil && i >= 0 && i < len(n) {
			n[i] = v
		}
	}
}

// syncTemplateJSON sets a template's annotations and scheduling gates in
// its JSON form (what templatePatch does for one template).
func syncTemplateJSON(tm map[string]any, annotations map[string]string, gates []corev1.PodSchedulingGate) {
	md, _ := tm["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	if len(annotations) == 0 {
		delete(md, "annotations")
	} else {
		ann := make(map[string]any, len(annotations))
		for k, v := range annotations {
			ann[k] = v
		}
		md["annotations"] = ann
	}
	if len(md) > 0 || tm["metadata"] != nil {
		tm["metadata"] = md
	}
	spec, _ := tm["spec"].(map[string]any)
	if spec == nil {
		return
	}
	if len(gates) == 0 {
		delete(spec, "schedulingGates")
		return
	}
	gs := make([]any, len(gates))
	for i, g := range gates {
		gs[i] = map[string]any{"name": g.Name}
	}
	spec["schedulingGates"] = gs
}

// jobKindWebhookName is a job kind's webhook name (prefix m or v), as WebhookConfigurations names it.
func jobKindWebhookName(prefix, kind string) string {
	return prefix + strings.ToLower(kind) + ".gpupack.io"
}

// SyncJobKinds makes the job-kind entries of the installed configurations
// those of o.JobKinds, as WebhookConfigurations builds them, and leaves every
// other entry alone. New entries take the caBundle of the configuration's
// first entry (the rotator, or cert-manager, keeps all of them equal). It
// reports whether anything changed.
func SyncJobKinds(mwc *admissionregistrationv1.MutatingWebhookConfiguration, vwc *admissionregistrationv1.ValidatingWebhookConfiguration, o ServeOptions) bool {
	wantM, wantV := WebhookConfigurations(o)
	isJobKind := func(prefix, name string) bool {
		for _, k := range AllJobKinds {
			if name == jobKindWebhookName(prefix, k) {
				return true
			}
		}
		return false
	}
	changed := false
	if mwc != nil {
		mwc.Webhooks, changed = syncEntries(mwc.Webhooks, wantM.Webhooks,
			func(w admissionregistrationv1.MutatingWebhook) string { return w.Name },
			func(name string) bool { return isJobKind("m", name) },
			func(w *admissionregistrationv1.MutatingWebhook) *[]byte { return &w.ClientConfig.CABundle })
	}
	if vwc != nil {
		var c bool
		vwc.Webhooks, c = syncEntries(vwc.Webhooks, wantV.Webhooks,
			func(w admissionregistrationv1.ValidatingWebhook) string { return w.Name },
			func(name string) bool { return isJobKind("v", name) },
			func(w *admissionregistrationv1.ValidatingWebhook) *[]byte { return &w.ClientConfig.CABundle })
		changed = changed || c
	}
	return changed
}

func syncEntries[W any](have, want []W, name func(W) string, isJobKind func(string) bool, ca func(*W) *[]byte) ([]W, bool) {
	var bundle []byte
	if len(have) > 0 {
		bundle = *ca(&have[0])
	}
	wanted := map[string]W{}
	for _, w := range want {
		if isJobKind(name(w)) {
			*ca(&w) = bundle
			wanted[name(w)] = w
		}
	}
	out := make([]W, 0, len(have)+len(wanted))
	seen := map[string]bool{}
	changed := false
	for _, w := range have {
		n := name(w)
		if !isJobKind(n) {
			out = append(out, w)
			continue
		}
		ww, ok := wanted[n]
		if !ok {
			changed = true // a kind this cluster does not serve (or is off)
			continue
		}
		seen[n] = true
		*ca(&ww) = *ca(&w)
		if !equality.Semantic.DeepEqual(ww, w) {
			changed = true
		}
		out = append(out, ww)
	}
	for _, w := range want {
		if n := name(w); isJobKind(n) && !seen[n] {
			out = append(out, wanted[n])
			changed = true
		}
	}
	return out, changed
}

// SetupJobKinds keeps the installed configurations' job-kind entries to
// o.JobKinds (SyncJobKinds): a re-applied manifest that lists every kind is
// corrected on the next watch event. The leader writes.
func SetupJobKinds(mgr ctrl.Manager, o ServeOptions) error {
	c := mgr.GetClient()
	sync := func(ctx context.Context) error {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := c.Get(ctx, types.NamespacedName{Name: o.MutatingName}, mwc); err != nil {
			return client.IgnoreNotFound(err)
		}
		if SyncJobKinds(mwc, nil, o) {
			if err := c.Update(ctx, mwc); err != nil {
				return err
			}
		}
		vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := c.Get(ctx, types.NamespacedName{Name: o.ValidatingName}, vwc); err != nil {
			return client.IgnoreNotFound(err)
		}
		if SyncJobKinds(nil, vwc, o) {
			return c.Update(ctx, vwc)
		}
		return nil
	}
	named := builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
		return obj.GetName() == o.MutatingName || obj.GetName() == o.ValidatingName
	}))
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhook-job-kinds").
		For(&admissionregistrationv1.MutatingWebhookConfiguration{}, named).
		Watches(&admissionregistrationv1.ValidatingWebhookConfiguration{}, &handler.EnqueueRequestForObject{}, named).
		Complete(reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			return reconcile.Result{}, sync(ctx) // a conflict (the rotator) is retried
		}))
}

// ResolveJobKinds reads --job-kinds: "auto" is every kind the cluster serves
// now (its CRD installed; Deployment and StatefulSet always), anything else
// is ParseJobKinds.
func ResolveJobKinds(mapper meta.RESTMapper, flag string) ([]string, error) {
	if strings.TrimSpace(flag) == "auto" {
		return ServedJobKinds(mapper, AllJobKinds)
	}
	return ParseJobKinds(flag)
}
