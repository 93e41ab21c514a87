package webhooks

import (
	"context"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// podGroupConfig: Kueue's pod integration on, as where LWS runs under Kueue.
var podGroupConfig = Config{Kueue: mutation.KueueConfig{Frameworks: append(slices.Clone(mutation.DefaultKueueFrameworks), "pod", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset")}}

// stsServe: the fast path with the StatefulSet kind (the LWS integration's
// StatefulSets).
func stsServe(t testing.TB) ServeOptions {
	t.Helper()
	o, err := DefaultServeOptions().WithFastPath(podGroupConfig)
	if err != nil {
		t.Fatal(err)
	}
	o.JobKinds = []string{KindLeaderWorkerSet, KindStatefulSet}
	return o
}

// lwsPod is a pod the StatefulSet controller makes from an LWS group's
// StatefulSet, whose template went through gpupack's StatefulSet webhook
// after Kueue's LWS webhook marked it (pod-suspending-parent).
func lwsPod(t testing.TB) *corev1.Pod {
	t.Helper()
	m, err := mutation.New(podGroupConfig)
	if err != nil {
		t.Fatal(err)
	}
	s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "infer", Namespace: "ns", UID: "sts-uid"}}
	s.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", placement.KueueSuspendingParent: "leaderworkerset.x-k8s.io/leaderworkerset"}
	s.Spec.Template.Labels = map[string]string{placement.KueueQueueLabel: "gpu"}
	s.Spec.Template.Spec.Containers = []corev1.Container{{Name: "srv", Image: "srv", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}
	if _, err := m.StatefulSet(s); err != nil {
		t.Fatal(err)
	}
	if s.Spec.Template.Annotations[v1alpha1.AnnotationInjected] == "" {
		t.Fatalf("the StatefulSet template got no marker: %+v", s.Spec.Template)
	}
	p := &corev1.Pod{ObjectMeta: *s.Spec.Template.ObjectMeta.DeepCopy(), Spec: *s.Spec.Template.Spec.DeepCopy()}
	p.Name, p.Namespace = "infer-0", "ns"
	p.Labels["apps.kubernetes.io/pod-index"] = "0"
	p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(s, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}
	return p
}

// The StatefulSet clause skips only the StatefulSet controller's pods of a
// marked template with Kueue's suspending parent, the gate and no plan;
// everything else meets the webhook. Evaluated by the apiserver's code.
func TestStatefulSetPodMatchConditions(t *testing.T) {
	o := stsServe(t)
	noSTS := o
	noSTS.JobKinds = []string{KindLeaderWorkerSet} // no StatefulSet entry rendered
	pod := lwsPod(t)
	const ssc, kcm, jobc, tenant = "system:serviceaccount:kube-system:statefulset-controller", "system:kube-controller-manager", "system:serviceaccount:kube-system:job-controller", "alice"
	edit := func(f func(p *corev1.Pod)) *corev1.Pod { p := pod.DeepCopy(); f(p); return p }
	for _, tc := range []struct {
		name  string
		o     ServeOptions
		pod   *corev1.Pod
		user  string
		calls bool
	}{
		{"LWS pod from the StatefulSet controller", o, pod, ssc, false},
		{"LWS pod from kube-controller-manager's own identity", o, pod, kcm, false},
		{"LWS pod, the StatefulSet kind off", noSTS, pod, ssc, true},
		{"LWS pod, fast path off", DefaultServeOptions(), pod, ssc, true},
		{"LWS pod copied by a tenant", o, pod, tenant, true},
		{"LWS pod from the Job controller (not a StatefulSet creator)", o, pod, jobc, true},
		{"a stale marker", o, edit(func(p *corev1.Pod) { p.Annotations[v1alpha1.AnnotationInjected] = "0123456789abcdef" }), ssc, true},
		{"no gate", o, edit(func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }), ssc, true},
		{"no suspending parent", o, edit(func(p *corev1.Pod) { delete(p.Annotations, placement.KueueSuspendingParent) }), ssc, true},
		{"a plan at creation", o, edit(func(p *corev1.Pod) { p.Annotations[v1alpha1.AnnotationPlan] = "plan-1" }), ssc, true},
		{"checkpointing", o, edit(func(p *corev1.Pod) { p.Annotations[v1alpha1.AnnotationCheckpoint] = "true" }), ssc, true},
		{"owned by a ReplicaSet", o, edit(func(p *corev1.Pod) { p.OwnerReferences[0].Kind = "ReplicaSet" }), ssc, true},
		{"a StatefulSet reference that is not the controller", o, edit(func(p *corev1.Pod) { p.OwnerReferences[0].Controller = ptr.To(false) }), ssc, true},
		{"a Job-owned pod from the StatefulSet controller", o, edit(func(p *corev1.Pod) {
			p.OwnerReferences[0].APIVersion, p.OwnerReferences[0].Kind = "batch/v1", "Job"
		}), ssc, true},
	} {
		r := podMatcher(t, tc.o).Match(context.Background(), podCreate(tc.pod.DeepCopy(), tc.user), nil, nil)
		if r.Error != nil || r.Matches != tc.calls {
			t.Errorf("%s: matches %v (error %v), want %v", tc.name, r.Matches, r.Error, tc.calls)
		}
	}
	// What the clause skips is what the pod webhook would leave alone.
	m, _ := mutation.New(podGroupConfig)
	p := pod.DeepCopy()
	if warn, err := m.AdmitPod(p, mutation.PodContext{}); err != nil || len(warn) > 0 || !equalSpec(pod, p) {
		t.Errorf("a skipped LWS pod is not a fixed point of AdmitPod: %v %v", err, warn)
	}
}

func equalSpec(a, b *corev1.Pod) bool {
	x, _ := a.Spec.Marshal()
	y, _ := b.Spec.Marshal()
	return string(x) == string(y)
}

// SyncFastPath puts the StatefulSet clause in only while the installed
// StatefulSet entry sees every StatefulSet write the pod entry's
// namespaces hold, failing closed.
func TestSyncFastPathStatefulSetEntry(t *testing.T) {
	o := stsServe(t)
	installed := func(f func(w *admissionregistrationv1.MutatingWebhook)) *admissionregistrationv1.MutatingWebhookConfiguration {
		mwc, _ := WebhookConfigurations(o)
		for i := range mwc.Webhooks {
			if mwc.Webhooks[i].Name == jobKindWebhookName("m", KindStatefulSet) && f != nil {
				f(&mwc.Webhooks[i])
			}
		}
		return mwc
	}
	byURL := func(podBase, stsBase string) *admissionregistrationv1.MutatingWebhookConfiguration {
		mwc := installed(nil)
		for i := range mwc.Webhooks {
			w := &mwc.Webhooks[i]
			base := podBase
			if w.Name != PodMutatingWebhookName {
				base = stsBase
			}
			u := base + *w.ClientConfig.Service.Path
			w.ClientConfig.Service, w.ClientConfig.URL = nil, &u
		}
		return mwc
	}
	ignore := admissionregistrationv1.Ignore
	exact := admissionregistrationv1.Exact
	for _, tc := range []struct {
		name   string
		mwc    *admissionregistrationv1.MutatingWebhookConfiguration
		clause bool
	}{
		{"as rendered", installed(nil), true},
		{"apiserver defaults (port 443, Equivalent, empty object selector)", installed(func(w *admissionregistrationv1.MutatingWebhook) {
			eq := admissionregistrationv1.Equivalent
			w.MatchPolicy, w.ObjectSelector, w.ClientConfig.Service.Port = &eq, &metav1.LabelSelector{}, ptr.To[int32](443)
		}), true},
		{"entry missing", func() *admissionregistrationv1.MutatingWebhookConfiguration {
			mwc := installed(nil)
			mwc.Webhooks = slices.DeleteFunc(mwc.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool {
				return w.Name == jobKindWebhookName("m", KindStatefulSet)
			})
			return mwc
		}(), false},
		{"failurePolicy Ignore", installed(func(w *admissionregistrationv1.MutatingWebhook) { w.FailurePolicy = &ignore }), false},
		{"matchPolicy Exact", installed(func(w *admissionregistrationv1.MutatingWebhook) { w.MatchPolicy = &exact }), false},
		{"CREATE only", installed(func(w *admissionregistrationv1.MutatingWebhook) {
			w.Rules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
		}), false},
		{"an object selector", installed(func(w *admissionregistrationv1.MutatingWebhook) {
			w.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"gpupack": "yes"}}
		}), false},
		{"a narrower namespace selector", installed(func(w *admissionregistrationv1.MutatingWebhook) {
			w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
		}), false},
		{"other match conditions", installed(func(w *admissionregistrationv1.MutatingWebhook) {
			w.MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "never", Expression: "false"}}
		}), false},
		{"another service", installed(func(w *admissionregistrationv1.MutatingWebhook) { w.ClientConfig.Service.Name = "elsewhere" }), false},
		{"a URL while the pod entry has a Service", installed(func(w *admissionregistrationv1.MutatingWebhook) {
			w.ClientConfig.Service, w.ClientConfig.URL = nil, ptr.To("https://example.com/mutate")
		}), false},
		{"both by URL, one server", byURL("https://gpupack.example:9443", "https://gpupack.example:9443"), true},
		{"both by URL, another server", byURL("https://gpupack.example:9443", "https://elsewhere.example:9443"), false},
		{"another path", installed(func(w *admissionregistrationv1.MutatingWebhook) { w.ClientConfig.Service.Path = ptr.To("/allow") }), false},
	} {
		SyncFastPath(tc.mwc, o)
		var conds []admissionregistrationv1.MatchCondition
		for _, w := range tc.mwc.Webhooks {
			if w.Name == PodMutatingWebhookName {
				conds = w.MatchConditions
			}
		}
		want := podMutatingConditions(o, tc.clause)
		if len(conds) != 1 || conds[0].Expression != want[0].Expression {
			t.Errorf("%s: StatefulSet clause %v, want %v", tc.name, !tc.clause, tc.clause)
		}
	}
	// The two renderings differ (else the table shows nothing).
	if podMutatingConditions(o, true)[0].Expression == podMutatingConditions(o, false)[0].Expression {
		t.Fatal("the StatefulSet clause changes nothing")
	}
}

