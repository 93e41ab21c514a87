package security

// Outside hostile review, session 9 (issue 14): policy gpupack-job-plan's
// copy exception and the LWS walk-through pairs of the owner walk
// (webhooks/managed.go intermediateOK), as tenant alice with `edit`, on the
// real apiserver with the shipped RBAC and policies. Each test asserts the
// promise; a failure starting "BROKEN" is the finding. Each finding failed
// here before its answer (docs/security.md, "Review 9"): F1 a GPU Job
// forged under the victim's JobSet in an opted-out namespace
// (Unmanaged.PosesAsChild), F1b the same as a CPU Job (the ungater places
// no pod that asks for no GPU), F2 a tenant's pod as an LWS leader
// (kueueView.statefulSetPod), F4 CronJobs (gpupack-job-plan).

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/preemption/owners"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// TestReview9ForgedJobUnderVictimJobSetTakesItsSlot attacks the copy
// exception of gpupack-job-plan (docs/security.md, "A namespace is one
// trust domain": "a tenant's Job forged under the victim's JobSet (where a
// namespace opted out of the unmanaged-GPU refusal …) would be given the
// victim's plan when the JobSet controller resumes its Jobs … (not yet
// attacked by a test)"). alice creates a GPU Job whose controller
// reference names bob's queued JobSet (its real UID) with the labels the
// JobSet controller files its children by; Kueue writes bob's plan into
// bob's JobSet and unsuspends it; the real JobSet controller (v0.11)
// copies the plan into alice's Job and resumes it; the Job controller's
// pod of alice's Job (alice's image) is admitted and the real ungater
// places it on bob's slot.
//
// Promise: a tenant's pod never takes another job's GPUPlan slot.
func TestReview9ForgedJobUnderVictimJobSetTakesItsSlot(t *testing.T) {
	forgedJobUnderJobSet(t, false)
}

// TestReview9ForgedCPUJobUnderVictimJobSetHoldsItsSlot is the same attack
// where no namespace opted out: alice's forged Job asks for no GPU, so no
// gpupack webhook sees its creation; the JobSet controller still copies
// bob's plan into it. Promise: her pod never takes (binds) bob's slot.
func TestReview9ForgedCPUJobUnderVictimJobSetHoldsItsSlot(t *testing.T) {
	forgedJobUnderJobSet(t, true)
}

