package webhooks

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/checkpoint/agent"
	"github.com/gpupack/gpupack/checkpoint/manifest"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

const legacyJobUID = "GPUPACK_JOB_UID"

// jobIDEnv admits pod through the pod webhooks hs and returns every
// GPUPACK_JOB_ID and GPUPACK_JOB_UID entry of its first container, in
// order; the mutated pod must pass the validating webhook.
func jobIDEnv(t *testing.T, hs map[string]admission.Handler, pod *corev1.Pod) (ids, legacy []string) {
	t.Helper()
	req := asAdmin(request(t, admissionv1.Create, pod, nil)) // owner chains of every shape, planned
	resp := hs[PathMutatePod].Handle(context.Background(), req)
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	var got corev1.Pod
	apply(t, req, resp, &got)
	if resp := hs[PathValidatePod].Handle(context.Background(), request(t, admissionv1.Create, &got, nil)); !resp.Allowed {
		t.Errorf("validation of the mutated pod: %v", resp.Result)
	}
	for _, e := range got.Spec.Containers[0].Env {
		switch e.Name {
		case agent.EnvJobID:
			ids = append(ids, e.Value)
		case legacyJobUID:
			legacy = append(legacy, e.Value)
		}
	}
	return ids, legacy
}

func ownedBy(apiVersion, kind, name, uid string) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}}
}

// Every pod of a known job gets GPUPACK_JOB_ID = its job's identity
// (namespace, kind and name of the top of its controller chain — a
// JobSet's pod: Pod → Job → JobSet —, found by the coordinator's owner
// walk), whether or not it opts in to the agent (the helper alone writes
// manifests too); a tenant's own value, under the new or the legacy name,
// never stands: overwritten, or removed where the job is not known, and a
// ConfigMap's value through envFrom is shadowed by an explicit empty entry.
func TestPodHandlerInjectsTheJobID(t *testing.T) {
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	_ = jobset.AddToScheme(s)
	js := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "js", Namespace: "ns", UID: "jobset-uid"}}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "js-w-0", Namespace: "ns", UID: "job-uid",
		OwnerReferences: ownedBy("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "jobset-uid")}}
	plain := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "ns", UID: "plain-uid"}}
	m, err := mutation.New(mutation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, fake.NewClientBuilder().WithScheme(s).WithObjects(js, job, plain).Build())
	envFrom := []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "tenant"}}}}
	cases := []struct {
		name    string
		optIn   bool
		owners  []metav1.OwnerReference
		envFrom bool
		want    []string // GPUPACK_JOB_ID entries
	}{
		{"JobSet pod: the JobSet, not the Job", true, ownedBy("batch/v1", "Job", "js-w-0", "job-uid"), false, []string{"ns:JobSet.jobset.x-k8s.io:js"}},
		{"a Job's pod", true, ownedBy("batch/v1", "Job", "plain", "plain-uid"), false, []string{"ns:Job.batch:plain"}},
		{"a Job's pod not opted in: set too", false, ownedBy("batch/v1", "Job", "plain", "plain-uid"), false, []string{"ns:Job.batch:plain"}},
		{"a StatefulSet's pod: unknown, the tenant's value removed", true, ownedBy("apps/v1", "StatefulSet", "sts", "sts-uid"), false, nil},
		{"no controller: unknown, removed", true, nil, false, nil},
		{"not opted in, unknown: removed", false, nil, false, nil},
		{"unknown, envFrom: an explicit empty entry shadows it", false, nil, true, []string{""}},
		{"known, envFrom: the job's", false, ownedBy("batch/v1", "Job", "plain", "plain-uid"), true, []string{"ns:Job.batch:plain"}},
		// A read that fails part way (here: the Job is gone) names no job,
		// never the intermediate, whose id would be another job's.
		{"a Job that cannot be read: unknown, never the Job's name", true, ownedBy("batch/v1", "Job", "gone", "gone-uid"), false, nil},
		{"a forged JobSet UID: unknown", true, ownedBy("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "forged-uid"), false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := gpuPod("10Gi", corev1.EnvVar{Name: agent.EnvJobID, Value: "forged"}, corev1.EnvVar{Name: legacyJobUID, Value: "forged-uid"})
			pod.Spec.Containers[0].Command = []string{"python", "train.py"}
			pod.OwnerReferences = tc.owners
			if tc.optIn {
				pod.Annotations[v1alpha1.AnnotationCheckpoint] = "true"
			}
			if tc.envFrom {
				pod.Spec.Containers[0].EnvFrom = envFrom
			}
			ids, legacy := jobIDEnv(t, h, pod)
			if strings.Join(ids, ",") != strings.Join(tc.want, ",") || len(ids) != len(tc.want) {
				t.Errorf("%s = %q, want %q", agent.EnvJobID, ids, tc.want)
			}
			if len(legacy) != 0 {
				t.Errorf("%s = %q: the tenant's legacy value stands", legacyJobUID, legacy)
			}
		})
	}
}

