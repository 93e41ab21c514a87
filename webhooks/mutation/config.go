// Package mutation is the pure core of gpupack's fractional-GPU webhooks and
// of `gpupack mutate`: it rewrites PyTorchJobs, batch Jobs and Pods in place
// (requests into gpupack.io/* resources — or HAMi's, in hami mode — hook
// injection, checkpoint wrapping, the placement gate) and validates them.
// The admission handlers and the CLI are thin adapters around it.
package mutation

import (
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/preemption/policy"
)

// Preload modes of the hook library.
const (
	// PreloadFile mounts the node's ld.so.preload over /etc/ld.so.preload:
	// the tenant cannot unset it, and static helper binaries are unaffected.
	PreloadFile = "File"
	// PreloadEnv sets LD_PRELOAD (for images that already use /etc/ld.so.preload).
	PreloadEnv = "Env"
)

// Resource modes: what a fractional request is written as.
const (
	// ResourcesGpupack writes gpupack.io/vgpu, gpu-memory and gpu-cores and
	// injects gpupack's hook (gpupack-node serves the GPUs). Default.
	ResourcesGpupack = "gpupack"
	// ResourcesHAMi writes HAMi's nvidia.com/gpu, gpumem and gpucores and
	// injects nothing: HAMi's device plugin serves the GPUs and injects
	// HAMi-core at Allocate.
	ResourcesHAMi = "hami"
)

// Env policies for tenant values of the keys the webhook owns.
const (
	EnvPolicyStrip = "Strip" // remove them and warn (default)
	EnvPolicyDeny  = "Deny"  // deny the pod
)

// Names this package adds to pods. They are part of the node agent's
// contract (it reads the shared cache under <SharedCacheHostPath>/<pod UID>/).
const (
	VolumeHook          = "gpupack-hook"
	VolumeSharedCache   = "gpupack-cache"
	VolumeCkptBin       = "gpupack-ckpt-bin"
	VolumePodInfo       = "gpupack-podinfo"
	EnvPodUID           = "GPUPACK_POD_UID"
	SharedCacheFileName = "vgpu.cache"
	CkptBinDir          = "/gpupack/bin"
	CkptBinary          = CkptBinDir + "/gpupack-ckpt"
	PodInfoDir          = "/etc/gpupack/podinfo" // gpupack-ckpt's default --annotations-file dir
	InitCkptInstall     = "gpupack-ckpt-install"
	// AnnotationCheckpointDir names the trainer's checkpoint directory
	// (passed as --checkpoint-dir).
	AnnotationCheckpointDir = "gpupack.io/checkpoint-dir"
	// DefaultCheckpointSignal matches gpupack-ckpt's default.
	DefaultCheckpointSignal = "SIGUSR1"
)

