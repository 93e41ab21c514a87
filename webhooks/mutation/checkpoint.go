package mutation

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/checkpoint/agent"
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
func (m *Mutator) wrapCheckpoint(p *corev1.Pod, reqs []gpureq.Request) error {
	t := corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	s, err := m.checkpointSettings("pod", &t)
	if err != nil {
		return err
	}
	need := int64((s.timeout + m.cfg.Checkpoint.Margin.Duration + time.Second - 1) / time.Second)
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if p.Spec.TerminationGracePeriodSeconds != nil {
		grace = *p.Spec.TerminationGracePeriodSeconds
	}
	if grace < need {
		grace = need
	}
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
