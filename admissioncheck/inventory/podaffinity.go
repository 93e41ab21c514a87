package inventory

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
)

// ErrNotPlanned marks a request the check reads but does not plan (a pod
// affinity rule it cannot honour); the check refuses it, saying which.
var ErrNotPlanned = errors.New("not planned by gang-fit")

// PodAffinity is what pod anti-affinity needs to know of one pod set's
// pods: where they run, what labels their template gives them, and their
// required anti-affinity terms (all with topologyKey kubernetes.io/hostname:
// others are refused).
type PodAffinity struct {
	PodSet    string
	Namespace string
	Labels    map[string]string
	Anti      []corev1.PodAffinityTerm
}

// Running is a pod already bound to a node, as pod anti-affinity sees it.
type Running struct {
	Namespace string
	Labels    map[string]string
	Node      string
	// Anti are its required anti-affinity terms (any topologyKey).
	Anti []corev1.PodAffinityTerm
}

// podAffinities reads the GPU pod sets' required pod (anti-)affinity and
// sets Apart on g's pod sets. Only what the plan can honour is accepted:
// required anti-affinity with topologyKey kubernetes.io/hostname (the
// plan puts pods kept apart on different nodes). Required pod affinity, or
// anti-affinity over another topology key, would make the scheduler refuse
// some plans; they are refused here (ErrNotPlanned) rather than planned
// wrongly. Preferred terms never keep a pod off a node and are ignored.
func podAffinities(ns string, podSets []kueue.PodSet, g *fit.Gang) ([]PodAffinity, error) {
	byName := map[string]*kueue.PodSet{}
	for i := range podSets {
		byName[string(podSets[i].Name)] = &podSets[i]
	}
	var out []PodAffinity
	for _, ps := range g.PodSets {
		t := &byName[ps.Name].Template
		pa := PodAffinity{PodSet: ps.Name, Namespace: ns, Labels: t.Labels}
		if a := t.Spec.Affinity; a != nil {
			if a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
				return nil, fmt.Errorf("pod set %s: required pod affinity is %w (the plan pins each pod to a node without regard to where the pods it must join run); use a topology level (gpupack.io/gang-topology) to keep the gang together", ps.Name, ErrNotPlanned)
			}
			if a.PodAntiAffinity != nil {
				for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
					if term.TopologyKey != corev1.LabelHostname {
						return nil, fmt.Errorf("pod set %s: required pod anti-affinity with topologyKey %q is %w (only %s: one pod per node)", ps.Name, term.TopologyKey, ErrNotPlanned, corev1.LabelHostname)
					}
					if _, err := metav1.LabelSelectorAsSelector(term.LabelSelector); err != nil {
						return nil, fmt.Errorf("pod set %s: required pod anti-affinity: bad labelSelector: %v", ps.Name, err)
					}
					if _, err := metav1.LabelSelectorAsSelector(term.NamespaceSelector); err != nil {
						return nil, fmt.Errorf("pod set %s: required pod anti-affinity: bad namespaceSelector: %v", ps.Name, err)
					}
					pa.Anti = append(pa.Anti, term)
				}
			}
		}
		out = append(out, pa)
	}
	for i := range g.PodSets {
		for j := range g.PodSets {
			// Each direction is one term of one pod against the other's labels;
			// the engine reads Apart as symmetric.
			if AntiMayMatch(out[i].Anti, ns, out[i].Labels, ns, out[j].Labels, false) {
				g.PodSets[i].Apart = append(g.PodSets[i].Apart, g.PodSets[j].Name)
			}
		}
	}
	return out, nil
}

