package jobkinds

import (
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
)

// gpuPodTemplate is a kwok-runnable pod template of one container asking
// for whole GPUs (the job-level gpupack.io/gpu-memory converts it), opted
// in to checkpointing when checkpoint is set.
func gpuPodTemplate(container string, gpus int64, checkpoint bool) corev1.PodTemplateSpec {
	res := corev1.ResourceList{}
	if gpus > 0 {
		res[v1alpha1.ResourceNvidiaGPU] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	tm := corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Tolerations:  []corev1.Toleration{framework.KwokToleration},
		NodeSelector: map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"},
		Containers: []corev1.Container{{Name: container, Image: "trainer:test",
			Resources: corev1.ResourceRequirements{Limits: res, Requests: res}}},
	}}
	if checkpoint {
		tm.Spec.Containers[0].Command = []string{"python", "train.py"}
		tm.Annotations = map[string]string{v1alpha1.AnnotationCheckpoint: "true", v1alpha1.AnnotationCheckpointTimeout: "60s"}
	}
	return tm
}

// fractionalMPIJob: a CPU-only launcher and workers × one GPU with the
// MPIJob-level request mem, queued at priority.
func fractionalMPIJob(name, ns, priority string, workers int32, mem string, checkpoint bool) *mpi.MPIJob {
	return &mpi.MPIJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": priority},
			Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: mem}},
		Spec: mpi.MPIJobSpec{
			SlotsPerWorker: ptr.To[int32](1),
			RunPolicy:      mpi.RunPolicy{CleanPodPolicy: ptr.To(mpi.CleanPodPolicyRunning)},
			MPIReplicaSpecs: map[mpi.MPIReplicaType]*mpi.ReplicaSpec{
				mpi.MPIReplicaTypeLauncher: {Replicas: ptr.To[int32](1), Template: gpuPodTemplate("launcher", 0, false)},
				mpi.MPIReplicaTypeWorker:   {Replicas: ptr.To(workers), Template: gpuPodTemplate("worker", 1, checkpoint)},
			},
		},
	}
}

// The whole path for MPIJob with the real MPI operator: a fractional
// MPIJob is converted, counted by Kueue in gpupack.io/*, admitted by the
// check, its worker pods (made by the MPI operator, controlled by the
// MPIJob) pinned each to its own planned slot; a higher-priority MPIJob
// makes Kueue preempt it; the coordinator finds the victim's workers
// (MPIJob → Pod) and runs the checkpoint protocol; the check holds the
// preemptor while they hold the GPUs and admits it once they are gone; the
// consistent step is recorded on the MPIJob, and when the victim is
// re-admitted the workers the operator recreates get GPUPACK_RESUME_STEP.
func TestMPIOperatorPreemptedThroughTheCheckpointProtocol(t *testing.T) {
	needController(t, "mpi-operator")
	s := startControllerSuite(t, framework.Options{RayMPI: true, MPIOperator: true}, webhooks.KindMPIJob)
	env := s.env
	workers := func(job string) client.MatchingLabels {
		return client.MatchingLabels{mpi.JobNameLabel: job, mpi.JobRoleLabel: "worker"}
	}
	lowSel, highSel := workers("low"), workers("high")
	trainer := &fakeTrainer{env: env, ns: s.ns, selector: lowSel}
	trainer.run(t)

	// The victim: 2 workers × 50 GiB, one per GPU, opted in to checkpointing.
	env.MustCreate(t, fractionalMPIJob("low", s.ns, "low", 2, "50Gi", true))
	wl := env.WaitForWorkloadOf(t, s.ns, "low", "MPIJob", admitted)
	for _, ps := range wl.Spec.PodSets {
		req := ps.Template.Spec.Containers[0].Resources.Requests
		if _, ok := req[v1alpha1.ResourceNvidiaGPU]; ok {
			t.Errorf("Kueue counts whole GPUs for pod set %s: %v", ps.Name, req)
		}
		if q := req[v1alpha1.ResourceGPUMemory]; ps.Name == "worker" && q.Value() != 51200 {
			t.Errorf("pod set worker requests %v, want gpupack.io/gpu-memory 51200", req)
		}
	}
	low := s.waitPinned(t, "low's 2 workers", lowSel, 2)
	for _, p := range low {
		if ref := metav1.GetControllerOf(&p); ref == nil || ref.Kind != "MPIJob" {
			t.Errorf("worker %s not made by the MPI operator: %v", p.Name, p.OwnerReferences)
		}
	}
	env.Eventually(t, 60*time.Second, "low's launcher Job and workers' containers running", func() (bool, string) {
		n := 0
		for _, p := range s.pods(t, lowSel) {
			if controllerutil.ContainsFinalizer(&p, containerAlive) {
				n++
			}
		}
		launchers := s.launcherJobs(t, "low")
		return n == 2 && len(launchers) == 1, fmt.Sprintf("%d of 2 running, %d launcher Jobs", n, len(launchers))
	})

	// The preemptor needs both GPUs' memory; Kueue's quota only fits it
	// without the victim.
	env.MustCreate(t, fractionalMPIJob("high", s.ns, "high", 2, "50Gi", false))
	s.checkpointingHoldsPreemptor(t, "MPIJob", lowSel)
	if n := len(s.pods(t, highSel)); n != 0 {
		t.Errorf("%d preemptor workers exist while the victim checkpoints", n)
	}

	trainer.setAnswer(true)
	done := s.waitVictimDone(t, "MPIJob", lowSel, true)
	var job mpi.MPIJob
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &job); err != nil {
		t.Fatal(err)
	}
	if got := job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
		t.Errorf("MPIJob %s = %q, want %d", v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
	}

	s.preemptorAdmittedAfter(t, "MPIJob", done)
	s.waitPinned(t, "high's 2 workers", highSel, 2)

	// The preemptor leaves: the victim is re-admitted, and the workers the
	// operator recreates carry the consistent step.
	if err := env.Client.Delete(env.Ctx, &mpi.MPIJob{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "high"}}, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	s.waitResumed(t, "MPIJob", lowSel, phaseTime(done, ladder.PhaseDone), 2)
	s.waitPinned(t, "low's recreated workers", lowSel, 2)
}

