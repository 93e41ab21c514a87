package mutation

import (
	"strings"
	"testing"
)

// TestCheckPlanCreator: who may create an object carrying gpupack.io/plan
// (issue 14, finding 6).
func TestCheckPlanCreator(t *testing.T) {
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	custom, err := New(Config{UnmanagedGPUs: UnmanagedGPUsConfig{OwnerControllers: []string{"system:serviceaccount:ops:my-operator"}}})
	if err != nil {
		t.Fatal(err)
	}
	tenant := []string{"system:authenticated"}
	for _, tc := range []struct {
		name          string
		m             *Mutator
		hasController bool
		user          string
		groups        []string
		deny          string // "" = allowed
	}{
		{"the Job controller, for its Job", m, true, "system:serviceaccount:kube-system:job-controller", nil, ""},
		{"kube-controller-manager's own identity, for its owner", m, true, "system:kube-controller-manager", nil, ""},
		{"the JobSet controller, for its JobSet", m, true, "system:serviceaccount:jobset-system:jobset-controller-manager", nil, ""},
		{"a cluster admin, no owner", m, false, "root", []string{"system:masters"}, ""},
		{"the tenant, for her own Job", m, true, "alice", tenant, `created by "alice"`},
		{"the tenant, a bare pod", m, false, "alice", tenant, `created by "alice"`},
		{"a tenant's service account", m, true, "system:serviceaccount:team-a:default", []string{"system:serviceaccounts"}, "not by a controller gpupack trusts"},
		{"the Job controller, no owner", m, false, "system:serviceaccount:kube-system:job-controller", nil, "no controlling owner"},
		{"an account added to ownerControllers", custom, true, "system:serviceaccount:ops:my-operator", nil, ""},
		{"a default account no longer listed", custom, true, "system:serviceaccount:kube-system:job-controller", nil, "not by a controller gpupack trusts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.CheckPlanCreator("pod p", tc.hasController, tc.user, tc.groups)
			switch {
			case tc.deny == "" && err != nil:
				t.Errorf("denied: %v", err)
			case tc.deny != "" && (err == nil || !strings.Contains(err.Error(), tc.deny) || !strings.Contains(err.Error(), "gpupack.io/plan")):
				t.Errorf("err = %v, want a denial naming gpupack.io/plan with %q", err, tc.deny)
			}
		})
	}
}
