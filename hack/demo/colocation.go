package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// teamQueue is one team's ClusterQueue in the seed's §6.3 cohort: quota
// counted in gpupack.io/gpu-memory (what fractional and whole-card
// requests share), the gang-fit check, and reclaim of lent quota.
func teamQueue(name string, gpus int64) *kueue.ClusterQueue {
	p, _ := flavors.Lookup(framework.H100)
	mem := flavors.DefaultBuffer().GPUMemoryQuotaMiB(p.MemoryMiB, gpus)
	return framework.MakeClusterQueue(name).Flavor("gpu",
		framework.Quota{Resource: corev1.ResourceCPU, Nominal: "10000"}, framework.Quota{Resource: corev1.ResourceMemory, Nominal: "100Ti"},
		framework.Quota{Resource: v1alpha1.ResourceNvidiaGPU, Nominal: "0"},
		framework.Quota{Resource: v1alpha1.ResourceVGPU, Nominal: "64"},
		framework.Quota{Resource: v1alpha1.ResourceGPUMemory, Nominal: fmt.Sprint(mem)},
		framework.Quota{Resource: v1alpha1.ResourceGPUCores, Nominal: "10000"},
	).Cohort("shared").AdmissionChecks("gang-fit").
		Preemption(kueue.ClusterQueuePreemption{ReclaimWithinCohort: kueue.PreemptionPolicyAny, WithinClusterQueue: kueue.PreemptionPolicyLowerPriority}).Obj()
}

// timeline records when each milestone was first seen.
type timeline struct {
	mu    sync.Mutex
	start time.Time
	at    map[string]time.Duration
	order []string
}

func (tl *timeline) mark(what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if _, ok := tl.at[what]; ok {
		return
	}
	tl.at[what] = time.Since(tl.start)
	tl.order = append(tl.order, what)
}

func (tl *timeline) get(what string) (time.Duration, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	d, ok := tl.at[what]
	return d, ok
}

const (
	msScaleUp  = "scale-up to 6 replicas"
	msDecision = "Kueue preempts the training job (reclaims the lent quota)"
	msSaved    = "checkpoint saved by every rank"
	msFree     = "training pods gone, GPUs free"
	msBound    = "all 6 inference pods bound to planned GPUs"
)