// launcherJobs are the Jobs the MPIJob job controls (its launcher).
func (s *controllerSuite) launcherJobs(t *testing.T, job string) []batchv1.Job {
	t.Helper()
	var jobs batchv1.JobList
	if err := s.env.Client.List(s.env.Ctx, &jobs, client.InNamespace(s.ns)); err != nil {
		t.Fatal(err)
	}
	var out []batchv1.Job
	for _, j := range jobs.Items {
		if ref := metav1.GetControllerOf(&j); ref != nil && ref.Kind == "MPIJob" && ref.Name == job {
			out = append(out, j)
		}
	}
	return out
}

// waitResumed waits until n pods of sel created after since carry
// GPUPACK_RESUME_STEP = consistentStep.
func (s *controllerSuite) waitResumed(t *testing.T, kind string, sel client.MatchingLabels, since time.Time, n int) {
	t.Helper()
	s.env.Eventually(t, 120*time.Second, "the victim's new pods with GPUPACK_RESUME_STEP", func() (bool, string) {
		var notes []string
		got := 0
		for _, p := range s.pods(t, sel) {
			if p.CreationTimestamp.Time.Before(since.Truncate(time.Second)) || p.DeletionTimestamp != nil {
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
				got++
			}
		}
		w, _ := s.env.WorkloadOf(s.ns, "low", kind)
		return got == n, strings.Join(notes, ", ") + "; " + framework.DescribeWorkload(w)
	})
}

const labelTestRayJob = "test.gpupack.io/rayjob"

// fractionalRayJob: an InteractiveMode RayJob (KubeRay never submits a
// job: no Ray runs in kwok's pods) with its job id given, so KubeRay takes
// it to Running once its cluster is ready (KubeRay v1.6.0 suspends a RayJob
// only from Initializing or Running: one left Waiting for its job id is
// never suspended, and Kueue's preemption of it never completes), whose cluster has a GPU head on a
// headMem share (its template's own request) and workers × one GPU with
// the RayJob-level request mem, in group "gpu"; every pod labelled
// labelTestRayJob=name and opted in to checkpointing when checkpoint is set.
func fractionalRayJob(name, ns, priority string, workers int32, headMem, mem string, checkpoint bool) *ray.RayJob {
	head := gpuPodTemplate("ray-head", 1, checkpoint)
	if head.Annotations == nil {
		head.Annotations = map[string]string{}
	}
	head.Annotations[v1alpha1.AnnotationGPUMemory] = headMem
	worker := gpuPodTemplate("ray-worker", 1, checkpoint)
	for _, tm := range []*corev1.PodTemplateSpec{&head, &worker} {
		tm.Labels = map[string]string{labelTestRayJob: name}
	}
	return &ray.RayJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": priority},
			Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: mem}},
		Spec: ray.RayJobSpec{
			SubmissionMode:           ray.InteractiveMode,
			JobId:                    name + "-job",
			ShutdownAfterJobFinishes: true,
			RayClusterSpec: &ray.RayClusterSpec{
				HeadGroupSpec: ray.HeadGroupSpec{RayStartParams: map[string]string{}, Template: head},
				WorkerGroupSpecs: []ray.WorkerGroupSpec{{GroupName: "gpu", Replicas: ptr.To(workers), MinReplicas: ptr.To(workers), MaxReplicas: ptr.To(workers),
					RayStartParams: map[string]string{}, Template: worker}},
			},
		},
	}
}