// H2: a training job cannot be edited, so "delete, fix, re-apply the same
// YAML" makes a job of the same name with a new UID. Its pods get the same
// job identity as the first job's, so the steps the first job saved count
// as its own (resume, not restart and overwrite); a job of another name in
// the same directory still does not.
func TestRecreatedJobKeepsItsJobID(t *testing.T) {
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	first := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ns", UID: "uid-1"}}
	other := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "ns", UID: "uid-o"}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(first, other).Build()
	m, err := mutation.New(mutation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, c)
	idOf := func(job *batchv1.Job) string {
		pod := gpuPod("10Gi")
		pod.Spec.Containers[0].Command = []string{"python", "train.py"}
		pod.Annotations[v1alpha1.AnnotationCheckpoint] = "true"
		pod.OwnerReferences = ownedBy("batch/v1", "Job", job.Name, string(job.UID))
		ids, _ := jobIDEnv(t, h, pod)
		if len(ids) != 1 || ids[0] == "" {
			t.Fatalf("job %s/%s: %s = %q", job.Name, job.UID, agent.EnvJobID, ids)
		}
		return ids[0]
	}
	idA := idOf(first)
	if err := c.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	again := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ns", UID: "uid-2"}}
	if err := c.Create(context.Background(), again); err != nil {
		t.Fatal(err)
	}
	if got := c.Get(context.Background(), client.ObjectKeyFromObject(again), again); got != nil || again.UID != "uid-2" {
		t.Fatalf("re-created job: %v, uid %q", got, again.UID)
	}
	idB, idO := idOf(again), idOf(other)
	if idB != idA {
		t.Fatalf("re-created job's id %q, first job's %q: it would start from scratch and overwrite the first job's steps", idB, idA)
	}
	if idO == idA {
		t.Fatalf("another job's id %q equals train's", idO)
	}
	dir := t.TempDir()
	for r := 0; r < 2; r++ { // the first job's gang saves step 3000
		if _, err := manifest.SaveRankWith(dir, 3000, manifest.RankInfo{Rank: r, WorldSize: 2, RunID: "run-1", JobID: idA},
			map[string]manifest.WriteFunc{"model.pt": manifest.Bytes([]byte("weights"))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []struct {
		job  string
		want bool
	}{{idB, true}, {idO, false}} {
		st, err := (&manifest.Verifier{JobID: v.job}).StepState(context.Background(), dir, 3000)
		if err != nil || st.Consistent() != v.want {
			t.Errorf("agent of job %q: step 3000 consistent %v (%v, %q), want %v", v.job, st.Consistent(), err, st.Problems, v.want)
		}
	}
}

// The identity is a valid manifest id whatever the names' lengths, and
// distinct names (or kinds, or namespaces) stay distinct.
func TestJobIDFitsTheManifest(t *testing.T) {
	long := strings.Repeat("a", 253)
	ids := map[string]bool{}
	for _, c := range []struct {
		ns   string
		gk   schema.GroupKind
		name string
	}{
		{"ns", schema.GroupKind{Group: "batch", Kind: "Job"}, "train"},
		{"ns", schema.GroupKind{Group: "kubeflow.org", Kind: "PyTorchJob"}, "train"},
		{"ns2", schema.GroupKind{Group: "batch", Kind: "Job"}, "train"},
		{"ns", schema.GroupKind{Group: "batch", Kind: "Job"}, long},
		{"ns", schema.GroupKind{Group: "batch", Kind: "Job"}, long[1:] + "b"},
	} {
		id := mutation.JobID(c.ns, c.gk, c.name)
		if err := manifest.ValidateRunID(id); err != nil {
			t.Errorf("JobID(%q, %v, %q) = %q: %v", c.ns, c.gk, c.name, id, err)
		}
		if ids[id] {
			t.Errorf("JobID(%q, %v, %q) = %q twice", c.ns, c.gk, c.name, id)
		}
		ids[id] = true
	}
	if id := mutation.JobID("ns", schema.GroupKind{Kind: "Job"}, ""); id != "" {
		t.Errorf("no name: %q, want none", id)
	}
}

// Two jobs share one checkpoint directory: the job id each pod got from
// the webhook is what the helper stamps into its manifests and what the
// agent's verifier checks, so the second job's agent never counts the
// first job's step as its own checkpoint ("Saved").
func TestSharedDirectoryAnotherJobsStepIsNotSaved(t *testing.T) {
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	a := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", UID: "uid-a"}}
	b := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns", UID: "uid-b"}}
	m, err := mutation.New(mutation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := Handlers(m, fake.NewClientBuilder().WithScheme(s).WithObjects(a, b).Build())
	envOf := func(job *batchv1.Job) string {
		pod := gpuPod("10Gi", corev1.EnvVar{Name: agent.EnvJobID, Value: "ns:Job.batch:a"}) // b's tenant copies a's value: it does not stand
		pod.Spec.Containers[0].Command = []string{"python", "train.py"}
		pod.Annotations[v1alpha1.AnnotationCheckpoint] = "true"
		pod.OwnerReferences = ownedBy("batch/v1", "Job", job.Name, string(job.UID))
		ids, _ := jobIDEnv(t, h, pod)
		if len(ids) != 1 {
			t.Fatalf("job %s: %s = %q", job.Name, agent.EnvJobID, ids)
		}
		return ids[0]
	}
	jobA, jobB := envOf(a), envOf(b)
	if jobA != "ns:Job.batch:a" || jobB != "ns:Job.batch:b" {
		t.Fatalf("job ids from the webhook: a %q, b %q", jobA, jobB)
	}
	dir := t.TempDir()
	for r := 0; r < 2; r++ { // job a's gang saves step 1200
		if _, err := manifest.SaveRankWith(dir, 1200, manifest.RankInfo{Rank: r, WorldSize: 2, RunID: "run-a", JobID: jobA},
			map[string]manifest.WriteFunc{"model.pt": manifest.Bytes([]byte("weights"))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		job  string
		want bool
	}{{jobA, true}, {jobB, false}} {
		st, err := (&manifest.Verifier{JobID: c.job}).StepState(context.Background(), dir, 1200)
		if err != nil || st.Consistent() != c.want {
			t.Errorf("agent of job %q: step 1200 consistent %v (%v, %q), want %v", c.job, st.Consistent(), err, st.Problems, c.want)
		}
	}
}
