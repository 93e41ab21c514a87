package webhooks

import (
	"context"
	"fmt"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// gpupack's shipped ValidatingAdmissionPolicies that see pod creations,
// compiled and evaluated offline by the apiserver's own validating-policy
// code (k8s.io/apiserver's validator, as its plugin's compilePolicy builds
// it): what each decides for the pods a cluster creates, and what deciding
// costs the apiserver per pod (BenchmarkPolicyPodCreate). Their behaviour
// in the real apiserver is tested in test/integration/security.

// compiledPolicy is vap as the apiserver's validating-policy plugin
// compiles it (plugin.go compilePolicy, k8s.io/apiserver v0.37).
func compiledPolicy(vap *admissionregistrationv1.ValidatingAdmissionPolicy) validating.Validator {
	v, _ := compilePolicyParts(vap)
	return v
}

// compilePolicyParts is compiledPolicy and its match conditions alone
// (nil without any), whose runtime CEL cost matchCost reads.
func compilePolicyParts(vap *admissionregistrationv1.ValidatingAdmissionPolicy) (validating.Validator, plugincel.ConditionEvaluator) {
	vars := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	msgVars := plugincel.OptionalVariableDeclarations{}
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return validating.NewValidator(nil, nil, nil, nil, vap.Spec.FailurePolicy, err), nil
	}
	named := make([]plugincel.NamedExpressionAccessor, len(vap.Spec.Variables))
	for i, v := range vap.Spec.Variables {
		named[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(named, vars, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	var match plugincel.ConditionEvaluator
	if len(vap.Spec.MatchConditions) > 0 {
		conds := make([]plugincel.ExpressionAccessor, len(vap.Spec.MatchConditions))
		for i := range vap.Spec.MatchConditions {
			conds[i] = (*matchconditions.MatchCondition)(&vap.Spec.MatchConditions[i])
		}
		// Compiled without the policy's variables: the apiserver refuses a
		// policy whose match conditions read them.
		plain, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
		if err != nil {
			return validating.NewValidator(nil, nil, nil, nil, vap.Spec.FailurePolicy, err), nil
		}
		match = plain.CompileCondition(conds, vars, environment.StoredExpressions)
		matcher = matchconditions.NewMatcher(match, vap.Spec.FailurePolicy, "policy", "validate", vap.Name)
	}
	validations := make([]plugincel.ExpressionAccessor, len(vap.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(vap.Spec.Validations))
	for i, v := range vap.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	return validating.NewValidator(compiler.CompileCondition(validations, vars, environment.StoredExpressions), matcher,
		compiler.CompileCondition(nil, vars, environment.StoredExpressions), compiler.CompileCondition(messages, msgVars, environment.StoredExpressions),
		vap.Spec.FailurePolicy, nil), match
}

// matchCost is the runtime CEL cost (the apiserver's own measure, which
// its per-call budget limits) of evaluating match on attr: a figure
// that, unlike time, does not move with the machine's load.
func matchCost(ctx context.Context, tb testing.TB, match plugincel.ConditionEvaluator, attr *admission.VersionedAttributes) int64 {
	tb.Helper()
	req := plugincel.CreateAdmissionRequest(attr.Attributes, metav1.GroupVersionResource(corev1.SchemeGroupVersion.WithResource("pods")), metav1.GroupVersionKind(attr.VersionedKind))
	_, left, err := match.ForInput(ctx, attr, req, plugincel.OptionalVariableBindings{}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		tb.Fatal(err)
	}
	return celconfig.RuntimeCELCostBudget - left
}

// podPolicyFiles hold the shipped policies whose rules include pod
// creation.
var podPolicyFiles = []string{"placement.yaml", "seccomp.yaml"}

// podPolicies are those policies, compiled, by name.
func podPolicies(t testing.TB) map[string]validating.Validator {
	t.Helper()
	out := map[string]validating.Validator{}
	for _, f := range podPolicyFiles {
		vap, _ := readPolicy(t, f)
		out[vap.Name] = compiledPolicy(&vap)
	}
	return out
}

// decide is the policy's answer: "" (admitted: nothing matched or every
// validation held) or the first denial's message.
func decide(ctx context.Context, v validating.Validator, attr *admission.VersionedAttributes) (denied string, evalErr bool) {
	r := v.Validate(ctx, corev1.SchemeGroupVersion.WithResource("pods"), attr, nil, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attr.GetNamespace()}}, celconfig.RuntimeCELCostBudget, nil)
	for _, d := range r.Decisions {
		if d.Evaluation == validating.EvalError {
			return d.Message, true
		}
		if d.Action == validating.ActionDeny {
			return d.Message, false
		}
	}
	return "", false
}

// ephemeralUpdate is `kubectl debug` adding c to pod as admission sees it.
func ephemeralUpdate(p *corev1.Pod, c corev1.EphemeralContainer, username string) *admission.VersionedAttributes {
	old := p.DeepCopy()
	p = p.DeepCopy()
	p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, c)
	return podUpdateOf(old, p, "ephemeralcontainers", username)
}

// podUpdate is an update of old to p (the pods resource) as admission sees it.
func podUpdate(old, p *corev1.Pod, username string) *admission.VersionedAttributes {
	return podUpdateOf(old, p, "", username)
}

// podUpdateOf is an update of old to p through subresource ("" for the
// pods resource itself) as admission sees it.
func podUpdateOf(old, p *corev1.Pod, subresource, username string) *admission.VersionedAttributes {
	kind := corev1.SchemeGroupVersion.WithKind("Pod")
	attr := admission.NewAttributesRecord(p, old, kind, p.Namespace, p.Name, corev1.SchemeGroupVersion.WithResource("pods"), subresource,
		admission.Update, &metav1.UpdateOptions{}, false, &user.DefaultInfo{Name: username})
	va := &admission.VersionedAttributes{Attributes: attr, VersionedKind: kind}
	va.VersionedObject.Set(p)
	va.VersionedOldObject.Set(old)
	return va
}

type policyCase struct {
	name   string
	attr   *admission.VersionedAttributes
	denyBy string // policy that denies; "" admitted by all
}

type policyPods struct {
	cpu, cpuUnconfined, gpuConfined, gpuBare, gpuPodUnconfined, gpuContainerUnconfined, gpuInitOnly, gpuContainerOverride, job, devices *corev1.Pod
}

func makePolicyPods(t testing.TB) policyPods {
	t.Helper()
	mp := makeMatchPods(t)
	runtimeDefault := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	profile := func(p corev1.SeccompProfileType) *corev1.SecurityContext {
		return &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: p}}
	}
	confined := mp.bare.DeepCopy()
	confined.Spec.SecurityContext = runtimeDefault
	// A second CPU-only sidecar, as many training pods have.
	confined.Spec.Containers = append(confined.Spec.Containers, corev1.Container{Name: "logs", Image: "fluent-bit", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}})
	podUnconfined := confined.DeepCopy()
	podUnconfined.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
	containerUnconfined := confined.DeepCopy()
	containerUnconfined.Spec.Containers[1].SecurityContext = profile(corev1.SeccompProfileTypeUnconfined)
	// The pod is unconfined but every container sets its own profile.
	override := podUnconfined.DeepCopy()
	for i := range override.Spec.Containers {
		override.Spec.Containers[i].SecurityContext = profile(corev1.SeccompProfileTypeRuntimeDefault)
	}
	initOnly := mp.cpu.DeepCopy()
	initOnly.Spec.InitContainers = []corev1.Container{{Name: "warm", Image: "warm", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceVGPU: resource.MustParse("1")}}}}
	cpuUnconfined := mp.cpu.DeepCopy()
	cpuUnconfined.Spec.SecurityContext = podUnconfined.Spec.SecurityContext.DeepCopy()
	devices := confined.DeepCopy()
	devices.Annotations = map[string]string{v1alpha1.AnnotationDevices: "GPU-victim:70000"}
	return policyPods{cpu: mp.cpu, cpuUnconfined: cpuUnconfined, gpuConfined: confined, gpuBare: mp.bare, gpuPodUnconfined: podUnconfined,
		gpuContainerUnconfined: containerUnconfined, gpuInitOnly: initOnly, gpuContainerOverride: override, job: mp.job, devices: devices}
}

