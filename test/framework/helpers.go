package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/controller-runtime/pkg/metrics"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

// MustCreate creates an object or fails the test. A RoleBinding or
// ClusterRoleBinding returns once the apiserver's authorizer grants its
// User subjects the role's first rule: RBAC answers from an informer, and
// on a loaded machine a request made right after the binding was created
// can still be refused (CI saw "alice cannot create rayjobs" that way).
func (e *Env) MustCreate(t TB, obj client.Object) {
	t.Helper()
	if err := e.Client.Create(e.Ctx, obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
	switch b := obj.(type) {
	case *rbacv1.RoleBinding:
		e.waitBindingEffective(t, b.Namespace, b.RoleRef, b.Subjects)
	case *rbacv1.ClusterRoleBinding:
		e.waitBindingEffective(t, "", b.RoleRef, b.Subjects)
	}
}

// waitBindingEffective polls SubjectAccessReviews until every User in
// subjects is allowed the first rule of ref (in ns), or fails the test.
func (e *Env) waitBindingEffective(t TB, ns string, ref rbacv1.RoleRef, subjects []rbacv1.Subject) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(e.Ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var rules []rbacv1.PolicyRule
		if ref.Kind == "Role" {
			r := &rbacv1.Role{}
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, r); err != nil {
				last = err.Error()
				return false, nil
			}
			rules = r.Rules
		} else {
			r := &rbacv1.ClusterRole{}
			if err := e.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, r); err != nil {
				last = err.Error()
				return false, nil
			}
			rules = r.Rules
		}
		attrs, ok := firstResourceRule(rules)
		if !ok {
			last = fmt.Sprintf("%s %s has no resource rule yet", ref.Kind, ref.Name)
			return false, nil // an aggregated role not filled in yet
		}
		attrs.Namespace = ns
		for _, s := range subjects {
			if s.Kind != rbacv1.UserKind {
				continue
			}
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: s.Name, Groups: []string{"system:authenticated"}, ResourceAttributes: &attrs}}
			if err := e.Client.Create(ctx, sar); err != nil {
				last = err.Error()
				return false, nil
			}
			if !sar.Status.Allowed {
				last = fmt.Sprintf("%s not yet allowed to %s %s/%s in %q", s.Name, attrs.Verb, attrs.Group, attrs.Resource, ns)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("binding to %s %s never took effect: %s (%v)", ref.Kind, ref.Name, last, err)
	}
}

// firstResourceRule is the first rule of rules that names a resource, as
// the attributes of one request it allows.
func firstResourceRule(rules []rbacv1.PolicyRule) (authorizationv1.ResourceAttributes, bool) {
	for _, r := range rules {
		if len(r.Resources) == 0 || len(r.Verbs) == 0 || len(r.ResourceNames) > 0 {
			continue
		}
		group := ""
		if len(r.APIGroups) > 0 {
			group = r.APIGroups[0]
		}
		res, sub, _ := strings.Cut(r.Resources[0], "/")
		return authorizationv1.ResourceAttributes{Verb: r.Verbs[0], Group: group, Resource: res, Subresource: sub}, true
	}
	return authorizationv1.ResourceAttributes{}, false
}

// Namespace creates a namespace with a unique name starting with prefix.
func (e *Env) Namespace(t TB, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	e.MustCreate(t, ns)
	return ns.Name
}

// Eventually polls cond every 100 ms until it holds or timeout passes; the
// failure names what was awaited and cond's last explanation.
func (e *Env) Eventually(t TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, last)
		}
		select {
		case <-e.Ctx.Done():
			t.Fatalf("context done waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// SetAdmissionCheckActive marks an AdmissionCheck Active, as its controller would.
func (e *Env) SetAdmissionCheckActive(t TB, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var ac kueue.AdmissionCheck
		if err := e.Client.Get(e.Ctx, client.ObjectKey{Name: name}, &ac); err != nil {
			return err
		}
		apimeta.SetStatusCondition(&ac.Status.Conditions, metav1.Condition{Type: kueue.AdmissionCheckActive, Status: metav1.ConditionTrue, Reason: "Active", Message: "set by test"})
		return e.Client.Status().Update(e.Ctx, &ac)
	})
	if err != nil {
		t.Fatalf("activating admission check %s: %v", name, err)
	}
}

// WaitForAdmissionCheckActive waits until the check's controller has set
// the AdmissionCheck Active (a ClusterQueue using it is not active before).
func (e *Env) WaitForAdmissionCheckActive(t TB, name string) {
	t.Helper()
	e.Eventually(t, 90*time.Second, name+" check Active", func() (bool, string) {
		var ac kueue.AdmissionCheck
		if err := e.Client.Get(e.Ctx, client.ObjectKey{Name: name}, &ac); err != nil {
			return false, err.Error()
		}
		return apimeta.IsStatusConditionTrue(ac.Status.Conditions, kueue.AdmissionCheckActive), fmt.Sprint(ac.Status.Conditions)
	})
}

