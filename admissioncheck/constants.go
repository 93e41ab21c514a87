// Package admissioncheck is the gpupack.io/gang-fit Kueue AdmissionCheck
// controller: it admits a Workload only when every pod of it fits at once,
// GPU by GPU, inside one topology domain (package fit decides; this package
// translates API objects to the engine and decisions back to Kueue).
//
// Modelled on Kueue's ProvisioningRequest check: one reconciler keeps each
// AdmissionCheck's Active condition, another decides per Workload.
package admissioncheck

import "time"

const (
	// FieldOwner names gpupack's writes (server-side apply field manager).
	FieldOwner = "gpupack-gang-fit"
	// EventSource is the Event reporter name.
	EventSource = "gpupack-gang-fit"

	// Reasons of the AdmissionCheck's Active condition.
	ReasonActive           = "Active"
	ReasonBadParametersRef = "BadParametersRef"
	ReasonBadParameters    = "BadParameters"

	// Event reasons on Workloads (a fit has none: the Ready check's message
	// says it, naming the plan).
	EventWaitingTerminating = "WaitingForTerminatingPods"
	EventNoFit              = "GangDoesNotFit"
	EventNeverFits          = "GangCanNeverFit"
	EventPlanReleased       = "GPUPlanReleased"
	EventBadRequest         = "BadGPURequest"
	EventPlanLost           = "GPUPlanLost"
	EventInventoryWarning   = "GPUInventoryWarning"
	EventTASConflict        = "TopologyAssignmentConflict"
	EventMultiKueue         = "CheckBelongsInWorkerClusters"

	// Defaults of GangFitParameters.spec.retryBackoff.
	DefaultRetryMinSeconds int32 = 5
	DefaultRetryMaxSeconds int32 = 300

	// pendingRecheck is how often a workload waiting for terminating pods is
	// re-evaluated.
	pendingRecheck = time.Second
	// maxPendingOnTerminating bounds how long a check stays Pending (holding
	// quota) for terminating pods before it turns Retry.
	maxPendingOnTerminating = 10 * time.Minute
)
