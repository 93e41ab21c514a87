package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// GPUPlan phases.
const (
	// PlanPlanned: capacity is reserved; pods are not all placed yet.
	PlanPlanned = "Planned"
	// PlanPlaced: every slot is bound to a pod.
	PlanPlaced = "Placed"
	// PlanReleased: the workload finished or was evicted; the plan no longer
	// reserves capacity (pods still present keep theirs through usage).
	PlanReleased = "Released"
)

// GPUAssignment is one GPU given to one pod.
type GPUAssignment struct {
	UUID string `json:"uuid"`
	// MemoryMiB reserved on this GPU (the whole allocatable when exclusive).
	MemoryMiB int64 `json:"memoryMiB"`
	// Cores is the SM percent reserved (100 when exclusive).
	// +optional
	Cores int32 `json:"cores,omitempty"`
	// +optional
	Exclusive bool `json:"exclusive,omitempty"`
}

// PodAssignment places one pod of a pod set.
type PodAssignment struct {
	PodSet string `json:"podSet"`
	Index  int32  `json:"index"`
	Node   string `json:"node"`
	// +listType=atomic
	GPUs []GPUAssignment `json:"gpus"`
}

// GPUPlanSpec is the durable decision of the gang-fit check: every pod of the
// workload → node → GPUs. It is the ledger a restarted manager rebuilds from.
type GPUPlanSpec struct {
	WorkloadName string    `json:"workloadName"`
	WorkloadUID  types.UID `json:"workloadUID,omitempty"`
	// Level is the node label key of the domain; empty when the whole cluster is one domain.
	// +optional
	Level string `json:"level,omitempty"`
	// Domain is the value of Level shared by every planned node.
	// +optional
	Domain string `json:"domain,omitempty"`
	// PodCount and GPUCount summarise Assignments for kubectl get.
	PodCount int32 `json:"podCount"`
	GPUCount int32 `json:"gpuCount"`
	// +listType=atomic
	Assignments []PodAssignment `json:"assignments"`
}

// SlotBinding records which pod took a slot, so a recreated pod of the same
// replica gets its slot back.
type SlotBinding struct {
	PodSet  string    `json:"podSet"`
	Index   int32     `json:"index"`
	PodName string    `json:"podName"`
	PodUID  types.UID `json:"podUID,omitempty"`
}

// GPUPlanStatus reports how far the plan got.
type GPUPlanStatus struct {
	// +optional
	Phase string `json:"phase,omitempty"`
	// +optional
	PlacedPods int32 `json:"placedPods,omitempty"`
	// +optional
	// +listType=atomic
	Bindings []SlotBinding `json:"bindings,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=gplan
// +kubebuilder:printcolumn:name="Workload",type=string,JSONPath=`.spec.workloadName`
// +kubebuilder:printcolumn:name="Domain",type=string,JSONPath=`.spec.domain`
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.spec.podCount`
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.spec.gpuCount`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// GPUPlan is the stored placement of one admitted Workload, owned by it.
type GPUPlan struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GPUPlanSpec   `json:"spec,omitempty"`
	Status GPUPlanStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// GPUPlanList is a list of GPUPlans.
type GPUPlanList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GPUPlan `json:"items"`
}

func init() {
	SchemeBuilder.Register(&GPUPlan{}, &GPUPlanList{})
}