// Config configures the webhooks. Zero values take the defaults (Default()).
type Config struct {
	// Resources: gpupack (default) or hami — the resources a fractional
	// request becomes, and whether gpupack injects its hook (gpupack only).
	Resources string `json:"resources,omitempty"`
	// Hook says where the hook library is. In hami mode nothing is
	// injected; MountPath is then where HAMi-core appears in containers,
	// and tenant mounts there are removed.
	Hook HookConfig `json:"hook,omitempty"`
	// EnvPolicy: Strip (default) or Deny.
	EnvPolicy string `json:"envPolicy,omitempty"`
	// Buffer is the per-GPU memory safety buffer; keep it equal to the
	// GangFitParameters' so the webhook and the check agree.
	Buffer BufferConfig `json:"buffer,omitempty"`
	// DefaultGPUModel is assumed for pods that name no model
	// (nodeSelector or required affinity on nvidia.com/gpu.product).
	// Empty: such pods get a warning and are checked at admission.
	DefaultGPUModel string `json:"defaultGPUModel,omitempty"`
	// GPUModels adds models the built-in profiles do not know (or overrides them).
	GPUModels []GPUModel `json:"gpuModels,omitempty"`
	// Checkpoint configures the opt-in checkpoint wrapping.
	Checkpoint CheckpointConfig `json:"checkpoint,omitempty"`
	// UnmanagedGPUs says what happens to pods and jobs that ask for GPUs
	// but that Kueue will not manage (no quota, no plan).
	UnmanagedGPUs UnmanagedGPUsConfig `json:"unmanagedGPUs,omitempty"`
	// Kueue mirrors the settings of Kueue's own Configuration that decide
	// what Kueue manages. Keep them equal to Kueue's.
	Kueue KueueConfig `json:"kueue,omitempty"`

	// FastPathSalt is this installation's secret, mixed into Fingerprint
	// so that nobody can compute the marker before gpupack is installed
	// (and store a template carrying it where gpupack does not look). The
	// manager reads it from its gpupack-fastpath Secret
	// (webhooks.EnsureFastPathSalt); never from the configuration file.
	// Empty (gpupack mutate, tests): an unsalted marker, which only a
	// manager with the same empty salt accepts.
	FastPathSalt []byte `json:"-"`
	// FastPathEpoch, when set, is mixed into Fingerprint too: the epoch
	// the manager keeps in the same Secret and renews whenever objects may
	// have been stored while gpupack did not see them (webhooks'
	// fast-path reconciler), so a marker never repeats across such a
	// period. Shared by every Mutator of one manager; nil or empty: the
	// marker of the salt alone.
	FastPathEpoch *FastPathEpoch `json:"-"`
	// JobKinds are the job kinds with webhook entries besides Pod, Job and
	// PyTorchJob (webhooks.ServeOptions.JobKinds). They are part of
	// Fingerprint: enabling a kind sends the pods of every template marked
	// before (when that kind's objects were not seen) the slow way.
	JobKinds []string `json:"-"`
}

// Policies for GPU objects Kueue will not manage.
const (
	// UnmanagedDeny refuses them, except in namespaces labelled
	// NamespaceLabelUnmanagedGPUs=allow. Default.
	UnmanagedDeny = "Deny"
	// UnmanagedAllow admits them (the device plugin serves whole GPUs no
	// plan covers from free GPUs and records them on the pod).
	UnmanagedAllow = "Allow"
)

// NamespaceLabelUnmanagedGPUs, set to "allow" on a namespace, lets its
// pods and jobs use whole GPUs outside Kueue under UnmanagedDeny.
const NamespaceLabelUnmanagedGPUs = "gpupack.io/unmanaged-gpus"

// UnmanagedGPUsConfig configures the unmanaged-GPU policy.
type UnmanagedGPUsConfig struct {
	// Policy: Deny (default) or Allow.
	Policy string `json:"policy,omitempty"`
	// OwnerControllers are the users that create objects for an owner:
	// the Job controller a Job's pods, the JobSet controller a JobSet's
	// Jobs, the Trainer a TrainJob's JobSet, the training operator, the
	// MPI operator, KubeRay and the LWS controller theirs. A GPU object
	// with a controlling owner counts as managed through that owner only
	// when one of them (or a member of system:masters) created it: a
	// tenant's own pod whose controller reference names its queued,
	// suspended Job would otherwise run with whole GPUs outside every
	// quota (Kueue never gates a Job's pods). Default:
	// DefaultOwnerControllers. Add your controllers' accounts if they
	// run elsewhere.
	OwnerControllers []string `json:"ownerControllers,omitempty"`
}

// DefaultOwnerControllers are the accounts the controllers of Kueue's job
// integrations run as in their own installs (kube-controller-manager with
// and without --use-service-account-credentials).
var DefaultOwnerControllers = []string{
	"system:kube-controller-manager",
	"system:serviceaccount:kube-system:job-controller",
	"system:serviceaccount:kube-system:replicaset-controller",
	"system:serviceaccount:kube-system:statefulset-controller",
	"system:serviceaccount:kubeflow:training-operator",
	"system:serviceaccount:mpi-operator:mpi-operator",
	"system:serviceaccount:kubeflow:mpi-operator",
	"system:serviceaccount:jobset-system:jobset-controller-manager",
	"system:serviceaccount:lws-system:lws-controller-manager",
	"system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager",
	"system:serviceaccount:ray-system:kuberay-operator",
}

