package webhooks

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/gpureq"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// ServeOptions name the Service that fronts the manager's webhook server.
type ServeOptions struct {
	// Namespace gpupack runs in; excluded from the webhooks, like kube-system.
	Namespace string
	// ServiceName of the webhook Service (port 443 → the manager's 9443).
	ServiceName string
	// MutatingName and ValidatingName of the configurations.
	MutatingName, ValidatingName string
	// ExcludedNamespaces besides kube-system and Namespace.
	ExcludedNamespaces []string
	// CertManagerCertificate, when set ("ns/name"), asks cert-manager's CA
	// injector to fill caBundle instead of the built-in rotator.
	CertManagerCertificate string
	// TimeoutSeconds per call (default 10).
	TimeoutSeconds int32
	// ValidatePodCreate also sends pod creations to the validating webhook.
	// Off by default: the mutating webhook already denies every bad pod and
	// is reinvoked (IfNeeded) when a later webhook changes the pod, so the
	// second call only catches a webhook that undoes gpupack's injection in
	// the reinvocation round — at the price of a second round trip on every
	// GPU pod (docs/bench/webhooks.md). Turn it on where such webhooks run.
	ValidatePodCreate bool
	// TemplatePodCreators are the users that create pods from job templates
	// (the Job controller, the training operator). Their pods made from a
	// template gpupack already injected (gpupack.io/injected =
	// TemplateFingerprint) skip the pod webhook: the work was done once
	// per job, not per pod. Empty (or no fingerprint): every GPU pod goes
	// to the webhook.
	TemplatePodCreators []string
	// TemplateFingerprint is the mutation configuration's Fingerprint. The
	// manager keeps the installed configuration in step with its own
	// (SetupFastPath); a stale value only sends pods the slow way.
	TemplateFingerprint string
	// StatefulSetPodCreators are the users that create a StatefulSet's
	// pods (kube-controller-manager's StatefulSet controller). With the
	// StatefulSet kind in JobKinds, their pods made from an injected
	// StatefulSet template skip the pod webhook too — but only while the
	// installed StatefulSet entry holds (SyncFastPath, statefulSetEntryHolds)
	// and under the epoch that the manager renews after any period in
	// which it did not (docs/webhooks.md#lws-pods-on-the-fast-path).
	// Empty: every StatefulSet pod meets the pod webhook.
	StatefulSetPodCreators []string

	// fastPathEpoch and fingerprintAt (WithFastPath of a Config with an
	// epoch): SetupFastPath renews the epoch and writes the marker of it.
	fastPathEpoch *mutation.FastPathEpoch
	fingerprintAt func(epoch []byte) string
	// JobKinds get webhook entries besides Pod, Job and PyTorchJob (of
	// AllJobKinds). The static manifests have only StatefulSet's, and only
	// where the LWS or StatefulSet integration is enabled; the manager adds
	// those of the kinds the cluster serves to the installed configurations
	// (SetupJobKinds, --job-kinds).
	JobKinds []string
}

// DefaultTemplatePodCreators: kube-controller-manager's Job controller
// (with and without --use-service-account-credentials) and the Kubeflow
// training operator's service account.
var DefaultTemplatePodCreators = []string{
	"system:serviceaccount:kube-system:job-controller",
	"system:kube-controller-manager",
	"system:serviceaccount:kubeflow:training-operator",
}

// DefaultStatefulSetPodCreators: kube-controller-manager's StatefulSet
// controller, with and without --use-service-account-credentials.
var DefaultStatefulSetPodCreators = []string{
	"system:serviceaccount:kube-system:statefulset-controller",
	"system:kube-controller-manager",
}

// CheckTemplatePodCreators: every user whose template pods skip the pod
// webhook (TemplatePodCreators, --template-pod-creators) must be one the
// unmanaged-GPU policy trusts to create objects for their owner
// (ownerControllers, unmanagedGPUs.ownerControllers): a fast-path pod
// skips the creation check of gpupack.io/plan (CheckPlanCreator), which
// only those controllers pass (issue 14 finding 6, round 2).
func CheckTemplatePodCreators(creators, ownerControllers []string) error {
	return checkPodCreators("--template-pod-creators", creators, ownerControllers)
}

