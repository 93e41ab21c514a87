package security

// Outside review 18 (regression tests): the LWS (StatefulSet) fast path
// attacked as a tenant.
// The promise (docs/webhooks.md#lws-pods-on-the-fast-path): a pod skips
// the pod webhook only if the pod webhook would have left it unchanged —
// no change, no warning, no denial. The template probe (podReady,
// templateGated) runs AdmitPod on the template alone, with an empty
// PodContext and no unmanaged-GPU check; the real pod webhook also reads
// the pod's controller chain live (resumeStep, kueueView.unmanaged). Each
// test below makes a marked StatefulSet whose pod skips the webhook, and
// then creates the same pod without the marker (so the webhook sees it)
// to show what the webhook would have done.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// stsFastPath is a cluster for the StatefulSet fast path: real apiserver,
// shipped RBAC and policies, alice under edit, gpupack's webhooks with the
// StatefulSet kind and its fast-path reconciler (the epoch), the
// StatefulSet controller's identity.
type stsFastPath struct {
	c      *cluster
	m      *mutation.Mutator
	epoch  *mutation.FastPathEpoch
	ssc    client.Client // the StatefulSet controller's identity
	probes int           // dry-run pods made by waitAdmission
}

func startSTSFastPath(t *testing.T) *stsFastPath {
	t.Helper()
	shipped := webhooks.DefaultServeOptions()
	shipped.JobKinds = []string{webhooks.KindStatefulSet}
	epoch := &mutation.FastPathEpoch{}
	r := &stsFastPath{epoch: epoch}
	r.c = startClusterServing(t, framework.Options{NoKueue: true}, shipped, func(env *framework.Env, mgr ctrl.Manager) error {
		if err := env.Client.Create(env.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: shipped.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		salt, err := webhooks.EnsureFastPathSalt(env.Ctx, env.Client, shipped.Namespace)
		if err != nil {
			return err
		}
		cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "kubeflow.org/pytorchjob", "pod", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset"}},
			FastPathSalt: salt, FastPathEpoch: epoch, JobKinds: shipped.JobKinds}
		if r.m, err = mutation.New(cfg); err != nil {
			return err
		}
		if err := webhooks.Setup(mgr, cfg); err != nil {
			return err
		}
		serve, err := shipped.WithFastPath(cfg)
		if err != nil {
			return err
		}
		return webhooks.SetupFastPath(mgr, serve)
	})
	r.ssc = r.c.as(t, statefulSetControllerUser, []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, nil)
	env := r.c.env
	env.Eventually(t, 30*time.Second, "the manager writes the StatefulSet clause", func() (bool, string) {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: shipped.MutatingName}, mwc); err != nil {
			return false, err.Error()
		}
		for _, w := range mwc.Webhooks {
			if w.Name == webhooks.PodMutatingWebhookName && len(w.MatchConditions) == 1 {
				e := w.MatchConditions[0].Expression
				return strings.Contains(e, "r.kind == 'StatefulSet'") && strings.Contains(e, "== '"+r.m.Fingerprint()+"'"), "no clause yet"
			}
		}
		return false, "no pod entry"
	})
	return r
}

// sts is a queued GPU StatefulSet as Kueue's StatefulSet webhook leaves it.
func (r *stsFastPath) sts(name string) *appsv1.StatefulSet {
	p := wholeGPUPod("", "", "1")
	return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.c.open, Labels: map[string]string{mutation.LabelQueueName: "gpu"}},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name, mutation.LabelQueueName: "gpu"},
				Annotations: map[string]string{placement.KueueSuspendingParent: "statefulset"}}, Spec: p.Spec}}}
}

// podOf creates, as the StatefulSet controller, pod i of s from its stored
// template; unmarked drops gpupack's marker (the pod then meets the pod
// webhook, to show what it would have done). It returns the created pod
// (or the error) and how many times gpupack's pod webhook answered; opts
// go to the create (client.DryRunAll for a probe).
func (r *stsFastPath) podOf(t *testing.T, s *appsv1.StatefulSet, i int, unmarked bool, opts ...client.CreateOption) (*corev1.Pod, float64, error) {
	t.Helper()
	env, ctx := r.c.env, r.c.env.Ctx
	got := &appsv1.StatefulSet{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), got); err != nil {
		t.Fatal(err)
	}
	tm := got.Spec.Template.DeepCopy()
	p := &corev1.Pod{ObjectMeta: tm.ObjectMeta, Spec: tm.Spec}
	if unmarked {
		delete(p.Annotations, v1alpha1.AnnotationInjected)
	}
	p.Name, p.Namespace = fmt.Sprintf("%s-%d", s.Name, i), s.Namespace
	p.Labels["statefulset.kubernetes.io/pod-name"], p.Labels["apps.kubernetes.io/pod-index"] = p.Name, fmt.Sprint(i)
	p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(got, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}
	calls := func() float64 {
		n, err := framework.CounterSum("gpupack_webhook_admissions_total", map[string]string{"webhook": "mutating", "kind": "Pod"})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := calls()
	err := r.ssc.Create(ctx, p, opts...)
	return p, calls() - before, err
}

