package mutation

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/webhooks/gpureq"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// Mutator applies one Config. It is safe for concurrent use.
type Mutator struct {
	cfg         Config
	buf         flavors.Buffer
	fingerprint string
	// Kueue's managedJobsNamespaceSelector, parsed; whether it reads a
	// label besides kubernetes.io/metadata.name.
	nsSelector            labels.Selector
	nsSelectorNeedsLabels bool
}

// New fills cfg's defaults and validates it.
func New(cfg Config) (*Mutator, error) {
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Mutator{cfg: cfg, buf: cfg.buffer()}
	m.nsSelector, _ = metav1.LabelSelectorAsSelector(cfg.Kueue.ManagedJobsNamespaceSelector) // validated
	m.nsSelectorNeedsLabels = selectorReadsMoreThanTheName(cfg.Kueue.ManagedJobsNamespaceSelector)
	m.fingerprint = m.computeFingerprint()
	return m, nil
}

// Config returns the effective configuration.
func (m *Mutator) Config() Config { return m.cfg }

// PodContext is what the admission adapter knows about a pod beyond the pod.
type PodContext struct {
	// ResumeStep is the owning job's gpupack.io/last-consistent-checkpoint.
	ResumeStep string
	// JobID names the job the pod belongs to (JobID of the top of its
	// controller chain: namespace, kind and name, stable when the job is
	// deleted and re-applied), "" when not known. Every container gets it
	// as GPUPACK_JOB_ID (setJobID).
	JobID string
	// Class is the priority class the checkpoint policy keys the pod's
	// grace on, when ClassKnown: Kueue's class for the pod's job (see
	// webhooks' podMutator.priorityClass). Not known (gpupack mutate, a
	// failed lookup, a pod no job owns): the shortest cap of any class or
	// queue (policy.Shortest). The pod's own labels are the tenant's and
	// never choose it here.
	Class      string
	ClassKnown bool
	// Creator is the user name of the request that creates the pod (the
	// admission request's userInfo.username; `gpupack mutate --user`). A
	// pod of a Kueue pod group gets it as gpupack.io/created-by (stampCreator).
	Creator string
}

// tmpl is the outcome of mutating one pod template.
type tmpl struct {
	reqs   []gpureq.Request // per regular container, after conversion
	warn   []string
	anyGPU bool
}

// model is the GPU model a pod can land on.
type model struct {
	name     string
	physical int64
	known    bool
}

// gpuModel reads the model from the nodeSelector, else the required node
// affinity (the largest of the listed models: a request must fit on at least
// one), else the configured default.
func (m *Mutator) gpuModel(s *corev1.PodSpec) (model, string) {
	if name, ok := s.NodeSelector[flavors.LabelGPUProduct]; ok {
		if phys, ok := m.cfg.lookupModel(name); ok {
			return model{name, phys, true}, ""
		}
		return model{name: name}, fmt.Sprintf("GPU model %q (nodeSelector %s) is unknown to gpupack; add it to the webhook's gpuModels so requests are checked against its 90%% line", name, flavors.LabelGPUProduct)
	}
	if a := s.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		var best model
		var unknown []string
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				if e.Key != flavors.LabelGPUProduct || e.Operator != corev1.NodeSelectorOpIn {
					continue
				}
				for _, v := range e.Values {
					phys, ok := m.cfg.lookupModel(v)
					if !ok {
						unknown = append(unknown, v)
						continue
					}
					if phys > best.physical {
						best = model{v, phys, true}
					}
				}
			}
		}
		if best.known {
			return best, ""
		}
		if len(unknown) > 0 {
			return model{name: unknown[0]}, fmt.Sprintf("GPU models %q (node affinity) are unknown to gpupack; add them to the webhook's gpuModels", unknown)
		}
	}
	if m.cfg.DefaultGPUModel != "" {
		phys, _ := m.cfg.lookupModel(m.cfg.DefaultGPUModel) // checked by Validate
		return model{m.cfg.DefaultGPUModel, phys, true}, ""
	}
	return model{}, fmt.Sprintf("no GPU model is known for this pod (set nodeSelector %s, or the webhook's defaultGPUModel); the per-GPU memory limit is checked when the job is admitted", flavors.LabelGPUProduct)
}

var memoryKeys = []string{v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage}
var coresKeys = []string{v1alpha1.AnnotationGPUCores, v1alpha1.AnnotationHAMiGPUCores}
var checkpointKeys = []string{v1alpha1.AnnotationCheckpoint, v1alpha1.AnnotationCheckpointSignal, v1alpha1.AnnotationCheckpointTimeout, AnnotationCheckpointDir}

