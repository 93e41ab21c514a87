package install

import (
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// jobKindRBAC is, per Kueue integration gpupack follows beyond batch/job
// and kubeflow.org/pytorchjob, the resources its ClusterRole
// gpupack-manager-<name> grants, as group/resource → verbs.
var jobKindRBAC = []struct {
	integration, name string
	grants            map[string][]string
}{
	{"jobset.x-k8s.io/jobset", "jobset", map[string][]string{"jobset.x-k8s.io/jobsets": {"get", "list", "watch", "patch"}}},
	{"trainer.kubeflow.org/trainjob", "trainjob", map[string][]string{"trainer.kubeflow.org/trainjobs": {"get", "list", "watch", "patch"}, "jobset.x-k8s.io/jobsets": {"get", "list", "watch"}}},
	{"leaderworkerset.x-k8s.io/leaderworkerset", "leaderworkerset", map[string][]string{"leaderworkerset.x-k8s.io/leaderworkersets": {"get", "list", "watch", "patch"}, "apps/statefulsets": {"get", "list", "watch"}}},
	{"ray.io/rayjob", "rayjob", map[string][]string{"ray.io/rayjobs": {"get", "list", "watch", "patch"}, "ray.io/rayclusters": {"get", "list", "watch"}}},
	{"ray.io/raycluster", "raycluster", map[string][]string{"ray.io/rayclusters": {"get", "list", "watch", "patch"}}},
	{"kubeflow.org/mpijob", "mpijob", map[string][]string{"kubeflow.org/mpijobs": {"get", "list", "watch", "patch"}}},
	{"deployment", "deployment", map[string][]string{"apps/deployments": {"get", "list", "watch"}, "apps/replicasets": {"get", "list", "watch"}}},
	{"statefulset", "statefulset", map[string][]string{"apps/statefulsets": {"get", "list", "watch"}}},
}

// baseGrants is what gpupack-manager's own ClusterRole grants on the job
// kinds' resources in every configuration: the unmanaged-GPU policy walks a
// pod's controller chain through ReplicaSets and StatefulSets (get only).
var baseGrants = map[string][]string{"apps/replicasets": {"get"}, "apps/statefulsets": {"get"}}

// managerGrants is what every ClusterRole bound to gpupack-manager grants,
// as group/resource → verbs (sorted, deduplicated).
func managerGrants(t *testing.T, objs []*unstructured.Unstructured) map[string][]string {
	t.Helper()
	bound := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.ClusterRoleBinding
		into(t, o, &b)
		for _, s := range b.Subjects {
			if s.Kind == "ServiceAccount" && s.Name == "gpupack-manager" && s.Namespace == Namespace {
				bound[b.RoleRef.Name] = true
			}
		}
	}
	out := map[string][]string{}
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" || !bound[o.GetName()] {
			continue
		}
		var r rbacv1.ClusterRole
		into(t, o, &r)
		for _, rule := range r.Rules {
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					k := g + "/" + res
					out[k] = append(out[k], rule.Verbs...)
				}
			}
		}
	}
	for k, v := range out {
		slices.Sort(v)
		out[k] = slices.Compact(v)
	}
	return out
}

// Each job kind's rules appear exactly when its integration is enabled: in
// no default rendering, in Helm only for the integrations listed (alone or
// together), and in the job-kinds overlay for all of them. A rule left
// over from another kind, or one granted by default beyond baseGrants, fails.
func TestJobKindRBACOnlyWhenEnabled(t *testing.T) {
	jobKindResources := map[string]bool{}
	for _, k := range jobKindRBAC {
		for r := range k.grants {
			jobKindResources[r] = true
		}
	}
	// want: the union of the enabled kinds' grants.
	check := func(t *testing.T, what string, objs []*unstructured.Unstructured, enabled []string) {
		t.Helper()
		want := map[string][]string{}
		for r, v := range baseGrants {
			want[r] = append(want[r], v...)
		}
		names := map[string]bool{}
		for _, k := range jobKindRBAC {
			if !slices.Contains(enabled, k.integration) {
				continue
			}
			names["gpupack-manager-"+k.name] = true
			for r, v := range k.grants {
				want[r] = append(want[r], v...)
			}
		}
		got := managerGrants(t, objs)
		for r := range jobKindResources {
			w := append([]string(nil), want[r]...)
			slices.Sort(w)
			w = slices.Compact(w)
			if !slices.Equal(w, got[r]) {
				t.Errorf("%s: gpupack-manager may %v %s, want %v", what, got[r], r, w)
			}
		}
		for _, o := range objs {
			if (o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding") && strings.HasPrefix(o.GetName(), "gpupack-manager-") {
				if n := o.GetName(); !names[n] && n != "gpupack-manager-volcano" {
					t.Errorf("%s: %s %s rendered but its integration is not enabled", what, o.GetKind(), n)
				}
			}
		}
		for n := range names {
			find(t, objs, "ClusterRole", n)
		}
	}
	check(t, "kustomize default", Kustomize(t, "manifests/overlays/default"), nil)
	check(t, "helm defaults", Helm(t), nil)
	var all []string
	for _, k := range jobKindRBAC {
		all = append(all, k.integration)
		check(t, "helm "+k.integration, Helm(t, "--set-json", `jobKinds.integrations=["`+k.integration+`"]`), []string{k.integration})
	}
	check(t, "helm ray.io/rayjob + deployment", Helm(t, "--set-json", `jobKinds.integrations=["ray.io/rayjob","deployment"]`), []string{"ray.io/rayjob", "deployment"})
	check(t, "kustomize job-kinds", Kustomize(t, "manifests/overlays/job-kinds"), all)
	check(t, "helm all", Helm(t, "--set-json", `jobKinds.integrations=["`+strings.Join(all, `","`)+`"]`), all)
	// Every component is in the job-kinds overlay, one per integration.
	for _, k := range jobKindRBAC {
		if !strings.Contains(string(readFile(t, "manifests/overlays/job-kinds/kustomization.yaml")), "../../components/job-kinds/"+k.name+"\n") {
			t.Errorf("manifests/overlays/job-kinds lacks the %s component", k.name)
		}
	}
	// An unknown integration is refused, naming what is known.
	if _, err := run(t, "helm", "template", "gpupack", "manifests/helm/gpupack", "--namespace", Namespace, "--set-json", `jobKinds.integrations=["ray.io/rayservice"]`); err == nil || !strings.Contains(err.Error(), "ray.io/rayjob") {
		t.Errorf("unknown integration: %v", err)
	}
}
