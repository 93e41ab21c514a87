package install

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpupack/gpupack/webhooks"
)

var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection", "*"}

// grants reports the verbs a ClusterRole's rules give on resource (core
// group when group is "").
func grants(r rbacv1.ClusterRole, group, resource string) []string {
	var out []string
	for _, rule := range r.Rules {
		if (slices.Contains(rule.APIGroups, group) || slices.Contains(rule.APIGroups, "*")) &&
			(slices.Contains(rule.Resources, resource) || slices.Contains(rule.Resources, "*")) && len(rule.ResourceNames) == 0 {
			out = append(out, rule.Verbs...)
		}
	}
	return out
}

func writes(verbs []string) bool {
	for _, v := range verbs {
		if slices.Contains(writeVerbs, v) {
			return true
		}
	}
	return false
}

// policy returns the rendered ValidatingAdmissionPolicy name, failing
// unless a Deny binding enforces it.
func policy(t *testing.T, objs []*unstructured.Unstructured, name string) admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	var p admissionregistrationv1.ValidatingAdmissionPolicy
	into(t, find(t, objs, "ValidatingAdmissionPolicy", name), &p)
	bound := false
	for _, o := range objs {
		if o.GetKind() != "ValidatingAdmissionPolicyBinding" {
			continue
		}
		var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
		into(t, o, &b)
		if b.Spec.PolicyName == name && slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
			bound = true
		}
	}
	if !bound {
		t.Errorf("policy %s has no binding with validationActions Deny", name)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("policy %s does not fail closed", name)
	}
	return p
}

// expressions is every CEL expression of p, joined.
func expressions(p admissionregistrationv1.ValidatingAdmissionPolicy) string {
	var b strings.Builder
	for _, c := range p.Spec.MatchConditions {
		b.WriteString(c.Expression + "\n")
	}
	for _, v := range p.Spec.Variables {
		b.WriteString(v.Expression + "\n")
	}
	for _, v := range p.Spec.Validations {
		b.WriteString(v.Expression + "\n")
	}
	return b.String()
}

