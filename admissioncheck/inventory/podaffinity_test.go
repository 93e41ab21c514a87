package inventory

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

func hostAnti(sel *metav1.LabelSelector) corev1.PodAffinityTerm {
	return corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname, LabelSelector: sel}
}

func labelled(ps kueue.PodSet, labels map[string]string, anti ...corev1.PodAffinityTerm) kueue.PodSet {
	ps.Template.Labels = labels
	if len(anti) > 0 {
		ps.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: anti}}
	}
	return ps
}

func TestGangPodAntiAffinity(t *testing.T) {
	gpu := func(name string, n int32) kueue.PodSet {
		return podSet(name, n, nil, rl(v1alpha1.ResourceNvidiaGPU, 1))
	}
	app := map[string]string{"app": "infer"}
	selApp := &metav1.LabelSelector{MatchLabels: app}
	cases := []struct {
		name    string
		in      []kueue.PodSet
		want    map[string][]string // pod set → Apart
		wantErr string
		notPlan bool
	}{{
		name: "no affinity",
		in:   []kueue.PodSet{labelled(gpu("w", 2), app)},
		want: map[string][]string{"w": nil},
	}, {
		name: "one per node: its own labels",
		in:   []kueue.PodSet{labelled(gpu("w", 2), app, hostAnti(selApp))},
		want: map[string][]string{"w": {"w"}},
	}, {
		name: "selector of other pods only",
		in:   []kueue.PodSet{labelled(gpu("w", 2), app, hostAnti(&metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}))},
		want: map[string][]string{"w": nil},
	}, {
		name: "master kept from workers",
		in: []kueue.PodSet{
			labelled(gpu("master", 1), map[string]string{"role": "master"}, hostAnti(&metav1.LabelSelector{MatchLabels: map[string]string{"role": "worker"}})),
			labelled(gpu("worker", 3), map[string]string{"role": "worker"})},
		want: map[string][]string{"master": {"worker"}, "worker": nil},
	}, {
		// The job controller adds the replica index later: a selector on it
		// may hold, so the pods are kept apart (safe side).
		name: "a key the template lacks may be added to the pods",
		in: []kueue.PodSet{labelled(gpu("w", 2), app, hostAnti(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "training.kubeflow.org/replica-index", Operator: metav1.LabelSelectorOpIn, Values: []string{"0"}}}}))},
		want: map[string][]string{"w": {"w"}},
	}, {
		name: "another namespace only",
		in:   []kueue.PodSet{labelled(gpu("w", 2), app, corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname, LabelSelector: selApp, Namespaces: []string{"other"}})},
		want: map[string][]string{"w": nil},
	}, {
		name: "a namespace selector may select ours",
		in: []kueue.PodSet{labelled(gpu("w", 2), app, corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname, LabelSelector: selApp,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}})},
		want: map[string][]string{"w": {"w"}},
	}, {
		name: "nil labelSelector selects nothing",
		in:   []kueue.PodSet{labelled(gpu("w", 2), app, hostAnti(nil))},
		want: map[string][]string{"w": nil},
	}, {
		name: "matchLabelKeys with the template's value",
		in: []kueue.PodSet{labelled(gpu("w", 2), map[string]string{"app": "infer", "rev": "1"},
			corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname, LabelSelector: selApp, MatchLabelKeys: []string{"rev"}})},
		want: map[string][]string{"w": {"w"}},
	}, {
		name: "mismatchLabelKeys: pods of one revision do not repel each other",
		in: []kueue.PodSet{labelled(gpu("w", 2), map[string]string{"app": "infer", "rev": "1"},
			corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname, LabelSelector: selApp, MismatchLabelKeys: []string{"rev"}})},
		want: map[string][]string{"w": nil},
	}, {
		name:    "zone anti-affinity is not planned",
		in:      []kueue.PodSet{labelled(gpu("w", 2), app, corev1.PodAffinityTerm{TopologyKey: "topology.kubernetes.io/zone", LabelSelector: selApp})},
		wantErr: `required pod anti-affinity with topologyKey "topology.kubernetes.io/zone" is not planned by gang-fit`,
		notPlan: true,
	}, {
		name: "required pod affinity is not planned",
		in: func() []kueue.PodSet {
			ps := labelled(gpu("w", 2), app)
			ps.Template.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{hostAnti(selApp)}}}
			return []kueue.PodSet{ps}
		}(),
		wantErr: "required pod affinity is not planned by gang-fit",
		notPlan: true,
	}, {
		name: "a bad selector is a clear error",
		in: []kueue.PodSet{labelled(gpu("w", 2), app, hostAnti(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: "Near"}}}))},
		wantErr: "bad labelSelector",
	}, {
		name: "pod sets without GPUs are not read",
		in: []kueue.PodSet{labelled(podSet("launcher", 1, nil), app, corev1.PodAffinityTerm{TopologyKey: "zone", LabelSelector: selApp}),
			labelled(gpu("w", 2), app)},
		want: map[string][]string{"w": nil},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, aff, err := GangFromPodSets("ns", tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if errors.Is(err, ErrNotPlanned) != tc.notPlan {
					t.Errorf("errors.Is(ErrNotPlanned) = %v, want %v", !tc.notPlan, tc.notPlan)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for _, ps := range g.PodSets {
				got[ps.Name] = ps.Apart
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("Apart (-want +got):\n%s", d)
			}
			if len(aff) != len(g.PodSets) {
				t.Errorf("%d pod affinities for %d pod sets", len(aff), len(g.PodSets))
			}
		})
	}
}

