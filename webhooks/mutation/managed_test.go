package mutation

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNamespaceSelector: Kueue's managedJobsNamespaceSelector mirrored —
// its default (every namespace but kube-system and Kueue's), selectors
// that need the namespace's labels and ones the name decides, and a
// selector that cannot be parsed refused at start.
func TestNamespaceSelector(t *testing.T) {
	byName := func(op metav1.LabelSelectorOperator, v ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: corev1.LabelMetadataName, Operator: op, Values: v}}}
	}
	cases := []struct {
		name        string
		kueue       KueueConfig
		ns          string
		labels      map[string]string
		selected    bool
		needsLabels bool
	}{
		{"default: a tenant namespace", KueueConfig{}, "team-a", nil, true, false},
		{"default: kube-system", KueueConfig{}, "kube-system", nil, false, false},
		{"default: Kueue's namespace", KueueConfig{}, "kueue-system", nil, false, false},
		{"default follows kueue.namespace", KueueConfig{Namespace: "queues"}, "queues", nil, false, false},
		{"default with kueue.namespace set: kueue-system is a tenant's", KueueConfig{Namespace: "queues"}, "kueue-system", nil, true, false},
		{"by name, In", KueueConfig{ManagedJobsNamespaceSelector: byName(metav1.LabelSelectorOpIn, "team-a")}, "team-b", nil, false, false},
		{"a label a tenant cannot forge: the name label is the name", KueueConfig{ManagedJobsNamespaceSelector: byName(metav1.LabelSelectorOpIn, "team-a")}, "team-b",
			map[string]string{corev1.LabelMetadataName: "team-a"}, false, false},
		{"by label, selected", KueueConfig{ManagedJobsNamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kueue": "on"}}}, "x",
			map[string]string{"kueue": "on"}, true, true},
		{"by label, not selected", KueueConfig{ManagedJobsNamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kueue": "on"}}}, "x", nil, false, true},
		{"empty selector selects everything", KueueConfig{ManagedJobsNamespaceSelector: &metav1.LabelSelector{}}, "kube-system", nil, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(Config{Kueue: tc.kueue})
			if err != nil {
				t.Fatal(err)
			}
			if got := m.NamespaceSelected(tc.ns, tc.labels); got != tc.selected {
				t.Errorf("NamespaceSelected(%s, %v) = %v, want %v", tc.ns, tc.labels, got, tc.selected)
			}
			if got := m.NamespaceSelectorNeedsLabels(); got != tc.needsLabels {
				t.Errorf("NamespaceSelectorNeedsLabels = %v, want %v", got, tc.needsLabels)
			}
		})
	}
	_, err := New(Config{Kueue: KueueConfig{ManagedJobsNamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Near"}}}}})
	if err == nil || !strings.Contains(err.Error(), "kueue.managedJobsNamespaceSelector") {
		t.Fatalf("bad selector: %v", err)
	}
}
