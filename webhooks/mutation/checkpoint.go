package mutation

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kueueconstants "sigs.k8s.io/kueue/pkg/controller/constants"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/checkpoint/agent"
	"github.com/gpupack/gpupack/checkpoint/manifest"
	"github.com/gpupack/gpupack/preemption/policy"
	"github.com/gpupack/gpupack/webhooks/gpureq"
)

type ckptSettings struct {
	signal  string
	timeout time.Duration
	dir     string
}

var signalRE = regexp.MustCompile(`^(SIG)?[A-Z][A-Z0-9]*$|^[0-9]{1,2}$`)

// checkpointSettings reads and checks the checkpoint annotations of an
// opted-in template, and that the containers to wrap have a command.
func (m *Mutator) checkpointSettings(where string, t *corev1.PodTemplateSpec) (ckptSettings, error) {
	s := ckptSettings{signal: DefaultCheckpointSignal, timeout: m.cfg.Checkpoint.DefaultTimeout.Duration, dir: t.Annotations[AnnotationCheckpointDir]}
	if v, ok := t.Annotations[v1alpha1.AnnotationCheckpointSignal]; ok {
		v = strings.ToUpper(strings.TrimSpace(v))
		if !signalRE.MatchString(v) {
			return s, fmt.Errorf("%s: annotation %s %q is not a signal name (example: SIGUSR1)", where, v1alpha1.AnnotationCheckpointSignal, v)
		}
		if _, err := agent.ParseSignal(v); err != nil {
			return s, fmt.Errorf("%s: annotation %s: %w", where, v1alpha1.AnnotationCheckpointSignal, err)
		}
		s.signal = v
	}
	if v, ok := t.Annotations[v1alpha1.AnnotationCheckpointTimeout]; ok {
		d, err := parseTimeout(v)
		if err != nil || d <= 0 {
			return s, fmt.Errorf("%s: annotation %s %q is not a positive duration (examples: 90s, 5m)", where, v1alpha1.AnnotationCheckpointTimeout, v)
		}
		if d > m.cfg.Checkpoint.MaxTimeout.Duration {
			return s, fmt.Errorf("%s: annotation %s %s is longer than the allowed %s", where, v1alpha1.AnnotationCheckpointTimeout, d, m.cfg.Checkpoint.MaxTimeout.Duration)
		}
		s.timeout = d
	}
	if s.dir != "" && !strings.HasPrefix(s.dir, "/") {
		return s, fmt.Errorf("%s: annotation %s %q must be an absolute path", where, AnnotationCheckpointDir, s.dir)
	}
	for _, i := range wrapTargets(t.Spec.Containers, nil) {
		c := t.Spec.Containers[i]
		if len(c.Command) == 0 {
			return s, fmt.Errorf("%s: %s is \"true\" but container %q has no command; gpupack cannot read the image's entrypoint, so set command (and args) explicitly", where, v1alpha1.AnnotationCheckpoint, c.Name)
		}
	}
	return s, nil
}

// parseTimeout accepts a Go duration or plain seconds.
func parseTimeout(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n > 1<<31 {
			return 0, fmt.Errorf("too long")
		}
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}

// wrapTargets are the containers run through gpupack-ckpt: the GPU
// containers, or the first container when none asks for a GPU.
func wrapTargets(cs []corev1.Container, reqs []gpureq.Request) []int {
	var out []int
	for i := range cs {
		if reqs != nil && i < len(reqs) && reqs[i].Kind != gpureq.NoGPU {
			out = append(out, i)
			continue
		}
		if reqs == nil {
			if r, err := gpureq.ContainerRequest(gpureq.Spec{}, &cs[i]); err == nil && r.Kind != gpureq.NoGPU {
				out = append(out, i)
			}
		}
	}
	if len(out) == 0 && len(cs) > 0 {
		out = []int{0}
	}
	return out
}

