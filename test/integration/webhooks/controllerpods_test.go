package webhooks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// Objects as the real controllers make them, for tests that create their
// pods without running the controllers (the throughput benchmark).

// benchConfig is the webhook configuration of the throughput benchmark:
// Kueue's frameworks as a cluster running LWS has them (Kueue's LWS
// integration runs on its pod integration).
var benchConfig = webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: []string{
	"batch/job", "kubeflow.org/pytorchjob", "jobset.x-k8s.io/jobset", "pod", "leaderworkerset.x-k8s.io/leaderworkerset"}}}

// userStatefulSetController is kube-controller-manager's StatefulSet
// controller with --use-service-account-credentials.
const userStatefulSetController = "system:serviceaccount:kube-system:statefulset-controller"

// jobSetJob is the Job the JobSet controller (v0.11.1, constructJob and
// labelAndAnnotateObject) makes for replicated Job rj's index idx: rj's
// template, the JobSet's labels and annotations on the Job and on its pod
// template, and a controller reference to the JobSet.
func jobSetJob(js *jobset.JobSet, rj *jobset.ReplicatedJob, idx int) *batchv1.Job {
	name := fmt.Sprintf("%s-%s-%d", js.Name, rj.Name, idx)
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: js.Namespace, UID: "jobset-job-uid",
			Labels: maps.Clone(rj.Template.Labels), Annotations: maps.Clone(rj.Template.Annotations),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(js, jobset.SchemeGroupVersion.WithKind("JobSet"))}},
		Spec: *rj.Template.Spec.DeepCopy(),
	}
	key := sha256.Sum256([]byte(js.Namespace + "/" + name))
	set := map[string]string{
		jobset.JobSetNameKey:                 js.Name,
		jobset.JobSetUIDKey:                  string(js.UID),
		jobset.ReplicatedJobNameKey:          rj.Name,
		"jobset.sigs.k8s.io/restart-attempt": "0",
		jobset.ReplicatedJobReplicas:         strconv.Itoa(int(rj.Replicas)),
		jobset.GlobalReplicasKey:             strconv.Itoa(int(rj.Replicas)),
		jobset.JobIndexKey:                   strconv.Itoa(idx),
		jobset.JobKey:                        hex.EncodeToString(key[:20]),
		jobset.JobGlobalIndexKey:             strconv.Itoa(idx),
	}
	for _, o := range []metav1.Object{j, &j.Spec.Template} {
		l, a := maps.Clone(o.GetLabels()), maps.Clone(o.GetAnnotations())
		if l == nil {
			l = map[string]string{}
		}
		if a == nil {
			a = map[string]string{}
		}
		maps.Copy(l, set)
		maps.Copy(a, set)
		o.SetLabels(l)
		o.SetAnnotations(a)
	}
	j.Spec.Suspend = ptr.To(false)
	return j
}

// jobSetPod is a pod the Job controller makes for an Indexed Job of a
// JobSet (completion index 0): the template's labels and annotations (the
// JobSet's among them) plus the Job controller's, its completion index, a
// controller reference to the Job.
func jobSetPod(j *batchv1.Job, name string) *corev1.Pod {
	tmpl := j.Spec.Template.DeepCopy()
	p := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	p.Name, p.Namespace = name, j.Namespace
	p.Labels = maps.Clone(tmpl.Labels)
	maps.Copy(p.Labels, map[string]string{
		"batch.kubernetes.io/controller-uid": string(j.UID), "controller-uid": string(j.UID),
		"batch.kubernetes.io/job-name": j.Name, "job-name": j.Name,
		"batch.kubernetes.io/job-completion-index": "0",
	})
	p.Annotations = maps.Clone(tmpl.Annotations)
	p.Annotations["batch.kubernetes.io/job-completion-index"] = "0"
	p.Spec.Hostname = j.Name + "-0"
	p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))}
	for i := range p.Spec.Containers {
		p.Spec.Containers[i].Env = append(p.Spec.Containers[i].Env, corev1.EnvVar{Name: "JOB_COMPLETION_INDEX",
			ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}})
	}
	return p
}

