// Command demo runs gpupack on an embedded control plane (real
// kube-apiserver, etcd, Kueue with its pod and deployment integrations,
// kube-scheduler, kwok fake GPU nodes and the Kubeflow training operator)
// and tells what happened, step by step. Exit status 0 only if every step
// behaved as expected. With -keep (make demo KEEP=1) the cluster stays up
// after the last part, for kubectl, until Ctrl-C.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// demoTB lets the test framework run outside `go test`.
type demoTB struct {
	// testing.TB only gives demoTB that type (kubelettest wants it); every
	// method those helpers call is defined below, any other would panic.
	testing.TB
	dir      string
	failed   bool
	cleanups []func()
}

func (d *demoTB) Helper()                 {}
func (d *demoTB) Logf(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) }
func (d *demoTB) Cleanup(f func())        { d.cleanups = append(d.cleanups, f) }
func (d *demoTB) Failed() bool            { return d.failed }
func (d *demoTB) TempDir() string         { return d.dir }
func (d *demoTB) Fatalf(f string, a ...any) {
	d.failed = true
	fmt.Printf("FAILED: "+f+"\n", a...)
	d.finish()
	os.Exit(1)
}
func (d *demoTB) finish() {
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
	os.RemoveAll(d.dir)
}

var failures []string

func expect(ok bool, format string, a ...any) {
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		failures = append(failures, fmt.Sprintf(format, a...))
	}
	fmt.Printf("  [%s] %s\n", mark, fmt.Sprintf(format, a...))
}

func step(format string, a ...any) { fmt.Printf("\n== "+format+"\n", a...) }
func say(format string, a ...any)  { fmt.Printf("   "+format+"\n", a...) }

// keep leaves the cluster up after the last part (make demo KEEP=1).
var keep = flag.Bool("keep", os.Getenv("KEEP") != "" && os.Getenv("KEEP") != "0", "leave the embedded cluster running after the last part, until Ctrl-C (also KEEP=1)")

// cluster is the demo's control plane; webhookConfig tells gpupack's
// webhooks what its Kueue manages (the unmanaged-GPU policy).
var (
	cluster       = framework.Options{Scheduler: true, TrainingOperator: true, PodIntegration: true}
	webhookConfig = webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: cluster.KueueFrameworks()}}
)

func main() {
	flag.Parse()
	start := time.Now()
	dir, _ := os.MkdirTemp("", "gpupack-demo-")
	t := &demoTB{dir: dir}
	defer t.finish()

	step("Starting an embedded control plane: kube-apiserver, etcd, Kueue, kube-scheduler, kwok, training-operator")
	// Component logs are in files; keep the controllers' conflict retries off the screen.
	os.Setenv("GPUPACK_QUIET", "1")
	env := framework.Start(t, cluster)
	say("up in %.1fs (logs in %s)", time.Since(start).Seconds(), env.Dir)
	for _, n := range []string{"gpu-node-a", "gpu-node-b"} {
		env.CreateNode(t, framework.MakeNode(n).GPUs(4, framework.H100).Obj())
	}
	say("2 fake nodes x 4 H100 = 8 GPUs; Kueue quota: 16 GPUs (two teams' nominal quota over-subscribe the hardware)")

	seedWithoutGpupack(t, env)
	seedWithGpupack(t, env)
	fractional(t, env)
	preemptWithCheckpoint(t, env)
	colocation(t, env)

	fmt.Printf("\nDemo finished in %.0fs.\n", time.Since(start).Seconds())
	if len(failures) > 0 {
		fmt.Printf("%d step(s) did not behave as expected:\n  - %s\n", len(failures), strings.Join(failures, "\n  - "))
	} else {
		fmt.Println("Every step behaved as expected.")
	}
	if *keep {
		explore(t, env)
	}
	if len(failures) > 0 {
		t.finish()
		os.Exit(1)
	}
}

func twoJobs(env *framework.Env, ns, queue string) []*kftraining.PyTorchJob {
	jobs := []*kftraining.PyTorchJob{
		framework.MakePyTorchJob("llm-a", ns, queue, 7, 1).Obj(),
		framework.MakePyTorchJob("llm-b", ns, queue, 7, 1).Obj(),
	}
	return jobs
}

type podCount struct{ running, pending int }

func count(env *framework.Env, ns, job string) podCount {
	var pods corev1.PodList
	_ = env.Client.List(env.Ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"training.kubeflow.org/job-name": job})
	var c podCount
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		switch {
		case p.Spec.NodeName != "":
			c.running++
		default:
			c.pending++
		}
	}
	return c
}