// What each pod-creating policy decides. The pods a cluster creates by
// the thousand (CPU pods, confined GPU pods, job pods from marked
// templates) must be admitted; every GPU pod with an unconfined container
// and every pod naming its own devices denied, whichever way the policy's
// conditions are written.
func TestPodPoliciesDecide(t *testing.T) {
	pods := makePolicyPods(t)
	policies := podPolicies(t)
	debug := corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox"}}
	debugConfined := debug
	debugConfined.SecurityContext = &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	debugUnconfined := debug
	debugUnconfined.SecurityContext = &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
	initUnconfined := pods.gpuConfined.DeepCopy()
	initUnconfined.Spec.InitContainers = []corev1.Container{{Name: "fetch", Image: "fetch",
		SecurityContext: &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}}}
	const alice = "alice"
	var cases []policyCase
	for _, tc := range []policyCase{
		{"CPU pod, no profile", podCreate(pods.cpu, alice), ""},
		{"CPU pod, Unconfined", podCreate(pods.cpuUnconfined, alice), ""},
		{"GPU pod, RuntimeDefault", podCreate(pods.gpuConfined, alice), ""},
		{"job pod from a marked template", podCreate(pods.job, "system:kube-controller-manager"), ""},
		// The pod's own Unconfined is refused even where every container
		// overrides it: a container added later would inherit it.
		{"GPU pod Unconfined, every container overriding it", podCreate(pods.gpuContainerOverride, alice), "gpupack-seccomp"},
		{"GPU pod, no profile", podCreate(pods.gpuBare, alice), "gpupack-seccomp"},
		{"GPU pod, pod Unconfined", podCreate(pods.gpuPodUnconfined, alice), "gpupack-seccomp"},
		{"GPU pod, a CPU sidecar Unconfined", podCreate(pods.gpuContainerUnconfined, alice), "gpupack-seccomp"},
		{"GPU only in an init container, no profile", podCreate(pods.gpuInitOnly, alice), "gpupack-seccomp"},
		{"GPU pod, RuntimeDefault, an init container Unconfined", podCreate(initUnconfined, alice), "gpupack-seccomp"},
		{"tenant names its own devices", podCreate(pods.devices, alice), "gpupack-placement"},
		{"debug container, no profile, into a confined GPU pod (inherits it)", ephemeralUpdate(pods.gpuConfined, debug, alice), ""},
		{"debug container, Unconfined, into a confined GPU pod", ephemeralUpdate(pods.gpuConfined, debugUnconfined, alice), "gpupack-seccomp"},
		{"debug container, no profile, into a GPU pod made before the policy", ephemeralUpdate(pods.gpuBare, debug, alice), "gpupack-seccomp"},
		{"debug container, RuntimeDefault, into that pod", ephemeralUpdate(pods.gpuBare, debugConfined, alice), ""},
		{"debug container into a CPU pod", ephemeralUpdate(pods.cpu, debug, alice), ""},
	} {
		cases = append(cases, tc)
	}
	// Each GPU resource the webhooks know, as a limit and as a request of
	// an unconfined pod's second container.
	for _, r := range gpuResources {
		for _, asLimit := range []bool{true, false} {
			p := pods.gpuBare.DeepCopy()
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
			rl := corev1.ResourceList{corev1.ResourceName(r): resource.MustParse("1")}
			c := corev1.Container{Name: "second", Image: "x", Resources: corev1.ResourceRequirements{Requests: rl}}
			if asLimit {
				c.Resources = corev1.ResourceRequirements{Limits: rl}
			}
			p.Spec.Containers = append(p.Spec.Containers, c)
			cases = append(cases, policyCase{fmt.Sprintf("unconfined, %s (limit %v)", r, asLimit), podCreate(p, alice), "gpupack-seccomp"})
		}
	}
	// The creator stamp of a Kueue pod group's pod (review 14 F3).
	stamped := func(user string) *corev1.Pod {
		p := pods.gpuConfined.DeepCopy()
		p.Labels = map[string]string{"kueue.x-k8s.io/pod-group-name": "g"}
		p.Annotations = map[string]string{v1alpha1.AnnotationCreatedBy: user}
		return p
	}
	restamp := func(user string) *corev1.Pod {
		p := stamped(alice)
		if user == "" {
			delete(p.Annotations, v1alpha1.AnnotationCreatedBy)
		} else {
			p.Annotations[v1alpha1.AnnotationCreatedBy] = user
		}
		return p
	}
	relabelled := stamped(alice)
	relabelled.Labels["app"] = "trainer"
	const manager = "system:serviceaccount:gpupack-system:gpupack-manager"
	cases = append(cases,
		policyCase{"pod-group pod stamped by its creator", podCreate(stamped(alice), alice), ""},
		policyCase{"pod-group pod stamped as another user's", podCreate(stamped("bob"), alice), "gpupack-placement"},
		policyCase{"pod stamped empty", podCreate(stamped(""), alice), "gpupack-placement"},
		policyCase{"stamp changed by an update", podUpdate(stamped(alice), restamp("bob"), alice), "gpupack-placement"},
		policyCase{"stamp removed by the manager", podUpdate(stamped(alice), restamp(""), manager), "gpupack-placement"},
		policyCase{"stamp added by an update", podUpdate(pods.gpuConfined, stamped(alice), alice), "gpupack-placement"},
		policyCase{"an update keeping the stamp", podUpdate(stamped(alice), relabelled, alice), ""},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for name, v := range policies {
				msg, evalErr := decide(context.Background(), v, tc.attr)
				if evalErr {
					t.Errorf("%s: evaluation error: %s", name, msg)
					continue
				}
				if want := name == tc.denyBy; want != (msg != "") {
					t.Errorf("%s: denied=%v (%q), want denied=%v", name, msg != "", msg, want)
				}
			}
		})
	}
}