// The whole path for RayJob with KubeRay's real operator: a fractional
// RayJob is converted (head and worker group), counted by Kueue in
// gpupack.io/*, admitted by the check, its pods (RayJob → RayCluster →
// Pod, made by KubeRay) pinned each to a slot of its own pod set (the head
// asks for less memory than a worker: a swap shows); a higher-priority
// RayJob makes Kueue preempt it, KubeRay deletes the victim's RayCluster;
// the coordinator runs the checkpoint protocol on the victim's pods; the
// check holds the preemptor until they are gone; the consistent step is
// recorded on the RayJob, and the RayCluster KubeRay makes when the victim
// is re-admitted (it copies the RayJob's annotations) gives the new pods
// GPUPACK_RESUME_STEP.
func TestKubeRayRayJobPreemptedThroughTheCheckpointProtocol(t *testing.T) {
	needController(t, "kuberay")
	s := startControllerSuite(t, framework.Options{RayMPI: true, KubeRay: true}, webhooks.KindRayJob, webhooks.KindRayCluster)
	env := s.env
	lowSel := client.MatchingLabels{labelTestRayJob: "low"}
	highSel := client.MatchingLabels{labelTestRayJob: "high"}
	trainer := &fakeTrainer{env: env, ns: s.ns, selector: lowSel}
	trainer.run(t)

	// The victim: a 10 GiB head and one 50 GiB worker.
	env.MustCreate(t, fractionalRayJob("low", s.ns, "low", 1, "10Gi", "50Gi", true))
	wl := env.WaitForWorkloadOf(t, s.ns, "low", "RayJob", admitted)
	want := map[kueue.PodSetReference]int64{"head": 10240, "gpu": 51200}
	for _, ps := range wl.Spec.PodSets {
		req := ps.Template.Spec.Containers[0].Resources.Requests
		if _, ok := req[v1alpha1.ResourceNvidiaGPU]; ok {
			t.Errorf("Kueue counts whole GPUs for pod set %s: %v", ps.Name, req)
		}
		if q := req[v1alpha1.ResourceGPUMemory]; q.Value() != want[ps.Name] {
			t.Errorf("pod set %s requests %v, want gpupack.io/gpu-memory %d", ps.Name, req, want[ps.Name])
		}
	}
	low := s.waitPinned(t, "low's head and worker", lowSel, 2)
	for _, p := range low {
		if ref := metav1.GetControllerOf(&p); ref == nil || ref.Kind != "RayCluster" {
			t.Errorf("pod %s not made by KubeRay: %v", p.Name, p.OwnerReferences)
		}
		s.boundToPodSet(t, p, map[string]string{"head": "head", "worker": "gpu"}[p.Labels["ray.io/node-type"]])
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

	// The preemptor: a 10 GiB head and two 50 GiB workers; Kueue's quota
	// only fits it without the victim.
	env.MustCreate(t, fractionalRayJob("high", s.ns, "high", 2, "10Gi", "50Gi", false))
	s.checkpointingHoldsPreemptor(t, "RayJob", lowSel)
	if n := len(s.pods(t, highSel)); n != 0 {
		t.Errorf("%d preemptor pods exist while the victim checkpoints", n)
	}

	trainer.setAnswer(true)
	done := s.waitVictimDone(t, "RayJob", lowSel, true)
	var job ray.RayJob
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &job); err != nil {
		t.Fatal(err)
	}
	if got := job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
		t.Errorf("RayJob %s = %q, want %d", v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
	}

	s.preemptorAdmittedAfter(t, "RayJob", done)
	for _, p := range s.waitPinned(t, "high's head and 2 workers", highSel, 3) {
		s.boundToPodSet(t, p, map[string]string{"head": "head", "worker": "gpu"}[p.Labels["ray.io/node-type"]])
	}

	if err := env.Client.Delete(env.Ctx, &ray.RayJob{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "high"}}, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	s.waitResumed(t, "RayJob", lowSel, phaseTime(done, ladder.PhaseDone), 2)
	s.waitPinned(t, "low's recreated head and worker", lowSel, 2)
}