func deleteAll(env *framework.Env, ns string, jobs []*kftraining.PyTorchJob) {
	bg := metav1.DeletePropagationBackground
	for _, j := range jobs {
		_ = env.Client.Delete(env.Ctx, j, &client.DeleteOptions{PropagationPolicy: &bg})
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var pods corev1.PodList
		_ = env.Client.List(env.Ctx, &pods, client.InNamespace(ns))
		if len(pods.Items) == 0 {
			return
		}
		// The in-pod stand-in keeps a pod until it has saved; a pod deleted
		// with its job needs no checkpoint.
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp == nil {
				continue
			}
			var keep []string
			for _, f := range p.Finalizers {
				if f != containerAlive {
					keep = append(keep, f)
				}
			}
			if len(keep) != len(p.Finalizers) {
				raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": keep}})
				_ = env.Client.Patch(env.Ctx, p, client.RawPatch(types.MergePatchType, raw))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func seedWithoutGpupack(t *demoTB, env *framework.Env) {
	step("1a. The seed's §0.1 without gpupack: two 8-GPU PyTorchJobs submitted together")
	env.MustCreate(t, framework.MakeResourceFlavor("plain"))
	env.MustCreate(t, framework.MakeClusterQueue("plain").GPUFlavor("plain", 16, framework.H100).Obj())
	ns := env.Namespace(t, "without-gpupack")
	env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "plain"))
	jobs := twoJobs(env, ns, "lq")
	for _, j := range jobs {
		env.MustCreate(t, j)
	}
	// Kueue admits both on quota; the pods race for 8 GPUs.
	var a, b podCount
	env.Eventually(t, 60*time.Second, "16 pods created and the scheduler settled", func() (bool, string) {
		a, b = count(env, ns, "llm-a"), count(env, ns, "llm-b")
		return a.running+a.pending+b.running+b.pending == 16 && a.running+b.running == 8, fmt.Sprint(a, b)
	})
	time.Sleep(2 * time.Second)
	a, b = count(env, ns, "llm-a"), count(env, ns, "llm-b")
	say("Kueue admitted both (quota 16). llm-a: %d pods on GPUs, %d Pending; llm-b: %d on GPUs, %d Pending", a.running, a.pending, b.running, b.pending)
	expect(a.pending+b.pending == 8, "8 pods stuck Pending while all 8 GPUs are held")
	if a.running > 0 && b.running > 0 {
		say("both jobs hold GPUs and neither can start: the partial-allocation deadlock (NCCL would time out in 30 min)")
	} else {
		say("this time the scheduler happened to give one job all 8 GPUs; the other's 8 pods still wait, created for nothing")
	}
	deleteAll(env, ns, jobs)
}

func seedWithGpupack(t *demoTB, env *framework.Env) {
	step("1b. The same with gpupack's gang-fit AdmissionCheck")
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gang-fit"},
		Spec: v1alpha1.GangFitParametersSpec{RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](5)}}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gang-fit"))
	env.StartManager(t, func(mgr ctrl.Manager) error { return admissioncheck.Setup(mgr, admissioncheck.Options{}) })
	env.WaitForAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("gpu").GPUFlavor("gpu", 16, framework.H100).AdmissionChecks("gang-fit").Obj())
	ns := env.Namespace(t, "with-gpupack")
	env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "gpu"))
	jobs := twoJobs(env, ns, "lq")
	for _, j := range jobs {
		env.MustCreate(t, j)
	}
	var winner, loser string
	env.Eventually(t, 60*time.Second, "one job running", func() (bool, string) {
		winner, loser = "", ""
		for _, j := range jobs {
			wl, _ := env.WorkloadOf(ns, j.Name, "PyTorchJob")
			if wl != nil && apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) {
				winner = j.Name
			} else {
				loser = j.Name
			}
		}
		return winner != "" && count(env, ns, winner).running == 8, winner
	})
	time.Sleep(2 * time.Second)
	w, l := count(env, ns, winner), count(env, ns, loser)
	say("%s: admitted, %d pods on GPUs; %s: %d pods", winner, w.running, loser, l.running+l.pending)
	expect(w.running == 8 && w.pending == 0, "%s runs all 8 pods", winner)
	expect(l.running+l.pending == 0, "%s holds no pod and no GPU", loser)
	wl, _ := env.WorkloadOf(ns, loser, "PyTorchJob")
	reason := lastEvent(env, ns, wl.Name, admissioncheck.EventNoFit)
	say("why %s waits: %s", loser, reason)
	expect(strings.Contains(reason, "does not fit"), "the waiting job says why")

	say("%s finishes...", winner)
	bg := metav1.DeletePropagationBackground
	for _, j := range jobs {
		if j.Name == winner {
			_ = env.Client.Delete(env.Ctx, j, &client.DeleteOptions{PropagationPolicy: &bg})
		}
	}
	env.Eventually(t, 90*time.Second, loser+" running", func() (bool, string) {
		return count(env, ns, loser).running == 8, fmt.Sprint(count(env, ns, loser))
	})
	expect(true, "%s is admitted and runs all 8 pods once the GPUs are free", loser)
	deleteAll(env, ns, jobs)
}

