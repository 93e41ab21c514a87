package v1alpha1

// Names that users, other controllers and tests rely on. Changing any of them
// is a breaking change.
const (
	GroupName = "gpupack.io"

	// ControllerName is the AdmissionCheck controllerName gpupack answers to.
	ControllerName = "gpupack.io/gang-fit"

	// Request annotations (pod template, replica template or job level).
	AnnotationGPUMemory = "gpupack.io/gpu-memory" // per-GPU memory, quantity; plain integer = MiB
	AnnotationGPUCores  = "gpupack.io/gpu-cores"  // SM percent per GPU, 1–100
	// HAMi's names, accepted as input.
	AnnotationHAMiGPUMem           = "nvidia.com/gpumem"
	AnnotationHAMiGPUMemPercentage = "nvidia.com/gpumem-percentage"
	AnnotationHAMiGPUCores         = "nvidia.com/gpucores"

	// AnnotationGangTopology overrides the topology level (a node label key)
	// the whole gang must fit in.
	AnnotationGangTopology = "gpupack.io/gang-topology"

	// Checkpoint protocol.
	AnnotationCheckpoint               = "gpupack.io/checkpoint" // "true" opts a job in
	AnnotationCheckpointSignal         = "gpupack.io/checkpoint-signal"
	AnnotationCheckpointTimeout        = "gpupack.io/checkpoint-timeout"
	AnnotationCheckpointRequest        = "gpupack.io/checkpoint-request"
	AnnotationCheckpointStep           = "gpupack.io/checkpoint-step"
	AnnotationLastConsistentCheckpoint = "gpupack.io/last-consistent-checkpoint"
	AnnotationPreemptionPhase          = "gpupack.io/preemption"

	// Placement.
	AnnotationPlan          = "gpupack.io/plan"    // names the GPUPlan (set through podSetUpdates)
	AnnotationDevices       = "gpupack.io/devices" // "<uuid>:<MiB>[,…]" on a pinned pod
	SchedulingGatePlacement = "gpupack.io/placement"
	// AnnotationCreatedBy, on a pod of a Kueue pod group (label
	// kueue.x-k8s.io/pod-group-name), names the user who created it: the pod
	// webhook writes the request's user name at creation (replacing a
	// tenant's value), policy gpupack-placement refuses a value that is not
	// the creator's and any later change. A pod-group slot is taken only by
	// pods whose stamps agree (owners.GroupSlot, review 14 F3).
	AnnotationCreatedBy = "gpupack.io/created-by"
	// AnnotationAdmission, on a GPUPlan, names the Workload admission (quota
	// reservation) it was planned for: the QuotaReserved condition's
	// lastTransitionTime, RFC 3339. A re-admitted Workload keeps its name
	// and UID; this tells its plans apart. Set by gpupack only.
	AnnotationAdmission = "gpupack.io/admission"
	// AnnotationPodRequests, on a GPUPlan, is what one pod of each GPU pod
	// set requests of everything but GPUs (JSON: pod set → resource list):
	// a slot no pod is on yet reserves it on the slot's node. Set by
	// gpupack only.
	AnnotationPodRequests = "gpupack.io/pod-requests"
	// AnnotationPodAffinity, on a GPUPlan, is what pod anti-affinity needs
	// of each GPU pod set's pods (JSON: pod set → {"labels", "anti"}: the
	// template's labels and required anti-affinity terms): a slot whose pod
	// is not bound yet stands for it on the slot's node, so a gang decided
	// meanwhile is kept apart from it. Set by gpupack only.
	AnnotationPodAffinity = "gpupack.io/pod-affinity"
	// AnnotationInjected marks a job's pod template that the webhook already
	// brought to the form it gives pods; the value fingerprints the webhook
	// configuration. Pods a trusted controller makes from such a template
	// skip the pod webhook (docs/webhooks.md). Set by gpupack only.
	AnnotationInjected = "gpupack.io/injected"

	// Node inventory.
	AnnotationGPUs             = "gpupack.io/gpus" // JSON array of GPUInfo
	AnnotationHAMiNodeRegister = "hami.io/node-nvidia-register"
	LabelNVLinkDomain          = "gpupack.io/nvlink-domain"

	// Resources.
	ResourceNvidiaGPU = "nvidia.com/gpu"
	ResourceVGPU      = "gpupack.io/vgpu"
	ResourceGPUMemory = "gpupack.io/gpu-memory" // MiB
	ResourceGPUCores  = "gpupack.io/gpu-cores"  // percent

	// Hook environment (HAMi-core compatible). The webhook owns these keys.
	EnvLDPreload          = "LD_PRELOAD"
	EnvMemoryLimit        = "CUDA_DEVICE_MEMORY_LIMIT" // also _<i>
	EnvSMLimit            = "CUDA_DEVICE_SM_LIMIT"     // also _<i>
	EnvSharedCache        = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
	EnvDisableControl     = "CUDA_DISABLE_CONTROL"
	EnvVisibleDevices     = "NVIDIA_VISIBLE_DEVICES"
	EnvLogLevel           = "LIBCUDA_LOG_LEVEL"
	EnvContextReserve     = "GPUPACK_CONTEXT_RESERVE" // devicehook: per-context reserve counted against the limit
	EnvSMPeriod           = "GPUPACK_SM_PERIOD_MS"    // devicehook: SM limiter control period
	EnvResumeStep         = "GPUPACK_RESUME_STEP"
	GPUHealthy            = "Healthy"
	GPUUnhealthy          = "Unhealthy"
	HookLibraryName       = "libgpupack-hook.so"
	DefaultHookHostPath   = "/usr/local/gpupack"
	DefaultSharedCacheDir = "/var/lib/gpupack/cache"
)