func forgedJobUnderJobSet(t *testing.T, cpu bool) {
	cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "kubeflow.org/pytorchjob", "jobset.x-k8s.io/jobset"}}}
	c := startClusterCfg(t, framework.Options{NoKueue: true, JobSetController: true, JobPodsKeepRunning: true}, []string{webhooks.KindJobSet}, cfg)
	env, ctx, ns := c.env, c.env.Ctx, c.open
	applyObjects(t, c.env, "manifests/components/job-kinds/jobset/rbac.yaml")
	env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pathNode}})
	c.startUngater(t)
	kueueCl := asKueue(t, c)
	jobCtl := c.alice.(*throughJob).controller

	// bob's queued, suspended whole-GPU JobSet (one replicated job,
	// "workers", one Job, one pod). (A fractional one's gpu-memory
	// annotation, merged into alice's whole-GPU template, makes the
	// Job webhook refuse the JobSet controller's update.)
	bobTemplate := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeSelector: map[string]string{flavors.LabelGPUProduct: h100},
			Containers: []corev1.Container{{Name: "trainer", Image: "bob/trainer", Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, "1")}}}},
	}
	bob := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "bob-js", Namespace: ns, Labels: map[string]string{mutation.LabelQueueName: "gpu"}},
		Spec: jobset.JobSetSpec{Suspend: ptr.To(true), ReplicatedJobs: []jobset.ReplicatedJob{{Name: "workers", Replicas: 1,
			Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: bobTemplate}}}}}}
	env.MustCreate(t, bob)
	env.Eventually(t, 90*time.Second, "bob's JobSet's suspended Job", func() (bool, string) {
		var jobs batchv1.JobList
		if err := env.Client.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{jobset.JobSetNameKey: "bob-js"}); err != nil {
			return false, err.Error()
		}
		return len(jobs.Items) == 1, fmt.Sprintf("%d Jobs", len(jobs.Items))
	})

	// alice's Job: whole GPU, her own image, controlled by bob's JobSet.
	forged := func(name string) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{jobset.JobSetNameKey: "bob-js", jobset.ReplicatedJobNameKey: "workers", "jobset.sigs.k8s.io/restart-attempt": "0",
				jobset.JobIndexKey: "0", jobset.ReplicatedJobReplicas: "1"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: jobset.GroupVersion.String(), Kind: "JobSet", Name: bob.Name, UID: bob.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}},
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{Name: "miner", Image: "alice/miner", Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, "1")}}}}}}}
	}
	mine := forged("alice-forged")
	if cpu {
		mine.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	} else {
		// Held part: where the namespace has not opted out, the creation
		// check refuses her.
		denied(t, "alice's GPU Job under bob's JobSet (no opt-out)", c.aliceSelf.Create(ctx, forged("alice-forged-0")), `created by "alice"`)
		// The administrator opts the namespace out (whole GPUs outside
		// Kueue allowed there, recorded by gpupack-node).
		if err := env.Client.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
			mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{mutation.NamespaceLabelUnmanagedGPUs: "allow"}}})); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if err = c.aliceSelf.Create(ctx, mine); err == nil {
			break
		}
	}
	if err != nil {
		if strings.Contains(err.Error(), "not by a controller gpupack trusts") {
			t.Logf("HELD: alice's Job under bob's JobSet refused at creation: %v", err)
			return
		}
		t.Fatalf("alice's Job under bob's JobSet: %v", err)
	}
	t.Logf("alice's Job (CPU %v) controlled by bob's JobSet %s created (opted-out namespace: %v)", cpu, bob.UID, !cpu)

	// Kueue admits bob's JobSet: its podSetUpdates (the plan) into the
	// suspended JobSet's template, then the unsuspend.
	if err := kueueCl.Patch(ctx, bob, jsonPatch(t, planOp("add", "/spec/replicatedJobs/0/template/spec/template", "bob-plan"))); err != nil {
		t.Fatalf("Kueue writing bob's plan: %v", err)
	}
	if err := kueueCl.Patch(ctx, bob, mergePatch(map[string]any{"spec": map[string]any{"suspend": false}})); err != nil {
		t.Fatalf("Kueue unsuspending bob's JobSet: %v", err)
	}
	got := &batchv1.Job{}
	copied := false
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mine), got); err == nil &&
			!ptr.Deref(got.Spec.Suspend, true) && got.Spec.Template.Annotations[v1alpha1.AnnotationPlan] == "bob-plan" {
			copied = true
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !copied {
		var jobs batchv1.JobList
		_ = env.Client.List(ctx, &jobs, client.InNamespace(ns))
		var states []string
		for _, j := range jobs.Items {
			states = append(states, fmt.Sprintf("%s suspend=%v plan=%q", j.Name, ptr.Deref(j.Spec.Suspend, false), j.Spec.Template.Annotations[v1alpha1.AnnotationPlan]))
		}
		logTail := ""
		if raw, err := os.ReadFile(filepath.Join(env.Dir, "jobset.log")); err == nil {
			for _, l := range strings.Split(string(raw), "\n") {
				if strings.Contains(l, "alice-forged") || strings.Contains(strings.ToLower(l), "error") {
					logTail += l + "\n"
				}
			}
			if len(logTail) > 4000 {
				logTail = logTail[len(logTail)-4000:]
			}
		}
		t.Logf("HELD: the JobSet controller did not give alice's Job bob's plan (suspend %v, template annotations %v); Jobs %v; JobSet controller log:\n%s", ptr.Deref(got.Spec.Suspend, true), got.Spec.Template.Annotations, states, logTail)
		return
	}
	t.Logf("the JobSet controller resumed alice's Job with bob's plan: template annotations %v", got.Spec.Template.Annotations)

	// bob's Workload (Kueue's, controlled by his JobSet) and plan (one
	// slot on GPU-victim-0).
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "bob-plan", Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: jobset.GroupVersion.String(), Kind: "JobSet", Name: bob.Name, UID: bob.UID, Controller: ptr.To(true)}}},
		Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{Name: "workers", Count: 1, Template: bobTemplate}}}}
	env.MustCreate(t, wl)
	env.MustCreate(t, gangPlan(ns, "bob-plan", []string{"GPU-victim-0"}))

	// The Job controller makes alice's Job's pod from its template.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "alice-forged-0", Namespace: ns, Labels: got.Spec.Template.Labels, Annotations: got.Spec.Template.Annotations,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(got, batchv1.SchemeGroupVersion.WithKind("Job"))}}, Spec: got.Spec.Template.Spec}
	if err := jobCtl.Create(ctx, pod); err != nil {
		t.Logf("HELD: the Job controller's pod of alice's forged Job refused: %v", err)
		return
	}
	t.Logf("the pod of alice's Job (image alice/miner) carrying bob's plan admitted")
	placed := ""
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end) && placed == ""; time.Sleep(time.Second) {
		cur := &corev1.Pod{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), cur); err == nil && !hasGate(cur) && cur.Annotations[v1alpha1.AnnotationDevices] != "" {
			placed = cur.Annotations[v1alpha1.AnnotationDevices]
		}
	}
	evs, _ := env.Clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
	var seen []string
	for _, e := range evs.Items {
		seen = append(seen, e.Reason+": "+e.Message)
	}
	pl := &v1alpha1.GPUPlan{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bob-plan"}, pl); err != nil {
		t.Fatal(err)
	}
	for _, b := range pl.Status.Bindings {
		if b.PodUID == pod.UID && placed == "" {
			t.Errorf("BROKEN: alice's pod (CPU %v) holds bob's GPUPlan slot %+v; events %v", cpu, b, seen)
			return
		}
	}
	if placed != "" {
		t.Errorf("BROKEN: alice's pod (her image; CPU %v; her Job forged under bob's JobSet; opted-out namespace %v) was placed on bob's GPUPlan slot: devices %s; events %v", cpu, !cpu, placed, seen)
		return
	}
	t.Logf("HELD: alice's pod stays gated: events %v", seen)
	for _, e := range evs.Items {
		if e.Reason == placement.EventPlanNotForPod {
			return
		}
	}
}