func hasAny(ann map[string]string, keys []string) bool {
	for _, k := range keys {
		if _, ok := ann[k]; ok {
			return true
		}
	}
	return false
}

// template converts the GPU requests of one pod template in place. jobAnn
// are the job-level annotations (nil for a Pod).
func (m *Mutator) template(where string, jobAnn map[string]string, t *corev1.PodTemplateSpec) (tmpl, error) {
	var out tmpl
	if err := refuseHAMiSelection(jobAnn, t.Annotations); err != nil { // hamiselect.go
		return out, fmt.Errorf("%s: %w", where, err)
	}
	spec, err := gpureq.Effective(jobAnn, t.Annotations)
	if err != nil {
		return out, fmt.Errorf("%s: %w", where, err)
	}
	mdl, modelWarn := m.gpuModel(&t.Spec)
	alloc := m.buf.Allocatable(mdl.physical)
	anyGPU, warned := false, false
	for i := range t.Spec.Containers {
		c := &t.Spec.Containers[i]
		req, err := gpureq.ContainerRequest(spec, c)
		if err != nil {
			return out, fmt.Errorf("%s: %w", where, err)
		}
		if req.Kind != gpureq.NoGPU {
			anyGPU = true
		}
		if req.Kind == gpureq.Fractional || req.Kind == gpureq.Converted {
			if req.Spec.MemoryPercent > 0 {
				switch {
				case mdl.known:
					req.Spec.MemoryMiB = max(1, (int64(req.Spec.MemoryPercent)*alloc+99)/100)
					req.Spec.MemoryPercent = 0
				case !m.cfg.hami():
					return out, fmt.Errorf("%s: container %q: %s needs a known GPU model to become MiB; set nodeSelector %s (or the webhook's defaultGPUModel), or ask for %s in MiB", where, c.Name, v1alpha1.AnnotationHAMiGPUMemPercentage, flavors.LabelGPUProduct, v1alpha1.AnnotationGPUMemory)
				}
				// hami mode without a model: the percentage stays for HAMi.
			}
			if mdl.known && req.Spec.MemoryMiB > alloc {
				return out, fmt.Errorf("%s: container %q asks for %d MiB per GPU, more than the %d MiB a pod may take on one %s (%d MiB physical − %d MiB driver overhead − %d%% buffer, never above %d%%); ask for at most %dMi", where, c.Name, req.Spec.MemoryMiB, alloc, mdl.name, mdl.physical, m.buf.DriverOverheadMiB, m.buf.BufferPercent, flavors.HardCapPercent, alloc)
			}
			// Warn on the first conversion only, so a second pass (or a pod
			// made from a mutated template) is silent.
			first := req.Kind == gpureq.Fractional
			if m.cfg.hami() {
				// HAMi form is read back as Fractional: only a rewrite
				// tells a first pass from a second.
				first = convertHAMi(c, req)
				req.Kind = gpureq.Fractional
			} else if req.Kind == gpureq.Fractional {
				convert(c, req)
				req.Kind = gpureq.Converted
			}
			if first && !mdl.known && modelWarn != "" && !warned {
				out.warn = append(out.warn, where+": "+modelWarn)
				warned = true
			}
		}
		out.reqs = append(out.reqs, req)
	}
	out.anyGPU = anyGPU
	if err := initContainersAskGPU(&t.Spec); err != nil {
		return out, fmt.Errorf("%s: %w", where, err)
	}
	if anyGPU {
		if err := m.podSecurity(&t.Spec); err != nil {
			return out, fmt.Errorf("%s: %w", where, err)
		}
		defaultSeccomp(&t.Spec)
		// The placement is the ungater's to write (and a
		// ValidatingAdmissionPolicy keeps it so after creation): a
		// tenant's value would name GPUs and limits to the node.
		if _, ok := t.Annotations[v1alpha1.AnnotationDevices]; ok {
			delete(t.Annotations, v1alpha1.AnnotationDevices)
			out.warn = append(out.warn, fmt.Sprintf("%s: removed annotation %s; only gpupack's placement writes it", where, v1alpha1.AnnotationDevices))
		}
	}
	// Only the template's own request must find a GPU container: a job-level
	// default also reaches CPU-only replicas (a PyTorchJob's master), which
	// simply do not use it.
	own := hasAny(t.Annotations, memoryKeys) || hasAny(t.Annotations, coresKeys)
	if !anyGPU && own && (spec.HasMemory() || spec.Cores > 0) {
		return out, fmt.Errorf("%s: %s/%s is set but no container asks for %s in its limits; add %s: 1 (or more) to the GPU container", where, v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationGPUCores, v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceNvidiaGPU)
	}
	// Carry job-level defaults down so the pods (which never see the job's
	// annotations) read the same request.
	if jobAnn != nil && anyGPU {
		copyKeys := func(keys []string) {
			if hasAny(t.Annotations, keys) {
				return
			}
			for _, k := range keys {
				if v, ok := jobAnn[k]; ok {
					if t.Annotations == nil {
						t.Annotations = map[string]string{}
					}
					t.Annotations[k] = v
				}
			}
		}
		copyKeys(memoryKeys)
		copyKeys(coresKeys)
		copyKeys(checkpointKeys)
	}
	if t.Annotations[v1alpha1.AnnotationCheckpoint] == "true" {
		if _, err := m.checkpointSettings(where, t); err != nil {
			return out, err
		}
	}
	return out, nil
}