// lwsLeaderStatefulSet is the leader StatefulSet the LWS controller
// (v0.8.0) makes in ns for an LWS without a leader template: the worker
// template with the LWS's labels and the group size, a controller
// reference to the LWS.
func lwsLeaderStatefulSet(t *testing.T, m *mutation.Mutator, l *lws.LeaderWorkerSet, ns string) *appsv1.StatefulSet {
	t.Helper()
	tmpl := l.Spec.LeaderWorkerTemplate.WorkerTemplate.DeepCopy()
	labels := map[string]string{lws.SetNameLabelKey: l.Name, "leaderworkerset.sigs.k8s.io/template-revision-hash": "5c8d7f9b6"}
	tmpl.Labels = maps.Clone(labels)
	maps.Copy(tmpl.Labels, l.Spec.LeaderWorkerTemplate.WorkerTemplate.Labels)
	tmpl.Labels[lws.WorkerIndexLabelKey] = "0"
	if tmpl.Annotations == nil {
		tmpl.Annotations = map[string]string{}
	}
	tmpl.Annotations[lws.SizeAnnotationKey] = strconv.Itoa(int(*l.Spec.LeaderWorkerTemplate.Size))
	tmpl.Annotations[lws.ReplicasAnnotationKey] = strconv.Itoa(int(*l.Spec.Replicas))
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: l.Name, Namespace: ns, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(l, lws.SchemeGroupVersion.WithKind("LeaderWorkerSet"))}},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To[int32](0), // stored only: no controller runs
			ServiceName:         l.Name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: map[string]string{lws.SetNameLabelKey: l.Name, lws.WorkerIndexLabelKey: "0"}},
			Template:            *tmpl,
		},
	}
	// As gpupack's StatefulSet webhook leaves it (the marker, the gate).
	if _, err := m.StatefulSet(sts); err != nil {
		t.Fatal(err)
	}
	return sts
}

// statefulSetPod is a pod the StatefulSet controller makes for sts: the
// template with the controller's labels, hostname and subdomain, a
// controller reference to sts.
func statefulSetPod(sts *appsv1.StatefulSet, name string) *corev1.Pod {
	tmpl := sts.Spec.Template.DeepCopy()
	p := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	p.Name, p.Namespace = name, sts.Namespace
	p.Labels = maps.Clone(tmpl.Labels)
	maps.Copy(p.Labels, map[string]string{
		appsv1.ControllerRevisionHashLabelKey: sts.Name + "-5c8d7f9b6",
		appsv1.StatefulSetPodNameLabel:        name,
		appsv1.PodIndexLabel:                  "0",
	})
	p.Spec.Hostname, p.Spec.Subdomain = name, sts.Spec.ServiceName
	p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(sts, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}
	return p
}

// benchJobSetJob is the Job of a fractional JobSet (20Gi on one GPU) as
// it reaches the Job controller: the JobSet through gpupack's JobSet
// mutation (its webhook), with the plan Kueue's podSetUpdates write into
// the replicated Job's template when it starts the JobSet; the JobSet
// controller's Job through gpupack's Job mutation (the Job webhook on the
// JobSet controller's create).
func benchJobSetJob(t *testing.T, m *mutation.Mutator) *batchv1.Job {
	t.Helper()
	oneGPU := limits(v1alpha1.ResourceNvidiaGPU, "1")
	js := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "js", UID: "jobset-uid", Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
		Spec: jobset.JobSetSpec{ReplicatedJobs: []jobset.ReplicatedJob{{Name: "workers", Replicas: 1, Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationPlan: "plan-js"}},
				Spec: gpuPod("", "", nil, corev1.Container{Resources: oneGPU}).Spec}}}}}}}
	if _, err := m.JobSet(js); err != nil {
		t.Fatal(err)
	}
	j := jobSetJob(js, &js.Spec.ReplicatedJobs[0], 0)
	if _, err := m.Job(j); err != nil {
		t.Fatal(err)
	}
	return j
}

// benchLWS is a fractional LWS (20Gi on one GPU, groups of 2) through
// gpupack's LWS mutation and then Kueue's LWS webhook (v0.17, after
// gpupack's), which marks its templates as its pod integration's. No plan:
// Kueue writes it into each pod by its update at admission.
func benchLWS(t *testing.T, m *mutation.Mutator) *lws.LeaderWorkerSet {
	t.Helper()
	l := &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "serve", UID: "lws-uid", Labels: map[string]string{"kueue.x-k8s.io/queue-name": "lq"},
		Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
		// StartupPolicy: not omitempty in the Go type, so the CRD's default
		// never applies.
		Spec: lws.LeaderWorkerSetSpec{Replicas: ptr.To[int32](1), StartupPolicy: lws.LeaderCreatedStartupPolicy, LeaderWorkerTemplate: lws.LeaderWorkerTemplate{Size: ptr.To[int32](2),
			WorkerTemplate: corev1.PodTemplateSpec{Spec: gpuPod("", "", nil, corev1.Container{Resources: limits(v1alpha1.ResourceNvidiaGPU, "1")}).Spec}}}}
	// The LWS webhook's defaults (v0.8.0), which no webhook applies here.
	shared := lws.SubdomainShared
	l.Spec.LeaderWorkerTemplate.RestartPolicy = lws.RecreateGroupOnPodRestart
	l.Spec.RolloutStrategy = lws.RolloutStrategy{Type: lws.RollingUpdateStrategyType, RollingUpdateConfiguration: &lws.RollingUpdateConfiguration{
		MaxUnavailable: intstr.FromInt32(1), MaxSurge: intstr.FromInt32(0), Partition: ptr.To[int32](0)}}
	l.Spec.NetworkConfig = &lws.NetworkConfig{SubdomainPolicy: &shared}
	if _, err := m.LeaderWorkerSet(l); err != nil {
		t.Fatal(err)
	}
	tmpl := &l.Spec.LeaderWorkerTemplate.WorkerTemplate
	if tmpl.Annotations == nil {
		tmpl.Annotations = map[string]string{}
	}
	tmpl.Annotations["kueue.x-k8s.io/pod-suspending-parent"] = "leaderworkerset.x-k8s.io/leaderworkerset"
	tmpl.Annotations["kueue.x-k8s.io/pod-group-serving"] = "true"
	return l
}