// boundToPodSet checks that pod's plan binding is a slot of pod set ps.
func (s *controllerSuite) boundToPodSet(t *testing.T, p corev1.Pod, ps string) {
	t.Helper()
	var gp v1alpha1.GPUPlan
	if err := s.env.Client.Get(s.env.Ctx, client.ObjectKey{Namespace: s.ns, Name: p.Annotations[v1alpha1.AnnotationPlan]}, &gp); err != nil {
		t.Fatalf("pod %s's plan: %v", p.Name, err)
	}
	for _, b := range gp.Status.Bindings {
		if b.PodUID == p.UID {
			if b.PodSet != ps {
				t.Errorf("pod %s bound to %s[%d], want a slot of pod set %s", p.Name, b.PodSet, b.Index, ps)
			}
			return
		}
	}
	t.Errorf("pod %s not bound in plan %s", p.Name, gp.Name)
}

// fractionalRayCluster is fractionalRayJob's cluster as a RayCluster of
// its own, queued (Kueue's ray.io/raycluster integration suspends it).
func fractionalRayCluster(name, ns, priority string, workers int32, headMem, mem string, checkpoint bool) *ray.RayCluster {
	j := fractionalRayJob(name, ns, priority, workers, headMem, mem, checkpoint)
	return &ray.RayCluster{ObjectMeta: j.ObjectMeta, Spec: *j.Spec.RayClusterSpec}
}

// The same path for a RayCluster of its own: KubeRay suspends it by
// deleting its pods (the RayCluster stays, RayCluster → Pod); the step is
// recorded on the RayCluster, and the pods KubeRay recreates on
// re-admission read it from there.
func TestKubeRayRayClusterPreemptedThroughTheCheckpointProtocol(t *testing.T) {
	needController(t, "kuberay")
	s := startControllerSuite(t, framework.Options{RayMPI: true, KubeRay: true}, webhooks.KindRayJob, webhooks.KindRayCluster)
	env := s.env
	lowSel := client.MatchingLabels{labelTestRayJob: "low"}
	highSel := client.MatchingLabels{labelTestRayJob: "high"}
	trainer := &fakeTrainer{env: env, ns: s.ns, selector: lowSel}
	trainer.run(t)
	podSetOf := map[string]string{"head": "head", "worker": "gpu"}

	env.MustCreate(t, fractionalRayCluster("low", s.ns, "low", 1, "10Gi", "50Gi", true))
	env.WaitForWorkloadOf(t, s.ns, "low", "RayCluster", admitted)
	for _, p := range s.waitPinned(t, "low's head and worker", lowSel, 2) {
		if ref := metav1.GetControllerOf(&p); ref == nil || ref.Kind != "RayCluster" || ref.Name != "low" {
			t.Errorf("pod %s not made by KubeRay for RayCluster low: %v", p.Name, p.OwnerReferences)
		}
		s.boundToPodSet(t, p, podSetOf[p.Labels["ray.io/node-type"]])
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

	env.MustCreate(t, fractionalRayCluster("high", s.ns, "high", 2, "10Gi", "50Gi", false))
	s.checkpointingHoldsPreemptor(t, "RayCluster", lowSel)
	trainer.setAnswer(true)
	done := s.waitVictimDone(t, "RayCluster", lowSel, false)
	var rc ray.RayCluster
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &rc); err != nil {
		t.Fatal(err)
	}
	if got := rc.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
		t.Errorf("RayCluster %s = %q, want %d", v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
	}
	s.preemptorAdmittedAfter(t, "RayCluster", done)
	for _, p := range s.waitPinned(t, "high's head and 2 workers", highSel, 3) {
		s.boundToPodSet(t, p, podSetOf[p.Labels["ray.io/node-type"]])
	}
	if err := env.Client.Delete(env.Ctx, &ray.RayCluster{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "high"}}, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	s.waitResumed(t, "RayCluster", lowSel, phaseTime(done, ladder.PhaseDone), 2)
}
