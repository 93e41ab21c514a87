package preemption

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/policy"
	"github.com/gpupack/gpupack/test/framework"
)

// deletionLog records, per victim pod (UID), the latest deletionTimestamp
// and deletionGracePeriodSeconds the API server showed.
type deletionLog struct {
	mu      sync.Mutex
	history map[types.UID][]deletion
	names   map[types.UID]string
}

type deletion struct {
	at, seen time.Time
	grace    int64
}

// A tenant asks an hour of grace (terminationGracePeriodSeconds: 3600) and
// an hour of checkpoint time against a cluster cap of 5 s (+ 3 s margin).
// Kueue preempts the job; the training operator deletes its pods with their
// own hour; the coordinator shortens every deletion so that it ends by the
// checkpoint deadline + margin. The test plays the kubelet (kwok is
// stopped for the node): a pod goes when its deletionTimestamp passes (a
// kubelet's SIGKILL at the end of the grace), so the pods are gone when
// their grace ends: the ladder reaches Done without
// Killing, and no pod's deletion ever ends after the policy's bound. With
// the pods' own grace the test would wait an hour (Done never comes).
func TestTenantGraceDoesNotOutlastThePolicy(t *testing.T) {
	s, _ := startPreemptionSuite(t)
	env := s.env
	const capTimeout, margin = 5 * time.Second, 3 * time.Second
	env.StartManager(t, func(mgr ctrl.Manager) error {
		return preemption.SetupWithManager(mgr, preemption.Options{Slack: 5 * time.Second, SkipNameValidation: true,
			Policy: policy.Policy{Max: capTimeout, Margin: margin}})
	})
	low := framework.MakePyTorchJob("low", s.ns, "lq", 1, 2).PriorityClass("low").
		TemplateAnnotation(v1alpha1.AnnotationCheckpoint, "true").
		Annotation(v1alpha1.AnnotationCheckpointTimeout, "1h").Obj()
	for _, rs := range low.Spec.PyTorchReplicaSpecs {
		rs.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](3600)
	}
	env.MustCreate(t, low)
	agent := &fakeNodeAgent{env: env, ns: s.ns, job: "low", node: "n1"} // never answers: the trainers never save
	agent.run(t)
	env.Eventually(t, 90*time.Second, "low running on all 4 GPUs", func() (bool, string) {
		n := 0
		for _, p := range s.pods(t, "low") {
			if p.Status.Phase == corev1.PodRunning && p.Annotations[v1alpha1.AnnotationDevices] != "" && controllerutil.ContainsFinalizer(&p, containerAlive) {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d of 2 pods running with devices", n)
	})
	// kwok stops acting for the node (it would end a deleted pod at once,
	// whatever its grace); the test's kubelet below ends a pod when its
	// deletionTimestamp passes, as a kubelet's SIGKILL at the grace's end.
	env.SetKubelet(t, "n1", false)
	log := &deletionLog{history: map[types.UID][]deletion{}, names: map[types.UID]string{}}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // the kubelet's SIGKILL at the end of the grace, and the log
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			var pods corev1.PodList
			if env.Client.List(env.Ctx, &pods, client.InNamespace(s.ns), client.MatchingLabels{jobNameLabel: "low"}) != nil {
				continue
			}
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp == nil {
					continue
				}
				log.mu.Lock()
				g := int64(-1)
				if p.DeletionGracePeriodSeconds != nil {
					g = *p.DeletionGracePeriodSeconds
				}
				if h := log.history[p.UID]; len(h) == 0 || h[len(h)-1].grace != g || !h[len(h)-1].at.Equal(p.DeletionTimestamp.Time) {
					log.history[p.UID] = append(h, deletion{at: p.DeletionTimestamp.Time, grace: g, seen: time.Now()})
				}
				log.names[p.UID] = p.Name
				log.mu.Unlock()
				if !time.Now().After(p.DeletionTimestamp.Time) {
					continue
				}
				// The grace is over: the kubelet kills the containers and
				// removes the pod.
				if controllerutil.ContainsFinalizer(p, containerAlive) {
					raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": removeString(p.Finalizers, containerAlive), "resourceVersion": p.ResourceVersion}})
					if err := env.Client.Patch(env.Ctx, p, client.RawPatch(types.MergePatchType, raw)); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
						t.Logf("fake kubelet: %v", err)
					}
				}
				if err := env.Client.Delete(env.Ctx, p, client.GracePeriodSeconds(0), client.Preconditions{UID: &p.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					t.Logf("fake kubelet: %v", err)
				}
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })

	env.MustCreate(t, framework.MakePyTorchJob("high", s.ns, "lq", 1, 2).PriorityClass("high").Obj())
	env.Eventually(t, 120*time.Second, "victim preemption Done", func() (bool, string) {
		st, _ := s.state(t, "low")
		return st.Phase == ladder.PhaseDone, fmt.Sprintf("phases %v, %d pods left", phasesOf(st), len(s.pods(t, "low")))
	})
	done2, _ := s.state(t, "low")
	raw, _ := json.Marshal(done2)
	t.Logf("victim's %s: %s", v1alpha1.AnnotationPreemptionPhase, raw)
	asked := phaseAt(done2, ladder.PhaseCheckpointing)
	if done2.CheckpointDeadline == nil || done2.CheckpointDeadline.Sub(asked) != capTimeout {
		t.Errorf("checkpoint deadline %v after the request, want the cap %v (not the tenant's 1h)", done2.CheckpointDeadline, capTimeout)
	}
	bound := asked.Add(capTimeout + margin)
	if done2.GraceDeadline == nil || !done2.GraceDeadline.Equal(bound) {
		t.Errorf("grace deadline %v, want the checkpoint deadline + margin %v", done2.GraceDeadline, bound)
	}
	if got, want := fmt.Sprint(phasesOf(done2)), fmt.Sprint([]ladder.Phase{ladder.PhaseCheckpointing, ladder.PhaseTerminating, ladder.PhaseDone}); got != want {
		t.Errorf("phases %s, want %s: the pods should have gone at the end of their (shortened) grace", got, want)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.history) != 2 {
		t.Errorf("saw %d victim pods deleted, want 2", len(log.history))
	}
	for uid, h := range log.history {
		for _, d := range h {
			t.Logf("pod %s: deletionTimestamp %s, deletionGracePeriodSeconds %d (seen at %s)", log.names[uid], d.at.Format(time.RFC3339), d.grace, d.seen.Format(time.RFC3339Nano))
		}
		// The last deletion the pod had before it went: it ends by the
		// bound (deletionTimestamp has second resolution, the bound is
		// exact), with a grace no longer than the policy's.
		last := h[len(h)-1]
		if last.at.After(bound) {
			t.Errorf("pod %s: deletion ends at %s (deletionGracePeriodSeconds %d), after the checkpoint deadline + margin %s",
				log.names[uid], last.at.Format(time.RFC3339), last.grace, bound.Format(time.RFC3339Nano))
		}
		if time.Duration(last.grace)*time.Second > capTimeout+margin+time.Second {
			t.Errorf("pod %s: deletionGracePeriodSeconds %d, want at most the policy's grace %v", log.names[uid], last.grace, capTimeout+margin)
		}
	}
	if n := len(s.pods(t, "low")); n != 0 {
		// (Done means none is left; a replacement would be a new UID.)
		t.Errorf("%d victim pods left after Done", n)
	}
}

func removeString(list []string, s string) []string {
	var out []string
	for _, x := range list {
		if x != s {
			out = append(out, x)
		}
	}
	if out == nil {
		out = []string{}
	}
	return out
}
