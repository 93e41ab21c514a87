package webhooks

import (
	"strings"
	"testing"
)

// The gpupack-seccomp policy (manifests/base/policy/seccomp.yaml) is the
// backstop for the pod webhook's seccomp rule: it must call the same pods
// GPU pods (gpuResources, as the match conditions do; TestPodPoliciesDecide
// asks it about each) and leave out the namespaces the webhooks leave out.
// Its behaviour is tested against the real apiserver in
// test/integration/security.
func TestSeccompPolicyMatchesTheWebhooks(t *testing.T) {
	vap, binding := readPolicy(t, "seccomp.yaml")
	var cond string
	for _, c := range vap.Spec.MatchConditions {
		cond += c.Expression
	}
	// A container's limits and requests, in its containers and init
	// containers: four lookups in the webhooks' GPU resources.
	if n := strings.Count(cond, "r in "+celList(gpuResources)+")"); n != 4 {
		t.Errorf("policy %s's match condition looks up the webhooks' GPU resources %s %d times, want 4 (limits and requests of containers and init containers):\n%s", vap.Name, celList(gpuResources), n, cond)
	}
	mwc, _ := WebhookConfigurations(DefaultServeOptions())
	want := mwc.Webhooks[0].NamespaceSelector
	if mr := binding.Spec.MatchResources; mr == nil || mr.NamespaceSelector == nil || mr.NamespaceSelector.String() != want.String() {
		t.Errorf("binding %s's namespaces %v, want the webhooks' %v", binding.Name, binding.Spec.MatchResources, want)
	}
}
