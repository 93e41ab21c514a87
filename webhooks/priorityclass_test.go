package webhooks

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/policy"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// Review 16, H3: a tenant's pod label (kueue.x-k8s.io/priority-class) or
// priorityClassName chose the grace cap. Now the cap is keyed on the class
// Kueue gives the pod's Workload — the top job's label, read live through
// the owner walk — and the pod's own label counts only where the pod is the
// job (Kueue's pod integration); an unknown job gets the shortest cap of
// any class or queue, never the longest.
func TestPodGraceCapFollowsTheJobsClassNotThePodsLabel(t *testing.T) {
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = jobset.AddToScheme(s)
	lowLabel := map[string]string{"kueue.x-k8s.io/priority-class": "low", "kueue.x-k8s.io/queue-name": "lq"}
	researchLabel := map[string]string{"kueue.x-k8s.io/priority-class": "research"}
	// Objects a tenant can create that carry the class label but that
	// Kueue does not manage (second review N2): never the class.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "anything", Namespace: "ns", UID: "cm-uid", Labels: researchLabel}}
	idle := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "idle", Namespace: "ns", UID: "idle-uid", Labels: researchLabel}, Spec: batchv1.JobSpec{Suspend: ptr.To(true)}}
	js := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "js", Namespace: "ns", UID: "jobset-uid", Labels: lowLabel}}
	jsJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "js-w-0", Namespace: "ns", UID: "js-job-uid",
		Labels:          map[string]string{"kueue.x-k8s.io/priority-class": "research"}, // not the class: the JobSet's is
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "js", UID: "jobset-uid", Controller: ptr.To(true)}}}}
	lowJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "low", Namespace: "ns", UID: "low-uid", Labels: lowLabel}}
	bare := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "ns", UID: "bare-uid", Labels: map[string]string{"kueue.x-k8s.io/queue-name": "lq"}}}
	m, err := mutation.New(mutation.Config{Kueue: mutation.KueueConfig{Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset", "pod"}}, Checkpoint: mutation.CheckpointConfig{Image: "mgr:v1", Margin: metav1.Duration{Duration: 15 * time.Second},
		MaxTimeout: metav1.Duration{Duration: 2 * time.Hour},
		Policy:     policy.Policy{Max: 5 * time.Minute, MaxByPriorityClass: map[string]time.Duration{"low": time.Minute, "research": 30 * time.Minute}}}})
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, fake.NewClientBuilder().WithScheme(s).WithObjects(js, jsJob, lowJob, bare, cm, idle).Build())[PathMutatePod]
	ctrlBy := func(apiVersion, kind, name, uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}}
	}
	const low, research, max = 75, 30*60 + 15, 5*60 + 15
	cases := []struct {
		name      string
		optIn     bool
		owners    []metav1.OwnerReference
		queued    bool // the pod carries Kueue's queue-name label
		pcn       string
		wantGrace int64
	}{
		{"a Job labelled low: low, whatever the pod says", false, ctrlBy("batch/v1", "Job", "low", "low-uid"), false, "research", low},
		{"opted in, a Job labelled low: low", true, ctrlBy("batch/v1", "Job", "low", "low-uid"), false, "", low},
		{"a JobSet's pod: the JobSet's class, not its Job's", true, ctrlBy("batch/v1", "Job", "js-w-0", "js-job-uid"), false, "", low},
		{"a Job with no class label: the pods' priorityClassName (Kueue's template class)", false, ctrlBy("batch/v1", "Job", "bare", "bare-uid"), false, "research", research},
		{"a Job with no class at all: the unnamed class", false, ctrlBy("batch/v1", "Job", "bare", "bare-uid"), false, "", max},
		{"an owner that is not there: unknown, the shortest cap", true, ctrlBy("batch/v1", "Job", "gone", "gone-uid"), false, "", low},
		{"an owner with another UID: unknown, the shortest cap", false, ctrlBy("batch/v1", "Job", "low", "forged-uid"), false, "", low},
		{"no owner, not Kueue's: unknown, the shortest cap", false, nil, false, "research", low},
		{"Kueue's pod integration: the pod is the job, its label counts", false, nil, true, "", research},
		{"queue label on a Job's pod: still the Job's class", false, ctrlBy("batch/v1", "Job", "low", "low-uid"), true, "", low},
		{"a tenant's ConfigMap as the controller, labelled research: unknown, the shortest", false, ctrlBy("v1", "ConfigMap", "anything", "cm-uid"), false, "", low},
		{"an unqueued Job labelled research: not Kueue's, the shortest", false, ctrlBy("batch/v1", "Job", "idle", "idle-uid"), false, "", low},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := gpuPod("10Gi")
			pod.Spec.Containers[0].Command = []string{"python", "train.py"}
			pod.OwnerReferences = tc.owners
			pod.Labels = map[string]string{"kueue.x-k8s.io/priority-class": "research"} // the tenant's spoof
			if tc.queued {
				pod.Labels["kueue.x-k8s.io/queue-name"] = "lq"
			}
			pod.Spec.PriorityClassName = tc.pcn
			pod.Spec.TerminationGracePeriodSeconds = ptr.To(int64(3600))
			if tc.optIn {
				pod.Annotations[v1alpha1.AnnotationCheckpoint] = "true"
				pod.Annotations[v1alpha1.AnnotationCheckpointTimeout] = "1h"
			}
			req := asAdmin(request(t, admissionv1.Create, pod, nil)) // a planned pod of any owner
			resp := h.Handle(context.Background(), req)
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			var got corev1.Pod
			apply(t, req, resp, &got)
			if g := got.Spec.TerminationGracePeriodSeconds; g == nil || *g != tc.wantGrace {
				t.Fatalf("terminationGracePeriodSeconds %v, want %d", ptr.Deref(g, -1), tc.wantGrace)
			}
			if tc.optIn {
				want := "--grace=" + (time.Duration(tc.wantGrace) * time.Second).String()
				if cmd := strings.Join(got.Spec.Containers[0].Command, " "); !strings.Contains(cmd, want) {
					t.Errorf("agent command %q, want %s", cmd, want)
				}
			}
		})
	}
}

// gpupack.io/checkpoint decides whether the coordinator counts a pod's
// drain, non-Kueue preemption or delete (and bounds its grace): a tenant
// may not add, remove or change it on a running pod (review 16, H3).
func TestPodCheckpointAnnotationCannotChange(t *testing.T) {
	m, err := mutation.New(mutation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, nil)[PathValidatePod]
	opted := gpuPod("10Gi")
	opted.Annotations[v1alpha1.AnnotationCheckpoint] = "true"
	plain := gpuPod("10Gi")
	falsy := gpuPod("10Gi")
	falsy.Annotations[v1alpha1.AnnotationCheckpoint] = "false"
	relabelled := opted.DeepCopy()
	relabelled.Labels = map[string]string{"x": "y"}
	for _, tc := range []struct {
		name     string
		old, cur *corev1.Pod
		allowed  bool
	}{
		{"removed", opted, plain, false},
		{"set to false", opted, falsy, false},
		{"added", plain, opted, false},
		{"unchanged, relabelled", opted, relabelled, true},
	} {
		resp := h.Handle(context.Background(), request(t, admissionv1.Update, tc.cur, tc.old))
		if resp.Allowed != tc.allowed {
			t.Errorf("%s: allowed %v, want %v (%v)", tc.name, resp.Allowed, tc.allowed, resp.Result)
		}
	}
}