// KueueConfig mirrors Kueue's Configuration.
type KueueConfig struct {
	// ManageJobsWithoutQueueName is Kueue's manageJobsWithoutQueueName:
	// objects of the frameworks below are managed even without a
	// kueue.x-k8s.io/queue-name label.
	ManageJobsWithoutQueueName bool `json:"manageJobsWithoutQueueName,omitempty"`
	// Frameworks is Kueue's integrations.frameworks ("batch/job",
	// "kubeflow.org/pytorchjob", "jobset.x-k8s.io/jobset",
	// "leaderworkerset.x-k8s.io/leaderworkerset", "pod", …). Default:
	// batch/job and kubeflow.org/pytorchjob. A framework listed here that
	// Kueue does not run lets its objects through unmanaged.
	Frameworks []string `json:"frameworks,omitempty"`
	// ManagedJobsNamespaceSelector is Kueue's managedJobsNamespaceSelector.
	// Kueue v0.17 manages nothing in a namespace it does not select (its
	// feature gate ManagedJobsNamespaceSelectorAlwaysRespected, on by
	// default): a pod there is never gated, a Deployment's or
	// StatefulSet's pods run at once, a job without a queue label runs
	// even under manageJobsWithoutQueueName, and a queued job stays
	// suspended. gpupack treats every GPU object in such a namespace as
	// one Kueue will not manage (the unmanaged-GPU policy). Default,
	// Kueue's own: every namespace but kube-system and Namespace. A
	// selector on kubernetes.io/metadata.name alone (the apiserver sets
	// it to the namespace's name) costs no read; any other label costs a
	// read of the namespace per GPU object.
	ManagedJobsNamespaceSelector *metav1.LabelSelector `json:"managedJobsNamespaceSelector,omitempty"`
	// Namespace is the namespace Kueue runs in, for the default
	// ManagedJobsNamespaceSelector. Default: kueue-system.
	Namespace string `json:"namespace,omitempty"`
}

// DefaultKueueNamespace is the namespace Kueue's manifests install it in.
const DefaultKueueNamespace = "kueue-system"

// DefaultKueueFrameworks are the frameworks assumed when none are configured.
var DefaultKueueFrameworks = []string{"batch/job", "kubeflow.org/pytorchjob"}

// HookConfig says where the node agent installs the hook library.
type HookConfig struct {
	// HostPath is the node directory holding the library (read-only in pods).
	HostPath string `json:"hostPath,omitempty"`
	// MountPath is where it appears in containers. Default: HostPath.
	MountPath string `json:"mountPath,omitempty"`
	// Library is the file name of the library in HostPath.
	Library string `json:"library,omitempty"`
	// Preload: File (default) or Env.
	Preload string `json:"preload,omitempty"`
	// PreloadFile is the file in HostPath that the node agent fills with the
	// library's path; mounted over /etc/ld.so.preload. Default ld.so.preload.
	PreloadFile string `json:"preloadFile,omitempty"`
	// SharedCacheHostPath is the node directory of per-pod accounting files.
	SharedCacheHostPath string `json:"sharedCacheHostPath,omitempty"`
	// SharedCacheMountPath is where a container sees its own directory.
	SharedCacheMountPath string `json:"sharedCacheMountPath,omitempty"`
}

// BufferConfig mirrors GangFitParameters' buffer settings.
type BufferConfig struct {
	DriverOverheadMiB *int64 `json:"driverOverheadMiB,omitempty"`
	BufferPercent     *int32 `json:"bufferPercent,omitempty"`
}

// GPUModel is a GPU model's physical memory.
type GPUModel struct {
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
}

