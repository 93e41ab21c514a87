package jobkinds

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/yaml"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// trainingRuntime is a torch TrainingRuntime whose trainer ("node")
// template asks, by the runtime's own annotation, for mem of one H100 per
// node — where the request usually lives (docs/webhooks.md, "Where a
// TrainJob's request lives"). checkpoint opts its pods in to the
// checkpoint protocol; gpu false leaves the template without a GPU (the
// TrainJob then carries the request). ns "" makes a ClusterTrainingRuntime.
func trainingRuntime(name, ns, mem string, gpu, checkpoint bool) *unstructured.Unstructured {
	kind, meta := "TrainingRuntime", fmt.Sprintf("name: %s\n  namespace: %s", name, ns)
	if ns == "" {
		kind, meta = "ClusterTrainingRuntime", "name: "+name
	}
	ann := ""
	if mem != "" {
		ann = fmt.Sprintf("\n  annotations:\n    gpupack.io/gpu-memory: %q", mem)
	}
	podAnn := ""
	if checkpoint {
		podAnn = fmt.Sprintf("\n                annotations:\n                  %s: \"true\"\n                  %s: 60s", v1alpha1.AnnotationCheckpoint, v1alpha1.AnnotationCheckpointTimeout)
	}
	res := "{}"
	if gpu {
		res = "\n                    limits:\n                      nvidia.com/gpu: 1"
	}
	return fromYAML(fmt.Sprintf(`apiVersion: trainer.kubeflow.org/v1alpha1
kind: %s
metadata:
  %s
  labels:
    trainer.kubeflow.org/framework: torch%s
spec:
  mlPolicy:
    numNodes: 2
    torch: {}
  template:
    spec:
      network:
        enableDNSHostnames: false
      replicatedJobs:
      - name: node
        replicas: 1
        template:
          metadata:
            labels:
              trainer.kubeflow.org/trainjob-ancestor-step: trainer
          spec:
            template:
              metadata:
                labels:
                  test.gpupack.io/runtime: %s%s
              spec:
                restartPolicy: Never
                nodeSelector:
                  nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
                tolerations:
                - key: kwok.x-k8s.io/node
                  operator: Exists
                  effect: NoSchedule
                containers:
                - name: node
                  image: docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
                  command: ["python", "train.py"]
                  resources: %s
`, kind, meta, ann, name, podAnn, res))
}

// trainJob is a TrainJob of 2 nodes on runtime (of runtimeKind), queued in
// lq at priority. perNodeMem, when set, puts the request on the TrainJob
// instead: its annotation plus nvidia.com/gpu: 1 in
// trainer.resourcesPerNode.
func trainJob(name, ns, runtimeKind, runtime, priority, perNodeMem string) *unstructured.Unstructured {
	ann, res := "", ""
	if perNodeMem != "" {
		ann = fmt.Sprintf("\n  annotations:\n    gpupack.io/gpu-memory: %q", perNodeMem)
		res = "\n    resourcesPerNode:\n      limits:\n        nvidia.com/gpu: 1"
	}
	return fromYAML(fmt.Sprintf(`apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: %s
  namespace: %s
  labels:
    kueue.x-k8s.io/queue-name: lq
    kueue.x-k8s.io/priority-class: %s%s
spec:
  runtimeRef:
    name: %s
    kind: %s
  trainer:
    numNodes: 2%s
`, name, ns, priority, ann, runtime, runtimeKind, res))
}

// createRuntime creates a (Cluster)TrainingRuntime and waits until the
// Trainer's TrainJob webhook, which reads runtimes from its cache, knows
// it: a dry-run TrainJob in ns naming it is no longer refused "must be
// created before the TrainJob is created".
func createRuntime(t *testing.T, env *framework.Env, ns string, rt *unstructured.Unstructured) {
	t.Helper()
	env.MustCreate(t, rt)
	probe := trainJob("runtime-probe", ns, rt.GetKind(), rt.GetName(), "low", "")
	env.Eventually(t, 60*time.Second, "the Trainer's webhook knows "+rt.GetKind()+" "+rt.GetName(), func() (bool, string) {
		err := env.Client.Create(env.Ctx, probe.DeepCopy(), client.DryRunAll)
		return err == nil || !strings.Contains(err.Error(), "must be created before the TrainJob is created"), fmt.Sprint(err)
	})
}