// CheckStatefulSetPodCreators is CheckTemplatePodCreators for
// --statefulset-pod-creators.
func CheckStatefulSetPodCreators(creators, ownerControllers []string) error {
	return checkPodCreators("--statefulset-pod-creators", creators, ownerControllers)
}

func checkPodCreators(flag string, creators, ownerControllers []string) error {
	trusted := map[string]bool{}
	for _, u := range ownerControllers {
		trusted[u] = true
	}
	var extra []string
	for _, u := range creators {
		if !trusted[u] {
			extra = append(extra, u)
		}
	}
	if len(extra) > 0 {
		return fmt.Errorf("%s names %s, not in the configuration's unmanagedGPUs.ownerControllers: their pods would skip the pod webhook's check of who may create a pod carrying %s; add them to ownerControllers or drop them from %s", flag, strings.Join(extra, ", "), v1alpha1.AnnotationPlan, flag)
	}
	return nil
}

// DefaultServeOptions match manifests/: namespace gpupack-system.
func DefaultServeOptions() ServeOptions {
	return ServeOptions{
		Namespace:      "gpupack-system",
		ServiceName:    "gpupack-webhook-service",
		MutatingName:   "gpupack-mutating-webhook-configuration",
		ValidatingName: "gpupack-validating-webhook-configuration",
		TimeoutSeconds: 10,

		TemplatePodCreators:    DefaultTemplatePodCreators,
		StatefulSetPodCreators: DefaultStatefulSetPodCreators,
	}
}

// CEL building blocks. Objects reach matchConditions untyped, so every step
// is guarded with has().
var gpuResources = []string{v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores,
	v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage, v1alpha1.AnnotationHAMiGPUCores}

// matchAnnotations are the annotations that make an object gpupack's business
// even without a GPU resource (to deny a memory request without a GPU, to
// wrap a checkpointing job, to gate a planned pod).
func matchAnnotations() []string {
	keys := append([]string(nil), gpureq.RequestKeys...)
	return append(keys, v1alpha1.AnnotationCheckpoint, v1alpha1.AnnotationPlan)
}

func celList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = "'" + x + "'"
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// containersAskGPU is true when a container list (a CEL expression) asks for GPUs.
func containersAskGPU(containers string) string { return containersAsk(containers, gpuResources) }

// containersAsk is true when a container list asks for one of resources.
func containersAsk(containers string, resources []string) string {
	// A container's few limits and requests are looked up in the list,
	// not each listed resource in them: less work for the apiserver on
	// every pod (BenchmarkPodMatchConditions).
	r := celList(resources)
	return fmt.Sprintf("%s.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, r in %s)) || (has(c.resources.requests) && c.resources.requests.exists(r, r in %s))))", containers, r, r)
}

func annotated(meta string) string {
	return fmt.Sprintf("(has(%s.annotations) && %s.exists(k, k in %s.annotations))", meta, celList(matchAnnotations()), meta)
}

// templateIsGPU: a pod template (CEL expression of a PodTemplateSpec) asks for GPUs.
func templateIsGPU(t string) string {
	return fmt.Sprintf("(has(%[1]s.spec) && ((has(%[1]s.spec.containers) && %[2]s) || (has(%[1]s.spec.initContainers) && %[3]s))) || (has(%[1]s.metadata) && %[4]s)", t, containersAskGPU(t+".spec.containers"), containersAskGPU(t+".spec.initContainers"), annotated(t+".metadata"))
}