// CheckpointConfig configures jobs that opt in with gpupack.io/checkpoint: "true".
type CheckpointConfig struct {
	// Image holds /gpupack-ckpt (the manager image).
	Image string `json:"image,omitempty"`
	// InstallCommand copies the binary into the shared emptyDir at /gpupack/bin.
	InstallCommand []string `json:"installCommand,omitempty"`
	// DefaultTimeout when the job sets no gpupack.io/checkpoint-timeout
	// (default policy.DefaultTimeout, the same figure the coordinator and
	// the eviction webhook use).
	DefaultTimeout metav1.Duration `json:"defaultTimeout,omitempty"`
	// Margin is added to the timeout for terminationGracePeriodSeconds.
	Margin metav1.Duration `json:"margin,omitempty"`
	// MaxTimeout bounds gpupack.io/checkpoint-timeout (default
	// policy.DefaultMax; gpupack-manager raises it to the longest cap of
	// its --checkpoint-timeout-max* flags). The coordinator caps each
	// victim again by its priority class and ClusterQueue, and the agent
	// stops at the deadline written with the checkpoint request.
	MaxTimeout metav1.Duration `json:"maxTimeout,omitempty"`
	// Policy is the cluster's checkpoint policy (gpupack-manager's
	// --checkpoint-timeout-* flags): the caps that bound a GPU pod's
	// terminationGracePeriodSeconds (checkpoint.go). Zero: MaxTimeout is
	// the only cap. Margin is this configuration's.
	Policy policy.Policy `json:"-"`
}

// DefaultImage is the manager image the checkpoint agent is copied from.
const DefaultImage = "ghcr.io/gpupack/gpupack-manager:latest"

// Default returns the configuration with every default filled in.
func Default() Config {
	var c Config
	c.applyDefaults()
	return c
}

func (c *Config) applyDefaults() {
	h := &c.Hook
	if h.HostPath == "" {
		h.HostPath = v1alpha1.DefaultHookHostPath
	}
	if h.MountPath == "" {
		h.MountPath = h.HostPath
	}
	if h.Library == "" {
		h.Library = v1alpha1.HookLibraryName
	}
	if h.Preload == "" {
		h.Preload = PreloadFile
	}
	if h.PreloadFile == "" {
		h.PreloadFile = "ld.so.preload"
	}
	if h.SharedCacheHostPath == "" {
		h.SharedCacheHostPath = v1alpha1.DefaultSharedCacheDir
	}
	if h.SharedCacheMountPath == "" {
		h.SharedCacheMountPath = "/var/run/gpupack"
	}
	if c.EnvPolicy == "" {
		c.EnvPolicy = EnvPolicyStrip
	}
	if c.Resources == "" {
		c.Resources = ResourcesGpupack
	}
	if c.UnmanagedGPUs.Policy == "" {
		c.UnmanagedGPUs.Policy = UnmanagedDeny
	}
	if len(c.UnmanagedGPUs.OwnerControllers) == 0 {
		c.UnmanagedGPUs.OwnerControllers = append([]string(nil), DefaultOwnerControllers...)
	}
	if len(c.Kueue.Frameworks) == 0 {
		c.Kueue.Frameworks = append([]string(nil), DefaultKueueFrameworks...)
	}
	if c.Kueue.Namespace == "" {
		c.Kueue.Namespace = DefaultKueueNamespace
	}
	if c.Kueue.ManagedJobsNamespaceSelector == nil {
		// Kueue's default (apis/config/v1beta2/defaults.go).
		c.Kueue.ManagedJobsNamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", c.Kueue.Namespace},
		}}}
	}
	k := &c.Checkpoint
	if k.Image == "" {
		k.Image = DefaultImage
	}
	if len(k.InstallCommand) == 0 {
		k.InstallCommand = []string{"cp", "/gpupack-ckpt", CkptBinary}
	}
	if k.DefaultTimeout.Duration == 0 {
		k.DefaultTimeout.Duration = policy.DefaultTimeout
	}
	if k.Margin.Duration == 0 {
		k.Margin.Duration = 30 * time.Second
	}
	if k.MaxTimeout.Duration == 0 {
		k.MaxTimeout.Duration = policy.DefaultMax
	}
}

