package security

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// statefulSetControllerUser is kube-controller-manager's StatefulSet
// controller, which creates a StatefulSet's pods.
const statefulSetControllerUser = "system:serviceaccount:kube-system:statefulset-controller"

// TestLWSFastPathEpoch attacks the LWS (StatefulSet) fast path where the
// first evaluation broke it (docs/webhooks.md#lws-pods-on-the-fast-path):
// a StatefulSet stored while gpupack's StatefulSet entry was not installed
// keeps the template its author wrote — the current marker copied from one
// of her own templates, the placement gate, Kueue's suspending parent and
// NVIDIA_VISIBLE_DEVICES=all — and once the entry is back, a scale through
// statefulsets/scale (no StatefulSet webhook call) has the StatefulSet
// controller make pods from it. Those pods must meet the pod webhook
// (which strips the variable), for each period: the entry dropped and
// restored, and the configuration deleted and installed again with the
// Secret kept (helm uninstall + install). A pod of a template gpupack
// marked after the period stays on the fast path, and a change of the
// configuration that leaves its webhooks alone keeps the epoch. Real
// apiserver, alice under the shipped `edit`, the StatefulSet controller's
// identity, gpupack's fast-path reconciler in the manager.
func TestLWSFastPathEpoch(t *testing.T) {
	r := startSTSFastPath(t)
	c, m, epoch := r.c, r.m, r.epoch
	env, ctx, ns := c.env, c.env.Ctx, c.open
	shipped := webhooks.DefaultServeOptions()
	mwcKey := client.ObjectKey{Name: shipped.MutatingName}
	stsEntry := "mstatefulset.gpupack.io"

	podEntry := func() (admissionregistrationv1.MutatingWebhook, *admissionregistrationv1.MutatingWebhookConfiguration) {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := env.Client.Get(ctx, mwcKey, mwc); err != nil {
			return admissionregistrationv1.MutatingWebhook{}, nil
		}
		for _, w := range mwc.Webhooks {
			if w.Name == webhooks.PodMutatingWebhookName {
				return w, mwc
			}
		}
		return admissionregistrationv1.MutatingWebhook{}, mwc
	}
	// clause waits for the pod entry's condition to have the StatefulSet
	// clause (on) or not, under the current epoch's marker.
	clause := func(on bool, what string) {
		t.Helper()
		env.Eventually(t, 30*time.Second, what, func() (bool, string) {
			w, _ := podEntry()
			if len(w.MatchConditions) != 1 {
				return false, fmt.Sprint(w.MatchConditions)
			}
			e := w.MatchConditions[0].Expression
			has := strings.Contains(e, "r.kind == 'StatefulSet'")
			return has == on && strings.Contains(e, "== '"+m.Fingerprint()+"'"), fmt.Sprintf("clause %v, marker %s", has, m.Fingerprint())
		})
	}
	sts := func(name string, env ...corev1.EnvVar) *appsv1.StatefulSet {
		s := r.sts(name)
		s.Spec.Template.Spec.Containers[0].Env = env
		return s
	}
	// podOf is pod i of s as the StatefulSet controller makes it; calls is
	// how many times gpupack's pod webhook answered.
	podOf := func(s *appsv1.StatefulSet, i int) (*corev1.Pod, float64) {
		t.Helper()
		p, calls, err := r.podOf(t, s, i, false)
		if err != nil {
			t.Fatalf("the StatefulSet controller creating %s: %v", p.Name, err)
		}
		return p, calls
	}
	visible := func(p *corev1.Pod) (string, bool) {
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == v1alpha1.EnvVisibleDevices {
				return e.Value, true
			}
		}
		return "", false
	}
	vwcKey := client.ObjectKey{Name: shipped.ValidatingName}
	// dropValidating removes the validating StatefulSet entry (an
	// installation without the StatefulSet kind has neither) and returns
	// a function that puts it back.
	dropValidating := func() func() {
		t.Helper()
		vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := env.Client.Get(ctx, vwcKey, vwc); err != nil {
			t.Fatal(err)
		}
		var saved admissionregistrationv1.ValidatingWebhook
		vwc.Webhooks = slices.DeleteFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool {
			if w.Name == "vstatefulset.gpupack.io" {
				saved = w
				return true
			}
			return false
		})
		if err := env.Client.Update(ctx, vwc); err != nil {
			t.Fatal(err)
		}
		return func() {
			t.Helper()
			if err := env.Client.Get(ctx, vwcKey, vwc); err != nil {
				t.Fatal(err)
			}
			vwc.Webhooks = append(vwc.Webhooks, saved)
			if err := env.Client.Update(ctx, vwc); err != nil {
				t.Fatal(err)
			}
		}
	}
	markerOf := func(s *appsv1.StatefulSet) string { return s.Spec.Template.Annotations[v1alpha1.AnnotationInjected] }
	// currentMarker is what alice reads off a template gpupack marks now:
	// a queued GPU Job of hers (the Job entry stays installed throughout).
	jobs := 0
	currentMarker := func() string {
		t.Helper()
		jobs++
		p := wholeGPUPod("", "", "1")
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("peek-%d", jobs), Namespace: ns, Labels: map[string]string{mutation.LabelQueueName: "gpu"}},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: p.Spec}}}
		j.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
		if err := c.aliceSelf.Create(ctx, j); err != nil {
			t.Fatalf("alice's Job: %v", err)
		}
		if j.Spec.Template.Annotations[v1alpha1.AnnotationInjected] == "" {
			t.Fatalf("alice's Job got no marker: %v", j.Spec.Template.Annotations)
		}
		return j.Spec.Template.Annotations[v1alpha1.AnnotationInjected]
	}
	// forge stores, while gpupack's StatefulSet entry is not installed, a
	// StatefulSet whose template carries marker and the rest; it must be
	// stored as written (else the attack is not set up).
	forge := func(name, marker string) *appsv1.StatefulSet {
		t.Helper()
		f := sts(name, corev1.EnvVar{Name: v1alpha1.EnvVisibleDevices, Value: "all"})
		f.Spec.Template.Annotations[v1alpha1.AnnotationInjected] = marker
		f.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
		// As gpupack would have set it (gpupack-seccomp refuses a GPU
		// pod without it, webhook or not).
		f.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
		// The apiserver's admission sees the entries gone only once its
		// informer has the change: probe with dry runs until it does.
		env.Eventually(t, 30*time.Second, "the apiserver's admission no longer calls gpupack's StatefulSet webhooks", func() (bool, string) {
			probe := f.DeepCopy()
			if err := c.aliceSelf.Create(ctx, probe, client.DryRunAll); err != nil {
				return false, err.Error()
			}
			v, _ := visible(&corev1.Pod{Spec: probe.Spec.Template.Spec})
			return v == "all" && markerOf(probe) == marker, fmt.Sprintf("a dry run of %s came back with %s=%q, marker %q", name, v1alpha1.EnvVisibleDevices, v, markerOf(probe))
		})
		if err := c.aliceSelf.Create(ctx, f); err != nil {
			t.Fatalf("storing %s while gpupack does not see StatefulSets: %v", name, err)
		}
		if v, ok := visible(&corev1.Pod{Spec: f.Spec.Template.Spec}); !ok || v != "all" || markerOf(f) != marker {
			t.Fatalf("%s was not stored unseen: env %v, marker %q", name, f.Spec.Template.Spec.Containers[0].Env, markerOf(f))
		}
		return f
	}
	// mustMeetWebhook: a pod of a StatefulSet stored unseen.
	mustMeetWebhook := func(f *appsv1.StatefulSet, what string) {
		t.Helper()
		p, calls := podOf(f, 0)
		if v, ok := visible(p); ok || calls < 1 {
			t.Errorf("BROKEN (%s): the StatefulSet controller's pod of %s skipped gpupack (pod webhook answered %v times) and kept %s=%s", what, f.Name, calls, v1alpha1.EnvVisibleDevices, v)
		}
	}

	clause(true, "the manager writes the StatefulSet clause")
	if len(epoch.Get()) == 0 {
		t.Fatal("no epoch after the first reconcile")
	}

	// A StatefulSet gpupack sees: marked, gated; its pods skip the webhook.
	legit := sts("legit")
	if err := c.aliceSelf.Create(ctx, legit); err != nil {
		t.Fatal(err)
	}
	if markerOf(legit) != m.Fingerprint() || !slices.ContainsFunc(legit.Spec.Template.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGatePlacement }) {
		t.Fatalf("gpupack's StatefulSet webhook: marker %q (want %q), gates %v", markerOf(legit), m.Fingerprint(), legit.Spec.Template.Spec.SchedulingGates)
	}
	r.waitAdmission(t, legit, true, "the apiserver's admission has the StatefulSet clause")
	if _, calls := podOf(legit, 0); calls != 0 {
		t.Errorf("a pod of a StatefulSet gpupack marked: the pod webhook answered %v times, want 0 (fast path)", calls)
	}

	// Period 1: the StatefulSet entry dropped (an upgrade without the LWS
	// integration, a re-applied manifest, an edit) and later restored.
	_, mwc := podEntry()
	var saved admissionregistrationv1.MutatingWebhook
	mwc.Webhooks = slices.DeleteFunc(mwc.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool {
		if w.Name == stsEntry {
			saved = w
			return true
		}
		return false
	})
	if saved.Name == "" {
		t.Fatal("no StatefulSet entry installed")
	}
	if err := env.Client.Update(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	restoreValidating := dropValidating()
	clause(false, "the manager drops the StatefulSet clause while the entry is gone")
	forgedOld := forge("forged-old", markerOf(legit)) // the marker of before the period
	forgedNow := forge("forged-now", currentMarker()) // the marker current during it
	_, mwc = podEntry()
	mwc.Webhooks = append(mwc.Webhooks, saved)
	if err := env.Client.Update(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	restoreValidating()
	clause(true, "the manager restores the StatefulSet clause")
	// A template marked after the period is fast: once the apiserver's
	// admission has the renewed clause (a stale one, of before the period,
	// would let the forged pods by and read as a break).
	after := sts("after-restore")
	if err := c.aliceSelf.Create(ctx, after); err != nil {
		t.Fatal(err)
	}
	r.waitAdmission(t, after, true, "the apiserver's admission has the renewed StatefulSet clause")
	mustMeetWebhook(forgedOld, "entry dropped and restored, marker of before")
	mustMeetWebhook(forgedNow, "entry dropped and restored, marker of during")
	// A template marked before the period is stale too (the cost of a
	// renewal).
	if _, calls := podOf(legit, 1); calls != 1 {
		t.Errorf("a pod of a StatefulSet marked before the period: the pod webhook answered %v times, want 1", calls)
	}
	if _, calls := podOf(after, 0); calls != 0 {
		t.Errorf("a pod of a StatefulSet marked after the period: the pod webhook answered %v times, want 0", calls)
	}

	// A change that leaves the webhooks alone (a label) keeps the epoch.
	e := slices.Clone(epoch.Get())
	_, mwc = podEntry()
	mwc.Labels["touched"] = "true"
	if err := env.Client.Update(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the reconciler's watch event
	if !slices.Equal(e, epoch.Get()) {
		t.Errorf("a label on the configuration renewed the epoch")
	}
	if _, calls := podOf(after, 1); calls != 0 {
		t.Errorf("after a label change: the pod webhook answered %v times, want 0", calls)
	}

	// Period 2: gpupack uninstalled and installed again, the Secret kept
	// (helm uninstall leaves it); the shipped configuration comes back.
	_, mwc = podEntry()
	marker := markerOf(after)
	if err := env.Client.Delete(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 10*time.Second, "the configuration is gone", func() (bool, string) {
		_, gone := podEntry()
		return gone == nil, "still there"
	})
	restoreValidating = dropValidating() // (the whole validating configuration goes too; its StatefulSet entry is what matters)
	forgedReinstall := forge("forged-reinstall", marker)
	restoreValidating()
	again := mwc.DeepCopy()
	again.ObjectMeta = metav1.ObjectMeta{Name: mwc.Name, Labels: mwc.Labels}
	for i := range again.Webhooks {
		if again.Webhooks[i].Name == webhooks.PodMutatingWebhookName {
			again.Webhooks[i].MatchConditions = webhooks.MatchConditions("Pod", false) // as shipped
		}
	}
	if err := env.Client.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	clause(true, "the manager writes the StatefulSet clause into the new configuration")
	reinstalled := sts("after-reinstall")
	if err := c.aliceSelf.Create(ctx, reinstalled); err != nil {
		t.Fatal(err)
	}
	r.waitAdmission(t, reinstalled, true, "the apiserver's admission has the new configuration's StatefulSet clause")
	mustMeetWebhook(forgedReinstall, "configuration made again, Secret kept")

	// An entry that does not fail closed is no boundary: no clause.
	_, mwc = podEntry()
	ignore := admissionregistrationv1.Ignore
	for i := range mwc.Webhooks {
		if mwc.Webhooks[i].Name == stsEntry {
			mwc.Webhooks[i].FailurePolicy = &ignore
		}
	}
	if err := env.Client.Update(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	clause(false, "no StatefulSet clause while the StatefulSet entry is failurePolicy Ignore")
}