// The epoch is renewed unless the configuration is exactly the one
// recorded (UID and generation).
func TestEpochNeedsRenewal(t *testing.T) {
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{UID: "u1", Generation: 4}}
	for _, tc := range []struct {
		name      string
		of, epoch string
		renew     bool
	}{
		{"as recorded", "u1/4", "e", false},
		{"no epoch yet", "u1/4", "", true},
		{"not recorded since the last renewal", "", "e", true},
		{"changed since (an entry dropped and restored: two generations)", "u1/2", "e", true},
		{"made again (new UID, generation restarts)", "u0/4", "e", true},
	} {
		if got, why := EpochNeedsRenewal([]byte(tc.of), []byte(tc.epoch), mwc); got != tc.renew {
			t.Errorf("%s: renew %v (%s), want %v", tc.name, got, why, tc.renew)
		}
	}
}

// The marker changes with the epoch, and never without it.
func TestFingerprintFollowsTheEpoch(t *testing.T) {
	e := &mutation.FastPathEpoch{}
	m, err := mutation.New(Config{FastPathSalt: make([]byte, 32), FastPathEpoch: e})
	if err != nil {
		t.Fatal(err)
	}
	none := m.Fingerprint()
	e.Set([]byte("epoch-1"))
	one := m.Fingerprint()
	e.Set([]byte("epoch-2"))
	two := m.Fingerprint()
	if none == one || one == two || none == two || m.FingerprintAt([]byte("epoch-1")) != one || m.FingerprintAt(nil) != none {
		t.Errorf("fingerprints %s %s %s", none, one, two)
	}
}
