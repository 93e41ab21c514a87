package webhooks

import (
	"fmt"
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
	set := make([]string, len(gpuResources))
	for i, r := range gpuResources {
		set[i] = fmt.Sprintf("'%s'", r)
	}
	if got, want := variable(vap, "gpuResources"), "["+strings.Join(set, ", ")+"]"; got != want {
		t.Errorf("policy %s's gpuResources are not the webhooks' GPU resources:\n got %s\nwant %s", vap.Name, got, want)
	}
	mwc, _ := WebhookConfigurations(DefaultServeOptions())
	want := mwc.Webhooks[0].NamespaceSelector
	if mr := binding.Spec.MatchResources; mr == nil || mr.NamespaceSelector == nil || mr.NamespaceSelector.String() != want.String() {
		t.Errorf("binding %s's namespaces %v, want the webhooks' %v", binding.Name, binding.Spec.MatchResources, want)
	}
}
