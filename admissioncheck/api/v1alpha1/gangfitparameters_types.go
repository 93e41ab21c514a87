package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Fit policies for choosing among feasible domains.
const (
	// PolicyBestFit picks the feasible domain with the least free capacity
	// left after placing the gang (binpack), keeping large domains whole.
	PolicyBestFit = "BestFit"
	// PolicyWorstFit picks the domain with the most free capacity left (spread).
	PolicyWorstFit = "WorstFit"
)

// GangFitParametersSpec configures the gpupack.io/gang-fit admission check.
// +kubebuilder:validation:XValidation:rule="!has(self.requiredLevel) || self.requiredLevel == ” || !has(self.topologyLevels) || size(self.topologyLevels) == 0 || self.requiredLevel in self.topologyLevels || self.requiredLevel == 'kubernetes.io/hostname'",message="requiredLevel must be one of topologyLevels (or kubernetes.io/hostname)"
type GangFitParametersSpec struct {
	// TopologyLevels are node label keys ordered from the broadest domain to
	// the narrowest (e.g. spine, leaf, gpupack.io/nvlink-domain).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=316
	// +kubebuilder:validation:XValidation:rule="self.all(x, self.exists_one(y, x == y))",message="topologyLevels must not repeat a label key"
	TopologyLevels []string `json:"topologyLevels,omitempty"`

	// RequiredLevel is the node label key every pod of a gang must share one
	// value of. Jobs may override it with the gpupack.io/gang-topology
	// annotation. Empty: the whole cluster is one domain.
	// +optional
	// +kubebuilder:validation:MaxLength=316
	RequiredLevel string `json:"requiredLevel,omitempty"`

	// Buffer is the per-GPU memory safety buffer.
	// +optional
	Buffer BufferSettings `json:"buffer,omitempty"`

	// Search bounds the fit engine's work per decision.
	// +optional
	Search SearchBounds `json:"search,omitempty"`

	// Policy chooses among feasible domains: BestFit (default) or WorstFit.
	// +optional
	// +kubebuilder:validation:Enum=BestFit;WorstFit
	Policy string `json:"policy,omitempty"`

	// RetryBackoff bounds requeueAfterSeconds of Retry decisions.
	// +optional
	RetryBackoff RetryBackoff `json:"retryBackoff,omitempty"`

	// Volcano configures the Volcano bridge for workloads this check admits.
	// +optional
	Volcano *VolcanoSettings `json:"volcano,omitempty"`
}

// BufferSettings: allocatable = physical − driverOverheadMiB − ceil(bufferPercent% × physical),
// never above 90 % of physical.
type BufferSettings struct {
	// DriverOverheadMiB is reserved per GPU for the driver and CUDA context. Default 1500.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1048576
	DriverOverheadMiB *int64 `json:"driverOverheadMiB,omitempty"`
	// BufferPercent of physical memory kept free per GPU. Default 10.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=90
	BufferPercent *int32 `json:"bufferPercent,omitempty"`
}

// SearchBounds bound the exact search; see docs/gang-fit.md for the guarantee.
type SearchBounds struct {
	// MaxSteps bounds backtracking steps per domain. Default 200000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxSteps *int64 `json:"maxSteps,omitempty"`
	// MaxDomains bounds how many feasible-looking domains are dry-run. Default 64.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxDomains *int32 `json:"maxDomains,omitempty"`
}

// RetryBackoff bounds the Retry delay.
type RetryBackoff struct {
	// +optional
	// +kubebuilder:validation:Minimum=1
	MinSeconds *int32 `json:"minSeconds,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxSeconds *int32 `json:"maxSeconds,omitempty"`
}

// VolcanoSettings configures PodGroup creation.
type VolcanoSettings struct {
	// Enabled creates a PodGroup for every admitted workload, not only those
	// whose templates name schedulerName: volcano.
	// +optional
	Enabled bool `json:"enabled,omitempty"`
	// Queue is the Volcano queue of created PodGroups. Default "default".
	// +optional
	Queue string `json:"queue,omitempty"`
	// UnschedulablePatienceSeconds: a PodGroup Unschedulable for longer turns
	// the check to Retry. Default 300.
	// +optional
	// +kubebuilder:validation:Minimum=1
	UnschedulablePatienceSeconds *int32 `json:"unschedulablePatienceSeconds,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=gfp
// +kubebuilder:printcolumn:name="Required level",type=string,JSONPath=`.spec.requiredLevel`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// GangFitParameters are the parameters of a gpupack.io/gang-fit AdmissionCheck.
type GangFitParameters struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec GangFitParametersSpec `json:"spec,omitempty"`
}

// +kubebuilder:object:root=true

// GangFitParametersList is a list of GangFitParameters.
type GangFitParametersList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GangFitParameters `json:"items"`
}

func init() {
	SchemeBuilder.Register(&GangFitParameters{}, &GangFitParametersList{})
}
