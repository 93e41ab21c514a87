package mutation

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// podFrom makes a pod the way the Job controller or the training operator
// does: the template plus labels, an owner and env of their own.
func podFrom(t *corev1.PodTemplateSpec) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: *t.ObjectMeta.DeepCopy(), Spec: *t.Spec.DeepCopy()}
	p.Name, p.Namespace = "j-0-abcde", "ns"
	p.Labels = map[string]string{"batch.kubernetes.io/job-name": "j"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "j", Controller: new(true)}}
	for i := range p.Spec.Containers {
		p.Spec.Containers[i].Env = append(p.Spec.Containers[i].Env, corev1.EnvVar{Name: "JOB_COMPLETION_INDEX", Value: "0"})
	}
	return p
}

// A marked template is the promise the pod webhook's fast path relies on:
// a pod a controller makes from it is already what the pod webhook would
// make of it — Pod changes nothing and has nothing to say.
func TestMarkedTemplatePodsAreFixedPoints(t *testing.T) {
	h100 := func(ann map[string]string, cs ...corev1.Container) corev1.PodTemplateSpec {
		t := template(ann, cs...)
		t.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: h100}
		return t
	}
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	cases := []struct {
		name string
		cfg  Config
		job  *batchv1.Job
	}{
		{"fractional", Config{}, makeJob(mem, h100(nil, makeCtr("c").gpus("1").obj()))},
		{"fractional with cores, two GPUs, a sidecar", Config{}, makeJob(map[string]string{v1alpha1.AnnotationGPUMemory: "10Gi", v1alpha1.AnnotationGPUCores: "40"},
			h100(nil, makeCtr("c").gpus("2").obj(), makeCtr("log").limit("cpu", "1").obj()))},
		{"tenant env stripped", Config{}, makeJob(mem, h100(nil, makeCtr("c").gpus("1").env(v1alpha1.EnvLDPreload, "/evil.so").env("KEEP", "me").obj()))},
		{"LD_PRELOAD mode", Config{Hook: HookConfig{Preload: PreloadEnv}}, makeJob(mem, h100(nil, makeCtr("c").gpus("1").obj()))},
		{"whole GPUs", Config{}, makeJob(nil, template(nil, makeCtr("c").gpus("8").obj()))},
		{"HAMi percentage", Config{}, makeJob(map[string]string{v1alpha1.AnnotationHAMiGPUMemPercentage: "25"}, h100(nil, makeCtr("c").gpus("1").obj()))},
		{"hami mode", Config{Resources: ResourcesHAMi}, makeJob(mem, h100(nil, makeCtr("c").gpus("1").obj()))},
		{"planned (Kueue's podSetUpdates)", Config{}, makeJob(mem, h100(map[string]string{v1alpha1.AnnotationPlan: "wl-plan"}, makeCtr("c").gpus("1").obj()))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.cfg)
			if _, err := m.Job(tc.job); err != nil {
				t.Fatal(err)
			}
			tmpl := &tc.job.Spec.Template
			if got := tmpl.Annotations[v1alpha1.AnnotationInjected]; got != m.Fingerprint() {
				t.Fatalf("marker = %q, want %q", got, m.Fingerprint())
			}
			pod := podFrom(tmpl)
			before := pod.DeepCopy()
			warn, err := m.Pod(pod, PodContext{})
			if err != nil || len(warn) != 0 {
				t.Fatalf("Pod: warn %q err %v", warn, err)
			}
			if d := cmp.Diff(before, pod); d != "" {
				t.Errorf("the pod webhook would still change the pod (-template +webhook):\n%s", d)
			}
		})
	}
}