// lwsChain is bob's LWS group as the LWS and StatefulSet controllers
// build it: LWS → leader StatefulSet → leader Pod → worker StatefulSet.
type lwsChain struct {
	lws       *lws.LeaderWorkerSet
	leaderSTS *appsv1.StatefulSet
	leader    *corev1.Pod
	workerSTS *appsv1.StatefulSet
}

func ctlRef(apiVersion, kind, name string, uid types.UID) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
}

// lwsGPUTemplate is an LWS worker template as Kueue's LWS webhook leaves
// it (pod-suspending-parent), whole GPU.
func lwsGPUTemplate(image string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "w"},
		Annotations: map[string]string{placement.KueueSuspendingParent: "leaderworkerset.x-k8s.io/leaderworkerset"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Image: image, Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, "1")}}}}}
}

func cpuSTS(ns, name string, owners []metav1.OwnerReference, tmpl corev1.PodTemplateSpec) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, OwnerReferences: owners},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: tmpl.Labels}, Template: tmpl}}
}

// TestReview9LWSWalkThroughPairs attacks the two pairs commit 2dae57d let
// the owner walk pass (an LWS group's leader Pod under its StatefulSet, a
// StatefulSet under its LWS): alice forges each link with the real UIDs of
// bob's objects. Promise: her GPU object is never judged as managed by
// bob's admitted LWS (which would skip quota), and stale or mismatched
// UIDs end the walk. The real chain (the LWS and StatefulSet controllers'
// creates) is admitted, as the control.
func TestReview9LWSWalkThroughPairs(t *testing.T) {
	cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "kubeflow.org/pytorchjob", "leaderworkerset.x-k8s.io/leaderworkerset", "pod"}}}
	c := startClusterCfg(t, framework.Options{NoKueue: true}, []string{webhooks.KindStatefulSet, webhooks.KindLeaderWorkerSet}, cfg)
	env, ctx, ns := c.env, c.env.Ctx, c.open
	env.MustCreate(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "r9-lws-ctl"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"statefulsets"}, Verbs: []string{"*"}}}})
	env.MustCreate(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "r9-lws-ctl"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "r9-lws-ctl"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: framework.UserLWSController}}})
	lwsCtl := c.as(t, framework.UserLWSController, []string{"system:serviceaccounts", "system:serviceaccounts:lws-system", "system:authenticated"}, nil)
	stsCtl := c.as(t, statefulSetControllerUser, []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, nil)

	// bob's queued LWS and the links above the worker StatefulSet, as the
	// controllers made them (the admin stands in; CPU links reach no
	// gpupack webhook).
	cpuTmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "l"}}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "l", Image: "busybox"}}}}
	b := &lwsChain{}
	b.lws = &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "bob-lws", Namespace: ns, Labels: map[string]string{mutation.LabelQueueName: "gpu"}},
		Spec: lws.LeaderWorkerSetSpec{Replicas: ptr.To[int32](1), StartupPolicy: lws.LeaderCreatedStartupPolicy, RolloutStrategy: lws.RolloutStrategy{Type: lws.RollingUpdateStrategyType}, LeaderWorkerTemplate: lws.LeaderWorkerTemplate{Size: ptr.To[int32](2), WorkerTemplate: cpuTmpl}}}
	env.MustCreate(t, b.lws)
	b.leaderSTS = cpuSTS(ns, "bob-lws", ctlRef("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", b.lws.Name, b.lws.UID), cpuTmpl)
	env.MustCreate(t, b.leaderSTS)
	b.leader = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bob-lws-0", Namespace: ns, Labels: map[string]string{"app": "l"},
		OwnerReferences: ctlRef("apps/v1", "StatefulSet", b.leaderSTS.Name, b.leaderSTS.UID)}, Spec: cpuTmpl.Spec}
	env.MustCreate(t, b.leader)

	// Control: the LWS controller's GPU worker StatefulSet under the
	// leader Pod, and the StatefulSet controller's pod of it.
	b.workerSTS = cpuSTS(ns, "bob-lws-0", ctlRef("v1", "Pod", b.leader.Name, b.leader.UID), lwsGPUTemplate("bob/worker"))
	env.Eventually(t, 20*time.Second, "the LWS controller's worker StatefulSet admitted", func() (bool, string) {
		err := lwsCtl.Create(ctx, b.workerSTS)
		return err == nil || apierrors.IsAlreadyExists(err), fmt.Sprint(err)
	})
	workerPod := func(name string, sts *appsv1.StatefulSet) *corev1.Pod {
		tm := lwsGPUTemplate("bob/worker")
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: tm.Labels, Annotations: tm.Annotations,
			OwnerReferences: ctlRef("apps/v1", "StatefulSet", sts.Name, sts.UID)}, Spec: tm.Spec}
	}
	if err := stsCtl.Create(ctx, workerPod("bob-lws-0-1", b.workerSTS)); err != nil {
		t.Fatalf("control: the StatefulSet controller's worker pod of bob's real LWS chain refused: %v", err)
	}

	held := func(what string, err error, want string) {
		t.Helper()
		if err == nil {
			t.Errorf("BROKEN: %s admitted: judged as managed by bob's LWS, outside every quota", what)
			return
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: refused, but with %v (want it to say %q)", what, err, want)
			return
		}
		t.Logf("HELD: %s: %v", what, err)
	}
	trust := "not by a controller gpupack trusts"
	// A1/A2: alice's GPU StatefulSet under bob's leader Pod, or straight
	// under bob's LWS (a second "leader StatefulSet").
	held("alice's GPU StatefulSet under bob's leader Pod", c.aliceSelf.Create(ctx, cpuSTS(ns, "a1", ctlRef("v1", "Pod", b.leader.Name, b.leader.UID), lwsGPUTemplate("alice/miner"))), trust)
	held("alice's GPU StatefulSet under bob's LWS", c.aliceSelf.Create(ctx, cpuSTS(ns, "a2", ctlRef("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", b.lws.Name, b.lws.UID), lwsGPUTemplate("alice/miner"))), trust)
	// A3–A5: alice's GPU pod under bob's leader Pod, worker StatefulSet,
	// leader StatefulSet.
	for _, tc := range []struct {
		name, apiVersion, kind, owner string
		uid                           types.UID
	}{
		{"a3", "v1", "Pod", b.leader.Name, b.leader.UID},
		{"a4", "apps/v1", "StatefulSet", b.workerSTS.Name, b.workerSTS.UID},
		{"a5", "apps/v1", "StatefulSet", b.leaderSTS.Name, b.leaderSTS.UID},
	} {
		p := workerPod(tc.name, b.workerSTS)
		p.Spec.Containers[0].Image = "alice/miner"
		p.OwnerReferences = ctlRef(tc.apiVersion, tc.kind, tc.owner, tc.uid)
		held("alice's GPU pod under bob's "+tc.kind+" "+tc.owner, c.aliceSelf.Create(ctx, p), trust)
	}
	// A6: a CPU StatefulSet under bob's leader Pod (no webhook sees it),
	// then GPUs by update.
	a6 := cpuSTS(ns, "a6", ctlRef("v1", "Pod", b.leader.Name, b.leader.UID), corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "a6"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Image: "alice/miner"}}}})
	if err := c.aliceSelf.Create(ctx, a6); err != nil {
		t.Fatalf("alice's CPU StatefulSet: %v", err)
	}
	held("GPUs added to alice's CPU StatefulSet under bob's leader Pod", c.aliceSelf.Patch(ctx, a6, mergePatch(map[string]any{"spec": map[string]any{"template": map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{placement.KueueSuspendingParent: "leaderworkerset.x-k8s.io/leaderworkerset"}},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": "w", "image": "alice/miner", "resources": map[string]any{"limits": map[string]string{v1alpha1.ResourceNvidiaGPU: "1"}}}}}}}})), trust)
	// A7: a trusted controller's StatefulSet naming bob's leader Pod with
	// another UID.
	held("a worker StatefulSet naming bob's leader Pod with a forged UID", lwsCtl.Create(ctx, cpuSTS(ns, "a7", ctlRef("v1", "Pod", b.leader.Name, "bogus-uid"), lwsGPUTemplate("bob/worker"))), "is not that object")
	// A9: alice's own CPU pod as the middle link (no webhook sees a CPU
	// pod): controlled by bob's leader StatefulSet, as a leader Pod is.
	// A GPU StatefulSet the LWS controller makes under it walks through
	// her pod to bob's LWS.
	fake := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bob-lws-9", Namespace: ns, Labels: map[string]string{"app": "l"},
		OwnerReferences: ctlRef("apps/v1", "StatefulSet", b.leaderSTS.Name, b.leaderSTS.UID)}, Spec: cpuTmpl.Spec}
	if err := c.aliceSelf.Create(ctx, fake); err != nil {
		t.Fatalf("alice's CPU pod under bob's leader StatefulSet: %v", err)
	}
	held("a GPU StatefulSet under alice's own CPU pod posing as bob's leader Pod (the middle link nobody checked)",
		lwsCtl.Create(ctx, cpuSTS(ns, "a9", ctlRef("v1", "Pod", fake.Name, fake.UID), lwsGPUTemplate("bob/worker"))), "Pod")
	// A8: bob's leader Pod deleted and made again under its name (new
	// UID): a pod of the old worker StatefulSet no longer walks up.
	if err := env.Client.Delete(ctx, b.leader, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 20*time.Second, "bob's leader Pod gone", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(b.leader), &corev1.Pod{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: b.leader.Name, Namespace: ns, Labels: map[string]string{"app": "l"},
		OwnerReferences: ctlRef("apps/v1", "StatefulSet", b.leaderSTS.Name, b.leaderSTS.UID)}, Spec: cpuTmpl.Spec}
	env.MustCreate(t, again)
	held("a pod of the worker StatefulSet of bob's recreated leader Pod (stale UID)", stsCtl.Create(ctx, workerPod("bob-lws-0-2", b.workerSTS)), "is not that object")
}

// TestReview9JobPlanPolicyEdges tries gpupack-job-plan's edges as alice:
// server-side apply, the plan removed and put back, a planned replicated
// job renamed (the plan moved to a new key), and a kind the policy does
// not list (CronJob, whose jobTemplate is a Job template). Promise: only
// Kueue adds or changes the plan in a job's templates after creation;
// at creation only a trusted controller for its owner; and a pod takes a
// slot only of its own Workload.
func TestReview9JobPlanPolicyEdges(t *testing.T) {
	c := startClusterOpts(t, framework.Options{NoKueue: true}, nil)
	ctx, ns := c.env.Ctx, c.open
	kueueCl := asKueue(t, c)

	// Her own suspended CPU Job, planned by Kueue.
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "alices", Namespace: ns}, Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: cpuTemplate()}}
	if err := c.aliceSelf.Create(ctx, j); err != nil {
		t.Fatal(err)
	}
	// Server-side apply of the plan by alice.
	apply := &unstructuredJob{name: j.Name, ns: ns, plan: "bob-plan"}
	held := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("BROKEN: %s admitted", what)
			return
		}
		if !strings.Contains(err.Error(), "gpupack-job-plan") {
			t.Errorf("%s: refused, but not by gpupack-job-plan: %v", what, err)
			return
		}
		t.Logf("HELD: %s: %v", what, err)
	}
	held("alice's server-side apply of bob's plan into her Job", c.aliceSelf.Patch(ctx, apply.obj(t), client.Apply, client.FieldOwner("alice"), client.ForceOwnership))
	if err := kueueCl.Patch(ctx, j, jsonPatch(t, planOp("add", "/spec/template", "alices-plan"))); err != nil {
		t.Fatalf("Kueue writing alice's plan: %v", err)
	}
	if err := c.aliceSelf.Patch(ctx, j, jsonPatch(t, planOp("remove", "/spec/template", ""))); err != nil {
		t.Fatalf("alice removing her plan (allowed): %v", err)
	}
	held("alice putting back a plan she removed (bob's)", c.aliceSelf.Patch(ctx, j, jsonPatch(t, planOp("add", "/spec/template", "bob-plan"))))

	// Her JobSet planned by Kueue; the replicated job renamed, the plan
	// kept. (JobSet's install lets tenants write JobSets.)
	c.env.MustCreate(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "jobsets", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"jobset.x-k8s.io"}, Resources: []string{"jobsets"}, Verbs: []string{"*"}}}})
	c.env.MustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-jobsets", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "jobsets"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}}})
	js := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "alices-js", Namespace: ns}, Spec: jobset.JobSetSpec{Suspend: ptr.To(true),
		ReplicatedJobs: []jobset.ReplicatedJob{{Name: "workers", Replicas: 1, Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: cpuTemplate()}}}}}}
	if err := c.aliceSelf.Create(ctx, js); err != nil {
		t.Fatal(err)
	}
	if err := kueueCl.Patch(ctx, js, jsonPatch(t, planOp("add", "/spec/replicatedJobs/0/template/spec/template", "bob-plan"))); err != nil {
		t.Fatalf("Kueue writing a plan: %v", err)
	}
	held("alice renaming her planned replicated job (the plan under a new name)", c.aliceSelf.Patch(ctx, js, jsonPatch(t, map[string]any{"op": "replace", "path": "/spec/replicatedJobs/0/name", "value": "w2"})))

	// CronJob: no gpupack webhook entry; gpupack-job-plan refuses a plan
	// in its Job template at creation and on update (F4).
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "alices-cron", Namespace: ns}, Spec: batchv1.CronJobSpec{Schedule: "* * * * *", Suspend: ptr.To(true),
		JobTemplate: batchv1.JobTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{mutation.LabelQueueName: "gpu"}}, Spec: batchv1.JobSpec{Template: cpuTemplate()}}}}
	cj.Spec.JobTemplate.Spec.Template.Annotations[v1alpha1.AnnotationPlan] = "bob-plan"
	if err := c.aliceSelf.Create(ctx, cj); err != nil {
		t.Logf("HELD: alice's CronJob created with bob's plan in its Job template refused: %v", err)
	} else {
		t.Errorf("BROKEN (creation check, layer 1): alice's CronJob created with bob's plan in its Job template (no check at creation)")
	}
	cj2 := cj.DeepCopy()
	cj2.Name, cj2.ResourceVersion = "alices-cron-2", ""
	delete(cj2.Spec.JobTemplate.Spec.Template.Annotations, v1alpha1.AnnotationPlan)
	if err := c.aliceSelf.Create(ctx, cj2); err != nil {
		t.Fatal(err)
	}
	if err := c.aliceSelf.Patch(ctx, cj2, jsonPatch(t, planOp("add", "/spec/jobTemplate/spec/template", "bob-plan"))); err != nil {
		t.Logf("HELD: bob's plan added to alice's CronJob by update refused: %v", err)
	} else {
		t.Errorf("BROKEN (gpupack-job-plan, layer 1): bob's plan added to alice's CronJob's Job template by update (the policy does not list cronjobs)")
	}
	// The CronJob controller's Job of a CronJob, as kube-controller-manager
	// without --use-service-account-credentials (a trusted creator), with
	// bob's plan: what a CronJob stored with a plan before the policy
	// covered CronJobs makes. Refused at its creation by gpupack-job-plan
	// (a CPU Job meets no gpupack webhook).
	const kcm = "system:kube-controller-manager"
	c.env.MustCreate(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "r9-kcm-jobs"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"*"}}}})
	c.env.MustCreate(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "r9-kcm-jobs"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "r9-kcm-jobs"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: kcm}}})
	cronJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "alices-cron-1", Namespace: ns, Labels: cj.Spec.JobTemplate.Labels,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj2, batchv1.SchemeGroupVersion.WithKind("CronJob"))}}, Spec: *cj.Spec.JobTemplate.Spec.DeepCopy()}
	controller := c.as(t, kcm, []string{"system:authenticated"}, nil)
	held("the CronJob controller's Job of alice's CronJob created with bob's plan", controller.Create(ctx, cronJob.DeepCopy()))
	// The same Job without a plan is the CronJob controller's to make.
	delete(cronJob.Spec.Template.Annotations, v1alpha1.AnnotationPlan)
	if err := controller.Create(ctx, cronJob); err != nil {
		t.Fatalf("the CronJob controller's Job without a plan: %v", err)
	}
	// Backstop: its pods do not belong to bob's Workload (controlled by
	// bob's Job): the walk stops at the CronJob.
	bobJob, err := c.alice.(*throughJob).jobOf(ctx, ns, "bob-plan")
	if err != nil {
		t.Fatal(err)
	}
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: "bob-wl", OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(bobJob, batchv1.SchemeGroupVersion.WithKind("Job"))}}}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "alices-cron-1-x", Namespace: ns, UID: "u-x",
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cronJob, batchv1.SchemeGroupVersion.WithKind("Job"))}}}
	if (owners.Finder{Reader: c.env.Client}).BelongsTo(ctx, p, wl) {
		t.Errorf("BROKEN: a pod of alice's CronJob's Job belongs to bob's Workload")
	} else {
		t.Logf("HELD (backstop): a pod of alice's CronJob's Job does not belong to bob's Workload; the ungater would keep it gated (PlanNotForThisPod)")
	}
}