// hamiResources are HAMi's per-container resources; once converted they must
// go, or the pod would wait for a resource no node advertises.
var hamiResources = []corev1.ResourceName{v1alpha1.AnnotationHAMiGPUMem, v1alpha1.AnnotationHAMiGPUMemPercentage, v1alpha1.AnnotationHAMiGPUCores}

// convert rewrites a fractional request into the resources Kueue counts.
func convert(c *corev1.Container, req gpureq.Request) {
	set := func(rl corev1.ResourceList) corev1.ResourceList {
		if rl == nil {
			rl = corev1.ResourceList{}
		}
		delete(rl, v1alpha1.ResourceNvidiaGPU)
		for _, r := range hamiResources {
			delete(rl, r)
		}
		rl[v1alpha1.ResourceVGPU] = *resource.NewQuantity(req.GPUs, resource.DecimalSI)
		rl[v1alpha1.ResourceGPUMemory] = *resource.NewQuantity(req.GPUs*req.Spec.MemoryMiB, resource.DecimalSI)
		if req.Spec.Cores > 0 {
			rl[v1alpha1.ResourceGPUCores] = *resource.NewQuantity(req.GPUs*int64(req.Spec.Cores), resource.DecimalSI)
		} else {
			delete(rl, v1alpha1.ResourceGPUCores)
		}
		return rl
	}
	c.Resources.Limits = set(c.Resources.Limits)
	c.Resources.Requests = set(c.Resources.Requests)
}

// gpupackResources are what convert writes; hami mode removes them.
var gpupackResources = []corev1.ResourceName{v1alpha1.ResourceVGPU, v1alpha1.ResourceGPUMemory, v1alpha1.ResourceGPUCores}

// convertHAMi writes a fractional request as HAMi's resources, in limits and
// requests alike: nvidia.com/gpu N, nvidia.com/gpumem per GPU (or
// nvidia.com/gpumem-percentage while no model resolves it) and
// nvidia.com/gpucores when cores are asked. gpupack.io/* resources (an
// object written in gpupack mode) are removed. It reports whether anything
// changed; on HAMi form it wrote itself it changes nothing.
func convertHAMi(c *corev1.Container, req gpureq.Request) bool {
	before := c.Resources.DeepCopy()
	set := func(rl corev1.ResourceList) corev1.ResourceList {
		if rl == nil {
			rl = corev1.ResourceList{}
		}
		for _, r := range gpupackResources {
			delete(rl, r)
		}
		rl[v1alpha1.ResourceNvidiaGPU] = *resource.NewQuantity(req.GPUs, resource.DecimalSI)
		if req.Spec.MemoryMiB > 0 {
			rl[v1alpha1.AnnotationHAMiGPUMem] = *resource.NewQuantity(req.Spec.MemoryMiB, resource.DecimalSI)
			delete(rl, v1alpha1.AnnotationHAMiGPUMemPercentage)
		} else {
			rl[v1alpha1.AnnotationHAMiGPUMemPercentage] = *resource.NewQuantity(int64(req.Spec.MemoryPercent), resource.DecimalSI)
			delete(rl, v1alpha1.AnnotationHAMiGPUMem)
		}
		if req.Spec.Cores > 0 {
			rl[v1alpha1.AnnotationHAMiGPUCores] = *resource.NewQuantity(int64(req.Spec.Cores), resource.DecimalSI)
		} else {
			delete(rl, v1alpha1.AnnotationHAMiGPUCores)
		}
		return rl
	}
	c.Resources.Limits = set(c.Resources.Limits)
	c.Resources.Requests = set(c.Resources.Requests)
	return !equality.Semantic.DeepEqual(*before, c.Resources)
}

