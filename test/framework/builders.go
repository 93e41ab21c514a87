package framework

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// GPU models for test nodes (NVML names; physical MiB from flavors profiles).
const (
	H100 = "NVIDIA H100 80GB HBM3"
	H200 = "NVIDIA H200"
	A100 = "NVIDIA A100-SXM4-80GB"
)

// Label keys of a 3-level test topology.
const (
	LabelSpine = "network.topology.nvidia.com/spine"
	LabelLeaf  = "network.topology.nvidia.com/leaf"
	LabelRack  = "topology.gpupack.io/rack"
)

// kwok manages (plays the kubelet of) the nodes with this label.
const (
	KwokNodeLabel      = "type"
	KwokNodeLabelValue = "kwok"
)

// NodeWrapper builds a fake GPU node managed by kwok.
type NodeWrapper struct{ corev1.Node }

// MakeNode starts a Ready, kwok-managed node with CPU and memory.
func MakeNode(name string) *NodeWrapper {
	return &NodeWrapper{corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{corev1.LabelHostname: name, KwokNodeLabel: KwokNodeLabelValue},
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "kwok.x-k8s.io/node", Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("128"), corev1.ResourceMemory: resource.MustParse("1Ti"), corev1.ResourcePods: resource.MustParse("256")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("128"), corev1.ResourceMemory: resource.MustParse("1Ti"), corev1.ResourcePods: resource.MustParse("256")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		},
	}}
}

// GPUs gives the node n GPUs of a model: the gpupack.io/gpus inventory
// annotation, the product label, and capacity for nvidia.com/gpu and the
// gpupack.io/* resources (allocatable MiB by the default buffer).
func (w *NodeWrapper) GPUs(n int, model string) *NodeWrapper {
	p, ok := flavors.Lookup(model)
	if !ok {
		panic("unknown GPU model " + model)
	}
	gpus := make([]v1alpha1.GPUInfo, n)
	for i := range gpus {
		gpus[i] = v1alpha1.GPUInfo{UUID: fmt.Sprintf("GPU-%s-%d", w.Name, i), Index: i, Model: p.Model,
			MemoryMiB: p.MemoryMiB, SMCount: p.SMCount, NVLinkDomain: w.Name, NUMA: i * 2 / max(n, 1), Health: v1alpha1.GPUHealthy}
	}
	return w.Inventory(gpus)
}

// Inventory sets an explicit GPU inventory.
func (w *NodeWrapper) Inventory(gpus []v1alpha1.GPUInfo) *NodeWrapper {
	w.Annotations[v1alpha1.AnnotationGPUs] = v1alpha1.FormatGPUs(gpus)
	var mem int64
	for _, g := range gpus {
		mem += flavors.Allocatable(g.MemoryMiB)
	}
	n := int64(len(gpus))
	if n > 0 {
		w.Labels["nvidia.com/gpu.product"] = sanitizeLabel(gpus[0].Model)
		w.Labels[v1alpha1.LabelNVLinkDomain] = w.Name
	}
	for _, rl := range []corev1.ResourceList{w.Status.Capacity, w.Status.Allocatable} {
		rl[v1alpha1.ResourceNvidiaGPU] = *resource.NewQuantity(n, resource.DecimalSI)
		rl[v1alpha1.ResourceVGPU] = *resource.NewQuantity(n*4, resource.DecimalSI)
		rl[v1alpha1.ResourceGPUMemory] = *resource.NewQuantity(mem, resource.DecimalSI)
		rl[v1alpha1.ResourceGPUCores] = *resource.NewQuantity(n*100, resource.DecimalSI)
	}
	return w
}

func sanitizeLabel(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	return string(b)
}

// Label sets a node label.
func (w *NodeWrapper) Label(k, v string) *NodeWrapper { w.Labels[k] = v; return w }

// Taint adds a taint.
func (w *NodeWrapper) Taint(t corev1.Taint) *NodeWrapper {
	w.Spec.Taints = append(w.Spec.Taints, t)
	return w
}

// Unschedulable cordons the node.
func (w *NodeWrapper) Unschedulable() *NodeWrapper { w.Spec.Unschedulable = true; return w }

// Obj returns the node.
func (w *NodeWrapper) Obj() *corev1.Node { return &w.Node }

// KwokToleration lets pods land on kwok's fake nodes.
var KwokToleration = corev1.Toleration{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}