// TestLeastPrivilegeRBAC reads the rendered manifests (issue 14, item 11):
// every write gpupack's service accounts get that RBAC cannot narrow is
// narrowed by a shipped, enforced policy keyed on that service account
// (and, for gpupack-node, on its token's node binding); nobody may evict;
// the eviction webhook never holds kube-system's or gpupack's pods.
func TestLeastPrivilegeRBAC(t *testing.T) {
	for _, r := range []struct {
		name string
		objs func(t *testing.T) []*unstructured.Unstructured
	}{
		{"kustomize default", func(t *testing.T) []*unstructured.Unstructured { return Kustomize(t, "manifests/overlays/default") }},
		{"helm defaults", func(t *testing.T) []*unstructured.Unstructured { return Helm(t) }},
	} {
		t.Run(r.name, func(t *testing.T) {
			objs := r.objs(t)
			sa := func(name string) string { return "system:serviceaccount:" + Namespace + ":" + name }
			for _, o := range objs {
				if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
					continue
				}
				var role rbacv1.ClusterRole
				into(t, o, &role)
				for _, rule := range role.Rules {
					if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
						t.Errorf("%s %s grants a wildcard: %+v", o.GetKind(), o.GetName(), rule)
					}
					if slices.Contains(rule.Resources, "pods/eviction") {
						t.Errorf("%s %s may evict pods (enforcement deletes; evictions can be held)", o.GetKind(), o.GetName())
					}
				}
			}

			var node rbacv1.ClusterRole
			into(t, find(t, objs, "ClusterRole", "gpupack-node"), &node)
			nodes := policy(t, objs, "gpupack-node-nodes")
			pods := policy(t, objs, "gpupack-node-pods")
			for _, tc := range []struct {
				resource string
				p        admissionregistrationv1.ValidatingAdmissionPolicy
			}{{"nodes", nodes}, {"nodes/status", nodes}, {"pods", pods}} {
				if !writes(grants(node, "", tc.resource)) {
					continue
				}
				e := expressions(tc.p)
				if !strings.Contains(e, "'"+sa("gpupack-node")+"'") || !strings.Contains(e, "authentication.kubernetes.io/node-name") {
					t.Errorf("gpupack-node may write %s, but policy %s is not keyed on its service account and node binding", tc.resource, tc.p.Name)
				}
				covered := false
				for _, rr := range tc.p.Spec.MatchConstraints.ResourceRules {
					covered = covered || slices.Contains(rr.Resources, tc.resource)
				}
				if !covered {
					t.Errorf("policy %s does not match %s", tc.p.Name, tc.resource)
				}
			}

			var mgr rbacv1.ClusterRole
			into(t, find(t, objs, "ClusterRole", "gpupack-manager"), &mgr)
			if writes(grants(mgr, "", "pods")) {
				e := expressions(policy(t, objs, "gpupack-manager-pod-writes"))
				if !strings.Contains(e, "'"+sa("gpupack-manager")+"'") || !strings.Contains(e, "object.spec.containers == oldObject.spec.containers") {
					t.Errorf("gpupack-manager may write pods, but gpupack-manager-pod-writes does not limit it to the placement")
				}
			}
			for _, jr := range [][2]string{{"batch", "jobs"}, {"kubeflow.org", "pytorchjobs"}} {
				if !writes(grants(mgr, jr[0], jr[1])) {
					continue
				}
				p := policy(t, objs, "gpupack-manager-job-writes")
				if e := expressions(p); !strings.Contains(e, "'"+sa("gpupack-manager")+"'") || !strings.Contains(e, "gpupack.io/last-consistent-checkpoint") {
					t.Errorf("gpupack-manager may write %s, but gpupack-manager-job-writes does not limit it to the consistent step", jr[1])
				}
				covered := false
				for _, rr := range p.Spec.MatchConstraints.ResourceRules {
					covered = covered || (slices.Contains(rr.Resources, jr[1]) && slices.Contains(rr.APIGroups, jr[0]))
				}
				if !covered {
					t.Errorf("policy gpupack-manager-job-writes does not match %s.%s", jr[1], jr[0])
				}
			}
			if e := expressions(policy(t, objs, "gpupack-placement")); !strings.Contains(e, "'"+sa("gpupack-manager")+"'") || !strings.Contains(e, "gpupack.io/devices") {
				t.Errorf("gpupack-placement is not keyed on the manager and gpupack.io/devices")
			}

			// The manager makes its fast-path salt at its first start and
			// reads it back (webhooks.EnsureFastPathSalt); the read is
			// granted by name, and no ClusterRole reaches secrets.
			var own rbacv1.ClusterRole // a Role's rules, decoded alike
			into(t, find(t, objs, "Role", "gpupack-manager"), &own)
			if !slices.Contains(grants(own, "", "secrets"), "create") {
				t.Errorf("Role gpupack-manager cannot create the %s Secret", webhooks.FastPathSecretName)
			}
			named := false
			for _, rule := range own.Rules {
				named = named || (slices.Contains(rule.Resources, "secrets") && slices.Equal(rule.ResourceNames, []string{webhooks.FastPathSecretName}) && slices.Contains(rule.Verbs, "get"))
			}
			if !named {
				t.Errorf("Role gpupack-manager has no get on secrets named %s", webhooks.FastPathSecretName)
			}
			for _, o := range objs {
				if o.GetKind() != "ClusterRole" {
					continue
				}
				var cr rbacv1.ClusterRole
				into(t, o, &cr)
				if v := grants(cr, "", "secrets"); len(v) > 0 {
					t.Errorf("ClusterRole %s grants %v on secrets in every namespace", o.GetName(), v)
				}
			}

			var ev admissionregistrationv1.ValidatingWebhookConfiguration
			into(t, find(t, objs, "ValidatingWebhookConfiguration", "gpupack-preemption-eviction"), &ev)
			for _, w := range ev.Webhooks {
				ok := false
				if s := w.NamespaceSelector; s != nil {
					for _, e := range s.MatchExpressions {
						ok = ok || (e.Key == "kubernetes.io/metadata.name" && e.Operator == "NotIn" && slices.Contains(e.Values, "kube-system") && slices.Contains(e.Values, Namespace))
					}
				}
				if !ok {
					t.Errorf("eviction webhook %s is not scoped away from kube-system and %s: %+v", w.Name, Namespace, w.NamespaceSelector)
				}
			}
		})
	}
}