// PyTorchJob mutates a kubeflow.org/v1 PyTorchJob in place.
func (m *Mutator) PyTorchJob(j *kftraining.PyTorchJob) ([]string, error) {
	var warn []string
	anyGPU := false
	types := make([]string, 0, len(j.Spec.PyTorchReplicaSpecs))
	for rt := range j.Spec.PyTorchReplicaSpecs {
		types = append(types, string(rt))
	}
	sort.Strings(types)
	for _, rt := range types {
		rs := j.Spec.PyTorchReplicaSpecs[kftraining.ReplicaType(rt)]
		if rs == nil {
			continue
		}
		r, err := m.template("replica "+rt, nonNil(j.Annotations), &rs.Template)
		if err != nil {
			return warn, err
		}
		warn = append(warn, r.warn...)
		w, err := m.injectTemplate("replica "+rt, nonNil(j.Annotations), &rs.Template, r.reqs, "")
		warn = append(warn, w...)
		if err != nil {
			return warn, err
		}
		anyGPU = anyGPU || r.anyGPU
	}
	if err := jobLevelNeedsGPU(j.Annotations, anyGPU); err != nil {
		return warn, err
	}
	return warn, nil
}

func jobLevelNeedsGPU(ann map[string]string, anyGPU bool) error {
	if !anyGPU && (hasAny(ann, memoryKeys) || hasAny(ann, coresKeys)) {
		return fmt.Errorf("job: %s/%s is set but no container asks for %s in its limits; add %s: 1 (or more) to the GPU container", v1alpha1.AnnotationGPUMemory, v1alpha1.AnnotationGPUCores, v1alpha1.ResourceNvidiaGPU, v1alpha1.ResourceNvidiaGPU)
	}
	return nil
}

// Job mutates a batch/v1 Job in place.
func (m *Mutator) Job(j *batchv1.Job) ([]string, error) {
	r, err := m.template("pod template", nonNil(j.Annotations), &j.Spec.Template)
	if err != nil {
		return r.warn, err
	}
	w, err := m.injectTemplate("pod template", nonNil(j.Annotations), &j.Spec.Template, r.reqs, "")
	warn := append(r.warn, w...)
	if err != nil {
		return warn, err
	}
	return warn, jobLevelNeedsGPU(j.Annotations, r.anyGPU)
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// Pod mutates a Pod at creation: requests, hook injection on GPU containers
// (gpupack mode; in hami mode HAMi's device plugin injects HAMi-core),
// owned environment, checkpoint wrapping, resume step, placement gate.
func (m *Mutator) Pod(p *corev1.Pod, pc PodContext) ([]string, error) {
	t := corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	r, err := m.template("pod", nil, &t)
	if err != nil {
		return r.warn, err
	}
	p.ObjectMeta, p.Spec = t.ObjectMeta, t.Spec
	w, err := m.inject(&p.Spec, r.reqs)
	warn := append(r.warn, w...)
	if err != nil {
		return warn, err
	}
	if r.anyGPU {
		warn = append(warn, m.capGrace(p, pc)...)
	}
	if p.Annotations[v1alpha1.AnnotationCheckpoint] == "true" {
		if err := m.wrapCheckpoint(p, r.reqs, pc); err != nil {
			return warn, err
		}
	}
	setJobID(p, pc.JobID)
	step := pc.ResumeStep
	if step == "" {
		step = p.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]
	}
	if step != "" {
		if _, err := strconv.ParseInt(step, 10, 64); err != nil {
			warn = append(warn, fmt.Sprintf("ignoring %s %q: not a step number", v1alpha1.AnnotationLastConsistentCheckpoint, step))
		} else {
			for i := range p.Spec.Containers {
				setEnv(&p.Spec.Containers[i], corev1.EnvVar{Name: v1alpha1.EnvResumeStep, Value: step})
			}
		}
	}
	// A pod of Kueue's pod integration gets its plan later, by Kueue's
	// update at admission: it needs the gate now (placement.KueuePodIntegration).
	if _, ok := p.Annotations[v1alpha1.AnnotationPlan]; ok || placement.KueuePodIntegration(p) {
		addGate(&p.Spec, v1alpha1.SchedulingGatePlacement)
	}
	return warn, nil
}

// AdmitPod is Pod plus the placement rule of admission (finding 1): a
// fractional GPU pod (gpupack mode) always gets the gpupack.io/placement
// gate, and one that has no gpupack.io/plan and can never get one is
// denied. It is what the pod webhook stores, what `gpupack mutate` shows,
// and what a job template's pods must be a fixed point of.
func (m *Mutator) AdmitPod(p *corev1.Pod, pc PodContext) ([]string, error) {
	warn, err := m.Pod(p, pc)
	if err != nil {
		return warn, err
	}
	anyFractional := false
	for i := range p.Spec.Containers {
		if req, err := gpureq.ContainerRequest(gpureq.Spec{}, &p.Spec.Containers[i]); err == nil {
			anyFractional = anyFractional || req.Kind == gpureq.Fractional || req.Kind == gpureq.Converted
		}
	}
	stampCreator(p, pc.Creator)
	return warn, m.placementGate(p, anyFractional)
}

