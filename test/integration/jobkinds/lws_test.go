package jobkinds

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/preemption/owners"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
)

// fractionalLWS is a LeaderWorkerSet of one group of size pods (leader
// and workers from one template), each one GPU with the LWS-level request
// mem, opted in to checkpointing.
func fractionalLWS(name, ns, priority string, size int32, mem string) *lws.LeaderWorkerSet {
	res := corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}
	return &lws.LeaderWorkerSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": priority},
			Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: mem}},
		Spec: lws.LeaderWorkerSetSpec{
			Replicas: ptr.To[int32](1),
			// Not omitempty in the Go type: the CRD's default never applies.
			StartupPolicy: lws.LeaderCreatedStartupPolicy,
			LeaderWorkerTemplate: lws.LeaderWorkerTemplate{
				Size: ptr.To(size),
				WorkerTemplate: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
						v1alpha1.AnnotationCheckpoint: "true", v1alpha1.AnnotationCheckpointTimeout: "60s"}},
					Spec: corev1.PodSpec{
						Tolerations:  []corev1.Toleration{framework.KwokToleration},
						NodeSelector: map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"},
						Containers: []corev1.Container{{Name: "c", Image: "server:test", Command: []string{"python", "serve.py"},
							Resources: corev1.ResourceRequirements{Limits: res, Requests: res}}},
					},
				},
			},
		},
	}
}

// The same path for LeaderWorkerSet with the real LWS controller: Kueue
// runs an LWS replica group as a pod group (its Workload is owned by the
// LWS without a controller reference; its pods, leader and workers, are
// labelled with the group's Workload name). The coordinator finds them by
// that label and runs the checkpoint protocol when Kueue preempts the
// group; the preemptor is held by the check until the pods are gone; the
// consistent step is recorded on the LWS, and when the victim is admitted
// again its new pods get GPUPACK_RESUME_STEP.
func TestLWSControllerPreemptedThroughTheCheckpointProtocol(t *testing.T) {
	needController(t, "lws")
	s := startControllerSuite(t, framework.Options{LWS: true, LWSController: true}, webhooks.KindLeaderWorkerSet)
	env := s.env
	lowSel := client.MatchingLabels{lws.SetNameLabelKey: "low"}
	highSel := client.MatchingLabels{lws.SetNameLabelKey: "high"}
	trainer := &fakeTrainer{env: env, ns: s.ns, selector: lowSel}
	trainer.run(t)

	env.MustCreate(t, fractionalLWS("low", s.ns, "low", 2, "50Gi"))
	var stored lws.LeaderWorkerSet
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &stored); err != nil {
		t.Fatal(err)
	}
	if q := stored.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMemory]; q.Value() != 51200 {
		t.Errorf("stored worker template limits %v, want gpupack.io/gpu-memory 51200", stored.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec.Containers[0].Resources.Limits)
	}
	wl := env.WaitForWorkloadOf(t, s.ns, "low", "LeaderWorkerSet", admitted)
	if req := wl.Spec.PodSets[0].Template.Spec.Containers[0].Resources.Requests; req.Name(v1alpha1.ResourceGPUMemory, resource.BinarySI).Value() != 51200 {
		t.Errorf("Workload requests %v, want gpupack.io/gpu-memory 51200", req)
	}
	lwsPinned(t, s, "low's leader and worker", lowSel)
	env.Eventually(t, 120*time.Second, "low's leader and worker running", func() (bool, string) {
		var notes []string
		n := 0
		for _, p := range s.pods(t, lowSel) {
			notes = append(notes, fmt.Sprintf("%s phase=%s group=%q gates=%v", p.Name, p.Status.Phase, p.Labels[owners.LabelPodGroup], p.Spec.SchedulingGates))
			if p.Status.Phase == corev1.PodRunning && p.Labels[owners.LabelPodGroup] == wl.Name && controllerutil.ContainsFinalizer(&p, containerAlive) {
				n++
			}
		}
		return n == 2, strings.Join(notes, "; ")
	})
	// The group's pods before the preemption: the StatefulSets recreate a
	// pod as soon as the old one is gone, which may be before the record
	// says Done, so new pods are told apart by UID, not creation time.
	old := map[types.UID]bool{}
	for _, p := range s.pods(t, lowSel) {
		old[p.UID] = true
	}

	env.MustCreate(t, fractionalLWS("high", s.ns, "high", 2, "50Gi"))
	s.checkpointingHoldsPreemptor(t, "LeaderWorkerSet", lowSel)
	trainer.setAnswer(true)
	done := s.waitVictimDone(t, "LeaderWorkerSet", lowSel, false)
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "low"}, &stored); err != nil {
		t.Fatal(err)
	}
	if got := stored.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != fmt.Sprint(consistentStep) {
		t.Errorf("LWS %s = %q, want %d", v1alpha1.AnnotationLastConsistentCheckpoint, got, consistentStep)
	}
	s.preemptorAdmittedAfter(t, "LeaderWorkerSet", done)
	env.Eventually(t, 120*time.Second, "high's leader and worker running", func() (bool, string) {
		n := 0
		for _, p := range s.pods(t, highSel) {
			if p.Status.Phase == corev1.PodRunning {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d of 2", n)
	})
	lwsPinned(t, s, "high's leader and worker", highSel)

	// The preemptor leaves: the victim's group is admitted again and its
	// new pods (the StatefulSets recreate them once the old ones are gone)
	// carry the consistent step, which the pod webhook reads through the
	// pod's StatefulSet (and a worker's leader Pod) from the LWS.
	if err := env.Client.Delete(env.Ctx, &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "high"}}, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 120*time.Second, "the victim's new pods running with GPUPACK_RESUME_STEP", func() (bool, string) {
		var notes []string
		n := 0
		for _, p := range s.pods(t, lowSel) {
			if p.DeletionTimestamp != nil || old[p.UID] {
				continue
			}
			step := ""
			for _, e := range p.Spec.Containers[0].Env {
				if e.Name == v1alpha1.EnvResumeStep {
					step = e.Value
				}
			}
			notes = append(notes, fmt.Sprintf("%s=%q phase=%s", p.Name, step, p.Status.Phase))
			if step == fmt.Sprint(consistentStep) && p.Status.Phase == corev1.PodRunning {
				n++
			}
		}
		w, _ := env.WorkloadOf(s.ns, "low", "LeaderWorkerSet")
		return n == 2, strings.Join(notes, ", ") + "; " + framework.DescribeWorkload(w)
	})
	lwsPinned(t, s, "low's leader and worker, again", lowSel)
}

// lwsPinned checks the ungater pinned an LWS group's pods to the plan:
// Kueue gates pod-group pods with its own gate and adds gpupack.io/plan by
// an update after creation; the pod webhook puts gpupack's placement gate
// on them too (placement.KueuePodIntegration), so they wait for the plan.
func lwsPinned(t *testing.T, s *controllerSuite, what string, sel client.MatchingLabels) {
	t.Helper()
	s.waitPinned(t, what, sel, 2)
}