// isGPU returns the CEL condition for one object variable ("object" or "oldObject").
func isGPU(kind, v string) string {
	switch kind {
	case "Pod":
		// Init containers (and restartable sidecars) too: the webhook
		// denies GPUs there, which it can only do if it sees them.
		return fmt.Sprintf("(has(%[1]s.spec) && (%[2]s || (has(%[1]s.spec.initContainers) && %[3]s))) || %[4]s", v, containersAskGPU(v+".spec.containers"), containersAskGPU(v+".spec.initContainers"), annotated(v+".metadata"))
	case "Job":
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && has(%[1]s.spec.template) && (%[3]s))", v, annotated(v+".metadata"), templateIsGPU(v+".spec.template"))
	case "PyTorchJob":
		rs := v + ".spec.pytorchReplicaSpecs"
		// rt, not k: annotated iterates its annotation keys as k.
		return fmt.Sprintf("%[2]s || (has(%[1]s.spec) && has(%[3]s) && %[3]s.exists(rt, has(%[3]s[rt].template) && (%[4]s)))", v, annotated(v+".metadata"), rs, templateIsGPU(rs+"[rt].template"))
	}
	return jobKindIsGPU(kind, v)
}

// MatchConditions select the objects that ask for GPUs. Only those are sent
// to gpupack, so a down webhook (failurePolicy Fail) never blocks anything
// else. Validating conditions also look at the old object, so removing the
// annotations of a running job is still seen.
func MatchConditions(kind string, validating bool) []admissionregistrationv1.MatchCondition {
	expr := fmt.Sprintf("object != null && (%s)", isGPU(kind, "object"))
	if validating {
		expr = fmt.Sprintf("(%s) || (oldObject != null && (%s))", expr, isGPU(kind, "oldObject"))
	}
	conds := []admissionregistrationv1.MatchCondition{{Name: "asks-for-gpus", Expression: expr}}
	if kind == "Pod" && validating {
		conds = append(conds, admissionregistrationv1.MatchCondition{Name: "creates-or-edits-the-request", Expression: podRequestEdited()})
	}
	return conds
}

// podUpdateRefusedKeys are the annotations the pod validator refuses to
// change on an existing pod (mutation.PodUpdateRefusedKeys): the request
// keys, and gpupack.io/checkpoint, which decides whether the coordinator
// counts the pod's disruptions (review 16, H3).
func podUpdateRefusedKeys() []string { return mutation.PodUpdateRefusedKeys }

// podRequestEdited is true for a pod creation (sent only with
// ValidatePodCreate), for ephemeral containers being added (`kubectl
// debug`: the pods/ephemeralcontainers subresource), and for an update that
// changes a request annotation —
// the one thing the pod validator refuses on update. GPU pods are updated
// often (the ungater lifts its gate, Kueue and operators relabel them); none
// of that needs a round trip. Absent and empty annotations differ, as they
// do for the validator.
func podRequestEdited() string {
	val := func(v string) string {
		return fmt.Sprintf("(has(%[1]s.metadata.annotations) && k in %[1]s.metadata.annotations ? 'set:' + %[1]s.metadata.annotations[k] : 'unset')", v)
	}
	return fmt.Sprintf("request.operation == 'CREATE' || (has(request.subResource) && request.subResource == 'ephemeralcontainers') || (object != null && oldObject != null && %s.exists(k, %s != %s))", celList(podUpdateRefusedKeys()), val("object"), val("oldObject"))
}

// FastPathConditionName names the pod mutating webhook's one match
// condition while the fast path is on.
const FastPathConditionName = "gpu-pod-not-from-an-injected-template"

// FastPathCondition is the pod mutating webhook's condition with the fast
// path: asks-for-gpus, except for a pod that a trusted controller creates
// for its Job or PyTorchJob from a template carrying the current injection
// marker, that needs no checkpoint wrapping or resume step, that already
// has the placement gate if it has a plan, and that has a plan if it asks
// for gpupack.io/vgpu. A tenant cannot meet
// it: tenants are not those controllers, the controllers copy their pods
// from templates, and every GPU template passes the job webhooks, which set
// the marker only on a template whose pods are already a fixed point
// (mutation.SyncTemplate). A pod that misses any part is mutated as before.
//
// One expression, not two conditions: the apiserver evaluates every
// condition of a webhook, but && stops at the first false term, so a
// fast-path pod never pays for the GPU test, and a tenant's pod stops at
// the user name. Cheap terms come first.
func FastPathCondition(creators []string, fingerprint string) admissionregistrationv1.MatchCondition {
	return fastPathCondition(creators, nil, fingerprint)
}