func lastEvent(env *framework.Env, ns, name, reason string) string {
	var evs corev1.EventList
	_ = env.Client.List(env.Ctx, &evs, client.InNamespace(ns))
	msg := ""
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			msg = e.Message
		}
	}
	return msg
}

func fractional(t *demoTB, env *framework.Env) {
	step("2. Fractional GPUs: PyTorchJobs annotated gpupack.io/gpu-memory share GPUs, each pod pinned and limited")
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		if err := webhooks.Setup(mgr, webhookConfig); err != nil {
			return err
		}
		return placement.Setup(mgr)
	}, opts)
	serve, err := webhooks.DefaultServeOptions().WithFastPath(webhookConfig)
	if err != nil {
		t.Fatalf("%v", err)
	}
	mwc, vwc := webhooks.WebhookConfigurations(serve)
	env.InstallWebhooks(t, opts, mwc, vwc)
	ns := env.Namespace(t, "fractional")
	env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "gpu"))
	jobs := []*kftraining.PyTorchJob{
		framework.MakePyTorchJob("infer-20g", ns, "lq", 5, 1).Annotation(v1alpha1.AnnotationGPUMemory, "20Gi").Obj(),
		framework.MakePyTorchJob("tune-30g", ns, "lq", 5, 1).Annotation(v1alpha1.AnnotationGPUMemory, "30Gi").Annotation(v1alpha1.AnnotationGPUCores, "50").Obj(),
	}
	podCalls := func() float64 {
		n, _ := framework.CounterSum("gpupack_webhook_admissions_total", map[string]string{"webhook": "mutating", "kind": "Pod"})
		return n
	}
	callsBefore := podCalls()
	for _, j := range jobs {
		env.MustCreate(t, j)
	}
	say("submitted infer-20g (6 pods x 20 GiB) and tune-30g (6 pods x 30 GiB, 50%% SM) onto 8 x 80 GiB GPUs")
	wl, _ := env.WorkloadOf(ns, "infer-20g", "PyTorchJob")
	for wl == nil {
		time.Sleep(100 * time.Millisecond)
		wl, _ = env.WorkloadOf(ns, "infer-20g", "PyTorchJob")
	}
	q := wl.Spec.PodSets[0].Template.Spec.Containers[0].Resources.Requests[v1alpha1.ResourceGPUMemory]
	say("Kueue counts infer-20g's pods as %s: %s MiB each (the webhook rewrote the annotation before Kueue built the Workload)", v1alpha1.ResourceGPUMemory, q.String())
	expect(q.Value() == 20480, "Workload pod set requests gpupack.io/gpu-memory: 20480")

	var pods []corev1.Pod
	env.Eventually(t, 120*time.Second, "12 fractional pods pinned and running", func() (bool, string) {
		var list corev1.PodList
		_ = env.Client.List(env.Ctx, &list, client.InNamespace(ns))
		pods = nil
		for _, p := range list.Items {
			if p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationDevices] != "" && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		return len(pods) == 12, fmt.Sprintf("%d of 12 pinned and bound", len(pods))
	})
	perGPU := map[string][]string{}
	usedMiB := map[string]int64{}
	envOK := true
	for _, p := range pods {
		ds, err := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices])
		if err != nil {
			envOK = false
			continue
		}
		for _, d := range ds {
			perGPU[d.UUID] = append(perGPU[d.UUID], p.Name)
			usedMiB[d.UUID] += d.MemoryMiB
		}
		// The limit travels as the converted resource (the device plugin
		// writes it into the container's read-only limits file); the pod
		// carries no hostPath volume and no limit env a tenant could edit.
		want := map[string]int64{"infer-20g": 20480, "tune-30g": 30720}[p.Labels["training.kubeflow.org/job-name"]]
		q := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMemory]
		if q.Value() != want {
			envOK = false
		}
		for _, v := range p.Spec.Volumes {
			if v.HostPath != nil {
				envOK = false
			}
		}
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == v1alpha1.EnvMemoryLimit {
				envOK = false
			}
		}
	}
	p0 := pods[0]
	vars := []string{}
	for _, e := range p0.Spec.Containers[0].Env {
		if strings.HasPrefix(e.Name, "CUDA_") {
			vars = append(vars, e.Name+"="+e.Value)
		}
	}
	mounts := []string{}
	for _, m := range p0.Spec.Containers[0].VolumeMounts {
		mounts = append(mounts, m.MountPath)
	}
	say("pod %s on %s, GPUs %s", p0.Name, p0.Spec.NodeName, p0.Annotations[v1alpha1.AnnotationDevices])
	say("  env CUDA_*: [%s] and mounts: [%s] from the webhook (none: gpupack-node's device plugin delivers the hook and a read-only /etc/gpupack/limits)", strings.Join(vars, " "), strings.Join(mounts, " "))
	shared, over := 0, 0
	for uuid, ps := range perGPU {
		if len(ps) > 1 {
			shared++
		}
		if usedMiB[uuid] > 71903 {
			over++
		}
	}
	calls := podCalls() - callsBefore
	say("the training operator made the 12 pods from templates the job webhook had injected: the pod webhook was called %.0f times for them", calls)
	expect(calls == 0, "pods from injected job templates skip the pod webhook (fast path)")
	say("%d GPUs in use, %d of them shared by 2+ pods", len(perGPU), shared)
	expect(shared > 0, "pods share GPUs")
	expect(over == 0, "no GPU is planned past its allocatable 71903 MiB (81559 - 1500 - 10%%)")
	expect(envOK, "every pod carries its own gpupack.io/gpu-memory, and no hostPath volume or limit env")
	nodeAnswer(t, env, pods)
	deleteAll(env, ns, jobs)
}

