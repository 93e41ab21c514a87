package webhooks

import (
	"os"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// The gpupack-seccomp policy (manifests/base/policy/seccomp.yaml) is the
// backstop for the pod webhook's seccomp rule: it must call the same pods
// GPU pods (gpuResources, as the match conditions do) and leave out the
// namespaces the webhooks leave out. Its behaviour is tested against the
// real apiserver in test/integration/security.
func TestSeccompPolicyMatchesTheWebhooks(t *testing.T) {
	raw, err := os.ReadFile("../manifests/base/policy/seccomp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "ValidatingAdmissionPolicy":
			err = yaml.UnmarshalStrict([]byte(doc), &vap)
		case "ValidatingAdmissionPolicyBinding":
			err = yaml.UnmarshalStrict([]byte(doc), &binding)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var gpu string
	for _, c := range vap.Spec.MatchConditions {
		if c.Name == "asks-for-gpus" {
			gpu = c.Expression
		}
	}
	if !strings.Contains(gpu, celList(gpuResources)+".exists(") {
		t.Errorf("policy %s's asks-for-gpus condition does not test the webhooks' GPU resources %s:\n%s", vap.Name, celList(gpuResources), gpu)
	}
	if binding.Spec.PolicyName != vap.Name || len(binding.Spec.ValidationActions) != 1 || binding.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Errorf("binding %s does not deny for %s", binding.Name, vap.Name)
	}
	mwc, _ := WebhookConfigurations(DefaultServeOptions())
	want := mwc.Webhooks[0].NamespaceSelector
	if mr := binding.Spec.MatchResources; mr == nil || mr.NamespaceSelector == nil || mr.NamespaceSelector.String() != want.String() {
		t.Errorf("binding %s's namespaces %v, want the webhooks' %v", binding.Name, binding.Spec.MatchResources, want)
	}
}