// stampCreator writes gpupack.io/created-by = creator on a pod of a Kueue
// pod group (label kueue.x-k8s.io/pod-group-name), replacing whatever the
// tenant wrote; with no creator known (a template's fixed point) a value is
// removed, so a template carrying one is never a fast-path template. Kueue
// makes every member of a plain pod group an owner of the group's Workload,
// whoever created it: the stamp is what tells the ungater that a member is
// the group's creator's (owners.GroupSlot; review 14 F3). Policy
// gpupack-placement refuses, at creation, a stamp that is not the
// requester's — so pods that skip this webhook (CPU-only, the fast paths)
// carry either none or a true one — and any later change.
func stampCreator(p *corev1.Pod, creator string) {
	if _, group := p.Labels[placement.KueuePodGroupLabel]; !group {
		return
	}
	if creator == "" {
		delete(p.Annotations, v1alpha1.AnnotationCreatedBy)
		return
	}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1alpha1.AnnotationCreatedBy] = creator
}

func addGate(s *corev1.PodSpec, name string) {
	for _, g := range s.SchedulingGates {
		if g.Name == name {
			return
		}
	}
	s.SchedulingGates = append(s.SchedulingGates, corev1.PodSchedulingGate{Name: name})
}

// owned reports the environment keys the webhook owns on GPU containers.
func owned(name string) bool {
	switch name {
	case v1alpha1.EnvLDPreload, v1alpha1.EnvMemoryLimit, v1alpha1.EnvSMLimit, v1alpha1.EnvSharedCache,
		v1alpha1.EnvDisableControl, v1alpha1.EnvVisibleDevices, EnvPodUID,
		// devicehook's own knobs: a tenant lowering the context reserve or
		// stretching the SM period would loosen its own limits.
		v1alpha1.EnvContextReserve, v1alpha1.EnvSMPeriod:
		return true
	}
	return strings.HasPrefix(name, v1alpha1.EnvMemoryLimit+"_") || strings.HasPrefix(name, v1alpha1.EnvSMLimit+"_")
}

// ownEnv removes the owned keys of a GPU container: a tenant value is
// removed with a warning, or denied under EnvPolicyDeny. The webhook sets
// none of them any more: in gpupack mode gpupack-node's device plugin
// delivers the hook, its preload file and a read-only limits file at
// Allocate, and in hami mode HAMi's device plugin injects HAMi-core's
// environment (kubelet puts pod-spec env after a device plugin's, so a
// tenant value would win). Re-running is a no-op.
func (m *Mutator) ownEnv(c *corev1.Container) ([]string, error) {
	return m.replaceOwnedEnv(c, nil)
}

// inject brings the containers of a GPU pod (or pod template) to what
// gpupack admits: no owned environment on GPU containers, no
// NVIDIA_VISIBLE_DEVICES on any other container (it would pick GPUs where
// the NVIDIA toolkit still honours it), no volume named after gpupack's
// hook, and in hami mode no tenant mount over HAMi-core. Nothing is added:
// the device plugin delivers the hook. Re-running changes nothing.
func (m *Mutator) inject(s *corev1.PodSpec, reqs []gpureq.Request) ([]string, error) {
	var warn []string
	anyGPU := false
	for _, req := range reqs {
		anyGPU = anyGPU || req.Kind != gpureq.NoGPU
	}
	if !anyGPU {
		return nil, nil
	}
	for i, req := range reqs {
		c := &s.Containers[i]
		var w []string
		var err error
		if req.Kind == gpureq.NoGPU {
			w, err = m.stripVisibleDevices(c)
		} else {
			w, err = m.ownEnv(c)
		}
		if err != nil {
			return warn, err
		}
		warn = append(warn, w...)
		if req.Kind == gpureq.Fractional && m.cfg.hami() {
			warn = append(warn, m.guardHAMiHook(c)...)
		}
	}
	for i := range s.InitContainers {
		w, err := m.stripVisibleDevices(&s.InitContainers[i])
		if err != nil {
			return warn, err
		}
		warn = append(warn, w...)
	}
	warn = append(warn, m.stripOwnedVolumes(s)...)
	return warn, nil
}