// fastPathCondition is FastPathCondition, and with statefulSetCreators
// also skips a pod that one of them creates for its apps/v1 StatefulSet
// from a template carrying the current marker, that carries Kueue's
// pod-suspending-parent (Kueue's LWS or StatefulSet webhook wrote it into
// the template: Kueue's pod integration takes the pod), the placement gate
// (such a pod gets its plan only when Kueue admits it) and no plan.
func fastPathCondition(creators, statefulSetCreators []string, fingerprint string) admissionregistrationv1.MatchCondition {
	ann := "object.metadata.annotations"
	marker := fmt.Sprintf("has(%[1]s) && '%[2]s' in %[1]s && %[1]s['%[2]s'] == '%[3]s'", ann, v1alpha1.AnnotationInjected, fingerprint)
	noCheckpoint := fmt.Sprintf("!('%[2]s' in %[1]s) && !('%[3]s' in %[1]s)", ann, v1alpha1.AnnotationCheckpoint, v1alpha1.AnnotationLastConsistentCheckpoint)
	gated := fmt.Sprintf("has(object.spec.schedulingGates) && object.spec.schedulingGates.exists(g, g.name == '%s')", v1alpha1.SchedulingGatePlacement)
	// A planned pod must already be gated; a fractional pod must be
	// planned (the pod webhook denies one that cannot get a plan).
	planRule := fmt.Sprintf("(('%s' in %s) ? (%s) : !(has(object.spec.containers) && %s))",
		v1alpha1.AnnotationPlan, ann, gated, containersAsk("object.spec.containers", []string{v1alpha1.ResourceVGPU}))
	controlledBy := func(kinds string) string {
		return "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller && (" + kinds + "))"
	}
	job := strings.Join([]string{
		"request.userInfo.username in " + celList(creators),
		marker, noCheckpoint, planRule,
		controlledBy("(r.apiVersion == 'batch/v1' && r.kind == 'Job') || (r.apiVersion == 'kubeflow.org/v1' && r.kind == 'PyTorchJob')"),
	}, " && ")
	fast := job
	if len(statefulSetCreators) > 0 {
		sts := strings.Join([]string{
			"request.userInfo.username in " + celList(statefulSetCreators),
			marker, noCheckpoint,
			fmt.Sprintf("!('%s' in %s)", v1alpha1.AnnotationPlan, ann),
			fmt.Sprintf("'%s' in %s", placement.KueueSuspendingParent, ann),
			gated,
			controlledBy("r.apiVersion == 'apps/v1' && r.kind == 'StatefulSet'"),
		}, " && ")
		fast = fmt.Sprintf("(%s) || (%s)", job, sts)
	}
	return admissionregistrationv1.MatchCondition{
		Name:       FastPathConditionName,
		Expression: fmt.Sprintf("object != null && !(%s) && (%s)", fast, isGPU("Pod", "object")),
	}
}

// statefulSetFastPath: o renders the StatefulSet entries (the
// StatefulSet kind, which the LWS integration needs: an LWS's pods are its
// StatefulSets') and trusts StatefulSet pod creators, with a marker.
func (o ServeOptions) statefulSetFastPath() bool {
	return len(o.StatefulSetPodCreators) > 0 && o.TemplateFingerprint != "" && slices.Contains(o.JobKinds, KindStatefulSet)
}

// podMutatingConditions are the pod mutating webhook's match conditions;
// statefulSets: with the StatefulSet clause (only where the StatefulSet
// entry holds, SyncFastPath).
func podMutatingConditions(o ServeOptions, statefulSets bool) []admissionregistrationv1.MatchCondition {
	if len(o.TemplatePodCreators) > 0 && o.TemplateFingerprint != "" {
		var sts []string
		if statefulSets && o.statefulSetFastPath() {
			sts = o.StatefulSetPodCreators
		}
		return []admissionregistrationv1.MatchCondition{fastPathCondition(o.TemplatePodCreators, sts, o.TemplateFingerprint)}
	}
	return MatchConditions("Pod", false)
}