func inferencePods(env *framework.Env, ns string) []corev1.Pod {
	var list corev1.PodList
	_ = env.Client.List(env.Ctx, &list, client.InNamespace(ns), client.MatchingLabels{"app": "chat"})
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// colocation is the seed's §5: latency-sensitive inference and best-effort
// training share a cluster; inference takes back its GPUs as it scales,
// training checkpoints out, and the new inference pods start only on GPUs
// that are really free.
func colocation(t *demoTB, env *framework.Env) {
	step("4. Training + inference co-location (seed §5, two teams' ClusterQueues in a cohort, §6.3)")
	env.MustCreate(t, teamQueue("team-infer", 3))
	env.MustCreate(t, teamQueue("team-train", 5))
	ns := env.Namespace(t, "colocation")
	env.MustCreate(t, framework.MakeLocalQueue("infer", ns, "team-infer"))
	env.MustCreate(t, framework.MakeLocalQueue("train", ns, "team-train"))
	say("cohort \"shared\": team-infer owns 3 GPUs' memory, team-train 5 (quota in gpupack.io/gpu-memory); both use the gang-fit check, lent quota is reclaimed")

	// The inference service: a Deployment of fractional pods, each its own
	// Workload through Kueue's pod integration, planned by the check.
	labels := map[string]string{"app": "chat"}
	spec := corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](5),
		Tolerations:                   []corev1.Toleration{framework.KwokToleration},
		Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}},
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "chat", Namespace: ns, Labels: map[string]string{
			placement.KueueQueueLabel: "infer", "kueue.x-k8s.io/priority-class": "high"}},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "30Gi"}},
				Spec:       spec}},
	}
	env.MustCreate(t, deploy)
	env.Eventually(t, 90*time.Second, "2 inference pods running", func() (bool, string) {
		n := 0
		for _, p := range inferencePods(env, ns) {
			if p.Spec.NodeName != "" {
				n++
			}
		}
		return n == 2, fmt.Sprint(n)
	})
	say("inference Deployment chat (high priority): 2 pods x 30 GiB (Kueue pod integration, one Workload per pod)")

	// The training job borrows the idle quota: 6 ranks x 70 GiB, one GPU each.
	stop := make(chan struct{})
	defer close(stop)
	go inPod(env, ns, "pretrain-7b", 5100, stop)
	train := framework.MakePyTorchJob("pretrain-7b", ns, "train", 5, 1).PriorityClass("low").
		Annotation(v1alpha1.AnnotationGPUMemory, "70Gi").
		Annotation(v1alpha1.AnnotationCheckpoint, "true").Annotation(v1alpha1.AnnotationCheckpointTimeout, "60s").Obj()
	for _, rs := range train.Spec.PyTorchReplicaSpecs {
		rs.Template.Spec.Containers[0].Command = []string{"torchrun", "train.py"}
	}
	env.MustCreate(t, train)
	env.Eventually(t, 120*time.Second, "pretrain-7b running on 6 GPUs", func() (bool, string) {
		c := count(env, ns, "pretrain-7b")
		why := fmt.Sprint(c)
		if w, _ := env.WorkloadOf(ns, "pretrain-7b", "PyTorchJob"); w != nil {
			why += " " + framework.DescribeWorkload(w)
		}
		return c.running == 6, why
	})
	wl, _ := env.WorkloadOf(ns, "pretrain-7b", "PyTorchJob")
	borrowed := ""
	if wl != nil && wl.Status.Admission != nil {
		borrowed = "admitted in team-train"
	}
	// Kueue writes the ClusterQueue's usage a moment after the admission.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !strings.HasPrefix(borrowed, "borrows"); time.Sleep(200 * time.Millisecond) {
		var cq kueue.ClusterQueue
		_ = env.Client.Get(env.Ctx, client.ObjectKey{Name: "team-train"}, &cq)
		for _, fu := range cq.Status.FlavorsUsage {
			for _, r := range fu.Resources {
				if r.Name == v1alpha1.ResourceGPUMemory && !r.Borrowed.IsZero() {
					borrowed = fmt.Sprintf("borrows %s MiB of %s from team-infer's idle quota", r.Borrowed.String(), r.Name)
				}
			}
		}
	}
	say("low-priority training pretrain-7b (6 ranks x 70 GiB, opted into checkpointing): %s", borrowed)
	expect(strings.HasPrefix(borrowed, "borrows"), "the training job runs on quota borrowed through the cohort")

	// Invariant: no inference pod binds to a GPU a training pod still holds.
	held := map[string]bool{}
	var pods corev1.PodList
	_ = env.Client.List(env.Ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"training.kubeflow.org/job-name": "pretrain-7b"})
	for _, p := range pods.Items {
		ds, _ := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices])
		for _, d := range ds {
			held[d.UUID] = true
		}
	}
	tl := &timeline{start: time.Now(), at: map[string]time.Duration{}}
	violation := make(chan string, 1)
	waitMsg := ""
	var mu sync.Mutex
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			var tp corev1.PodList
			if env.Client.List(env.Ctx, &tp, client.InNamespace(ns), client.MatchingLabels{"training.kubeflow.org/job-name": "pretrain-7b"}) != nil {
				continue
			}
			saved := len(tp.Items) > 0
			for _, p := range tp.Items {
				saved = saved && p.Annotations[v1alpha1.AnnotationCheckpointStep] != ""
			}
			if saved {
				tl.mark(msSaved)
			}
			if w, _ := env.WorkloadOf(ns, "pretrain-7b", "PyTorchJob"); w != nil && apimeta.IsStatusConditionTrue(w.Status.Conditions, kueue.WorkloadEvicted) {
				tl.mark(msDecision)
			}
			_, decided := tl.get(msDecision)
			if decided && len(tp.Items) == 0 {
				tl.mark(msFree)
			}
			bound := 0
			for _, p := range inferencePods(env, ns) {
				if p.Spec.NodeName == "" {
					if msg := waitingReason(env, ns, &p); msg != "" && decided && len(tp.Items) > 0 {
						mu.Lock()
						if waitMsg == "" {
							waitMsg = p.Name + ": " + msg
						}
						mu.Unlock()
					}
					continue
				}
				bound++
				ds, _ := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices])
				for _, d := range ds {
					if held[d.UUID] && len(tp.Items) > 0 {
						select {
						case violation <- fmt.Sprintf("%s bound to %s while %d training pods exist", p.Name, d.UUID, len(tp.Items)):
						default:
						}
					}
				}
			}
			if bound == 6 {
				tl.mark(msBound)
				return
			}
		}
	}()

	say("traffic grows: scale chat from 2 to 6 replicas, as an HPA would")
	tl.mark(msScaleUp)
	raw, _ := json.Marshal(map[string]any{"spec": map[string]any{"replicas": 6}})
	if err := env.Client.Patch(env.Ctx, deploy, client.RawPatch(types.MergePatchType, raw)); err != nil {
		t.Fatalf("scaling chat: %v", err)
	}
	select {
	case <-watchDone:
	case <-time.After(180 * time.Second):
		expect(false, "all 6 inference pods bound within 180s")
	}
	tl.mu.Lock()
	order := append([]string(nil), tl.order...)
	tl.mu.Unlock()
	say("timeline:")
	for _, m := range order {
		d, _ := tl.get(m)
		say("  +%5.1fs  %s", d.Seconds(), m)
	}
	mu.Lock()
	if waitMsg != "" {
		say("while training checkpointed, a new inference pod waited: %s", waitMsg)
	}
	mu.Unlock()
	want := []string{msScaleUp, msDecision, msSaved, msFree, msBound}
	inOrder := true
	var prev time.Duration
	for _, m := range want {
		d, ok := tl.get(m)
		inOrder = inOrder && ok && d >= prev
		prev = d
	}
	expect(inOrder, "scale-up -> preemption decision -> checkpoint saved -> GPUs free -> inference pods bound, in that order")

	w, _ := env.WorkloadOf(ns, "pretrain-7b", "PyTorchJob")
	reason := ""
	if w != nil {
		if c := apimeta.FindStatusCondition(w.Status.Conditions, kueue.WorkloadPreempted); c != nil {
			reason = c.Reason
		}
	}
	say("pretrain-7b preempted, reason %q", reason)
	expect(strings.Contains(reason, "Reclamation") || strings.Contains(reason, "Cohort"), "Kueue preempted the training job to reclaim the cohort's lent quota")
	var job = train.DeepCopy()
	_ = env.Client.Get(env.Ctx, client.ObjectKeyFromObject(train), job)
	lcc := job.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]
	say("pretrain-7b's %s = %s: it resumes from there when quota comes back", v1alpha1.AnnotationLastConsistentCheckpoint, lcc)
	expect(lcc == "5100", "the training job's last consistent checkpoint is recorded")
	viol := ""
	select {
	case viol = <-violation:
	default:
	}
	expect(viol == "", "no inference pod was bound to a GPU a training pod still held %s", viol)

	perGPU := map[string]int64{}
	pinned := 0
	for _, p := range inferencePods(env, ns) {
		ds, err := v1alpha1.ParseDevices(p.Annotations[v1alpha1.AnnotationDevices])
		if err == nil && p.Spec.NodeName != "" && len(p.Spec.SchedulingGates) == 0 {
			pinned++
		}
		for _, d := range ds {
			perGPU[d.UUID] += d.MemoryMiB
		}
	}
	var use []string
	over := false
	for u, m := range perGPU {
		use = append(use, fmt.Sprintf("%s:%dMiB", u, m))
		over = over || m > 71903
	}
	sort.Strings(use)
	say("inference GPUs now: %s", strings.Join(use, " "))
	expect(pinned == 6 && !over, "6 inference pods pinned by their plans, no GPU past its allocatable memory")
}

// waitingReason is why an inference pod is not bound yet: its Workload's
// gang-fit check message, or the ungater's last Event.
func waitingReason(env *framework.Env, ns string, p *corev1.Pod) string {
	var wls kueue.WorkloadList
	if env.Client.List(env.Ctx, &wls, client.InNamespace(ns)) != nil {
		return ""
	}
	for _, wl := range wls.Items {
		for _, o := range wl.OwnerReferences {
			if o.UID != p.UID {
				continue
			}
			for _, ac := range wl.Status.AdmissionChecks {
				if ac.State == kueue.CheckStatePending && ac.Message != "" {
					return "gang-fit check Pending: " + ac.Message
				}
			}
		}
	}
	return ""
}