func TestSyncTemplate(t *testing.T) {
	m := mustNew(t, Config{})
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "70Gi"}
	created := makeJob(mem, template(nil, makeCtr("c").gpus("1").obj()))
	created.Spec.Template.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: h100}
	if _, err := m.Job(created); err != nil {
		t.Fatal(err)
	}
	gates := func(j *batchv1.Job) []string {
		var out []string
		for _, g := range j.Spec.Template.Spec.SchedulingGates {
			out = append(out, g.Name)
		}
		return out
	}
	marked := func(j *batchv1.Job) bool {
		return j.Spec.Template.Annotations[v1alpha1.AnnotationInjected] == m.Fingerprint()
	}

	// Kueue starts the job: its podSetUpdates name the plan, and TAS may
	// add its own gate. The placement gate joins; the marker stays.
	started := created.DeepCopy()
	started.Spec.Template.Annotations[v1alpha1.AnnotationPlan] = "plan-1"
	started.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/topology"}}
	m.SyncJob(started)
	if d := cmp.Diff([]string{"kueue.x-k8s.io/topology", v1alpha1.SchedulingGatePlacement}, gates(started)); d != "" || !marked(started) {
		t.Errorf("started: gates %v (-want +got %s), marked %v", gates(started), d, marked(started))
	}
	again := started.DeepCopy()
	m.SyncJob(again)
	if d := cmp.Diff(started, again); d != "" {
		t.Errorf("second sync changed the job:\n%s", d)
	}

	// Kueue stops it and restores the template: the gate goes with the plan.
	stopped := started.DeepCopy()
	delete(stopped.Spec.Template.Annotations, v1alpha1.AnnotationPlan)
	stopped.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
	m.SyncJob(stopped)
	if len(gates(stopped)) != 0 || !marked(stopped) {
		t.Errorf("stopped: gates %v, marked %v", gates(stopped), marked(stopped))
	}

	// Admitted to a smaller flavor: 70Gi is above an A100-40GB's line, so
	// the pods must meet the pod webhook (which denies them) — no marker.
	small := started.DeepCopy()
	small.Spec.Template.Spec.NodeSelector[flavors.LabelGPUProduct] = "NVIDIA-A100-SXM4-40GB"
	m.SyncJob(small)
	if marked(small) {
		t.Error("a template whose pods the webhook would deny kept the marker")
	}
	if _, err := m.Pod(podFrom(&small.Spec.Template), PodContext{}); err == nil {
		t.Error("the pod webhook admits the over-the-line pod")
	}

	// A forged or stale marker does not survive a sync.
	forged := created.DeepCopy()
	forged.Spec.Template.Annotations[v1alpha1.AnnotationInjected] = "0000000000000000"
	forged.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: v1alpha1.EnvDisableControl, Value: "1"}} // not what gpupack admits
	m.SyncJob(forged)
	if _, ok := forged.Spec.Template.Annotations[v1alpha1.AnnotationInjected]; ok {
		t.Error("a template that is not a fixed point kept a marker")
	}

	// Checkpointing jobs: their pods need the agent and the resume step.
	ck := makeJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationCheckpoint: "true"}, template(nil, makeCtr("c").gpus("1").obj()))
	ck.Spec.Template.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: h100}
	if _, err := m.Job(ck); err != nil {
		t.Fatal(err)
	}
	if marked(ck) {
		t.Error("a checkpointing template is marked")
	}

	// A different configuration writes a different marker.
	other := mustNew(t, Config{EnvPolicy: EnvPolicyDeny})
	if other.Fingerprint() == m.Fingerprint() {
		t.Error("two configurations share a fingerprint")
	}
	if again := mustNew(t, Config{}); again.Fingerprint() != m.Fingerprint() {
		t.Error("the fingerprint is not stable")
	}
}

// TestFingerprintInputs: the salt and the enabled job kinds are part of the
// marker (not of the configuration's JSON), the kinds' order is not, and
// the same inputs always give the same marker (a manager restart keeps
// accepting its templates).
func TestFingerprintInputs(t *testing.T) {
	salt := []byte("0123456789abcdef0123456789abcdef")
	base := Config{FastPathSalt: salt, JobKinds: []string{"JobSet"}}
	with := func(f func(*Config)) Config {
		c := base
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		same bool
	}{
		{"the same inputs", with(func(*Config) {}), true},
		{"the same salt in a fresh slice", with(func(c *Config) { c.FastPathSalt = append([]byte(nil), salt...) }), true},
		{"kinds in another order", with(func(c *Config) { c.JobKinds = []string{"JobSet"} }), true},
		{"no salt (what anyone computes from the release and config)", with(func(c *Config) { c.FastPathSalt = nil }), false},
		{"another salt", with(func(c *Config) { c.FastPathSalt = []byte("1123456789abcdef0123456789abcdef") }), false},
		{"LeaderWorkerSet enabled later", with(func(c *Config) { c.JobKinds = []string{"JobSet", "LeaderWorkerSet"} }), false},
		{"StatefulSet enabled later", with(func(c *Config) { c.JobKinds = []string{"StatefulSet", "JobSet"} }), false},
		{"no kinds", with(func(c *Config) { c.JobKinds = nil }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := mustNew(t, base).Fingerprint(), mustNew(t, tc.cfg).Fingerprint()
			if (a == b) != tc.same {
				t.Errorf("fingerprints %s and %s: same = %v, want %v", a, b, a == b, tc.same)
			}
		})
	}
	two := mustNew(t, Config{FastPathSalt: salt, JobKinds: []string{"StatefulSet", "JobSet"}}).Fingerprint()
	if two != mustNew(t, Config{FastPathSalt: salt, JobKinds: []string{"JobSet", "StatefulSet"}}).Fingerprint() {
		t.Error("the kinds' order changes the marker")
	}
}