type target struct {
	kind, group, version, resource string
	mutate, validate               string
	// clusterScoped kinds (ClusterTrainingRuntime) match Cluster scope; the
	// namespace selector does not apply to them.
	clusterScoped bool
}

var targets = []target{
	{"Pod", "", "v1", "pods", PathMutatePod, PathValidatePod, false},
	{"Job", "batch", "v1", "jobs", PathMutateJob, PathValidateJob, false},
	{"PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", PathMutatePyTorchJob, PathValidatePyTorchJb, false},
}

// WebhookConfigurations returns the mutating and validating configurations.
// caBundle is empty: the rotator (SetupCerts) or cert-manager fills it.
func WebhookConfigurations(o ServeOptions) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	ifNeeded := admissionregistrationv1.IfNeededReinvocationPolicy
	scope := admissionregistrationv1.NamespacedScope
	timeout := o.TimeoutSeconds
	if timeout == 0 {
		timeout = 10
	}
	excluded := append([]string{"kube-system", o.Namespace}, o.ExcludedNamespaces...)
	nsSel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: excluded,
	}}}
	client := func(path string) admissionregistrationv1.WebhookClientConfig {
		p := path
		return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: o.Namespace, Name: o.ServiceName, Path: &p}}
	}
	clusterScope := admissionregistrationv1.ClusterScope
	rule := func(t target, ops []admissionregistrationv1.OperationType, resources ...string) []admissionregistrationv1.RuleWithOperations {
		s := &scope
		if t.clusterScoped {
			s = &clusterScope
		}
		return []admissionregistrationv1.RuleWithOperations{{
			Operations: ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{t.group}, APIVersions: []string{t.version}, Resources: append([]string{t.resource}, resources...), Scope: s},
		}}
	}
	meta := func(name string) metav1.ObjectMeta {
		m := metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/part-of": "gpupack"}}
		if o.CertManagerCertificate != "" {
			m.Annotations = map[string]string{"cert-manager.io/inject-ca-from": o.CertManagerCertificate}
		}
		return m
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: meta(o.MutatingName),
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: meta(o.ValidatingName),
	}
	for _, t := range append(targets[:len(targets):len(targets)], jobKindTargets(o.JobKinds)...) {
		lower := strings.ToLower(t.kind)
		var reinvoke *admissionregistrationv1.ReinvocationPolicyType
		conds := MatchConditions(t.kind, false)
		// Jobs are mutated on update too: Kueue writes its podSetUpdates
		// (the plan) into a template when it starts the job, and the
		// template must then carry the placement gate (SyncTemplate).
		mops := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
		if t.kind == "Pod" {
			// Another webhook may add containers or env after us.
			reinvoke = &ifNeeded
			conds = podMutatingConditions(o, true)
			mops = mops[:1]
		}
		mwc.Webhooks = append(mwc.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name:                    "m" + lower + ".gpupack.io",
			ClientConfig:            client(t.mutate),
			Rules:                   rule(t, mops),
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          &timeout,
			NamespaceSelector:       nsSel,
			MatchConditions:         conds,
			ReinvocationPolicy:      reinvoke,
		})
		ops := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
		var sub []string
		if t.kind == "Pod" {
			if !o.ValidatePodCreate {
				ops = ops[1:]
			}
			// Ephemeral containers arrive through their own subresource.
			sub = []string{"pods/ephemeralcontainers"}
		}
		vwc.Webhooks = append(vwc.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name:                    "v" + lower + ".gpupack.io",
			ClientConfig:            client(t.validate),
			Rules:                   rule(t, ops, sub...),
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          &timeout,
			NamespaceSelector:       nsSel,
			MatchConditions:         MatchConditions(t.kind, true),
		})
	}
	return mwc, vwc
}