// Validate reports settings that cannot work.
func (c Config) Validate() error {
	switch c.Resources {
	case ResourcesGpupack, ResourcesHAMi:
	default:
		return fmt.Errorf("resources %q: want %s or %s", c.Resources, ResourcesGpupack, ResourcesHAMi)
	}
	switch c.Hook.Preload {
	case PreloadFile, PreloadEnv:
	default:
		return fmt.Errorf("hook.preload %q: want %s or %s", c.Hook.Preload, PreloadFile, PreloadEnv)
	}
	switch c.EnvPolicy {
	case EnvPolicyStrip, EnvPolicyDeny:
	default:
		return fmt.Errorf("envPolicy %q: want %s or %s", c.EnvPolicy, EnvPolicyStrip, EnvPolicyDeny)
	}
	switch c.UnmanagedGPUs.Policy {
	case UnmanagedDeny, UnmanagedAllow:
	default:
		return fmt.Errorf("unmanagedGPUs.policy %q: want %s or %s", c.UnmanagedGPUs.Policy, UnmanagedDeny, UnmanagedAllow)
	}
	for _, f := range c.Kueue.Frameworks {
		if f == "" || strings.ContainsAny(f, " ,") {
			return fmt.Errorf("kueue.frameworks: %q is not a framework name (like batch/job or pod)", f)
		}
	}
	if _, err := metav1.LabelSelectorAsSelector(c.Kueue.ManagedJobsNamespaceSelector); err != nil {
		return fmt.Errorf("kueue.managedJobsNamespaceSelector: %w", err)
	}
	if b := c.Buffer.DriverOverheadMiB; b != nil && *b < 0 {
		return fmt.Errorf("buffer.driverOverheadMiB %d: want ≥ 0", *b)
	}
	if b := c.Buffer.BufferPercent; b != nil && (*b < 0 || *b > 90) {
		return fmt.Errorf("buffer.bufferPercent %d: want 0–90", *b)
	}
	for _, m := range c.GPUModels {
		if m.Model == "" || m.MemoryMiB <= 0 {
			return fmt.Errorf("gpuModels: %q with memoryMiB %d: want a name and memoryMiB > 0", m.Model, m.MemoryMiB)
		}
	}
	if c.DefaultGPUModel != "" {
		if _, ok := c.lookupModel(c.DefaultGPUModel); !ok {
			return fmt.Errorf("defaultGPUModel %q is not a known GPU model; add it to gpuModels", c.DefaultGPUModel)
		}
	}
	if c.Checkpoint.Margin.Duration < 0 || c.Checkpoint.DefaultTimeout.Duration < 0 {
		return fmt.Errorf("checkpoint durations must be positive")
	}
	return nil
}

// hami reports the HAMi resource mode.
func (c Config) hami() bool { return c.Resources == ResourcesHAMi }

func (c Config) buffer() flavors.Buffer {
	return flavors.NewBuffer(c.Buffer.DriverOverheadMiB, c.Buffer.BufferPercent)
}

// lookupModel returns the physical MiB of a model: configured models first.
func (c Config) lookupModel(name string) (int64, bool) {
	for _, m := range c.GPUModels {
		if m.Model == name {
			return m.MemoryMiB, true
		}
	}
	if p, ok := flavors.Lookup(name); ok {
		return p.MemoryMiB, true
	}
	return 0, false
}

// ParseConfig reads a YAML (or JSON) configuration, strictly, and fills defaults.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("webhook config: %w", err)
	}
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("webhook config: %w", err)
	}
	return c, nil
}

// LoadConfig reads a configuration file; an empty path gives the defaults.
func LoadConfig(path string) (Config, error) {
	if path == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return ParseConfig(data)
}