func fromYAML(s string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(s), &u.Object); err != nil {
		panic(fmt.Sprintf("%v\n%s", err, s))
	}
	return u
}

func getTrainJob(t *testing.T, env *framework.Env, ns, name string) *trainer.TrainJob {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(trainer.GroupVersion.WithKind("TrainJob"))
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
		t.Fatal(err)
	}
	var tj trainer.TrainJob
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &tj); err != nil {
		t.Fatal(err)
	}
	return &tj
}

func podSet(wl *kueue.Workload, name string) *kueue.PodSet {
	for i := range wl.Spec.PodSets {
		if string(wl.Spec.PodSets[i].Name) == name {
			return &wl.Spec.PodSets[i]
		}
	}
	return nil
}

// The whole path for TrainJob with the real Kubeflow Trainer v2 and JobSet
// controllers and Kueue's trainer.kubeflow.org/trainjob integration: a
// fractional TrainJob (the request on its TrainingRuntime) is converted,
// counted by Kueue in gpupack.io/*, held by the gang-fit check while a GPU
// is busy and admitted once it is free; its pods (TrainJob → JobSet → Job
// → Pod, every link made by a real controller) are pinned to the planned
// GPUs, each on its own slot; a higher-priority TrainJob (the request on
// the TrainJob itself: resourcesPerNode, on a ClusterTrainingRuntime)
// makes Kueue preempt it; the
// coordinator finds the victim's pods through the chain and runs the
// checkpoint protocol; the check holds the preemptor until the victim's
// pods are gone; the consistent step is recorded on the TrainJob and when
// the victim is re-admitted its recreated pods get GPUPACK_RESUME_STEP.
//
// Kueue's jobset integration is off here: the TrainJob's JobSet is then a
// kind Kueue knows but does not run, and its Jobs are managed through the
// TrainJob (webhooks' owner walk; the Jobs were denied before).
func TestTrainJobControllerHeldPinnedAndPreemptedThroughTheCheckpointProtocol(t *testing.T) {
	testTrainJobController(t, framework.Options{TrainJob: true, JobSetController: true, TrainerController: true})
}

