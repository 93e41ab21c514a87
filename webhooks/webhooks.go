// Package webhooks serves gpupack's fractional-GPU admission webhooks: thin
// controller-runtime handlers around webhooks/mutation, the webhook
// configurations (failurePolicy Fail only for objects that ask for GPUs),
// and in-cluster certificates. The placement ungater is webhooks/placement.
package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/owners"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// Config is the webhook configuration (YAML: see docs/webhooks.md).
type Config = mutation.Config

// LoadConfig reads a configuration file; "" gives the defaults.
func LoadConfig(path string) (Config, error) { return mutation.LoadConfig(path) }

// Paths the handlers are served at.
const (
	PathMutatePod         = "/mutate-v1-pod"
	PathValidatePod       = "/validate-v1-pod"
	PathMutateJob         = "/mutate-batch-v1-job"
	PathValidateJob       = "/validate-batch-v1-job"
	PathMutatePyTorchJob  = "/mutate-kubeflow-org-v1-pytorchjob"
	PathValidatePyTorchJb = "/validate-kubeflow-org-v1-pytorchjob"
)

// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubeflow.org,resources=pytorchjobs,verbs=get;list;watch

// Setup registers the six handlers on mgr's webhook server. The pod handler
// reads the owning Job/PyTorchJob's metadata through mgr's cache (for
// GPUPACK_RESUME_STEP), so the manager needs get/list/watch on those.
func Setup(mgr ctrl.Manager, cfg Config) error {
	m, err := mutation.New(cfg)
	if err != nil {
		return err
	}
	for path, h := range HandlersWith(m, Readers{Cached: mgr.GetClient(), Live: mgr.GetAPIReader()}) {
		mgr.GetWebhookServer().Register(path, &webhook.Admission{Handler: h})
	}
	return nil
}

// Handlers returns the handlers by path. owners reads the owning Job or
// PyTorchJob of a pod (for GPUPACK_RESUME_STEP), the owners of GPU objects
// and their namespaces (the unmanaged-GPU policy); nil skips the first and
// counts every owned GPU object as one Kueue will not manage.
func Handlers(m *mutation.Mutator, owners client.Reader) map[string]admission.Handler {
	return HandlersWith(m, Readers{Cached: owners, Live: owners})
}

// HandlersWith is Handlers with a cached and a live reader.
func HandlersWith(m *mutation.Mutator, r Readers) map[string]admission.Handler {
	kv := kueueView{m: m, r: r}
	hs := kindHandlers(m, kv) // JobSet, LeaderWorkerSet, Deployment, StatefulSet (kinds.go)
	for p, h := range map[string]admission.Handler{
		PathMutatePod:         instrumented{"mutating", "Pod", &podMutator{m: m, kv: kv}},
		PathValidatePod:       instrumented{"validating", "Pod", &podValidator{m: m, kv: kv}},
		PathMutateJob:         instrumented{"mutating", "Job", &jobMutator{m: m, kv: kv}},
		PathValidateJob:       instrumented{"validating", "Job", &jobValidator{m: m}},
		PathMutatePyTorchJob:  instrumented{"mutating", "PyTorchJob", &ptMutator{m: m, kv: kv}},
		PathValidatePyTorchJb: instrumented{"validating", "PyTorchJob", &ptValidator{m: m}},
	} {
		hs[p] = h
	}
	return hs
}

// decode reads raw JSON; a plain json.Unmarshal is all typed objects need
// and is the cheapest path.
func decode(raw []byte, into any) error { return json.Unmarshal(raw, into) }