// podMatcherOf compiles o's pod mutating webhook conditions as the
// apiserver does.
func podMatcherOf(t *testing.T, o webhooks.ServeOptions) matchconditions.Matcher {
	t.Helper()
	mwc, _ := webhooks.WebhookConfigurations(o)
	for i := range mwc.Webhooks {
		if mwc.Webhooks[i].Name == webhooks.PodMutatingWebhookName {
			compiler := plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
			return webhook.NewMutatingWebhookAccessor("uid", mwc.Name, &mwc.Webhooks[i]).GetCompiledMatcher(compiler)
		}
	}
	t.Fatal("no pod webhook")
	return nil
}

// TestControllerPodsMeetTheMatchConditions checks, offline (the
// apiserver's own match-condition code, no control plane), the pods the
// throughput benchmark creates: a JobSet pod from the Job controller
// skips gpupack's pod webhook and is already what the webhook would store
// (a fixed point of the pod mutation), and so does an LWS pod from the
// StatefulSet controller (with the StatefulSet kind; without it, it meets
// the webhook).
func TestControllerPodsMeetTheMatchConditions(t *testing.T) {
	m, err := mutation.New(benchConfig)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := webhooks.DefaultServeOptions().WithFastPath(benchConfig)
	if err != nil {
		t.Fatal(err)
	}
	fast.JobKinds = []string{webhooks.KindStatefulSet} // the LWS integration's StatefulSets
	matcher := podMatcherOf(t, fast)
	calls := func(p *corev1.Pod, username string) bool {
		t.Helper()
		kind := corev1.SchemeGroupVersion.WithKind("Pod")
		attr := admission.NewAttributesRecord(p, nil, kind, p.Namespace, p.Name, corev1.SchemeGroupVersion.WithResource("pods"), "",
			admission.Create, &metav1.CreateOptions{}, false, &user.DefaultInfo{Name: username})
		va := &admission.VersionedAttributes{Attributes: attr, VersionedKind: kind}
		va.VersionedObject.Set(p)
		r := matcher.Match(context.Background(), va, nil, nil)
		if r.Error != nil {
			t.Fatal(r.Error)
		}
		return r.Matches
	}

	j := benchJobSetJob(t, m)
	j.Namespace = "ns"
	jsPod := jobSetPod(j, "js-workers-0-0-x")
	if calls(jsPod, framework.UserKubeControllerManager) {
		t.Errorf("JobSet pod from the Job controller meets the pod webhook; annotations %v, gates %v", jsPod.Annotations, jsPod.Spec.SchedulingGates)
	}
	stored := jsPod.DeepCopy()
	if warn, err := m.AdmitPod(stored, mutation.PodContext{}); err != nil || len(warn) > 0 || !equality.Semantic.DeepEqual(stored.Spec, jsPod.Spec) {
		t.Errorf("JobSet fast-path pod is not what the webhook stores: warnings %v, error %v, diff %s", warn, err, cmp.Diff(jsPod.Spec, stored.Spec))
	}

	sts := lwsLeaderStatefulSet(t, m, benchLWS(t, m), "ns")
	sts.UID = "sts-uid"
	lwsPod := statefulSetPod(sts, "serve-0")
	if calls(lwsPod, userStatefulSetController) {
		t.Errorf("LWS pod from the StatefulSet controller meets the pod webhook; annotations %v, gates %v", lwsPod.Annotations, lwsPod.Spec.SchedulingGates)
	}
	stored = lwsPod.DeepCopy()
	if warn, err := m.AdmitPod(stored, mutation.PodContext{}); err != nil || len(warn) > 0 || !equality.Semantic.DeepEqual(stored.Spec, lwsPod.Spec) || !hasGate(&lwsPod.Spec, v1alpha1.SchedulingGatePlacement) {
		t.Errorf("LWS fast-path pod is not what the webhook stores: warnings %v, error %v, gates %v, diff %s", warn, err, lwsPod.Spec.SchedulingGates, cmp.Diff(lwsPod.Spec, stored.Spec))
	}
	// Without the StatefulSet kind (so no StatefulSet entry to trust), it
	// meets the webhook.
	noSTS, err := webhooks.DefaultServeOptions().WithFastPath(benchConfig)
	if err != nil {
		t.Fatal(err)
	}
	matcher = podMatcherOf(t, noSTS)
	if !calls(lwsPod, userStatefulSetController) {
		t.Error("without the StatefulSet kind, an LWS pod skips the pod webhook")
	}
}
