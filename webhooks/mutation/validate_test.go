package mutation

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// DenialCases are the bad inputs of issue 4's "Done when"; the integration
// test sends the same through the real apiserver.
func TestDenials(t *testing.T) {
	m := mustNew(t, Config{})
	gpuPod := func(ann ...string) *podW {
		p := makePod("p").nodeSelector(flavors.LabelGPUProduct, h100)
		for i := 0; i < len(ann); i += 2 {
			p.ann(ann[i], ann[i+1])
		}
		return p
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"memory above the 90% line", gpuPod(v1alpha1.AnnotationGPUMemory, "79Gi").ctr(makeCtr("c").gpus("1").obj()).obj(), "more than the 71903 MiB a pod may take on one NVIDIA-H100-80GB-HBM3"},
		{"cores above 100", gpuPod(v1alpha1.AnnotationGPUMemory, "1Gi", v1alpha1.AnnotationGPUCores, "150").ctr(makeCtr("c").gpus("1").obj()).obj(), "gpu-cores \"150\" is outside 1–100"},
		{"cores zero", gpuPod(v1alpha1.AnnotationGPUMemory, "1Gi", v1alpha1.AnnotationHAMiGPUCores, "0").ctr(makeCtr("c").gpus("1").obj()).obj(), "gpucores \"0\" is outside 1–100"},
		{"unparsable memory", gpuPod(v1alpha1.AnnotationGPUMemory, "lots").ctr(makeCtr("c").gpus("1").obj()).obj(), "\"lots\" is not a quantity"},
		{"memory without a GPU", gpuPod(v1alpha1.AnnotationGPUMemory, "1Gi").ctr(makeCtr("c").limit("cpu", "1").obj()).obj(), "no container asks for nvidia.com/gpu"},
		{"conflicting gpupack and HAMi", gpuPod(v1alpha1.AnnotationGPUMemory, "1Gi", v1alpha1.AnnotationHAMiGPUMem, "2048").ctr(makeCtr("c").gpus("1").obj()).obj(), "conflict"},
		{"privileged GPU container", gpuPod().ctr(makeCtr("c").gpus("1").privileged().obj()).obj(), "is privileged"},
		{"cores without memory", gpuPod(v1alpha1.AnnotationGPUCores, "30").ctr(makeCtr("c").gpus("1").obj()).obj(), "exclusive"},
		{"checkpoint without command", gpuPod(v1alpha1.AnnotationCheckpoint, "true").ctr(makeCtr("c").gpus("1").noCommand().obj()).obj(), "has no command"},
		{"bad checkpoint timeout", gpuPod(v1alpha1.AnnotationCheckpoint, "true", v1alpha1.AnnotationCheckpointTimeout, "soon").ctr(makeCtr("c").gpus("1").obj()).obj(), "not a positive duration"},
		{"bad checkpoint signal", gpuPod(v1alpha1.AnnotationCheckpoint, "true", v1alpha1.AnnotationCheckpointSignal, "SIGNOPE").ctr(makeCtr("c").gpus("1").obj()).obj(), "checkpoint-signal"},
		{"vgpu without memory", gpuPod().ctr(makeCtr("c").limit(vgpu, "1").obj()).obj(), "needs a memory limit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Pod(tc.pod.DeepCopy(), PodContext{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Pod: err = %v, want %q", err, tc.want)
			}
			if err := m.ValidatePod(tc.pod); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ValidatePod: err = %v, want %q", err, tc.want)
			}
			// The same template inside a Job is denied too.
			j := makeJob(nil, corev1.PodTemplateSpec{ObjectMeta: tc.pod.ObjectMeta, Spec: tc.pod.Spec})
			if err := m.ValidateJob(j); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ValidateJob: err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCheckpointWrap(t *testing.T) {
	m := mustNew(t, Config{Checkpoint: CheckpointConfig{Image: "mgr:v1", Margin: metav1.Duration{Duration: 15 * time.Second}}})
	c := makeCtr("trainer").gpus("1").obj()
	c.Args = []string{"--epochs", "3"}
	p := makePod("p").ann(v1alpha1.AnnotationCheckpoint, "true").ann(v1alpha1.AnnotationCheckpointTimeout, "2m").
		ann(v1alpha1.AnnotationCheckpointSignal, "SIGUSR2").ann(AnnotationCheckpointDir, "/ckpt").
		ctr(c).ctr(makeCtr("logger").obj()).obj()
	if _, err := m.Pod(p, PodContext{ResumeStep: "4000"}); err != nil {
		t.Fatal(err)
	}
	tr := p.Spec.Containers[0]
	wantCmd := []string{CkptBinary, "--checkpoint-signal=SIGUSR2", "--checkpoint-timeout=2m0s", "--grace=2m15s",
		"--annotations-file=/etc/gpupack/podinfo/annotations", "--checkpoint-dir=/ckpt", "--", "python", "train.py", "--epochs", "3"}
	if d := cmp.Diff(wantCmd, tr.Command); d != "" || tr.Args != nil {
		t.Errorf("command (-want +got):\n%s\nargs %v", d, tr.Args)
	}
	if got := *p.Spec.TerminationGracePeriodSeconds; got != 135 {
		t.Errorf("terminationGracePeriodSeconds = %d, want 135", got)
	}
	if d := cmp.Diff([]string{"python", "train.py"}, p.Spec.Containers[1].Command); d != "" {
		t.Errorf("non-GPU container wrapped (-want +got):\n%s", d)
	}
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != "mgr:v1" || p.Spec.InitContainers[0].Name != InitCkptInstall {
		t.Errorf("init containers = %+v", p.Spec.InitContainers)
	}
	env := map[string]string{}
	for _, e := range tr.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if d := cmp.Diff(map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", v1alpha1.EnvResumeStep: "4000"}, env); d != "" {
		t.Errorf("env (-want +got):\n%s", d)
	}
	var vols []string
	for _, v := range p.Spec.Volumes {
		vols = append(vols, v.Name)
	}
	if d := cmp.Diff([]string{VolumeCkptBin, VolumePodInfo}, vols); d != "" {
		t.Errorf("volumes (-want +got):\n%s", d)
	}
	// A longer grace period the user set is capped at the policy's cap +
	// margin (here MaxTimeout 5m + 15s), and the agent is told that grace.
	long := int64(3600)
	p = makePod("p").ann(v1alpha1.AnnotationCheckpoint, "true").ctr(makeCtr("t").obj()).obj()
	p.Spec.TerminationGracePeriodSeconds = &long
	if _, err := m.Pod(p, PodContext{}); err != nil || *p.Spec.TerminationGracePeriodSeconds != 315 || !strings.Contains(strings.Join(p.Spec.Containers[0].Command, " "), "--grace=5m15s --") {
		t.Errorf("grace capped: %v %v %v", err, *p.Spec.TerminationGracePeriodSeconds, p.Spec.Containers[0].Command)
	}
}