// stripVisibleDevices removes NVIDIA_VISIBLE_DEVICES from a container of a
// GPU pod that gets no GPU from gpupack (init containers, CPU sidecars).
func (m *Mutator) stripVisibleDevices(c *corev1.Container) ([]string, error) {
	var warn []string
	kept := c.Env[:0:0]
	for _, e := range c.Env {
		if e.Name != v1alpha1.EnvVisibleDevices {
			kept = append(kept, e)
			continue
		}
		if m.cfg.EnvPolicy == EnvPolicyDeny {
			return nil, fmt.Errorf("container %q sets %s; in a GPU pod gpupack owns it (GPUs come from the device plugin); remove it", c.Name, e.Name)
		}
		warn = append(warn, fmt.Sprintf("container %q: removed %s; in a GPU pod GPUs come from gpupack's device plugin", c.Name, e.Name))
	}
	if len(kept) != len(c.Env) {
		if len(kept) == 0 {
			kept = nil
		}
		c.Env = kept
	}
	return warn, nil
}

// injectTemplate injects the hook into a job's pod template when the job is
// created, so the env policy's warning (or denial) reaches whoever applies
// the job — not the controller that later creates its pods, where a warning
// is lost and a denial leaves the job without pods for ever — and so pods
// made from the template arrive complete (SyncTemplate).
func (m *Mutator) injectTemplate(where string, jobAnn map[string]string, t *corev1.PodTemplateSpec, reqs []gpureq.Request, podController string) ([]string, error) {
	w, err := m.inject(&t.Spec, reqs)
	warn := make([]string, 0, len(w))
	for _, x := range w {
		warn = append(warn, where+": "+x)
	}
	if err != nil {
		return warn, fmt.Errorf("%s: %w", where, err)
	}
	m.syncTemplate(jobAnn, t, podController)
	return warn, nil
}

// SyncTemplate keeps in a job's pod template what its pods would otherwise
// get from the pod webhook at creation: the placement gate while Kueue's
// podSetUpdates name a GPUPlan, and gpupack.io/injected (this
// configuration's Fingerprint) while a pod made from the template is a
// fixed point of Pod — no change, no warning, no denial. Checkpointing
// templates never get the marker: their pods need the job's current resume
// step and the agent's wrapping, which only the pod webhook adds. The pod
// webhook's fast-path match condition skips a pod only with a current
// marker, from a trusted controller, owned by a Job or PyTorchJob
// (webhooks.FastPathCondition); every other pod is mutated as before.
func (m *Mutator) SyncTemplate(jobAnn map[string]string, t *corev1.PodTemplateSpec) {
	m.syncTemplate(jobAnn, t, "")
}

// syncTemplate is SyncTemplate for a template whose pods podController
// ("StatefulSet", "ReplicaSet"; "" for a job's pods) controls. Pods of a
// StatefulSet or ReplicaSet that Kueue's pod integration takes get their
// plan only when Kueue admits them (an update of the pod), so the pod
// webhook gates them at creation (placement.KueuePodIntegration): their
// template carries the gate already, and is judged as such a pod, through
// AdmitPod, as the pod webhook judges it.
func (m *Mutator) syncTemplate(jobAnn map[string]string, t *corev1.PodTemplateSpec, podController string) {
	if m.templateGated(t, podController) {
		addGate(&t.Spec, v1alpha1.SchedulingGatePlacement)
	} else {
		removeGate(&t.Spec, v1alpha1.SchedulingGatePlacement)
	}
	if m.podReady(jobAnn, t, podController) {
		if t.Annotations == nil {
			t.Annotations = map[string]string{}
		}
		t.Annotations[v1alpha1.AnnotationInjected] = m.Fingerprint()
	} else if _, ok := t.Annotations[v1alpha1.AnnotationInjected]; ok {
		delete(t.Annotations, v1alpha1.AnnotationInjected)
		if len(t.Annotations) == 0 {
			t.Annotations = nil
		}
	}
}

// templateGated: pods made from t need the placement gate at creation —
// t carries a plan, or (a StatefulSet's pods) the pod webhook would gate
// such a pod (AdmitPod: Kueue's pod integration gives it a plan later).
func (m *Mutator) templateGated(t *corev1.PodTemplateSpec, podController string) bool {
	if _, planned := t.Annotations[v1alpha1.AnnotationPlan]; planned {
		return true
	}
	if podController == "" {
		return false
	}
	p := probePod(t, podController)
	removeGate(&p.Spec, v1alpha1.SchedulingGatePlacement)
	if _, err := m.AdmitPod(p, PodContext{}); err != nil {
		return false
	}
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == v1alpha1.SchedulingGatePlacement {
			return true
		}
	}
	return false
}

// probePod is a pod as podController ("" for none) makes it from t.
func probePod(t *corev1.PodTemplateSpec, podController string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: *t.ObjectMeta.DeepCopy(), Spec: *t.Spec.DeepCopy()}
	if podController != "" {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: podController, Name: "probe", UID: "probe", Controller: &yes}}
	}
	return p
}

