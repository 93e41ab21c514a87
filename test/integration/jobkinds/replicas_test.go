package jobkinds

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
)

// A JobSet whose replicated Job has replicas 2 runs two Jobs whose pods
// share completion indices 0 and 1; Kueue's pod set counts 2 × 2 pods and
// the plan has slots workers[0..3]. With the real JobSet controller, all
// four pods run, each pinned to a slot of its own (the ungater numbers a
// JobSet pod's slot by its Job's index and its completion index), no GPU
// is given more than it has, and every (Job index, completion index) pair
// is one pod. Matched by completion index alone, the second Job's pods
// would wait for the first Job's slots forever. The pods, made by the Job
// controller from the Jobs' marked templates, take the pod webhook's fast
// path: the webhook sees none of them.
func TestJobSetReplicasGetTheirOwnSlots(t *testing.T) {
	needController(t, "jobset")
	s := startControllerSuite(t, framework.Options{JobSet: true, JobSetController: true}, webhooks.KindJobSet)
	before := podMutations(t)
	js := runnableJobSet("multi", s.ns, "low", 2, "30Gi", false)
	js.Spec.ReplicatedJobs[0].Replicas = 2
	s.env.MustCreate(t, js)
	wl := s.env.WaitForWorkloadOf(t, s.ns, "multi", "JobSet", admitted)
	if n := wl.Spec.PodSets[0].Count; n != 4 {
		t.Fatalf("Workload pod set %s counts %d pods, want 4 (2 Jobs × 2)", wl.Spec.PodSets[0].Name, n)
	}
	pods := s.waitPinned(t, "multi's 4 pods", client.MatchingLabels{labelJobSetName: "multi"}, 4)
	seen := map[string]string{}
	for _, p := range pods {
		k := p.Labels[jobset.JobIndexKey] + "/" + p.Labels[batchv1.JobCompletionIndexAnnotation]
		if other, dup := seen[k]; dup {
			t.Errorf("pods %s and %s are both (Job index, completion index) %s", other, p.Name, k)
		}
		seen[k] = p.Name
	}
	if len(seen) != 4 {
		t.Errorf("(Job index, completion index) pairs %v, want 4 distinct", seen)
	}
	if n := podMutations(t) - before; n != 0 {
		t.Errorf("the pod webhook answered %v pod creations, want none (JobSet's Jobs' pods take the fast path)", n)
	}
}

// podMutations is how many pod creations gpupack's mutating pod webhook
// has answered in this process.
func podMutations(t *testing.T) float64 {
	t.Helper()
	n, err := framework.CounterSum("gpupack_webhook_admissions_total", map[string]string{"webhook": "mutating", "kind": "Pod"})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// An LWS with replicas 2 is two groups, each its own Kueue pod group
// (Workload and plan), each group a leader (its own template, a smaller
// request) and a worker. With the real LWS controller all four pods run,
// each on a slot of its own group's plan, the leader on the leader's slot
// and the worker on the worker's (the slot gives each the memory it asked
// for: the ungater reads the pod set from Kueue's role annotation), and no
// GPU is given more than it has. With the StatefulSet kind (whose entry
// sees the LWS controller's StatefulSets), no pod meets the pod webhook:
// the StatefulSet controller makes them from templates gpupack marked
// (docs/webhooks.md, LWS pods on the fast path), and they still get all
// the above.
func TestLWSReplicasGetTheirOwnSlots(t *testing.T) {
	needController(t, "lws")
	s := startControllerSuite(t, framework.Options{LWS: true, LWSController: true}, webhooks.KindLeaderWorkerSet, webhooks.KindStatefulSet)
	before := podMutations(t)
	set := fractionalLWS("multi", s.ns, "low", 2, "40Gi")
	set.Spec.Replicas = ptr.To[int32](2)
	// Not checkpointing: a checkpointing pod needs the pod webhook's
	// wrapping, so its template is never marked (lws_test.go has those).
	delete(set.Spec.LeaderWorkerTemplate.WorkerTemplate.Annotations, v1alpha1.AnnotationCheckpoint)
	delete(set.Spec.LeaderWorkerTemplate.WorkerTemplate.Annotations, v1alpha1.AnnotationCheckpointTimeout)
	leader := set.Spec.LeaderWorkerTemplate.WorkerTemplate.DeepCopy()
	leader.Annotations = map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	res := corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}
	leader.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: res, Requests: res}
	set.Spec.LeaderWorkerTemplate.LeaderTemplate = leader
	s.env.MustCreate(t, set)
	sel := client.MatchingLabels{lws.SetNameLabelKey: "multi"}
	pods := s.waitPinned(t, "multi's 2 groups of 2", sel, 4)
	plans := map[string]string{}
	seen := map[string]string{}
	for _, p := range pods {
		g := p.Labels[lws.GroupIndexLabelKey]
		k := g + "/" + p.Labels[lws.WorkerIndexLabelKey]
		if other, dup := seen[k]; dup {
			t.Errorf("pods %s and %s are both (group, worker) %s", other, p.Name, k)
		}
		seen[k] = p.Name
		plan := p.Annotations[v1alpha1.AnnotationPlan]
		if prev, ok := plans[g]; ok && prev != plan {
			t.Errorf("group %s's pods name plans %s and %s", g, prev, plan)
		}
		plans[g] = plan
	}
	if len(plans) != 2 || plans["0"] == plans["1"] {
		t.Errorf("plans by group %v, want one per group", plans)
	}
	if n := podMutations(t) - before; n != 0 {
		t.Errorf("the pod webhook answered %v pod creations, want none (LWS pods take the fast path)", n)
	}
	for _, p := range pods {
		_, isWorker := p.Annotations[lws.LeaderPodNameAnnotationKey]
		want := map[bool]int64{false: 20480, true: 40960}[isWorker]
		if q := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMemory]; q.Value() != want {
			t.Errorf("pod %s (worker %v) limits %v, want gpupack.io/gpu-memory %d", p.Name, isWorker, p.Spec.Containers[0].Resources.Limits, want)
		}
	}
}