// The same with Kueue's jobset integration on as well (Kueue's default
// frameworks run both): the TrainJob's JobSet carries Kueue's queue label
// (from its runtime patch) and is a child of the managed TrainJob, for
// Kueue's webhooks and gpupack's alike.
func TestTrainJobControllerWithKueueJobSetIntegration(t *testing.T) {
	s := testTrainJobController(t, framework.Options{TrainJob: true, JobSet: true, JobSetController: true, TrainerController: true})
	// The shipped example passes the real Trainer's webhooks (and Kueue's,
	// and gpupack's) as it is.
	env := s.env
	env.MustCreate(t, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "ml-team"}}})
	for _, o := range framework.ReadObjects(t, "manifests/examples/trainjob-fractional.yaml") {
		if err := env.Client.Create(env.Ctx, o); err != nil {
			t.Errorf("example %s %s refused: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

func testTrainJobController(t *testing.T, opts framework.Options) *controllerSuite {
	needController(t, "jobset")
	needController(t, "trainer")
	s := startControllerSuite(t, opts,
		webhooks.KindTrainJob, webhooks.KindTrainingRuntime, webhooks.KindClusterTrainingRuntime, webhooks.KindJobSet)
	env := s.env
	lowSel := client.MatchingLabels{labelJobSetName: "low"}
	highSel := client.MatchingLabels{labelJobSetName: "high"}
	fake := &fakeTrainer{env: env, ns: s.ns, selector: lowSel}
	fake.run(t)

	// One of n1's two GPUs is busy (a pod in kube-system, which gpupack's
	// webhooks exclude, holds all of it): Kueue's quota admits the victim,
	// the check cannot place 2 × 50 GiB on one GPU and holds it.
	h100, _ := flavors.Lookup(framework.H100)
	env.MustCreate(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "kube-system", Annotations: map[string]string{
			v1alpha1.AnnotationDevices: v1alpha1.FormatDevices([]v1alpha1.DeviceAssignment{{UUID: "GPU-n1-1", MemoryMiB: flavors.Allocatable(h100.MemoryMiB)}})}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "x",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}},
	})

	// The victim's runtime carries the request (and the checkpoint opt-in);
	// the webhook converts its template at apply time.
	createRuntime(t, env, s.ns, trainingRuntime("torch-ckpt", s.ns, "50Gi", true, true))
	rt := &unstructured.Unstructured{}
	rt.SetGroupVersionKind(trainer.GroupVersion.WithKind("TrainingRuntime"))
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "torch-ckpt"}, rt); err != nil {
		t.Fatal(err)
	}
	var rts trainer.TrainingRuntime
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(rt.Object, &rts); err != nil {
		t.Fatal(err)
	}
	tmpl := rts.Spec.Template.Spec.ReplicatedJobs[0].Template.Spec.Template
	lim := tmpl.Spec.Containers[0].Resources.Limits
	if q := lim[v1alpha1.ResourceGPUMemory]; q.Value() != 51200 || lim.Name(v1alpha1.ResourceVGPU, resource.DecimalSI).Value() != 1 {
		t.Errorf("stored runtime template limits %v, want gpupack.io/vgpu 1 and gpupack.io/gpu-memory 51200", lim)
	}
	// Not marked: its pods opt in to checkpointing, so the pod webhook
	// still wraps them (no fast path).
	if _, ok := lim[v1alpha1.ResourceNvidiaGPU]; ok || tmpl.Annotations[v1alpha1.AnnotationInjected] != "" || tmpl.Annotations[v1alpha1.AnnotationGPUMemory] != "50Gi" {
		t.Errorf("stored runtime template: limits %v, annotations %v; want converted, the request written on it, and no marker", lim, tmpl.Annotations)
	}

	env.MustCreate(t, trainJob("low", s.ns, "TrainingRuntime", "torch-ckpt", "low", ""))
	wl := env.WaitForWorkloadOf(t, s.ns, "low", "TrainJob", nil)
	ps := podSet(wl, "node")
	if ps == nil || ps.Count != 2 {
		t.Fatalf("TrainJob Workload pod sets: %+v", wl.Spec.PodSets)
	}
	req := ps.Template.Spec.Containers[0].Resources.Requests
	if q := req[v1alpha1.ResourceGPUMemory]; q.Value() != 51200 || req.Name(v1alpha1.ResourceVGPU, resource.DecimalSI).Value() != 1 {
		t.Errorf("Workload pod set node requests %v, want gpupack.io/vgpu 1 and gpupack.io/gpu-memory 51200", req)
	}
	if _, ok := req[v1alpha1.ResourceNvidiaGPU]; ok {
		t.Errorf("Kueue counts nvidia.com/gpu for a fractional TrainJob: %v", req)
	}
	env.Eventually(t, 60*time.Second, "low held by the gang-fit check", func() (bool, string) {
		var evs corev1.EventList
		if err := env.Client.List(env.Ctx, &evs, client.InNamespace(s.ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == wl.Name && e.Reason == admissioncheck.EventNoFit && strings.Contains(e.Message, "51200") {
				return true, ""
			}
		}
		w, _ := env.WorkloadOf(s.ns, "low", "TrainJob")
		return false, framework.DescribeWorkload(w)
	})
	if w, _ := env.WorkloadOf(s.ns, "low", "TrainJob"); admitted(w) {
		t.Fatalf("2 x 50 GiB admitted onto one free GPU: %s", framework.DescribeWorkload(w))
	}
	if tj := getTrainJob(t, env, s.ns, "low"); tj.Spec.Suspend == nil || !*tj.Spec.Suspend {
		t.Errorf("held TrainJob not suspended: %v", tj.Spec.Suspend)
	}
	if n := len(s.pods(t, lowSel)); n != 0 {
		t.Errorf("%d pods of the held TrainJob", n)
	}

	// The GPU frees: the check admits it, and its pods come down the chain.
	if err := env.Client.Delete(env.Ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "holder"}}); err != nil {
		t.Fatal(err)
	}
	env.WaitForWorkloadOf(t, s.ns, "low", "TrainJob", admitted)
	low := s.waitPinned(t, "low's 2 pods", lowSel, 2)
	for _, p := range low {
		job := metav1.GetControllerOf(&p)
		if job == nil || job.Kind != "Job" {
			t.Fatalf("pod %s not made by a Job: %v", p.Name, p.OwnerReferences)
		}
		var j batchv1.Job
		if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: job.Name}, &j); err != nil {
			t.Fatal(err)
		}
		var js jobset.JobSet
		if ref := metav1.GetControllerOf(&j); ref == nil || ref.Kind != "JobSet" {
			t.Fatalf("Job %s not made by a JobSet: %v", j.Name, j.OwnerReferences)
		} else if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: ref.Name}, &js); err != nil {
			t.Fatal(err)
		}
		if ref := metav1.GetControllerOf(&js); ref == nil || ref.Kind != "TrainJob" || ref.Name != "low" {
			t.Fatalf("JobSet %s not made by TrainJob low: %v", js.Name, js.OwnerReferences)
		}
		if p.Labels["test.gpupack.io/runtime"] != "torch-ckpt" || p.Annotations[v1alpha1.AnnotationCheckpoint] != "true" {
			t.Errorf("pod %s not from the runtime's template: labels %v, annotations %v", p.Name, p.Labels, p.Annotations)
		}
	}
	env.Eventually(t, 30*time.Second, "low's containers running (finalizer)", func() (bool, string) {
		n := 0
		for _, p := range s.pods(t, lowSel) {
			if controllerutil.ContainsFinalizer(&p, containerAlive) {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d of 2", n)
	})

	// The preemptor carries its request itself: annotation plus
	// resourcesPerNode, on a ClusterTrainingRuntime without a GPU. Kueue's
	// quota only fits it without the victim.
	createRuntime(t, env, s.ns, trainingRuntime("torch-plain", "", "", false, false))
	env.MustCreate(t, trainJob("high", s.ns, "ClusterTrainingRuntime", "torch-plain", "high", "50Gi"))
	if tj := getTrainJob(t, env, s.ns, "high"); tj.Spec.Trainer == nil || tj.Spec.Trainer.ResourcesPerNode == nil {
		t.Fatal("stored TrainJob high has no resourcesPerNode")
	} else if lim := tj.Spec.Trainer.ResourcesPerNode.Limits; lim.Name(v1alpha1.ResourceGPUMemory, resource.DecimalSI).Value() != 51200 {
		t.Errorf("stored TrainJob resourcesPerNode limits %v, want gpupack.io/gpu-memory 51200", lim)
	}
	hw := env.WaitForWorkloadOf(t, s.ns, "high", "TrainJob", nil)
	if ps := podSet(hw, "node"); ps == nil {
		t.Fatalf("high's Workload pod sets: %+v", hw.Spec.PodSets)
	} else if q := ps.Template.Spec.Containers[0].Resources.Requests[v1alpha1.ResourceGPUMemory]; q.Value() != 51200 {
		t.Errorf("high's pod set requests %v, want gpupack.io/gpu-memory 51200", ps.Template.Spec.Containers[0].Resources.Requests)
	}
	s.checkpointingHoldsPreemptor(t, "TrainJob", lowSel)
	if n := len(s.pods(t, highSel)); n != 0 {
		t.Errorf("%d preemptor pods exist while the victim checkpoints", n)
	}

	fake.setAnswer(true)
	done := s.waitVictimDone(t, "TrainJob", lowSel, true)
	if got := getTrainJob(t, env, s.ns, "low").Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
		t.Errorf("TrainJob %s = %q, want %d", v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
	}

	// The preemptor is admitted once the victim's pods are gone, and lands
	// on the freed GPUs.
	hw = s.preemptorAdmittedAfter(t, "TrainJob", done)
	// Its pods are a fixed point (no checkpointing): the JobSet and Job
	// webhooks on the way down mark the templates they come from.
	for _, p := range s.waitPinned(t, "high's 2 pods", highSel, 2) {
		if p.Annotations[v1alpha1.AnnotationInjected] == "" {
			t.Errorf("preemptor pod %s not made from a marked template: %v", p.Name, p.Annotations)
		}
		if q := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMemory]; q.Value() != 51200 {
			t.Errorf("preemptor pod %s limits %v, want the TrainJob's gpupack.io/gpu-memory 51200", p.Name, p.Spec.Containers[0].Resources.Limits)
		}
	}

	// The preemptor leaves: the victim is re-admitted and its recreated
	// pods carry the consistent step.
	del := &unstructured.Unstructured{}
	del.SetGroupVersionKind(trainer.GroupVersion.WithKind("TrainJob"))
	del.SetNamespace(s.ns)
	del.SetName("high")
	if err := env.Client.Delete(env.Ctx, del, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 120*time.Second, "the victim's new pods with GPUPACK_RESUME_STEP", func() (bool, string) {
		var notes []string
		n := 0
		for _, p := range s.pods(t, lowSel) {
			if p.CreationTimestamp.Time.Before(phaseTime(done, ladder.PhaseDone).Truncate(time.Second)) {
				continue
			}
			step := ""
			for _, e := range p.Spec.Containers[0].Env {
				if e.Name == v1alpha1.EnvResumeStep {
					step = e.Value
				}
			}
			notes = append(notes, p.Name+"="+step)
			if step == fmt.Sprint(consistentStep) {
				n++
			}
		}
		w, _ := env.WorkloadOf(s.ns, "low", "TrainJob")
		return n == 2, strings.Join(notes, ", ") + "; " + framework.DescribeWorkload(w)
	})
	s.waitPinned(t, "low's recreated pods", lowSel, 2)
	return s
}