// MakeResourceFlavor builds a ResourceFlavor.
func MakeResourceFlavor(name string) *kueue.ResourceFlavor {
	return &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// ClusterQueueWrapper builds a ClusterQueue.
type ClusterQueueWrapper struct{ kueue.ClusterQueue }

// MakeClusterQueue starts a ClusterQueue open to every namespace.
func MakeClusterQueue(name string) *ClusterQueueWrapper {
	return &ClusterQueueWrapper{kueue.ClusterQueue{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       kueue.ClusterQueueSpec{NamespaceSelector: &metav1.LabelSelector{}},
	}}
}

// Quota is a nominal quota of one resource.
type Quota struct {
	Resource corev1.ResourceName
	Nominal  string
}

// Flavor adds a flavor with quotas to a resource group covering exactly those
// resources (one resource group per call).
func (w *ClusterQueueWrapper) Flavor(flavor string, quotas ...Quota) *ClusterQueueWrapper {
	rg := kueue.ResourceGroup{}
	fq := kueue.FlavorQuotas{Name: kueue.ResourceFlavorReference(flavor)}
	for _, q := range quotas {
		rg.CoveredResources = append(rg.CoveredResources, q.Resource)
		fq.Resources = append(fq.Resources, kueue.ResourceQuota{Name: q.Resource, NominalQuota: resource.MustParse(q.Nominal)})
	}
	rg.Flavors = []kueue.FlavorQuotas{fq}
	w.Spec.ResourceGroups = append(w.Spec.ResourceGroups, rg)
	return w
}

// GPUFlavor adds the usual GPU resource group: cpu, memory, nvidia.com/gpu
// and the three gpupack.io resources, for gpus GPUs of a model.
func (w *ClusterQueueWrapper) GPUFlavor(flavor string, gpus int64, model string) *ClusterQueueWrapper {
	p, _ := flavors.Lookup(model)
	return w.Flavor(flavor,
		Quota{corev1.ResourceCPU, "10000"}, Quota{corev1.ResourceMemory, "100Ti"},
		Quota{v1alpha1.ResourceNvidiaGPU, fmt.Sprint(gpus)},
		Quota{v1alpha1.ResourceVGPU, fmt.Sprint(gpus * 4)},
		Quota{v1alpha1.ResourceGPUMemory, fmt.Sprint(flavors.DefaultBuffer().GPUMemoryQuotaMiB(p.MemoryMiB, gpus))},
		Quota{v1alpha1.ResourceGPUCores, fmt.Sprint(gpus * 100)},
	)
}

// AdmissionChecks names admission checks (v1beta2: through the strategy).
func (w *ClusterQueueWrapper) AdmissionChecks(names ...string) *ClusterQueueWrapper {
	s := &kueue.AdmissionChecksStrategy{}
	for _, n := range names {
		s.AdmissionChecks = append(s.AdmissionChecks, kueue.AdmissionCheckStrategyRule{Name: kueue.AdmissionCheckReference(n)})
	}
	w.Spec.AdmissionChecksStrategy = s
	return w
}

// Cohort puts the queue in a cohort.
func (w *ClusterQueueWrapper) Cohort(c string) *ClusterQueueWrapper {
	w.Spec.CohortName = kueue.CohortReference(c)
	return w
}

// Preemption sets the within-queue and cohort preemption policies.
func (w *ClusterQueueWrapper) Preemption(p kueue.ClusterQueuePreemption) *ClusterQueueWrapper {
	w.Spec.Preemption = &p
	return w
}

// Obj returns the ClusterQueue.
func (w *ClusterQueueWrapper) Obj() *kueue.ClusterQueue { return &w.ClusterQueue }

// MakeLocalQueue builds a LocalQueue pointing at a ClusterQueue.
func MakeLocalQueue(name, ns, cq string) *kueue.LocalQueue {
	return &kueue.LocalQueue{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: kueue.LocalQueueSpec{ClusterQueue: kueue.ClusterQueueReference(cq)}}
}

// MakeGangFitCheck builds the AdmissionCheck for gpupack's controller,
// with parameters when params is not empty.
func MakeGangFitCheck(name, params string) *kueue.AdmissionCheck {
	ac := &kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kueue.AdmissionCheckSpec{ControllerName: v1alpha1.ControllerName}}
	if params != "" {
		ac.Spec.Parameters = &kueue.AdmissionCheckParametersReference{APIGroup: v1alpha1.GroupName, Kind: "GangFitParameters", Name: params}
	}
	return ac
}