// A running pod's labels are its own (exact); a template's may grow.
func TestAntiMayMatchExactAndTemplate(t *testing.T) {
	terms := []corev1.PodAffinityTerm{hostAnti(&metav1.LabelSelector{MatchLabels: map[string]string{"app": "infer", "idx": "0"}})}
	pod := map[string]string{"app": "infer"}
	if AntiMayMatch(terms, "ns", nil, "ns", pod, true) {
		t.Error("a running pod without idx=0 matched")
	}
	if !AntiMayMatch(terms, "ns", nil, "ns", pod, false) {
		t.Error("a template without idx did not match (its pods may get idx=0)")
	}
	if AntiMayMatch(terms, "ns", nil, "ns", map[string]string{"app": "infer", "idx": "1"}, false) {
		t.Error("a template with idx=1 matched")
	}
	if AntiMayMatch(terms, "ns", nil, "other", map[string]string{"app": "infer", "idx": "0"}, true) {
		t.Error("a pod of another namespace matched a term without namespaces")
	}
	all := []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{}, NamespaceSelector: &metav1.LabelSelector{}}}
	if !AntiMayMatch(all, "ns", nil, "other", nil, true) {
		t.Error("empty selectors did not match every pod of every namespace")
	}
}

// FuzzParsePodAffinity: the plan's record never panics the reader, and
// what FormatPodAffinity writes reads back the same.
func FuzzParsePodAffinity(f *testing.F) {
	for _, s := range []string{
		"",
		`{"main":{"labels":{"app":"infer"}}}`,
		`{"w":{"labels":{"app":"ring"},"anti":[{"topologyKey":"kubernetes.io/hostname","labelSelector":{"matchLabels":{"app":"ring"}}}]}}`,
		`{"w":{"anti":[{"topologyKey":"zone","labelSelector":{"matchExpressions":[{"key":"a","operator":"In","values":["x"]}]},"namespaceSelector":{}}]}}`,
		`[]`, `{"w":null}`, `{"w":{"labels":7}}`, `{`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParsePodAffinity(s)
		if err != nil {
			return
		}
		var aff []PodAffinity
		for name, pp := range got {
			aff = append(aff, PodAffinity{PodSet: name, Labels: pp.Labels, Anti: pp.Anti})
		}
		again, err := ParsePodAffinity(FormatPodAffinity(aff))
		if err != nil {
			t.Fatalf("re-reading what was written: %v", err)
		}
		for name, pp := range again {
			if len(pp.Labels) != len(got[name].Labels) || len(pp.Anti) != len(got[name].Anti) {
				t.Fatalf("pod set %s: %+v, then %+v", name, got[name], pp)
			}
		}
	})
}