// BenchmarkPolicyPodCreate: the apiserver CPU each pod-creating policy
// spends on a pod creation (match conditions, and the validations and
// message expressions where they match), for the pods a cluster creates
// by the thousand. Add BenchmarkPodMatchConditions for the pod webhook's
// part.
func BenchmarkPolicyPodCreate(b *testing.B) {
	pods := makePolicyPods(b)
	for _, bc := range []struct {
		name string
		pod  *corev1.Pod
		user string
	}{
		{"cpu-pod", pods.cpu, "alice"},
		{"gpu-pod-confined", pods.gpuConfined, "alice"},
		{"job-pod", pods.job, "system:kube-controller-manager"},
	} {
		for _, f := range podPolicyFiles {
			vap, _ := readPolicy(b, f)
			v, match := compilePolicyParts(&vap)
			b.Run(bc.name+"/"+vap.Name, func(b *testing.B) {
				ctx := context.Background()
				cost := matchCost(ctx, b, match, podCreate(bc.pod, bc.user))
				b.ReportAllocs()
				for b.Loop() {
					if msg, evalErr := decide(ctx, v, podCreate(bc.pod, bc.user)); msg != "" || evalErr {
						b.Fatal(msg)
					}
				}
				b.ReportMetric(float64(cost), "match-cel-cost/op")
			})
		}
	}
}