// AntiMayMatch reports whether some term of terms, written on a pod of
// namespace ownerNS with labels ownerLabels, may select a pod of namespace
// podNS with labels podLabels — the one rule pod anti-affinity is read by,
// for the gang's pods among themselves, against running pods, and for
// running pods' terms against the gang. exact: podLabels are the pod's own
// (a running pod); otherwise they are a template's, and controllers add
// labels to pods (job-name, replica index, …), so a requirement on a key the
// template does not have may still hold: it is taken to. A
// namespaceSelector other than {} may select any namespace (namespace
// labels are not read). Every doubt reads as "may match": kept apart, never
// placed where the scheduler could refuse.
func AntiMayMatch(terms []corev1.PodAffinityTerm, ownerNS string, ownerLabels map[string]string, podNS string, podLabels map[string]string, exact bool) bool {
	for i := range terms {
		if termMayMatch(&terms[i], ownerNS, ownerLabels, podNS, podLabels, exact) {
			return true
		}
	}
	return false
}

func termMayMatch(t *corev1.PodAffinityTerm, ownerNS string, ownerLabels map[string]string, podNS string, podLabels map[string]string, exact bool) bool {
	inNS := false
	switch {
	case len(t.Namespaces) == 0 && t.NamespaceSelector == nil:
		inNS = podNS == ownerNS
	case slices.Contains(t.Namespaces, podNS):
		inNS = true
	case t.NamespaceSelector != nil:
		inNS = true // {} selects every namespace; any other may select podNS
	}
	if !inNS {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
	if err != nil {
		return true // validated on the gang's side; a running pod's was validated by the apiserver
	}
	reqs, selectable := sel.Requirements()
	if !selectable {
		return false // a nil labelSelector selects no pod
	}
	// matchLabelKeys / mismatchLabelKeys: the apiserver merges them into the
	// labelSelector of a pod it creates; a template has them still apart.
	for _, k := range t.MatchLabelKeys {
		if v, ok := ownerLabels[k]; ok && !exactMerged(t, k) {
			if r, err := labels.NewRequirement(k, selection.In, []string{v}); err == nil {
				reqs = append(reqs, *r)
			}
		}
	}
	for _, k := range t.MismatchLabelKeys {
		if v, ok := ownerLabels[k]; ok && !exactMerged(t, k) {
			if r, err := labels.NewRequirement(k, selection.NotIn, []string{v}); err == nil {
				reqs = append(reqs, *r)
			}
		}
	}
	set := labels.Set(podLabels)
	for _, r := range reqs {
		if !exact && !set.Has(r.Key()) {
			continue // the pod may get this label later
		}
		if !r.Matches(set) {
			return false
		}
	}
	return true
}

// exactMerged: the labelSelector already holds a requirement on k (the
// apiserver merged matchLabelKeys into it).
func exactMerged(t *corev1.PodAffinityTerm, k string) bool {
	if t.LabelSelector == nil {
		return false
	}
	if _, ok := t.LabelSelector.MatchLabels[k]; ok {
		return true
	}
	return slices.ContainsFunc(t.LabelSelector.MatchExpressions, func(e metav1.LabelSelectorRequirement) bool { return e.Key == k })
}

// PlanPods is what a GPUPlan records of one pod set's pods
// (v1alpha1.AnnotationPodAffinity).
type PlanPods struct {
	Labels map[string]string        `json:"labels,omitempty"`
	Anti   []corev1.PodAffinityTerm `json:"anti,omitempty"`
}

// FormatPodAffinity renders the pod sets' labels and terms for a GPUPlan;
// "" when no pod set has either.
func FormatPodAffinity(aff []PodAffinity) string {
	out := map[string]PlanPods{}
	for _, a := range aff {
		if len(a.Labels) > 0 || len(a.Anti) > 0 {
			out[a.PodSet] = PlanPods{Labels: a.Labels, Anti: a.Anti}
		}
	}
	if len(out) == 0 {
		return ""
	}
	b, err := json.Marshal(out)
	if err != nil {
		return ""
	}
	return string(b)
}

// ParsePodAffinity reads AnnotationPodAffinity ("" is none).
func ParsePodAffinity(s string) (map[string]PlanPods, error) {
	if s == "" {
		return nil, nil
	}
	var out map[string]PlanPods
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, fmt.Errorf("%s: %w", v1alpha1.AnnotationPodAffinity, err)
	}
	return out, nil
}
