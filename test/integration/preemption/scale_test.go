package preemption

import (
	"fmt"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/ladder"
	"github.com/gpupack/gpupack/preemption/policy"
	"github.com/gpupack/gpupack/test/framework"
)

// A 4,096-rank gang preempted, through the real API server: the coordinator
// asks every rank (with the policy's deadline: the cap of the victim's
// priority class, not the tenant's longer annotation), writes and reads
// back a 4,096-rank record, and records the consistent step; the Workload
// annotation stays small.
func TestPreemptionRecordOf4096Ranks(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 4,096 pods")
	}
	const ranks = 4096
	env := frameworkStartNoKueue(t)
	env.StartManager(t, func(mgr ctrl.Manager) error {
		return preemption.SetupWithManager(mgr, preemption.Options{SkipNameValidation: true,
			Policy: policy.Policy{MaxByPriorityClass: map[string]time.Duration{"low": 2 * time.Minute}}})
	})
	ns := env.Namespace(t, "big")
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: ns, Annotations: map[string]string{v1alpha1.AnnotationCheckpointTimeout: "1h"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}}}}
	env.MustCreate(t, job)
	owner := metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "job-big", Namespace: ns, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: kueue.WorkloadSpec{PriorityClassRef: kueue.NewWorkloadPriorityClassRef("low"), Priority: ptr.To[int32](10), QueueName: "lq", PodSets: []kueue.PodSet{{Name: "main", Count: ranks,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}}}}}}
	env.MustCreate(t, wl)

	parallel := func(n int, f func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		sem := make(chan struct{}, 16)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := f(i); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	name := func(i int) string { return fmt.Sprintf("big-%04d", i) }
	parallel(ranks, func(i int) error {
		return env.Client.Create(env.Ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name(i), Namespace: ns,
			Annotations: map[string]string{v1alpha1.AnnotationCheckpoint: "true"}, OwnerReferences: []metav1.OwnerReference{owner}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}})
	})

	// Kueue preempts it.
	start := time.Now()
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadPreempted, Status: metav1.ConditionTrue, Reason: "InClusterQueue", Message: "test"})
	if err := env.Client.Status().Update(env.Ctx, wl); err != nil {
		t.Fatal(err)
	}
	var deadline string
	env.Eventually(t, 5*time.Minute, "every rank asked", func() (bool, string) {
		var pods corev1.PodList
		if err := env.Client.List(env.Ctx, &pods, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		n := 0
		for _, p := range pods.Items {
			if p.Annotations[v1alpha1.AnnotationCheckpointRequest] != "" {
				n++
				deadline = p.Annotations[policy.AnnotationCheckpointDeadline]
			}
		}
		return n == ranks, fmt.Sprintf("%d of %d asked", n, ranks)
	})
	t.Logf("4,096 ranks asked %v after the preemption", time.Since(start).Round(time.Millisecond))
	var cur kueue.Workload
	if err := env.Client.Get(env.Ctx, types.NamespacedName{Namespace: ns, Name: wl.Name}, &cur); err != nil {
		t.Fatal(err)
	}
	st, err := preemption.PreemptionRecord(env.Ctx, env.Client, &cur)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Ranks) != ranks || st.CheckpointDeadline == nil {
		t.Fatalf("record has %d ranks, deadline %v", len(st.Ranks), st.CheckpointDeadline)
	}
	asked := st.Transitions[0].At
	if got := st.CheckpointDeadline.Sub(asked); got != 2*time.Minute {
		t.Errorf("checkpoint budget %v, want the class cap 2m over the tenant's 1h", got)
	}
	if deadline != policy.FormatDeadline(*st.CheckpointDeadline) {
		t.Errorf("pods carry deadline %q, want %q", deadline, policy.FormatDeadline(*st.CheckpointDeadline))
	}

	// Every agent reports step 300 (and rank 0 an older one too).
	parallel(ranks, func(i int) error {
		steps := "300"
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name(i), Namespace: ns}}
		raw := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.AnnotationCheckpointStep, steps)
		return env.Client.Patch(env.Ctx, p, client.RawPatch(types.MergePatchType, []byte(raw)))
	})
	env.Eventually(t, 5*time.Minute, "Done with the consistent step", func() (bool, string) {
		if err := env.Client.Get(env.Ctx, types.NamespacedName{Namespace: ns, Name: wl.Name}, &cur); err != nil {
			return false, err.Error()
		}
		st, err = preemption.PreemptionRecord(env.Ctx, env.Client, &cur)
		return err == nil && st.Phase == ladder.PhaseDone, fmt.Sprintf("phases %v, err %v", phasesOf(st), err)
	})
	saved := 0
	for _, o := range st.Outcomes {
		if o == ladder.OutcomeSaved {
			saved++
		}
	}
	if len(st.Ranks) != ranks || saved != ranks || st.LastConsistentStep == nil || *st.LastConsistentStep != 300 {
		t.Errorf("record: %d ranks, %d saved, consistent %v; want %d, %d, 300", len(st.Ranks), saved, st.LastConsistentStep, ranks, ranks)
	}
	if n := len(cur.Annotations[v1alpha1.AnnotationPreemptionPhase]); n > 2048 {
		t.Errorf("Workload annotation %d B for %d ranks", n, ranks)
	}
	var j batchv1.Job
	if err := env.Client.Get(env.Ctx, types.NamespacedName{Namespace: ns, Name: job.Name}, &j); err != nil {
		t.Fatal(err)
	}
	if got := j.Annotations[v1alpha1.AnnotationLastConsistentCheckpoint]; got != "300" {
		t.Errorf("job %s = %q, want 300", v1alpha1.AnnotationLastConsistentCheckpoint, got)
	}
	t.Logf("4,096 ranks: Done %v after the preemption; annotation %d B", time.Since(start).Round(time.Millisecond), len(cur.Annotations[v1alpha1.AnnotationPreemptionPhase]))
}

func frameworkStartNoKueue(t *testing.T) *framework.Env {
	return framework.Start(t, framework.Options{NoKueue: true})
}