// podReady reports whether a pod made from t needs nothing from the pod
// webhook: Pod leaves it unchanged, without a warning or a denial (for a
// StatefulSet's or ReplicaSet's pod, AdmitPod: such pods skip the pod
// webhook only as a whole, with the gate, webhooks.FastPathCondition).
func (m *Mutator) podReady(jobAnn map[string]string, t *corev1.PodTemplateSpec, podController string) bool {
	for _, ann := range []map[string]string{jobAnn, t.Annotations} {
		if hasAny(ann, []string{v1alpha1.AnnotationCheckpoint, v1alpha1.AnnotationLastConsistentCheckpoint}) {
			return false
		}
	}
	p := probePod(t, podController)
	if r, err := m.template("pod", nil, &corev1.PodTemplateSpec{ObjectMeta: *p.ObjectMeta.DeepCopy(), Spec: *p.Spec.DeepCopy()}); err != nil || !r.anyGPU {
		return false // a CPU-only template's pods never reach the pod webhook
	}
	admit := m.Pod
	if podController != "" {
		admit = m.AdmitPod
	}
	warn, err := admit(p, PodContext{})
	return err == nil && len(warn) == 0 && equality.Semantic.DeepEqual(p.Spec, t.Spec)
}

// SyncJob is SyncTemplate for a batch/v1 Job being updated (Kueue writes
// its podSetUpdates, or restores the template, when it starts or stops the
// job). It changes only template annotations and scheduling gates, which a
// suspended Job may change.
func (m *Mutator) SyncJob(j *batchv1.Job) {
	m.SyncTemplate(nonNil(j.Annotations), &j.Spec.Template)
}

// SyncPyTorchJob is SyncJob for a PyTorchJob's replica templates.
func (m *Mutator) SyncPyTorchJob(j *kftraining.PyTorchJob) {
	for _, rs := range j.Spec.PyTorchReplicaSpecs {
		if rs != nil {
			m.SyncTemplate(nonNil(j.Annotations), &rs.Template)
		}
	}
}

// Fingerprint identifies this configuration's injection: the value of
// gpupack.io/injected it writes. It hashes the configuration, the enabled
// job kinds, the installation's salt and the mutation of a probe pod, so a
// changed configuration, a newly enabled kind or a release that injects
// differently sends pods of older templates through the webhook, and no
// one without the salt can compute it in advance.
// With an epoch (Config.FastPathEpoch) the current epoch is mixed in.
func (m *Mutator) Fingerprint() string { return m.FingerprintAt(m.cfg.FastPathEpoch.Get()) }