// unstructuredJob is a server-side apply configuration of a Job's
// template annotation.
type unstructuredJob struct{ name, ns, plan string }

func (u *unstructuredJob) obj(t *testing.T) client.Object {
	o := unstructuredOf(t, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: u.name, Namespace: u.ns},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationPlan: u.plan}}}}},
		batchv1.SchemeGroupVersion.WithKind("Job"))
	for _, f := range []string{"spec.template.spec", "spec.selector", "metadata.creationTimestamp", "spec.template.metadata.creationTimestamp"} {
		unstructured.RemoveNestedField(o.Object, strings.Split(f, ".")...)
	}
	return o
}

// TestReview9LWSControllerMakesWorkersForAFakeLeader takes F2 (a CPU pod
// of alice's as the leader-Pod link) through the real LWS controller
// (v0.8): its pod controller makes a worker StatefulSet for any pod
// labelled as a leader of an LWS (name, worker-index 0, a revision hash),
// controlled by that pod, whoever made it. alice's CPU pod names bob's
// leader StatefulSet as its controller and carries the labels of bob's
// leader pods (group index 9). Promise: nothing GPU is created as bob's
// LWS's but by bob's LWS's own controllers for bob's own groups.
func TestReview9LWSControllerMakesWorkersForAFakeLeader(t *testing.T) {
	cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "kubeflow.org/pytorchjob", "leaderworkerset.x-k8s.io/leaderworkerset", "pod"}}}
	c := startClusterCfg(t, framework.Options{NoKueue: true, LWSController: true}, []string{webhooks.KindStatefulSet, webhooks.KindLeaderWorkerSet}, cfg)
	env, ctx, ns := c.env, c.env.Ctx, c.open
	tmpl := lwsGPUTemplate("bob/worker")
	bob := &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "bob-lws", Namespace: ns, Labels: map[string]string{mutation.LabelQueueName: "gpu"}},
		Spec: lws.LeaderWorkerSetSpec{Replicas: ptr.To[int32](1), StartupPolicy: lws.LeaderCreatedStartupPolicy,
			LeaderWorkerTemplate: lws.LeaderWorkerTemplate{Size: ptr.To[int32](2), WorkerTemplate: tmpl}}}
	env.MustCreate(t, bob)
	leaderSTS := &appsv1.StatefulSet{}
	env.Eventually(t, 60*time.Second, "bob's leader StatefulSet", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: bob.Name}, leaderSTS)
		return err == nil, fmt.Sprint(err)
	})
	// alice's CPU pod with the leader labels of bob's leader StatefulSet's
	// template (she can read them), group 9, controlled by bob's leader
	// StatefulSet.
	labels := map[string]string{}
	for k, v := range leaderSTS.Spec.Template.Labels {
		labels[k] = v
	}
	labels[lws.WorkerIndexLabelKey] = "0"
	labels[lws.GroupIndexLabelKey] = "9"
	ann := map[string]string{}
	for k, v := range leaderSTS.Spec.Template.Annotations {
		if strings.HasPrefix(k, "leaderworkerset.sigs.k8s.io/") {
			ann[k] = v
		}
	}
	fake := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: bob.Name + "-9", Namespace: ns, Labels: labels, Annotations: ann,
		OwnerReferences: ctlRef("apps/v1", "StatefulSet", leaderSTS.Name, leaderSTS.UID)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "alice/idle"}}}}
	if err := c.aliceSelf.Create(ctx, fake); err != nil {
		t.Fatalf("alice's CPU pod posing as a leader of bob's: %v", err)
	}
	t.Logf("alice's CPU pod %s labels %v annotations %v", fake.Name, fake.Labels, fake.Annotations)
	worker := &appsv1.StatefulSet{}
	made := false
	for end := time.Now().Add(45 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fake.Name}, worker); err == nil {
			made = true
			break
		}
	}
	if !made {
		logTail := ""
		if raw, err := os.ReadFile(filepath.Join(env.Dir, "lws.log")); err == nil {
			for _, l := range strings.Split(string(raw), "\n") {
				if strings.Contains(l, fake.Name) || strings.Contains(strings.ToLower(l), "error") {
					logTail += l + "\n"
				}
			}
			if len(logTail) > 3000 {
				logTail = logTail[len(logTail)-3000:]
			}
		}
		t.Logf("HELD: the LWS controller made no worker StatefulSet for alice's pod; its log:\n%s", logTail)
		return
	}
	owner := metav1.GetControllerOf(worker)
	gpu := worker.Spec.Template.Spec.Containers[0].Resources.Limits
	t.Errorf("BROKEN: the LWS controller made GPU worker StatefulSet %s (bob's template: image %s, limits %v) controlled by alice's pod %s (UID %s), and gpupack admitted it as bob's LWS's (review 9, F2)",
		worker.Name, worker.Spec.Template.Spec.Containers[0].Image, gpu, owner.Name, owner.UID)
}