// A hostile tenant (alice, who may only create and read TrainJobs in her
// namespace) sets LD_PRELOAD for the trainer (spec.trainer.env, which the
// Trainer copies into the node container; it refuses env in a runtime
// patch) and writes her own runtime patch putting gpupack's injection
// marker (the real fingerprint) on the pod template, hoping the pods the
// controllers make take the pod webhook's fast path with the variable in
// place. The request is on the runtime, so the TrainJob webhook cannot know
// the trainer asks for a GPU (it reads nothing from the API) and lets the
// TrainJob in; the JobSet webhooks strip the variable from the JobSet the
// real Trainer makes from it and refuse the Trainer's updates putting it
// back (naming the template and the variable), before and after Kueue's
// admission, so the JobSet stays suspended and no pod is ever made.
func TestTrainJobControllerTenantLDPreloadNeverReachesAPod(t *testing.T) {
	needController(t, "jobset")
	needController(t, "trainer")
	opts := framework.Options{TrainJob: true, JobSetController: true, TrainerController: true}
	s := startControllerSuite(t, opts,
		webhooks.KindTrainJob, webhooks.KindTrainingRuntime, webhooks.KindClusterTrainingRuntime, webhooks.KindJobSet)
	env := s.env
	serve, err := webhooks.DefaultServeOptions().WithFastPath(s.cfg)
	if err != nil || serve.TemplateFingerprint == "" {
		t.Fatalf("fingerprint: %q %v", serve.TemplateFingerprint, err)
	}
	createRuntime(t, env, s.ns, trainingRuntime("torch", s.ns, "30Gi", true, false))
	env.MustCreate(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "trainjobs", Namespace: s.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"trainer.kubeflow.org"}, Resources: []string{"trainjobs"}, Verbs: []string{"get", "list", "watch", "create"}}}})
	env.MustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-trainjobs", Namespace: s.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "trainjobs"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}}})
	alice, err := client.New(env.UserConfig(t, "alice"), client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	evil := trainJob("evil", s.ns, "TrainingRuntime", "torch", "low", "")
	patch := map[string]any{
		"manager": "alice.example.com/tuning",
		"trainingRuntimeSpec": map[string]any{"template": map[string]any{"spec": map[string]any{"replicatedJobs": []any{map[string]any{
			"name": "node",
			"template": map[string]any{"spec": map[string]any{"template": map[string]any{
				"metadata": map[string]any{"annotations": map[string]any{v1alpha1.AnnotationInjected: serve.TemplateFingerprint}},
			}}},
		}}}}},
	}
	if err := unstructured.SetNestedSlice(evil.Object, []any{patch}, "spec", "runtimePatches"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(evil.Object, []any{map[string]any{"name": v1alpha1.EnvLDPreload, "value": "/tmp/evil.so"}}, "spec", "trainer", "env"); err != nil {
		t.Fatal(err)
	}
	// Her queue exists only once the Trainer has made the JobSet (suspended,
	// as Kueue's webhook suspended the TrainJob): where Kueue admitted the
	// TrainJob before the Trainer's first reconcile (its controller starts
	// after its webhook, slowly on loaded cores), the Trainer would create
	// the JobSet unsuspended, stripped, and never update it, and the update
	// path under attack here would not be taken.
	evil.GetLabels()["kueue.x-k8s.io/queue-name"] = "later"
	if err := alice.Create(env.Ctx, evil); err != nil {
		t.Fatalf("alice's TrainJob: %v", err)
	}
	logPath := filepath.Join(env.Dir, "trainer.log")
	want := `replicatedJobs[node].template: container \"node\" sets LD_PRELOAD, which gpupack owns on GPU containers`
	// refusedAfter: a refusal of the Trainer's JobSet write logged after t0.
	refusedAfter := func(what string, t0 time.Time) {
		t.Helper()
		env.Eventually(t, 3*time.Minute, what, func() (bool, string) {
			raw, err := os.ReadFile(logPath)
			if err != nil {
				return false, err.Error()
			}
			for _, line := range strings.Split(string(raw), "\n") {
				var l struct {
					TS    time.Time `json:"ts"`
					Error string    `json:"error"`
				}
				if json.Unmarshal([]byte(line), &l) == nil && strings.Contains(l.Error, `sets LD_PRELOAD, which gpupack owns on GPU containers`) && l.TS.After(t0) {
					return true, ""
				}
			}
			return false, "trainer.log does not say " + want + " after " + t0.Format(time.RFC3339Nano)
		})
	}
	env.Eventually(t, 2*time.Minute, "the Trainer's suspended JobSet evil", func() (bool, string) {
		var js jobset.JobSet
		if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "evil"}, &js); err != nil {
			return false, err.Error()
		}
		return ptr.Deref(js.Spec.Suspend, false), "JobSet evil is not suspended"
	})
	refusedAfter("the Trainer's update of its suspended JobSet refused by gpupack's JobSet webhook", time.Time{})
	// Kueue admits it (quota, a plan); the Trainer's unsuspending update
	// puts the variable back and is refused too.
	env.MustCreate(t, framework.MakeLocalQueue("later", s.ns, "cq"))
	env.WaitForWorkloadOf(t, s.ns, "evil", "TrainJob", admitted)
	env.Eventually(t, time.Minute, "alice's TrainJob unsuspended by Kueue", func() (bool, string) {
		u := evil.DeepCopy()
		if err := env.Client.Get(env.Ctx, client.ObjectKeyFromObject(evil), u); err != nil {
			return false, err.Error()
		}
		suspended, _, _ := unstructured.NestedBool(u.Object, "spec", "suspend")
		return !suspended, "spec.suspend is still true"
	})
	refusedAfter("the Trainer's unsuspending update of its JobSet refused", time.Now())
	if n := len(s.pods(t, client.MatchingLabels{labelJobSetName: "evil"})); n != 0 {
		t.Errorf("%d pods of alice's TrainJob exist", n)
	}
	// The JobSet (its first version got in suspended, the variable stripped
	// by the mutating webhook) is still suspended and carries no LD_PRELOAD.
	var js jobset.JobSet
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "evil"}, &js); err != nil {
		t.Fatal(err)
	}
	if !ptr.Deref(js.Spec.Suspend, false) {
		t.Errorf("JobSet evil was unsuspended")
	}
	for _, rj := range js.Spec.ReplicatedJobs {
		for _, c := range rj.Template.Spec.Template.Spec.Containers {
			for _, e := range c.Env {
				if e.Name == v1alpha1.EnvLDPreload {
					t.Errorf("JobSet evil replicated Job %s container %s stored with %s=%q", rj.Name, c.Name, e.Name, e.Value)
				}
			}
		}
	}
}