// wrapCheckpoint delivers gpupack-ckpt through an init container and runs
// the target containers under it.
func (m *Mutator) wrapCheckpoint(p *corev1.Pod, reqs []gpureq.Request, pc PodContext) error {
	t := corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	s, err := m.checkpointSettings("pod", &t)
	if err != nil {
		return err
	}
	// The policy of the pod's job's priority class bounds both: the
	// agent's timeout and the pod's grace (timeout + margin at least, the
	// class's cap + margin at most), so the grace the agent counts with is
	// the one the kubelet and the coordinator use.
	capd, maxGrace, _ := m.podCap(pc)
	s.timeout = min(s.timeout, capd)
	need := ceilSeconds(s.timeout + m.cfg.Checkpoint.Margin.Duration)
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if p.Spec.TerminationGracePeriodSeconds != nil {
		grace = *p.Spec.TerminationGracePeriodSeconds
	}
	grace = min(max(grace, need), ceilSeconds(maxGrace))
	p.Spec.TerminationGracePeriodSeconds = &grace

	for _, i := range wrapTargets(p.Spec.Containers, reqs) {
		c := &p.Spec.Containers[i]
		if len(c.Command) > 0 && c.Command[0] == CkptBinary {
			continue // already wrapped
		}
		cmd := []string{CkptBinary,
			"--checkpoint-signal=" + s.signal,
			"--checkpoint-timeout=" + s.timeout.String(),
			"--grace=" + (time.Duration(grace) * time.Second).String(),
			"--annotations-file=" + PodInfoDir + "/annotations",
		}
		if s.dir != "" {
			cmd = append(cmd, "--checkpoint-dir="+s.dir)
		}
		cmd = append(cmd, "--")
		cmd = append(cmd, c.Command...)
		cmd = append(cmd, c.Args...)
		c.Command, c.Args = cmd, nil
		addMount(c, corev1.VolumeMount{Name: VolumeCkptBin, MountPath: CkptBinDir, ReadOnly: true})
		addMount(c, corev1.VolumeMount{Name: VolumePodInfo, MountPath: PodInfoDir, ReadOnly: true})
		addEnvIfAbsent(c, corev1.EnvVar{Name: agent.EnvPodName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}})
		addEnvIfAbsent(c, corev1.EnvVar{Name: agent.EnvPodNamespace, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}})
	}
	setVolume(&p.Spec, corev1.Volume{Name: VolumeCkptBin, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	setVolume(&p.Spec, corev1.Volume{Name: VolumePodInfo, VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		Items: []corev1.DownwardAPIVolumeFile{{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations"}}},
	}}})
	for _, ic := range p.Spec.InitContainers {
		if ic.Name == InitCkptInstall {
			return nil
		}
	}
	p.Spec.InitContainers = append([]corev1.Container{{
		Name:         InitCkptInstall,
		Image:        m.cfg.Checkpoint.Image,
		Command:      append([]string(nil), m.cfg.Checkpoint.InstallCommand...),
		VolumeMounts: []corev1.VolumeMount{{Name: VolumeCkptBin, MountPath: CkptBinDir}},
	}}, p.Spec.InitContainers...)
	return nil
}

// ckptPolicy is the cluster's checkpoint policy as the pod webhook applies
// it: the manager's, with this configuration's margin; without one (tests,
// gpupack mutate) MaxTimeout caps every class.
func (m *Mutator) ckptPolicy() policy.Policy {
	p := m.cfg.Checkpoint.Policy
	if p.Max <= 0 {
		p.Max = m.cfg.Checkpoint.MaxTimeout.Duration
	}
	p.Margin = m.cfg.Checkpoint.Margin.Duration
	return p
}

// PodPriorityClass is the class Kueue gives an object's Workload from its
// metadata: Kueue's workload priority-class label, else priorityClassName.
// The pod webhook applies it to the pod's top job (or to the pod itself
// only where the pod is the job: Kueue's pod integration).
func PodPriorityClass(p *corev1.Pod) string {
	return PriorityClassOf(p.Labels, p.Spec.PriorityClassName)
}

// PriorityClassOf is PodPriorityClass for a job's labels and its pods'
// priorityClassName.
func PriorityClassOf(labels map[string]string, priorityClassName string) string {
	if pc := labels[kueueconstants.WorkloadPriorityClassLabel]; pc != "" {
		return pc
	}
	return priorityClassName
}

// podCap is the longest checkpoint time the policy lets the pod's class
// take, the longest grace that gives (cap + margin), and the class as
// messages name it. The pod's ClusterQueue is not
// known here, so a known class gets its longest over every queue
// (policy.CapOfClass; the coordinator applies the exact one at eviction);
// an unknown one the shortest cap of any (policy.Shortest).
func (m *Mutator) podCap(pc PodContext) (capd, grace time.Duration, class string) {
	pol := m.ckptPolicy()
	if !pc.ClassKnown {
		return pol.Shortest(), pol.ShortestGrace(), "unknown (the pod's job could not be told)"
	}
	return pol.CapOfClass(pc.Class), pol.MaxGraceOfClass(pc.Class), strconv.Quote(pc.Class)
}

// capGrace caps a GPU pod's terminationGracePeriodSeconds at what the
// policy lets its priority class hold GPUs after an eviction (the cap +
// margin): a tenant's hour of grace would otherwise keep a preempted
// pod's GPUs for an hour.
func (m *Mutator) capGrace(p *corev1.Pod, pc PodContext) []string {
	_, maxGrace, class := m.podCap(pc)
	limit := ceilSeconds(maxGrace)
	g := p.Spec.TerminationGracePeriodSeconds
	if g == nil || *g <= limit {
		return nil
	}
	w := fmt.Sprintf("terminationGracePeriodSeconds %d is longer than the cluster's checkpoint policy allows a GPU pod of priority class %s; set to %d", *g, class, limit)
	p.Spec.TerminationGracePeriodSeconds = &limit
	return []string{w}
}

// legacyEnvJobUID is the variable issue 16 first shipped (the job's UID):
// stripped like GPUPACK_JOB_ID, so a tenant's copy never stands either.
const legacyEnvJobUID = "GPUPACK_JOB_UID"

// JobID is the job identity GPUPACK_JOB_ID carries:
// <namespace>:<Kind>.<group>:<name> of the top of the pod's controller
// chain (a core-group kind has no ".<group>"). It names the job across
// delete-and-reapply, unlike its UID, and no tenant can name another
// namespace's job with it. An identity longer than a manifest id allows
// (manifest.MaxRunIDLen; names may be 253 characters) is
// "sha256-<hex of it>".
func JobID(namespace string, gk schema.GroupKind, name string) string {
	if namespace == "" || gk.Kind == "" || name == "" {
		return ""
	}
	id := namespace + ":" + gk.Kind
	if gk.Group != "" {
		id += "." + gk.Group
	}
	id += ":" + name
	if manifest.ValidateRunID(id) != nil {
		sum := sha256.Sum256([]byte(id))
		id = "sha256-" + hex.EncodeToString(sum[:])
	}
	return id
}

// setJobID sets GPUPACK_JOB_ID on every container of every pod to its
// job's identity (JobID; the helper writes it into each manifest, and the
// helper and the agent ignore another job's ranks in a shared directory).
// Any tenant entry of it, or of the legacy GPUPACK_JOB_UID, is removed
// first: a tenant's value never stands, since it could name another job.
// Where the job is not known a container that reads envFrom gets an
// explicit empty entry, which wins over a ConfigMap's or Secret's value.
// Not only checkpointing pods: a job using the helper without the agent
// writes manifests too.
func setJobID(p *corev1.Pod, id string) {
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		// (An env entry wins over a tenant's envFrom.)
		want := id != "" || len(c.EnvFrom) > 0
		var env []corev1.EnvVar
		for _, e := range c.Env {
			switch {
			case e.Name == agent.EnvJobID && want:
				// In place, so that mutating a mutated pod (ValidatePod)
				// changes nothing.
				env, want = append(env, corev1.EnvVar{Name: agent.EnvJobID, Value: id}), false
			case e.Name != agent.EnvJobID && e.Name != legacyEnvJobUID:
				env = append(env, e)
			}
		}
		if want {
			env = append(env, corev1.EnvVar{Name: agent.EnvJobID, Value: id})
		}
		c.Env = env
	}
}

func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

func addMount(c *corev1.Container, vm corev1.VolumeMount) {
	c.VolumeMounts = upsert(c.VolumeMounts, vm, func(x corev1.VolumeMount) bool { return x.MountPath == vm.MountPath })
}

func addEnvIfAbsent(c *corev1.Container, e corev1.EnvVar) {
	for _, x := range c.Env {
		if x.Name == e.Name {
			return
		}
	}
	c.Env = append(c.Env, e)
}