// specPatch answers with one JSON patch op that sets /spec to after, or no
// patch when the spec did not change. The mutations only ever change spec
// (pod template annotations live inside a job's spec), and a whole-spec op
// is far cheaper than diffing the full object (CreatePatch parses both
// documents into generic maps).
func specPatch(before []byte, after any, warn []string) admission.Response {
	a, err := json.Marshal(after)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.Allowed("")
	resp.Warnings = warn
	if bytes.Equal(before, a) {
		return resp
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.PatchType = &pt
	resp.Patches = []jsonpatch.JsonPatchOperation{{Operation: "add", Path: "/spec", Value: json.RawMessage(a)}}
	return resp
}

// templatePatch answers a job update with the changes SyncTemplate made to
// the templates at the given JSON pointers: their annotations and
// scheduling gates, nothing else. It edits the request's own JSON rather
// than re-encoding the typed object, so fields this build's types do not
// know (a newer CRD) are never dropped, and a batch Job's immutable
// template fields are never touched.
func templatePatch(raw []byte, tmpls map[string]*corev1.PodTemplateSpec) admission.Response {
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers stay as written: no float64 rounding, no spurious ops
	if err := dec.Decode(&doc); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	for ptr, t := range tmpls {
		node := any(doc)
		for _, key := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
			m, _ := node.(map[string]any)
			node = m[key]
		}
		tm, ok := node.(map[string]any)
		if !ok {
			continue
		}
		meta, _ := tm["metadata"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		if len(t.Annotations) == 0 {
			delete(meta, "annotations")
		} else {
			ann := make(map[string]any, len(t.Annotations))
			for k, v := range t.Annotations {
				ann[k] = v
			}
			meta["annotations"] = ann
		}
		if len(meta) > 0 || tm["metadata"] != nil {
			tm["metadata"] = meta
		}
		spec, _ := tm["spec"].(map[string]any)
		if spec == nil {
			continue
		}
		if len(t.Spec.SchedulingGates) == 0 {
			delete(spec, "schedulingGates")
		} else {
			gates := make([]any, len(t.Spec.SchedulingGates))
			for i, g := range t.Spec.SchedulingGates {
				gates[i] = map[string]any{"name": g.Name}
			}
			spec["schedulingGates"] = gates
		}
	}
	after, err := json.Marshal(doc)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(raw, after)
}

func denied(err error, warn []string) admission.Response {
	resp := admission.Denied(err.Error())
	resp.Warnings = warn
	return resp
}

type podMutator struct {
	m  *mutation.Mutator
	kv kueueView
}

func (h *podMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := decode(req.Object.Raw, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	if err := planAtCreation(h.m, req, describeKind("pod", pod.Name), pod); err != nil {
		return admission.Denied(err.Error())
	}
	before, _ := json.Marshal(pod.Spec)
	beforeAnn := maps.Clone(pod.Annotations)
	// The job at the top of the pod's controller chain, read once (live)
	// for the job id and the checkpoint class.
	top := topOf(ctx, h.kv, pod)
	pc := mutation.PodContext{ResumeStep: h.resumeStep(ctx, pod), JobID: jobIDOf(pod, top), Creator: req.UserInfo.Username}
	pc.Class, pc.ClassKnown = h.priorityClass(ctx, pod, top)
	warn, err := h.m.AdmitPod(pod, pc)
	if err != nil {
		return denied(err, warn)
	}
	_, planned := pod.Annotations[v1alpha1.AnnotationPlan]
	if specAsksGPU(&pod.Spec) || planned {
		if u := h.kv.unmanaged(ctx, pod, "pod", &req.UserInfo); u != nil {
			err := h.m.CheckUnmanaged(describeKind("pod", pod.Name), *u)
			if planned {
				err = h.m.CheckPlanManaged(describeKind("pod", pod.Name), *u, req.UserInfo.Groups)
			}
			if err != nil {
				return denied(err, warn)
			}
		}
	}
	resp := specPatch(before, pod.Spec, warn)
	if !maps.Equal(beforeAnn, pod.Annotations) {
		// A tenant's gpupack.io/devices was removed, or a pod group
		// member's gpupack.io/created-by written.
		ann := pod.Annotations
		if ann == nil {
			ann = map[string]string{}
		}
		pt := admissionv1.PatchTypeJSONPatch
		resp.PatchType = &pt
		resp.Patches = append(resp.Patches, jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/annotations", Value: ann})
	}
	return resp
}

// resumeStep reads gpupack.io/last-consistent-checkpoint from the pod's
// job: the nearest owner up its controller chain that carries it, walking
// on only through the objects Kueue's pod integration passes through
// (passThrough: a StatefulSet or ReplicaSet, and the leader Pod that owns
// an LWS group's worker StatefulSet) — so a pod of a Job or PyTorchJob
// reads its Job or PyTorchJob (from the cache, as before), an LWS pod its
// LeaderWorkerSet, a Deployment's pod its Deployment, where the preemption
// coordinator records the step. Each step checks the owner's UID (a tenant
// can write any owner reference). Any error means "no step": resuming from
// scratch is safe, a denial is not.
func (h *podMutator) resumeStep(ctx context.Context, pod *corev1.Pod) string {
	if h.kv.r.Cached == nil && h.kv.r.Live == nil {
		return ""
	}
	var cur metav1.Object = pod
	for depth := 0; depth < maxOwnerDepth; depth++ {
		ref := metav1.GetControllerOf(cur)
		if ref == nil {
			return ""
		}
		owner, err := h.kv.owner(ctx, pod.Namespace, ref)
		if err != nil || owner.UID != ref.UID {
			return ""
		}
		if step, ok := owner.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; ok {
			return step
		}
		if !passThrough(ref) {
			return ""
		}
		cur = owner
	}
	return ""
}

// jobID names a pod's job — the object Kueue manages, found by the
// coordinator's walk up the controller chain (preemption/owners: Pod → Job
// → JobSet → TrainJob, Pod → RayCluster → RayJob, Pod → PyTorchJob; each
// step checks the UID), read live — by namespace, kind and name
// (mutation.JobID), not by UID: "delete, fix, re-apply the same YAML" is
// how a job that cannot be edited is changed, and the re-created job must
// resume from, not overwrite, its own checkpoints. A pod controlled by a
// StatefulSet or ReplicaSet (LWS, Deployment) gets none: the walk stops
// there, and the leader's and the workers' StatefulSets would name two
// jobs. No controller: none.
func jobID(ctx context.Context, kv kueueView, pod *corev1.Pod) string {
	return jobIDOf(pod, topOf(ctx, kv, pod))
}

// topOf is the top of pod's controller chain (owners.Finder.Top: every
// step read live and UID-checked, the top too), nil when the pod has no
// controller, when it is a ReplicaSet's or StatefulSet's (Kueue's pod
// integration: the pod is its own job), or when a read fails — which
// means "unknown", never an intermediate's identity or class.
func topOf(ctx context.Context, kv kueueView, pod *corev1.Pod) *metav1.PartialObjectMetadata {
	if kv.r.Live == nil {
		return nil
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.APIVersion == "apps/v1" {
		return nil
	}
	return owners.Finder{Reader: kv.r.Live}.Top(ctx, pod)
}

// jobIDOf names pod's job from the top of its chain (topOf).
func jobIDOf(pod *corev1.Pod, top *metav1.PartialObjectMetadata) string {
	if top == nil {
		return ""
	}
	return mutation.JobID(pod.Namespace, top.GroupVersionKind().GroupKind(), top.Name)
}

type podValidator struct {
	m  *mutation.Mutator
	kv kueueView
}

func (h *podValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := decode(req.Object.Raw, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	switch req.Operation {
	case admissionv1.Create:
		if err := h.m.ValidatePodIn(pod, mutation.PodContext{JobID: jobID(ctx, h.kv, pod)}); err != nil {
			return admission.Denied(err.Error())
		}
	case admissionv1.Update:
		if req.SubResource == "ephemeralcontainers" {
			if err := h.m.ValidateEphemeralContainers(pod); err != nil {
				return admission.Denied(err.Error())
			}
			return admission.Allowed("")
		}
		old := &corev1.Pod{}
		if err := decode(req.OldObject.Raw, old); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		if err := h.m.ValidatePodUpdate(old, pod); err != nil {
			return admission.Denied(err.Error())
		}
	}
	return admission.Allowed("")
}

// garbageCollector is kube-controller-manager's garbage collector, which
// removes owner references to gone owners (as system:kube-controller-manager
// without --use-service-account-credentials, a trusted owner controller).
const garbageCollector = "system:serviceaccount:kube-system:generic-garbage-collector"

// gcRemovesOwners is the one rule for the garbage collector's owner
// changes (the webhooks' Job, PyTorchJob and job-kind paths; policy
// gpupack-job-plan says the same in CEL): an update by the garbage
// collector (kube-controller-manager, under its service account or its own
// name) that only removes owner references — every reference left is one
// old had, unchanged — is not judged as a creation. The collector removes
// references to a gone owner on an orphaning delete (`--cascade=orphan`)
// and for a dependent that has other owners left; refusing it would leave
// the owner terminating for good. It may also unblock a reference
// (blockOwnerDeletion true → false, a foreground deletion's cycle guard):
// a reference is compared by its identity — API version, kind, name, UID,
// controller — as the policies compare it (review 11 F1). What the orphans
// then run is counted by Kueue v0.17's Workload, which stays admitted, and
// by gpupack's usage rule (docs/security.md, "Orphaning deletes").
// Anything else by that user is judged as anyone's update is.
func gcRemovesOwners(user string, old, obj metav1.Object) bool {
	if user != garbageCollector && user != "system:kube-controller-manager" {
		return false
	}
	was := old.GetOwnerReferences()
	for _, r := range obj.GetOwnerReferences() {
		found := false
		for _, o := range was {
			if o.APIVersion == r.APIVersion && o.Kind == r.Kind && o.Name == r.Name && o.UID == r.UID && ptr.Deref(o.Controller, false) == ptr.Deref(r.Controller, false) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// updateCreator is who an update that changes obj's owner references is
// judged as having created obj by: its requester — unless the update gives
// obj a controller reference it did not have (none, or another UID), which
// no trusted controller does for a child it made: that is an adoption (the
// Trainer's and LWS's server-side apply take over an existing object of
// their child's name, whoever made it, review 10 F1), judged as if no
// trusted controller had created it; adopted says so (for the message).
func updateCreator(req admission.Request, old, obj metav1.Object) (creator *authenticationv1.UserInfo, adopted bool) {
	now, was := metav1.GetControllerOf(obj), metav1.GetControllerOf(old)
	if now != nil && (was == nil || was.UID != now.UID) {
		return &authenticationv1.UserInfo{Username: req.UserInfo.Username + ", by an update that gave it a controller reference it did not have"}, true
	}
	return &req.UserInfo, false
}

// judgeAsCreation applies the unmanaged-GPU policy to obj (of framework;
// kind for the message) as if the author of the update from old had
// created it (updateCreator). A refusal of an adoption by a controller
// gpupack trusts to create objects for their owners (an apply taking over
// an object of its child's name) tells its reader to clear the object in
// the way, not, as a tenant re-parenting her own job is told, to go
// through Kueue.
func (k kueueView) judgeAsCreation(ctx context.Context, req admission.Request, old metav1.Object, obj client.Object, framework, kind string) error {
	creator, adopted := updateCreator(req, old, obj)
	u := k.unmanaged(ctx, obj, framework, creator)
	if u == nil {
		return nil
	}
	u.Adopted = adopted && k.m.CreatesForOwners(req.UserInfo.Username, req.UserInfo.Groups)
	return k.m.CheckUnmanaged(describeKind(kind, obj.GetName()), *u)
}

// ownerChange judges an update of a GPU job (obj, of framework; kind for
// the message) whose owner references change as a creation by
// updateCreator: a queued job re-parented under another job is no longer
// Kueue's, and could be resumed with GPUs and no quota. old receives the
// request's old object. The garbage collector removing owner references
// is not judged (gcRemovesOwners).
func (k kueueView) ownerChange(ctx context.Context, req admission.Request, old, obj client.Object, framework, kind string, gpu bool) error {
	if !gpu || decode(req.OldObject.Raw, old) != nil || equality.Semantic.DeepEqual(old.GetOwnerReferences(), obj.GetOwnerReferences()) ||
		gcRemovesOwners(req.UserInfo.Username, old, obj) {
		return nil
	}
	return k.judgeAsCreation(ctx, req, old, obj, framework, kind)
}

type jobMutator struct {
	m  *mutation.Mutator
	kv kueueView
}

func (h *jobMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	j := &batchv1.Job{}
	if err := decode(req.Object.Raw, j); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if j.Namespace == "" {
		j.Namespace = req.Namespace
	}
	if req.Operation == admissionv1.Update {
		if err := h.kv.keepsManagement(ctx, req, j, "batch/job", specAsksGPU(&j.Spec.Template.Spec)); err != nil {
			return admission.Denied(err.Error())
		}
		// A GPU Job whose owner references change is judged as a creation
		// by the one who changes them, as other kinds are (kinds.go): a
		// tenant's queued Job re-parented under another job is no longer
		// Kueue's, and she could resume it with GPUs and no quota (issue
		// 14 finding 6, round 2). A planned Job's owners are frozen by the
		// gpupack-job-plan policy. The garbage collector removing owner
		// references is not judged (gcRemovesOwners).
		if err := h.kv.ownerChange(ctx, req, &batchv1.Job{}, j, "batch/job", "Job", specAsksGPU(&j.Spec.Template.Spec)); err != nil {
			return admission.Denied(err.Error())
		}
		h.m.SyncJob(j)
		return templatePatch(req.Object.Raw, map[string]*corev1.PodTemplateSpec{"/spec/template": &j.Spec.Template})
	}
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	if err := planAtCreation(h.m, req, describeKind("Job", j.Name), j, &j.Spec.Template); err != nil {
		return admission.Denied(err.Error())
	}
	before, _ := json.Marshal(j.Spec)
	warn, err := h.m.Job(j)
	if err != nil {
		return denied(err, warn)
	}
	if specAsksGPU(&j.Spec.Template.Spec) {
		if u := h.kv.unmanaged(ctx, j, "batch/job", &req.UserInfo); u != nil {
			if err := h.m.CheckUnmanaged(describeKind("Job", j.Name), *u); err != nil {
				return denied(err, warn)
			}
		}
	}
	return specPatch(before, j.Spec, warn)
}

type jobValidator struct{ m *mutation.Mutator }

func (h *jobValidator) Handle(_ context.Context, req admission.Request) admission.Response {
	j := &batchv1.Job{}
	if err := decode(req.Object.Raw, j); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	var err error
	switch req.Operation {
	case admissionv1.Create:
		err = h.m.ValidateJob(j)
	case admissionv1.Update:
		old := &batchv1.Job{}
		if derr := decode(req.OldObject.Raw, old); derr != nil {
			return admission.Errored(http.StatusBadRequest, derr)
		}
		err = h.m.ValidateJobUpdate(old, j)
	}
	if err != nil {
		return admission.Denied(err.Error())
	}
	return admission.Allowed("")
}

type ptMutator struct {
	m  *mutation.Mutator
	kv kueueView
}

func ptAsksGPU(j *kftraining.PyTorchJob) bool {
	for _, rs := range j.Spec.PyTorchReplicaSpecs {
		if rs != nil && specAsksGPU(&rs.Template.Spec) {
			return true
		}
	}
	return false
}

func (h *ptMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	j := &kftraining.PyTorchJob{}
	if err := decode(req.Object.Raw, j); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if j.Namespace == "" {
		j.Namespace = req.Namespace
	}
	if req.Operation == admissionv1.Update {
		if err := h.kv.keepsManagement(ctx, req, j, "kubeflow.org/pytorchjob", ptAsksGPU(j)); err != nil {
			return admission.Denied(err.Error())
		}
		// Owner references changed: judged as a creation, as for Jobs
		// (review 10, F2: a queued PyTorchJob re-parented under the
		// tenant's own admitted Job is that Job's child for Kueue, never
		// suspended again).
		if err := h.kv.ownerChange(ctx, req, &kftraining.PyTorchJob{}, j, "kubeflow.org/pytorchjob", "PyTorchJob", ptAsksGPU(j)); err != nil {
			return admission.Denied(err.Error())
		}
		h.m.SyncPyTorchJob(j)
		tmpls := map[string]*corev1.PodTemplateSpec{}
		for rt, rs := range j.Spec.PyTorchReplicaSpecs {
			if rs != nil {
				tmpls["/spec/pytorchReplicaSpecs/"+string(rt)+"/template"] = &rs.Template
			}
		}
		return templatePatch(req.Object.Raw, tmpls)
	}
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	var tmpls []*corev1.PodTemplateSpec
	for _, rs := range j.Spec.PyTorchReplicaSpecs {
		if rs != nil {
			tmpls = append(tmpls, &rs.Template)
		}
	}
	if err := planAtCreation(h.m, req, describeKind("PyTorchJob", j.Name), j, tmpls...); err != nil {
		return admission.Denied(err.Error())
	}
	before, _ := json.Marshal(j.Spec)
	warn, err := h.m.PyTorchJob(j)
	if err != nil {
		return denied(err, warn)
	}
	if ptAsksGPU(j) {
		if u := h.kv.unmanaged(ctx, j, "kubeflow.org/pytorchjob", &req.UserInfo); u != nil {
			if err := h.m.CheckUnmanaged(describeKind("PyTorchJob", j.Name), *u); err != nil {
				return denied(err, warn)
			}
		}
	}
	return specPatch(before, j.Spec, warn)
}

type ptValidator struct{ m *mutation.Mutator }

func (h *ptValidator) Handle(_ context.Context, req admission.Request) admission.Response {
	j := &kftraining.PyTorchJob{}
	if err := decode(req.Object.Raw, j); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	var err error
	switch req.Operation {
	case admissionv1.Create:
		err = h.m.ValidatePyTorchJob(j)
	case admissionv1.Update:
		old := &kftraining.PyTorchJob{}
		if derr := decode(req.OldObject.Raw, old); derr != nil {
			return admission.Errored(http.StatusBadRequest, derr)
		}
		err = h.m.ValidatePyTorchJobUpdate(old, j)
	}
	if err != nil {
		return admission.Denied(err.Error())
	}
	return admission.Allowed("")
}