func TestPlacementGate(t *testing.T) {
	m := mustNew(t, Config{})
	p := makePod("p").ann(v1alpha1.AnnotationPlan, "wl-plan").ctr(makeCtr("c").gpus("1").obj()).obj()
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/topology"}}
	if _, err := m.Pod(p, PodContext{}); err != nil {
		t.Fatal(err)
	}
	want := []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/topology"}, {Name: v1alpha1.SchedulingGatePlacement}}
	if d := cmp.Diff(want, p.Spec.SchedulingGates); d != "" {
		t.Errorf("gates (-want +got):\n%s", d)
	}
}

func TestUpdates(t *testing.T) {
	m := mustNew(t, Config{})
	yes, no := true, false
	// The edit changes the annotation only: a Job's template containers
	// (converted resources, hook env) cannot change after creation.
	created := makeJob(map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi"}, template(nil, makeCtr("c").gpus("1").obj()))
	if _, err := m.Job(created); err != nil {
		t.Fatal(err)
	}
	job := func(suspend *bool, mem string) *batchv1.Job {
		j := created.DeepCopy()
		j.Annotations[v1alpha1.AnnotationGPUMemory] = mem
		j.Spec.Suspend = suspend
		return j
	}
	if err := m.ValidateJobUpdate(job(&no, "1Gi"), job(&no, "2Gi")); err == nil || !strings.Contains(err.Error(), "cannot change while the job runs") {
		t.Errorf("running job edit: %v", err)
	}
	if err := m.ValidateJobUpdate(job(nil, "1Gi"), job(nil, "1Gi")); err != nil {
		t.Errorf("no edit: %v", err)
	}
	if err := m.ValidateJobUpdate(job(&yes, "1Gi"), job(&yes, "2Gi")); err != nil {
		t.Errorf("suspended job edit: %v", err)
	}
	oldPod := makePod("p").ann(v1alpha1.AnnotationGPUMemory, "1Gi").obj()
	newPod := makePod("p").ann(v1alpha1.AnnotationGPUMemory, "2Gi").obj()
	if err := m.ValidatePodUpdate(oldPod, newPod); err == nil {
		t.Error("pod annotation edit allowed")
	}
	other := oldPod.DeepCopy()
	other.Annotations[v1alpha1.AnnotationDevices] = "GPU-1:100"
	if err := m.ValidatePodUpdate(oldPod, other); err != nil {
		t.Errorf("unrelated pod edit: %v", err)
	}
	pt := makePyTorchJob(nil, map[string]corev1.PodTemplateSpec{"Worker": template(map[string]string{v1alpha1.AnnotationGPUMemory: "1Gi"}, makeCtr("c").gpus("1").obj())})
	pt2 := pt.DeepCopy()
	pt2.Spec.PyTorchReplicaSpecs["Worker"].Template.Annotations[v1alpha1.AnnotationGPUMemory] = "3Gi"
	if err := m.ValidatePyTorchJobUpdate(pt, pt2); err == nil {
		t.Error("running PyTorchJob template edit allowed")
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte("hook:\n  preload: Env\nenvPolicy: Deny\ndefaultGPUModel: NVIDIA H200\ncheckpoint:\n  margin: 45s\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Hook.Preload, want.EnvPolicy, want.DefaultGPUModel = PreloadEnv, EnvPolicyDeny, "NVIDIA H200"
	want.Checkpoint.Margin.Duration = 45 * time.Second
	if d := cmp.Diff(want, c); d != "" {
		t.Errorf("config (-want +got):\n%s", d)
	}
	for _, bad := range []string{"hook:\n  preload: Both\n", "envPolicy: Maybe\n", "defaultGPUModel: Voodoo2\n", "unknownField: 1\n", "buffer:\n  bufferPercent: 95\n", "gpuModels:\n- model: X\n"} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("ParseConfig(%q) accepted", bad)
		}
	}
}

// An owned env key put into a job's template by an update is refused (only
// the validating webhook sees updates); keys the old template already had
// (a job from before templates were stripped) do not block Kueue's or the
// operators' updates.
func TestJobUpdateAddingOwnedEnv(t *testing.T) {
	m := mustNew(t, Config{})
	h100Template := func(cs ...corev1.Container) corev1.PodTemplateSpec {
		t := template(nil, cs...)
		t.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: h100}
		return t
	}
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	clean := makeCtr("trainer").gpus("1").obj()
	tenant := makeCtr("trainer").gpus("1").env(v1alpha1.EnvLDPreload, "/evil.so").obj()
	cpu := makeCtr("logger").env(v1alpha1.EnvLDPreload, "/mine.so").obj()
	for _, tc := range []struct {
		name     string
		old, cur corev1.Container
		wantErr  bool
	}{
		{"added on the GPU container", clean, tenant, true},
		{"already there (older job), unchanged", tenant, tenant, false},
		{"changed value", tenant, makeCtr("trainer").gpus("1").env(v1alpha1.EnvLDPreload, "/other.so").obj(), true},
		{"nothing owned", clean, clean, false},
	} {
		t.Run("Job/"+tc.name, func(t *testing.T) {
			old, cur := makeJob(mem, h100Template(tc.old, cpu)), makeJob(mem, h100Template(tc.cur, cpu))
			err := m.ValidateJobUpdate(old, cur)
			if tc.wantErr != (err != nil) || (err != nil && !strings.Contains(err.Error(), `pod template: container "trainer" sets LD_PRELOAD, which gpupack owns on GPU containers; remove it`)) {
				t.Errorf("err = %v, want error %v", err, tc.wantErr)
			}
		})
		t.Run("PyTorchJob/"+tc.name, func(t *testing.T) {
			old := makePyTorchJob(mem, map[string]corev1.PodTemplateSpec{"Master": h100Template(cpu), "Worker": h100Template(tc.old, cpu)})
			cur := makePyTorchJob(mem, map[string]corev1.PodTemplateSpec{"Master": h100Template(cpu), "Worker": h100Template(tc.cur, cpu)})
			err := m.ValidatePyTorchJobUpdate(old, cur)
			if tc.wantErr != (err != nil) || (err != nil && !strings.Contains(err.Error(), `replica Worker: container "trainer" sets LD_PRELOAD`)) {
				t.Errorf("err = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}
