package fitcli

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/yaml"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// documents splits a file into its YAML documents and decodes each item of
// a List (kubectl get -o yaml) as its own object.
func documents(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for _, doc := range docSep.Split(string(data), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var head struct {
			metav1.TypeMeta `json:",inline"`
			Items           []any `json:"items"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, fmt.Errorf("%s: not YAML: %v", path, err)
		}
		if strings.HasSuffix(head.Kind, "List") || (head.Kind == "" && head.Items != nil) {
			for _, it := range head.Items {
				b, err := yaml.Marshal(it)
				if err != nil {
					return nil, fmt.Errorf("%s: %v", path, err)
				}
				out = append(out, b)
			}
			continue
		}
		out = append(out, []byte(doc))
	}
	return out, nil
}

func kindOf(doc []byte) (metav1.TypeMeta, error) {
	var tm metav1.TypeMeta
	err := yaml.Unmarshal(doc, &tm)
	return tm, err
}

func loadNodes(path string) ([]corev1.Node, error) {
	docs, err := documents(path)
	if err != nil {
		return nil, err
	}
	var nodes []corev1.Node
	for i, d := range docs {
		tm, err := kindOf(d)
		if err != nil {
			return nil, fmt.Errorf("%s: item %d: %v", path, i, err)
		}
		if tm.Kind != "Node" {
			return nil, fmt.Errorf("%s: item %d is a %q, want Node (a NodeList from kubectl get nodes -o yaml)", path, i, tm.Kind)
		}
		var n corev1.Node
		if err := yaml.Unmarshal(d, &n); err != nil {
			return nil, fmt.Errorf("%s: item %d: %v", path, i, err)
		}
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("%s: no nodes", path)
	}
	return nodes, nil
}

func loadPods(path string) ([]corev1.Pod, error) {
	docs, err := documents(path)
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for i, d := range docs {
		tm, err := kindOf(d)
		if err != nil {
			return nil, fmt.Errorf("%s: item %d: %v", path, i, err)
		}
		if tm.Kind != "Pod" {
			return nil, fmt.Errorf("%s: item %d is a %q, want Pod (a PodList from kubectl get pods -A -o yaml)", path, i, tm.Kind)
		}
		var p corev1.Pod
		if err := yaml.Unmarshal(d, &p); err != nil {
			return nil, fmt.Errorf("%s: item %d: %v", path, i, err)
		}
		pods = append(pods, p)
	}
	return pods, nil
}

func loadPlans(path string) ([]v1alpha1.GPUPlan, error) {
	docs, err := documents(path)
	if err != nil {
		return nil, err
	}
	var plans []v1alpha1.GPUPlan
	for i, d := range docs {
		tm, err := kindOf(d)
		if err != nil {
			return nil, fmt.Errorf("%s: item %d: %v", path, i, err)
		}
		if tm.Kind != "GPUPlan" {
			return nil, fmt.Errorf("%s: item %d is a %q, want GPUPlan (a GPUPlanList from kubectl get gpuplans -A -o yaml)", path, i, tm.Kind)
		}
		var p v1alpha1.GPUPlan
		if err := yaml.UnmarshalStrict(d, &p); err != nil {
			return nil, fmt.Errorf("%s: item %d: %v", path, i, err)
		}
		plans = append(plans, p)
	}
	return plans, nil
}

func loadParams(path string) (*v1alpha1.GangFitParameters, error) {
	docs, err := documents(path)
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 {
		return nil, fmt.Errorf("%s: want one GangFitParameters object, found %d documents", path, len(docs))
	}
	tm, err := kindOf(docs[0])
	if err != nil || tm.Kind != "GangFitParameters" {
		return nil, fmt.Errorf("%s: want kind GangFitParameters, found %q", path, tm.Kind)
	}
	var p v1alpha1.GangFitParameters
	if err := yaml.UnmarshalStrict(docs[0], &p); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return &p, nil
}

// workload is what the CLI needs of FILE.yaml.
type workload struct {
	kind        string
	name        string
	namespace   string // "default" when the file names none
	annotations map[string]string
	podSets     []kueue.PodSet
}

// loadWorkload reads a Kueue Workload, a PyTorchJob or a batch Job and turns
// jobs into pod sets as Kueue's integrations do: a PyTorchJob has one pod set
// per replica type (lowercase name, count = replicas), a Job one pod set
// "main" of min(parallelism, completions) pods. A raw job's request annotations are merged
// into each template (the template's own win), as the webhook reads them.
func loadWorkload(path string) (*workload, error) {
	docs, err := documents(path)
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 {
		return nil, fmt.Errorf("%s: want one workload object, found %d documents", path, len(docs))
	}
	doc := docs[0]
	tm, err := kindOf(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	group := tm.GroupVersionKind().Group
	switch {
	case tm.Kind == "Workload" && group == "kueue.x-k8s.io":
		var w kueue.Workload
		if err := yaml.Unmarshal(doc, &w); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		return &workload{kind: "Workload", name: w.Name, namespace: orDefault(w.Namespace), annotations: w.Annotations, podSets: w.Spec.PodSets}, nil
	case tm.Kind == "PyTorchJob" && group == "kubeflow.org":
		var j kubeflowv1.PyTorchJob
		if err := yaml.Unmarshal(doc, &j); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		types := make([]string, 0, len(j.Spec.PyTorchReplicaSpecs))
		for rt := range j.Spec.PyTorchReplicaSpecs {
			types = append(types, string(rt))
		}
		// Master first, as Kueue's integration orders them.
		slices.SortFunc(types, func(a, b string) int {
			if (a == string(kubeflowv1.PyTorchJobReplicaTypeMaster)) != (b == string(kubeflowv1.PyTorchJobReplicaTypeMaster)) {
				if a == string(kubeflowv1.PyTorchJobReplicaTypeMaster) {
					return -1
				}
				return 1
			}
			return strings.Compare(a, b)
		})
		w := &workload{kind: "PyTorchJob", name: j.Name, namespace: orDefault(j.Namespace), annotations: j.Annotations}
		for _, rt := range types {
			rs := j.Spec.PyTorchReplicaSpecs[kubeflowv1.ReplicaType(rt)]
			if rs == nil {
				continue
			}
			count := int32(1)
			if rs.Replicas != nil {
				count = *rs.Replicas
			}
			w.podSets = append(w.podSets, kueue.PodSet{Name: kueue.PodSetReference(strings.ToLower(rt)), Count: count,
				Template: withJobAnnotations(rs.Template, j.Annotations)})
		}
		if len(w.podSets) == 0 {
			return nil, fmt.Errorf("%s: PyTorchJob %s has no pytorchReplicaSpecs", path, j.Name)
		}
		return w, nil
	case tm.Kind == "Job" && group == "batch":
		var j batchv1.Job
		if err := yaml.Unmarshal(doc, &j); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		// As Kueue counts a Job: parallelism, but no more than completions.
		count := int32(1)
		if j.Spec.Parallelism != nil {
			count = *j.Spec.Parallelism
		}
		if j.Spec.Completions != nil && *j.Spec.Completions < count {
			count = *j.Spec.Completions
		}
		return &workload{kind: "Job", name: j.Name, namespace: orDefault(j.Namespace), annotations: j.Annotations, podSets: []kueue.PodSet{
			{Name: kueue.DefaultPodSetName, Count: count, Template: withJobAnnotations(j.Spec.Template, j.Annotations)},
		}}, nil
	}
	return nil, fmt.Errorf("%s: %s %q is not supported; want a Kueue Workload, a kubeflow.org PyTorchJob or a batch Job", path, tm.APIVersion, tm.Kind)
}

// withJobAnnotations copies the job's request annotations into a template
// as defaults: memory and cores separately, each only when the template does
// not name it in any form itself.
func withJobAnnotations(t corev1.PodTemplateSpec, job map[string]string) corev1.PodTemplateSpec {
	t = *t.DeepCopy()
	groups := [][]string{
		{v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage},
		{v1alpha1.AnnotationGPUCores, v1alpha1.AnnotationHAMiGPUCores},
	}
	for _, keys := range groups {
		if slices.ContainsFunc(keys, func(k string) bool { _, ok := t.Annotations[k]; return ok }) {
			continue
		}
		for _, k := range keys {
			if v, ok := job[k]; ok {
				if t.Annotations == nil {
					t.Annotations = map[string]string{}
				}
				t.Annotations[k] = v
			}
		}
	}
	return t
}

// orDefault is a namespace as kubectl reads a file without one.
func orDefault(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}
