package webhooks

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

func TestSyncFastPath(t *testing.T) {
	o, err := DefaultServeOptions().WithFastPath(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if o.TemplateFingerprint == "" {
		t.Fatal("no fingerprint")
	}
	installed, _ := WebhookConfigurations(DefaultServeOptions()) // as the manifests ship it
	names := func(mwc *admissionregistrationv1.MutatingWebhookConfiguration) []string {
		for _, w := range mwc.Webhooks {
			if w.Name == PodMutatingWebhookName {
				var out []string
				for _, c := range w.MatchConditions {
					out = append(out, c.Name)
				}
				return out
			}
		}
		return nil
	}
	if d := cmp.Diff([]string{"asks-for-gpus"}, names(installed)); d != "" {
		t.Fatalf("shipped conditions (-want +got):\n%s", d)
	}
	if !SyncFastPath(installed, o) {
		t.Fatal("nothing added")
	}
	want, _ := WebhookConfigurations(o)
	if d := cmp.Diff(want, installed); d != "" {
		t.Errorf("synced configuration differs from WebhookConfigurations with the fingerprint (-want +got):\n%s", d)
	}
	if SyncFastPath(installed, o) {
		t.Error("second sync changed something")
	}
	// Another configuration: the condition is replaced, not added twice.
	other := o
	other.TemplateFingerprint = "0123456789abcdef"
	if !SyncFastPath(installed, other) || len(names(installed)) != 1 {
		t.Errorf("replace: conditions %v", names(installed))
	}
	// Turned off: back to the plain condition.
	off := o
	off.TemplatePodCreators = nil
	if !SyncFastPath(installed, off) {
		t.Error("not removed")
	}
	if d := cmp.Diff([]string{"asks-for-gpus"}, names(installed)); d != "" {
		t.Errorf("after removal (-want +got):\n%s", d)
	}
	// Job webhooks see updates (the gate follows Kueue's plan); pods only creations.
	for _, w := range want.Webhooks {
		ops := w.Rules[0].Operations
		if (w.Name == PodMutatingWebhookName) != (len(ops) == 1) {
			t.Errorf("%s operations %v", w.Name, ops)
		}
	}
	c := FastPathCondition([]string{"system:kube-controller-manager"}, "abc")
	for _, part := range []string{"object != null && !(request.userInfo.username in ['system:kube-controller-manager'] && ", "r.kind == 'Job'", "== 'abc'",
		"'gpupack.io/checkpoint'", "'gpupack.io/placement'", ") && (" + isGPU("Pod", "object") + ")"} {
		if !strings.Contains(c.Expression, part) {
			t.Errorf("condition lacks %q: %s", part, c.Expression)
		}
	}
}

// A job update is answered with a patch of template annotations and gates
// only: fields this build does not know survive, containers are untouched.
func TestJobUpdatePatch(t *testing.T) {
	ctx := context.Background()
	h := handlers(t, mutation.Config{})
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns", Labels: map[string]string{mutation.LabelQueueName: "q"}, Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}}}
	j.Spec.Template.Spec.Containers = []corev1.Container{{Name: "c", Image: "i", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}
	j.Spec.Template.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
	req := request(t, admissionv1.Create, j, nil)
	var created batchv1.Job
	apply(t, req, h[PathMutateJob].Handle(ctx, req), &created)
	if created.Spec.Template.Annotations[v1alpha1.AnnotationInjected] == "" {
		t.Fatalf("created template not marked: %v", created.Spec.Template.Annotations)
	}

	// Kueue starts it: podSetUpdates put the plan into the template.
	started := created.DeepCopy()
	started.Spec.Template.Annotations[v1alpha1.AnnotationPlan] = "p1"
	raw, _ := json.Marshal(started)
	var doc map[string]any
	_ = json.Unmarshal(raw, &doc)
	doc["spec"].(map[string]any)["fieldFromTheFuture"] = "kept"
	doc["spec"].(map[string]any)["bigNumberFromTheFuture"] = json.Number("9007199254740993") // 2^53+1: a float64 would round it
	raw, _ = json.Marshal(doc)
	upd := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: raw}}}
	resp := h[PathMutateJob].Handle(ctx, upd)
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	for _, p := range resp.Patches {
		if !strings.HasPrefix(p.Path, "/spec/template/spec/schedulingGates") && !strings.HasPrefix(p.Path, "/spec/template/metadata/annotations") {
			t.Errorf("patch touches %s", p.Path)
		}
	}
	var got map[string]any
	apply(t, upd, resp, &got)
	if got["spec"].(map[string]any)["fieldFromTheFuture"] != "kept" {
		t.Error("unknown field dropped")
	}
	for _, p := range resp.Patches {
		if strings.Contains(p.Path, "FromTheFuture") {
			t.Errorf("patch touches %s", p.Path)
		}
	}
	var gotJob batchv1.Job
	b, _ := json.Marshal(got)
	_ = json.Unmarshal(b, &gotJob)
	if d := cmp.Diff([]corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}, gotJob.Spec.Template.Spec.SchedulingGates); d != "" {
		t.Errorf("gates (-want +got):\n%s", d)
	}
	if d := cmp.Diff(created.Spec.Template.Spec.Containers, gotJob.Spec.Template.Spec.Containers); d != "" {
		t.Errorf("containers changed:\n%s", d)
	}
	// Nothing to do: no patch.
	raw, _ = json.Marshal(created)
	if resp := h[PathMutateJob].Handle(ctx, admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: raw}}}); len(resp.Patches) != 0 {
		t.Errorf("unchanged job patched: %v", resp.Patches)
	}
}

// TestTemplatePodCreatorsMustBeOwnerControllers: a fast-path pod skips the
// check of who creates a planned pod, so only trusted owner controllers
// may take the fast path (round 2, finding 5).
func TestTemplatePodCreatorsMustBeOwnerControllers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		creators []string
		owners   []string
		deny     string // "" = accepted
	}{
		{"the defaults", DefaultTemplatePodCreators, mutation.DefaultOwnerControllers, ""},
		{"no fast path", nil, mutation.DefaultOwnerControllers, ""},
		{"a creator the policy does not trust", append([]string{"system:serviceaccount:team:bot"}, DefaultTemplatePodCreators...), mutation.DefaultOwnerControllers, "system:serviceaccount:team:bot"},
		{"ownerControllers narrowed below the creators", DefaultTemplatePodCreators, []string{"system:kube-controller-manager"}, "system:serviceaccount:kube-system:job-controller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckTemplatePodCreators(tc.creators, tc.owners)
			switch {
			case tc.deny == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.deny != "" && (err == nil || !strings.Contains(err.Error(), tc.deny)):
				t.Errorf("err = %v, want one naming %q", err, tc.deny)
			}
		})
	}
}
