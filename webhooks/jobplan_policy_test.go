package webhooks

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupack/gpupack/webhooks/mutation"
)

// readPolicy reads a policy file of manifests/base/policy: its policy and
// binding.
func readPolicy(t testing.TB, file string) (admissionregistrationv1.ValidatingAdmissionPolicy, admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	t.Helper()
	raw, err := os.ReadFile("../manifests/base/policy/" + file)
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
		default:
			t.Fatalf("%s: unexpected kind %q", file, meta.Kind)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if binding.Spec.PolicyName != vap.Name || !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding %s does not deny for %s", binding.Name, vap.Name)
	}
	return vap, binding
}

func variable(vap admissionregistrationv1.ValidatingAdmissionPolicy, name string) string {
	for _, v := range vap.Spec.Variables {
		if v.Name == name {
			return v.Expression
		}
	}
	return ""
}

var quoted = regexp.MustCompile(`'([^']*)'`)

// The gpupack-job-plan policy (manifests/base/policy/job-plan.yaml) must
// follow every job kind gpupack converts (Job, PyTorchJob and
// AllJobKinds): match its resource on update, read its templates, and let
// Kueue add a plan exactly where Kueue v0.17 writes podSetUpdates into
// templates — the kinds of its job integrations, not those of its pod
// integration (which writes onto pods: podBased) nor kinds it does not
// know (the Trainer's runtimes). The controllers it lets copy a plan from
// their owner are accounts the webhooks trust to create objects for their
// owner. Its behaviour is tested against the real apiserver in
// test/integration/security (TestPlanAddedByUpdateRefusedEveryKind).
func TestJobPlanPolicyCoversEveryJobKind(t *testing.T) {
	vap, _ := readPolicy(t, "job-plan.yaml")
	if vap.Name != "gpupack-job-plan" || vap.Spec.FailurePolicy == nil || *vap.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("policy %s does not fail closed", vap.Name)
	}
	kinds := append([]target(nil), targets[1:]...) // Job, PyTorchJob
	for _, k := range AllJobKinds {
		kinds = append(kinds, jobKinds[k].target)
	}
	templates, writes := variable(vap, "templates"), quoted.FindAllStringSubmatch(variable(vap, "kueueWrites"), -1)
	var kueueWrites, want []string
	for _, m := range writes {
		kueueWrites = append(kueueWrites, m[1])
	}
	for _, k := range kinds {
		matched := false
		for _, r := range vap.Spec.MatchConstraints.ResourceRules {
			matched = matched || (slices.Contains(r.APIGroups, k.group) && slices.Contains(r.APIVersions, k.version) && slices.Contains(r.Resources, k.resource) &&
				slices.Contains(r.Operations, admissionregistrationv1.Update))
		}
		if !matched {
			t.Errorf("policy %s does not match updates of %s (%s/%s %s)", vap.Name, k.kind, k.group, k.version, k.resource)
		}
		if !strings.Contains(templates, "'"+k.resource+"'") {
			t.Errorf("policy %s's templates variable does not read the templates of %s (%s)", vap.Name, k.kind, k.resource)
		}
		if fw := mutation.Framework(k.group+"/"+k.version, k.kind); mutation.KueueKnows(fw) && !podBased(fw) {
			want = append(want, k.resource)
		}
	}
	slices.Sort(kueueWrites)
	slices.Sort(want)
	if !slices.Equal(kueueWrites, want) {
		t.Errorf("policy %s lets Kueue write a plan into the templates of %v, want those of Kueue's job integrations %v", vap.Name, kueueWrites, want)
	}
	for _, m := range quoted.FindAllStringSubmatch(variable(vap, "propagates"), -1) {
		if strings.HasPrefix(m[1], "system:") && !slices.Contains(mutation.DefaultOwnerControllers, m[1]) {
			t.Errorf("policy %s lets %s copy a plan from an owner, not one of unmanagedGPUs.ownerControllers' defaults %v", vap.Name, m[1], mutation.DefaultOwnerControllers)
		}
	}
	if !strings.Contains(variable(vap, "kueue"), "'system:serviceaccount:kueue-system:kueue-controller-manager'") {
		t.Errorf("policy %s's kueue variable is not Kueue's controller manager: %s", vap.Name, variable(vap, "kueue"))
	}
}