// FingerprintAt is Fingerprint under epoch e (none: the salt's alone).
func (m *Mutator) FingerprintAt(e []byte) string {
	if len(e) == 0 {
		return m.fingerprint
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\nepoch %d %x\n", m.fingerprint, len(e), e)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// FastPathEpoch holds the current fast-path epoch (Config.FastPathEpoch);
// safe for concurrent use. The zero value and nil hold none.
type FastPathEpoch struct{ v atomic.Pointer[[]byte] }

// Set makes e the current epoch.
func (x *FastPathEpoch) Set(e []byte) {
	c := slices.Clone(e)
	x.v.Store(&c)
}

// Get returns the current epoch (nil: none).
func (x *FastPathEpoch) Get() []byte {
	if x == nil {
		return nil
	}
	if p := x.v.Load(); p != nil {
		return *p
	}
	return nil
}

// injectionVersion changes whenever the rules a pod must meet change
// without changing the probe's mutation (2: every container covered, hook
// delivered by the device plugin; 3: fractional pods always gated, denied
// without a plan they can get; 4: seccomp RuntimeDefault set, Unconfined
// denied; 5: terminationMessagePath checked like a mount).
const injectionVersion = "5"

func (m *Mutator) computeFingerprint() string {
	h := sha256.New()
	// The probe pod shows what this release injects; the version names
	// what it refuses, which a probe cannot show.
	fmt.Fprintln(h, injectionVersion)
	cfg, _ := json.Marshal(m.cfg)
	h.Write(cfg)
	// Neither is in the JSON: the salt is a secret, the kinds come from
	// the manager's flags.
	kinds := slices.Sorted(slices.Values(m.cfg.JobKinds))
	fmt.Fprintf(h, "\nkinds %q\nsalt %d %x\n", kinds, len(m.cfg.FastPathSalt), m.cfg.FastPathSalt)
	gpus := resource.MustParse("1")
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi", v1alpha1.AnnotationGPUCores: "50"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: gpus}}}}},
	}
	_, err := m.Pod(probe, PodContext{})
	out, _ := json.Marshal(probe)
	h.Write(out)
	fmt.Fprint(h, err)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func removeGate(s *corev1.PodSpec, name string) {
	for i, g := range s.SchedulingGates {
		if g.Name == name {
			s.SchedulingGates = append(s.SchedulingGates[:i:i], s.SchedulingGates[i+1:]...)
			if len(s.SchedulingGates) == 0 {
				s.SchedulingGates = nil
			}
			return
		}
	}
}

// replaceOwnedEnv removes the owned keys of c that are not in want (warning,
// or an error under EnvPolicyDeny) and adds want.
func (m *Mutator) replaceOwnedEnv(c *corev1.Container, want []corev1.EnvVar) ([]string, error) {
	ours := make(map[string]corev1.EnvVar, len(want))
	for _, e := range want {
		ours[e.Name] = e
	}
	// Entries already equal to ours stay where they are, so a second pass
	// changes nothing.
	var warn []string
	placed := map[string]bool{}
	kept := make([]corev1.EnvVar, 0, len(c.Env)+len(want))
	for _, e := range c.Env {
		if !owned(e.Name) {
			kept = append(kept, e)
			continue
		}
		if w, ok := ours[e.Name]; ok && envEqual(w, e) && !placed[e.Name] {
			placed[e.Name] = true
			kept = append(kept, e)
			continue
		}
		if m.cfg.EnvPolicy == EnvPolicyDeny {
			return nil, fmt.Errorf("container %q sets %s, which gpupack owns on GPU containers; remove it", c.Name, e.Name)
		}
		warn = append(warn, fmt.Sprintf("container %q: removed %s; gpupack owns it on GPU containers", c.Name, e.Name))
	}
	for _, w := range want {
		if !placed[w.Name] {
			kept = append(kept, w)
		}
	}
	if len(kept) == 0 {
		kept = nil // as decoded from JSON: an unchanged container stays equal
	}
	c.Env = kept
	return warn, nil
}

func envEqual(a, b corev1.EnvVar) bool {
	if a.Name != b.Name || a.Value != b.Value || (a.ValueFrom == nil) != (b.ValueFrom == nil) {
		return false
	}
	if a.ValueFrom == nil {
		return true
	}
	fa, fb := a.ValueFrom.FieldRef, b.ValueFrom.FieldRef
	return fa != nil && fb != nil && fa.FieldPath == fb.FieldPath && a.ValueFrom.ConfigMapKeyRef == nil && b.ValueFrom.ConfigMapKeyRef == nil &&
		a.ValueFrom.SecretKeyRef == nil && b.ValueFrom.SecretKeyRef == nil && a.ValueFrom.ResourceFieldRef == nil && b.ValueFrom.ResourceFieldRef == nil
}

// upsert replaces the first element of list that is the same as v (by
// name or path), or appends v: re-running a mutation then changes nothing.
func upsert[T any](list []T, v T, same func(T) bool) []T {
	for i := range list {
		if same(list[i]) {
			list[i] = v
			return list
		}
	}
	return append(list, v)
}

func setEnv(c *corev1.Container, e corev1.EnvVar) {
	c.Env = upsert(c.Env, e, func(x corev1.EnvVar) bool { return x.Name == e.Name })
}

const etcPreload = "/etc/ld.so.preload"

// guardHAMiHook removes, in hami mode, mounts that would shadow what HAMi's
// device plugin mounts at Allocate (/etc/ld.so.preload and HAMi-core's
// folder, hook.mountPath): kubelet applies pod-spec mounts after a device
// plugin's, so a tenant mount there would unload HAMi-core. gpupack's own
// hook mounts (left from gpupack mode) go silently. Nothing is added.
func (m *Mutator) guardHAMiHook(c *corev1.Container) []string {
	h := m.cfg.Hook
	guarded := map[string]bool{etcPreload: true, h.MountPath: true, h.MountPath + "/" + h.Library: true}
	var warn []string
	kept := c.VolumeMounts[:0:0]
	for _, vm := range c.VolumeMounts {
		switch {
		case vm.Name == VolumeHook || vm.Name == VolumeSharedCache:
		case guarded[vm.MountPath]:
			warn = append(warn, fmt.Sprintf("container %q: removed the mount at %s; HAMi's device plugin mounts its GPU hook there", c.Name, vm.MountPath))
		default:
			kept = append(kept, vm)
		}
	}
	if len(kept) == len(c.VolumeMounts) {
		return nil // unchanged (keeps nil vs empty as it was)
	}
	c.VolumeMounts = kept
	return warn
}

func setVolume(s *corev1.PodSpec, v corev1.Volume) {
	s.Volumes = upsert(s.Volumes, v, func(x corev1.Volume) bool { return x.Name == v.Name })
}