// PyTorchJobWrapper builds a kubeflow.org/v1 PyTorchJob.
type PyTorchJobWrapper struct{ kftraining.PyTorchJob }

// MakePyTorchJob starts a PyTorchJob in a LocalQueue with one master and the
// given workers, each asking for gpusPerPod GPUs (0 = none).
func MakePyTorchJob(name, ns, queue string, workers int32, gpusPerPod int64) *PyTorchJobWrapper {
	w := &PyTorchJobWrapper{kftraining.PyTorchJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": queue}, Annotations: map[string]string{}},
		Spec: kftraining.PyTorchJobSpec{
			RunPolicy: kftraining.RunPolicy{Suspend: ptr.To(true)},
			PyTorchReplicaSpecs: map[kftraining.ReplicaType]*kftraining.ReplicaSpec{
				kftraining.PyTorchJobReplicaTypeMaster: {Replicas: ptr.To[int32](1), RestartPolicy: kftraining.RestartPolicyOnFailure, Template: podTemplate(gpusPerPod)},
			},
		},
	}}
	if workers > 0 {
		w.Spec.PyTorchReplicaSpecs[kftraining.PyTorchJobReplicaTypeWorker] = &kftraining.ReplicaSpec{Replicas: ptr.To(workers), RestartPolicy: kftraining.RestartPolicyOnFailure, Template: podTemplate(gpusPerPod)}
	}
	return w
}

// WorkersOnly drops the master (a gang of N identical workers).
func (w *PyTorchJobWrapper) WorkersOnly() *PyTorchJobWrapper {
	delete(w.Spec.PyTorchReplicaSpecs, kftraining.PyTorchJobReplicaTypeMaster)
	return w
}

// Annotation sets a job-level annotation.
func (w *PyTorchJobWrapper) Annotation(k, v string) *PyTorchJobWrapper {
	w.Annotations[k] = v
	return w
}

// TemplateAnnotation sets an annotation on every replica template.
func (w *PyTorchJobWrapper) TemplateAnnotation(k, v string) *PyTorchJobWrapper {
	for _, rs := range w.Spec.PyTorchReplicaSpecs {
		if rs.Template.Annotations == nil {
			rs.Template.Annotations = map[string]string{}
		}
		rs.Template.Annotations[k] = v
	}
	return w
}

// PriorityClass sets the Kueue workload priority class label.
func (w *PyTorchJobWrapper) PriorityClass(name string) *PyTorchJobWrapper {
	w.Labels["kueue.x-k8s.io/priority-class"] = name
	return w
}

// Obj returns the PyTorchJob.
func (w *PyTorchJobWrapper) Obj() *kftraining.PyTorchJob { return &w.PyTorchJob }

func podTemplate(gpus int64) corev1.PodTemplateSpec {
	c := corev1.Container{Name: "pytorch", Image: "pytorch/pytorch:test",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}
	if gpus > 0 {
		q := *resource.NewQuantity(gpus, resource.DecimalSI)
		c.Resources.Limits = corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: q}
		c.Resources.Requests[v1alpha1.ResourceNvidiaGPU] = q
	}
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{c}, Tolerations: []corev1.Toleration{KwokToleration}}}
}

// JobWrapper builds a batch/v1 Job.
type JobWrapper struct{ batchv1.Job }

// MakeJob starts a suspended Job of parallelism pods in a LocalQueue, each
// asking for gpusPerPod GPUs (0 = none).
func MakeJob(name, ns, queue string, parallelism int32, gpusPerPod int64) *JobWrapper {
	return &JobWrapper{batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": queue}, Annotations: map[string]string{}},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(parallelism), Completions: ptr.To(parallelism),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Suspend:        ptr.To(true),
			Template: func() corev1.PodTemplateSpec {
				t := podTemplate(gpusPerPod)
				t.Spec.RestartPolicy = corev1.RestartPolicyNever
				return t
			}(),
		},
	}}
}

// TemplateAnnotation sets a pod template annotation.
func (w *JobWrapper) TemplateAnnotation(k, v string) *JobWrapper {
	if w.Spec.Template.Annotations == nil {
		w.Spec.Template.Annotations = map[string]string{}
	}
	w.Spec.Template.Annotations[k] = v
	return w
}

// Obj returns the Job.
func (w *JobWrapper) Obj() *batchv1.Job { return &w.Job }