// containerAlive stands for a running container: kwok runs none and removes
// a terminating pod at once, so the demo's in-pod stand-in keeps the pod
// until its "trainer" has saved, as gpupack-ckpt would.
const containerAlive = "demo.gpupack.io/container-running"

// inPod plays gpupack-ckpt for the pods of one job (kwok runs no process):
// it answers a checkpoint request with a verified step after a moment, and
// lets a terminating pod go once it has reported.
func inPod(env *framework.Env, ns, job string, step int, stop <-chan struct{}) {
	asked := map[string]time.Time{}
	for {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		var pods corev1.PodList
		if env.Client.List(env.Ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"training.kubeflow.org/job-name": job}) != nil {
			continue
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			var patch map[string]any
			hasFin := false
			for _, f := range p.Finalizers {
				hasFin = hasFin || f == containerAlive
			}
			switch {
			case p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && !hasFin:
				patch = map[string]any{"metadata": map[string]any{"finalizers": append(p.Finalizers, containerAlive)}}
			case p.Annotations[v1alpha1.AnnotationCheckpointRequest] != "" && p.Annotations[v1alpha1.AnnotationCheckpointStep] == "":
				if asked[p.Name].IsZero() {
					asked[p.Name] = time.Now()
				}
				if time.Since(asked[p.Name]) < 1500*time.Millisecond { // the trainer saves
					continue
				}
				patch = map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationCheckpointStep: fmt.Sprint(step)}}}
			case p.DeletionTimestamp != nil && hasFin && p.Annotations[v1alpha1.AnnotationCheckpointStep] != "":
				var keep []string
				for _, f := range p.Finalizers {
					if f != containerAlive {
						keep = append(keep, f)
					}
				}
				patch = map[string]any{"metadata": map[string]any{"finalizers": keep}}
			default:
				continue
			}
			raw, _ := json.Marshal(patch)
			_ = env.Client.Patch(env.Ctx, p, client.RawPatch(types.MergePatchType, raw))
		}
	}
}

