package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/webhooks/mutation"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// A TrainJob has no pod template of its own: its pods come from the
// (Cluster)TrainingRuntime it names (converted by that kind's webhook), with
// trainer.resourcesPerNode replacing the trainer container's resources. The
// handlers convert that override (mutation.Mutator.TrainJob).

func trainJobHandlers(m *mutation.Mutator) (admission.Handler, admission.Handler) {
	return &trainJobMutator{m: m}, &trainJobValidator{m: m}
}

func trainJobSuspended(j *trainer.TrainJob) bool { return j.Spec.Suspend != nil && *j.Spec.Suspend }

// trainJobRequestChanged reports whether an update changes what the
// request is read from (the annotations or resourcesPerNode), which is
// then converted like a create.
func trainJobRequestChanged(old, cur *trainer.TrainJob) bool {
	resources := func(j *trainer.TrainJob) any {
		if j.Spec.Trainer == nil {
			return nil
		}
		return j.Spec.Trainer.ResourcesPerNode
	}
	return !equality.Semantic.DeepEqual(old.Annotations, cur.Annotations) || !equality.Semantic.DeepEqual(resources(old), resources(cur))
}

type trainJobMutator struct{ m *mutation.Mutator }

func (h *trainJobMutator) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	j := &trainer.TrainJob{}
	if err := decode(req.Object.Raw, j); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if req.Operation == admissionv1.Update {
		// Kueue writes its runtime patch and flips suspend: nothing of
		// gpupack's changes. Only a new request on a suspended TrainJob is
		// converted (the validator refuses one on a running TrainJob).
		old := &trainer.TrainJob{}
		if err := decode(req.OldObject.Raw, old); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		if !trainJobSuspended(old) || !trainJobRequestChanged(old, j) {
			return admission.Allowed("")
		}
	}
	before := j.DeepCopy()
	warn, err := h.m.TrainJob(j)
	if err != nil {
		return denied(err, warn)
	}
	if equality.Semantic.DeepEqual(before.Spec.Trainer, j.Spec.Trainer) {
		resp := admission.Allowed("")
		resp.Warnings = warn
		return resp
	}
	resp := trainJobResourcesPatch(req.Object.Raw, j)
	resp.Warnings = warn
	return resp
}

// trainJobResourcesPatch sets spec.trainer.resourcesPerNode in the
// request's own JSON (fields this build's types do not know survive).
func trainJobResourcesPatch(raw []byte, j *trainer.TrainJob) admission.Response {
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	b, err := json.Marshal(j.Spec.Trainer.ResourcesPerNode)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	spec, _ := doc["spec"].(map[string]any)
	tr, _ := spec["trainer"].(map[string]any)
	if tr == nil {
		return admission.Errored(http.StatusBadRequest, errNoTrainer)
	}
	tr["resourcesPerNode"] = v
	after, err := json.Marshal(doc)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(raw, after)
}

type trainJobError string

func (e trainJobError) Error() string { return string(e) }

const errNoTrainer = trainJobError("spec.trainer is not an object")

type trainJobValidator struct{ m *mutation.Mutator }

func (h *trainJobValidator) Handle(_ context.Context, req admission.Request) admission.Response {
	j := &trainer.TrainJob{}
	if err := decode(req.Object.Raw, j); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	var err error
	switch req.Operation {
	case admissionv1.Create:
		err = h.m.ValidateTrainJob(j)
	case admissionv1.Update:
		old := &trainer.TrainJob{}
		if derr := decode(req.OldObject.Raw, old); derr != nil {
			return admission.Errored(http.StatusBadRequest, derr)
		}
		err = h.m.ValidateTrainJobUpdate(old, j, trainJobSuspended(old))
	}
	if err != nil {
		return admission.Denied(err.Error())
	}
	return admission.Allowed("")
}