// WorkloadOf returns the Workload Kueue created for a job (by owner
// reference), or nil.
func (e *Env) WorkloadOf(ns, ownerName, ownerKind string) (*kueue.Workload, error) {
	var wls kueue.WorkloadList
	if err := e.Client.List(e.Ctx, &wls, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for i := range wls.Items {
		for _, o := range wls.Items[i].OwnerReferences {
			if o.Name == ownerName && o.Kind == ownerKind {
				return &wls.Items[i], nil
			}
		}
	}
	return nil, nil
}

// WaitForWorkloadOf waits until the job's Workload exists and satisfies cond.
func (e *Env) WaitForWorkloadOf(t TB, ns, ownerName, ownerKind string, cond func(*kueue.Workload) bool) *kueue.Workload {
	t.Helper()
	var wl *kueue.Workload
	e.Eventually(t, 60*time.Second, fmt.Sprintf("workload of %s %s/%s", ownerKind, ns, ownerName), func() (bool, string) {
		w, err := e.WorkloadOf(ns, ownerName, ownerKind)
		if err != nil {
			return false, err.Error()
		}
		if w == nil {
			return false, "no workload yet"
		}
		wl = w
		if cond != nil && !cond(w) {
			return false, DescribeWorkload(w)
		}
		return true, ""
	})
	return wl
}

// DescribeWorkload renders conditions and check states in one line.
func DescribeWorkload(w *kueue.Workload) string {
	s := w.Name + ":"
	for _, c := range w.Status.Conditions {
		s += fmt.Sprintf(" %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, a := range w.Status.AdmissionChecks {
		s += fmt.Sprintf(" check %s=%s(%s)", a.Name, a.State, a.Message)
	}
	return s
}

// WaitForNodeReady waits until kwok reports the node Ready and the
// node-lifecycle controller has lifted the not-ready taint.
func (e *Env) WaitForNodeReady(t TB, name string) {
	t.Helper()
	e.Eventually(t, 60*time.Second, "node "+name+" ready", func() (bool, string) {
		var n corev1.Node
		if err := e.Client.Get(e.Ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return false, err.Error()
		}
		for _, tn := range n.Spec.Taints {
			if tn.Key == corev1.TaintNodeNotReady || tn.Key == corev1.TaintNodeUnreachable {
				return false, "taint " + tn.Key
			}
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, string(c.Status)
			}
		}
		return false, "no Ready condition"
	})
}

// CreateNode creates a fake node and waits until pods can land on it. With
// the scheduler stack running, kwok and the node-lifecycle controller make it
// Ready; without it, the not-ready taint the apiserver adds at creation is
// lifted here (the node's status already says Ready), as the controller would.
func (e *Env) CreateNode(t TB, n *corev1.Node) {
	t.Helper()
	e.MustCreate(t, n)
	if e.scheduling {
		e.WaitForNodeReady(t, n.Name)
		return
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur corev1.Node
		if err := e.Client.Get(e.Ctx, client.ObjectKey{Name: n.Name}, &cur); err != nil {
			return err
		}
		var keep []corev1.Taint
		for _, tn := range cur.Spec.Taints {
			if tn.Key != corev1.TaintNodeNotReady && tn.Key != corev1.TaintNodeUnreachable {
				keep = append(keep, tn)
			}
		}
		if len(keep) == len(cur.Spec.Taints) {
			return nil
		}
		cur.Spec.Taints = keep
		return e.Client.Update(e.Ctx, &cur)
	})
	if err != nil {
		t.Fatalf("lifting not-ready taint of %s: %v", n.Name, err)
	}
}

// SetKubelet takes a kwok node's fake kubelet away (up=false: nothing runs,
// confirms deletions or renews the node's lease any more, as when a node is
// lost) or gives it back.
func (e *Env) SetKubelet(t TB, node string, up bool) {
	t.Helper()
	var v any // JSON null removes the label
	if up {
		v = KwokNodeLabelValue
	}
	raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{KwokNodeLabel: v}}})
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := e.Client.Patch(e.Ctx, n, client.RawPatch(types.MergePatchType, raw)); err != nil {
		t.Fatalf("node %s kubelet up=%v: %v", node, up, err)
	}
}

// CounterSum adds up the samples of counter name in this process's
// controller-runtime metrics registry (what an in-process manager records)
// whose labels include match.
func CounterSum(name string, match map[string]string) (float64, error) {
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	sample:
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			for k, v := range match {
				if l[k] != v {
					continue sample
				}
			}
			n += m.GetCounter().GetValue()
		}
	}
	return n, nil
}

// AggregateClusterRole fills an aggregated ClusterRole's rules from the
// roles its aggregationRule selects, as kube-controller-manager's
// clusterrole aggregation controller does (these control planes run it
// only where a suite starts the controller manager), so `edit` is the
// real bootstrap role.
func (e *Env) AggregateClusterRole(t TB, name string) {
	t.Helper()
	role := &rbacv1.ClusterRole{}
	if err := e.Client.Get(e.Ctx, client.ObjectKey{Name: name}, role); err != nil {
		t.Fatalf("aggregating ClusterRole %s: %v", name, err)
	}
	var rules []rbacv1.PolicyRule
	for _, sel := range role.AggregationRule.ClusterRoleSelectors {
		s, err := metav1.LabelSelectorAsSelector(&sel)
		if err != nil {
			t.Fatalf("aggregating ClusterRole %s: %v", name, err)
		}
		var list rbacv1.ClusterRoleList
		if err := e.Client.List(e.Ctx, &list, client.MatchingLabelsSelector{Selector: s}); err != nil {
			t.Fatalf("aggregating ClusterRole %s: %v", name, err)
		}
		for _, r := range list.Items {
			rules = append(rules, r.Rules...)
		}
	}
	role.Rules = rules
	if err := e.Client.Update(e.Ctx, role); err != nil {
		t.Fatalf("aggregating ClusterRole %s: %v", name, err)
	}
}