func preemptWithCheckpoint(t *demoTB, env *framework.Env) {
	step("3. Preemption as a protocol: checkpoint, then SIGTERM, then (only if needed) SIGKILL")
	env.StartManager(t, func(mgr ctrl.Manager) error {
		return preemption.SetupWithManager(mgr, preemption.Options{Slack: 5 * time.Second})
	})
	env.MustCreate(t, &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "low"}, Value: 10})
	env.MustCreate(t, &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000})
	env.MustCreate(t, framework.MakeClusterQueue("prod").GPUFlavor("gpu", 8, framework.H100).AdmissionChecks("gang-fit").
		Preemption(kueue.ClusterQueuePreemption{WithinClusterQueue: kueue.PreemptionPolicyLowerPriority}).Obj())
	ns := env.Namespace(t, "preemption")
	env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "prod"))
	stop := make(chan struct{})
	defer close(stop)
	go inPod(env, ns, "pretrain", 4200, stop)

	low := framework.MakePyTorchJob("pretrain", ns, "lq", 3, 2).PriorityClass("low").
		Annotation(v1alpha1.AnnotationCheckpoint, "true").Annotation(v1alpha1.AnnotationCheckpointTimeout, "60s").Obj()
	for _, rs := range low.Spec.PyTorchReplicaSpecs {
		rs.Template.Spec.Containers[0].Command = []string{"python", "train.py"}
	}
	env.MustCreate(t, low)
	env.Eventually(t, 90*time.Second, "pretrain running on all 8 GPUs", func() (bool, string) {
		c := count(env, ns, "pretrain")
		return c.running == 4, fmt.Sprint(c)
	})
	var sample corev1.Pod
	var pods corev1.PodList
	_ = env.Client.List(env.Ctx, &pods, client.InNamespace(ns))
	if len(pods.Items) > 0 {
		sample = pods.Items[0]
		say("low-priority pretrain runs 4 pods x 2 GPUs, opted in: %s runs %v (grace %ds)", sample.Name,
			sample.Spec.Containers[0].Command, ptr.Deref(sample.Spec.TerminationGracePeriodSeconds, 30))
	}

	// Watch the invariant: no pod of the preemptor bound while a victim pod exists.
	violation := make(chan string, 1)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			var v, p corev1.PodList
			if env.Client.List(env.Ctx, &v, client.InNamespace(ns), client.MatchingLabels{"training.kubeflow.org/job-name": "pretrain"}) != nil ||
				env.Client.List(env.Ctx, &p, client.InNamespace(ns), client.MatchingLabels{"training.kubeflow.org/job-name": "urgent"}) != nil {
				continue
			}
			for _, u := range p.Items {
				if u.Spec.NodeName != "" && len(v.Items) > 0 {
					select {
					case violation <- fmt.Sprintf("%s bound while %d pretrain pods exist", u.Name, len(v.Items)):
					default:
					}
					return
				}
			}
		}
	}()
	say("a high-priority job needing the same 8 GPUs arrives; Kueue preempts pretrain")
	urgent := framework.MakePyTorchJob("urgent", ns, "lq", 3, 2).PriorityClass("high").Obj()
	env.MustCreate(t, urgent)
	var st ladder.State
	env.Eventually(t, 120*time.Second, "pretrain's preemption Done", func() (bool, string) {
		wl, _ := env.WorkloadOf(ns, "pretrain", "PyTorchJob")
		if wl == nil {
			return false, "no workload"
		}
		st, _ = preemption.PreemptionState(wl)
		return st.Phase == ladder.PhaseDone, string(st.Phase)
	})
	var phases []string
	for i, tr := range st.Transitions {
		d := ""
		if i > 0 {
			d = fmt.Sprintf(" (+%.1fs)", tr.At.Sub(st.Transitions[0].At).Seconds())
		}
		phases = append(phases, string(tr.Phase)+d)
	}
	say("phases recorded on the Workload: %s", strings.Join(phases, " -> "))
	expect(len(st.Transitions) >= 3 && st.Transitions[0].Phase == ladder.PhaseCheckpointing && st.Phase == ladder.PhaseDone, "phases went Checkpointing -> ... -> Done in order")
	var job kftraining.PyTorchJob
	_ = env.Client.Get(env.Ctx, client.ObjectKeyFromObject(low), &job)
	lcc := job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]
	say("pretrain's %s = %s (the step every rank saved; a restart resumes from it)", v1alpha1.AnnotationLastConsistentCheckpoint, lcc)
	expect(lcc == "4200", "the last consistent checkpoint is recorded on the job")
	env.Eventually(t, 90*time.Second, "urgent running", func() (bool, string) {
		c := count(env, ns, "urgent")
		return c.running == 4, fmt.Sprint(c)
	})
	viol := ""
	select {
	case viol = <-violation:
	default:
	}
	expect(viol == "", "urgent got GPUs only after pretrain's pods were gone %s", viol)
	deleteAll(env, ns, []*kftraining.PyTorchJob{low, urgent})
}