// waitAdmission waits until the apiserver's admission, which reads webhook
// configurations from an informer (seconds behind a change on a loaded
// machine: CI once stored a StatefulSet through an entry the test had
// just removed), treats a pod of s as fast says: the pod webhook not
// called (fast) or called. It probes with dry-run creates as the
// StatefulSet controller, at ordinals no test uses.
func (r *stsFastPath) waitAdmission(t *testing.T, s *appsv1.StatefulSet, fast bool, what string) {
	t.Helper()
	r.c.env.Eventually(t, 30*time.Second, what, func() (bool, string) {
		r.probes++
		_, calls, err := r.podOf(t, s, 1000+r.probes, false, client.DryRunAll)
		return (calls == 0) == fast, fmt.Sprintf("the pod webhook answered a dry-run pod of %s %v times (error %v)", s.Name, calls, err)
	})
}

func envOf(p *corev1.Pod, name string) (string, bool) {
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// TestStatefulSetQueueLabelDropJudgedAsCreation (review 18, finding 1):
// the StatefulSet webhook judges the unmanaged-GPU policy on a StatefulSet
// when it is made, and on an update that changes its GPUs, owners or queue
// label as a creation by whoever makes the update. Alice makes the
// StatefulSet under her own CPU pod (not queued: the StatefulSet is managed
// by its own label), then queues that pod and drops the StatefulSet's
// label. Before the fix keepsManagement accepted it (an owner Kueue manages
// is found, the creator not asked), the template stayed marked and its pods
// skipped the pod webhook, which denies them (gpupack does not walk through
// a StatefulSet controlled by a Pod Kueue manages). Now the drop is judged
// as her creating it under her own pod: refused.
func TestStatefulSetQueueLabelDropJudgedAsCreation(t *testing.T) {
	r := startSTSFastPath(t)
	env, ctx, ns, alice := r.c.env, r.c.env.Ctx, r.c.open, r.c.aliceSelf

	owner := cpuPod(ns, "owner")
	if err := alice.Create(ctx, owner); err != nil {
		t.Fatal(err)
	}
	s := r.sts("under-pod")
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
	if err := alice.Create(ctx, s); err != nil {
		t.Fatalf("alice's StatefulSet under her unqueued pod: %v", err)
	}
	if s.Spec.Template.Annotations[v1alpha1.AnnotationInjected] != r.m.Fingerprint() {
		t.Fatalf("not marked: %v", s.Spec.Template.Annotations)
	}
	// Queue the owner pod (a label update), then drop the StatefulSet's
	// queue label (owners unchanged).
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(owner), owner); err != nil {
		t.Fatal(err)
	}
	owner.Labels = map[string]string{mutation.LabelQueueName: "gpu"}
	if err := alice.Update(ctx, owner); err != nil {
		t.Fatalf("alice queues her pod: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	delete(s.Labels, mutation.LabelQueueName)
	err := alice.Update(ctx, s)
	if err == nil {
		// Had the drop been let through, the marked template's pod would
		// skip the pod webhook, which denies it.
		_, calls, slowErr := r.podOf(t, s, 1, true)
		p, fastCalls, fastErr := r.podOf(t, s, 0, false)
		t.Fatalf("BROKEN: alice dropped her StatefulSet's queue label (it now rests on her own pod, which no trusted controller made); the pod webhook says %v (%v calls), and the StatefulSet controller's pod %s of the marked template: %v calls, error %v", slowErr, calls, p.Name, fastCalls, fastErr)
	}
	denied(t, "dropping the StatefulSet's queue label", err, "Kueue will not manage it")
}

// TestStatefulSetRevisionsAndStatusClosedToTenants (review 18, held): the StatefulSet controller
// makes pods from ControllerRevisions (a partition, OnDelete) and the
// status subresource keeps metadata changes (labels, annotations, owners)
// without a StatefulSet webhook call. Neither is alice's under the shipped
// edit: she cannot create or patch a ControllerRevision, nor write
// statefulsets/status; statefulsets/scale only changes replicas.
func TestStatefulSetRevisionsAndStatusClosedToTenants(t *testing.T) {
	r := startSTSFastPath(t)
	env, ctx, ns, alice := r.c.env, r.c.env.Ctx, r.c.open, r.c.aliceSelf

	s := r.sts("held")
	if err := alice.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	raw := fmt.Sprintf(`{"spec":{"template":{"$patch":"replace","metadata":{"annotations":{%q:%q}},"spec":{"containers":[{"name":"trainer","image":"x","env":[{"name":"NVIDIA_VISIBLE_DEVICES","value":"all"}]}]}}}}`, v1alpha1.AnnotationInjected, r.m.Fingerprint())
	rev := &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "held-forged", Namespace: ns, Labels: map[string]string{"app": "held"}},
		Data: runtime.RawExtension{Raw: []byte(raw)}, Revision: 99}
	if err := alice.Create(ctx, rev); !apierrors.IsForbidden(err) {
		t.Errorf("alice creating a ControllerRevision: err %v, want Forbidden", err)
	}
	var revs appsv1.ControllerRevisionList
	if err := env.Client.List(ctx, &revs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range revs.Items {
		if err := alice.Patch(ctx, &revs.Items[i], client.RawPatch("application/merge-patch+json", []byte(`{"data":{}}`))); !apierrors.IsForbidden(err) {
			t.Errorf("alice patching ControllerRevision %s: err %v, want Forbidden", revs.Items[i].Name, err)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	s.Labels["via-status"] = "x"
	s.Annotations = map[string]string{v1alpha1.AnnotationLastConsistentCheckpoint: "1"}
	if err := alice.Status().Update(ctx, s); !apierrors.IsForbidden(err) {
		t.Errorf("alice writing statefulsets/status: err %v, want Forbidden", err)
	}
}
