package webhooks

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

var update = flag.Bool("update", false, "rewrite golden files")

// asTenant is r as tenant alice asks it.
func asTenant(r admission.Request) admission.Request {
	r.UserInfo = authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}
	return r
}

// asAdmin is r as a cluster admin (system:masters), who may create a
// planned pod with any owners (mutation.CheckPlanCreator): for tests of
// something else than who creates it.
func asAdmin(r admission.Request) admission.Request {
	r.UserInfo = authenticationv1.UserInfo{Username: "admin", Groups: []string{"system:masters", "system:authenticated"}}
	return r
}

func request(t testing.TB, op admissionv1.Operation, obj, old any) admission.Request {
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	// As a controller the unmanaged-GPU policy trusts to create objects
	// for their owners (asTenant makes it a tenant's request).
	r := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Namespace: "ns", Object: kruntime.RawExtension{Raw: raw},
		UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:job-controller"}}}
	if old != nil {
		b, _ := json.Marshal(old)
		r.OldObject = kruntime.RawExtension{Raw: b}
	}
	return r
}

// apply applies a response's JSON patch to the request object.
func apply(t testing.TB, req admission.Request, resp admission.Response, into any) {
	t.Helper()
	ops, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(req.Object.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, into); err != nil {
		t.Fatal(err)
	}
}

func gpuPod(mem string, env ...corev1.EnvVar) *corev1.Pod {
	return &corev1.Pod{
		// Placed by the gang-fit check: a fractional pod needs a plan, and
		// only a trusted controller creates a planned pod, for its owner
		// (request's identity), a job Kueue manages (pJob, in handlers'
		// fake client).
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: mem, v1alpha1.AnnotationPlan: "plan-p"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "p-job", UID: "uid-p-job", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{flavors.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3"},
			Containers: []corev1.Container{{Name: "c", Image: "i", Env: env, Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1"), corev1.ResourceCPU: resource.MustParse("2")}}}},
		},
	}
}

// pJob is gpuPod's owner: a queued Job, which Kueue manages.
func pJob() *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "p-job", Namespace: "ns", UID: "uid-p-job", Labels: map[string]string{mutation.LabelQueueName: "q"}}}
}

// handlers serves cfg with objs (and pJob) in the readers.
func handlers(t testing.TB, cfg mutation.Config, objs ...kruntime.Object) map[string]admission.Handler {
	objs = append(objs, pJob())
	m, err := mutation.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := kruntime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = batchv1.AddToScheme(s)
	return Handlers(m, fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(objs...).Build())
}

func TestPodHandler(t *testing.T) {
	ctx := context.Background()
	yes := true
	owner := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ns", UID: "u1", Labels: map[string]string{mutation.LabelQueueName: "q"}, Annotations: map[string]string{v1alpha1.AnnotationLastConsistentCheckpoint: "700"}}}
	h := handlers(t, mutation.Config{}, owner)
	pod := gpuPod("10Gi", corev1.EnvVar{Name: v1alpha1.EnvLDPreload, Value: "/evil.so"})
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: "u1", Controller: &yes}}
	req := request(t, admissionv1.Create, pod, nil)
	resp := h[PathMutatePod].Handle(ctx, req)
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "removed LD_PRELOAD") {
		t.Errorf("warnings = %q", resp.Warnings)
	}
	var got corev1.Pod
	apply(t, req, resp, &got)
	lim := got.Spec.Containers[0].Resources.Limits
	if q := lim[v1alpha1.ResourceGPUMemory]; q.Value() != 10240 {
		t.Errorf("gpu-memory = %s", q.String())
	}
	env := map[string]string{}
	for _, e := range got.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env[v1alpha1.EnvLDPreload] != "" || env[v1alpha1.EnvMemoryLimit] != "" || env[v1alpha1.EnvResumeStep] != "700" {
		t.Errorf("env = %v", env)
	}
	if len(got.Spec.Volumes) != 0 {
		t.Errorf("volumes = %v, want none (the device plugin delivers the hook)", got.Spec.Volumes)
	}
	// The stored pod passes validation.
	if resp := h[PathValidatePod].Handle(ctx, request(t, admissionv1.Create, &got, nil)); !resp.Allowed {
		t.Errorf("validation of mutated pod: %v", resp.Result)
	}
	// And the raw one does not.
	if resp := h[PathValidatePod].Handle(ctx, request(t, admissionv1.Create, pod, nil)); resp.Allowed {
		t.Error("validation of unmutated pod allowed")
	}

	// A tenant's gpupack.io/devices is removed from the stored pod.
	forged := gpuPod("10Gi")
	forged.Annotations[v1alpha1.AnnotationDevices] = "GPU-0:70000"
	req = request(t, admissionv1.Create, forged, nil)
	resp = h[PathMutatePod].Handle(ctx, req)
	got = corev1.Pod{}
	apply(t, req, resp, &got)
	if _, ok := got.Annotations[v1alpha1.AnnotationDevices]; ok || got.Annotations[v1alpha1.AnnotationGPUMemory] != "10Gi" {
		t.Errorf("annotations after the patch: %v", got.Annotations)
	}
}

// Ephemeral containers reach the pod validator through their subresource.
func TestEphemeralContainersHandler(t *testing.T) {
	ctx := context.Background()
	h := handlers(t, mutation.Config{})
	yes := true
	pod := gpuPod("10Gi")
	// As stored: the pod webhook set the pod's seccomp profile.
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	dbg := pod.DeepCopy()
	dbg.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "busybox",
		SecurityContext: &corev1.SecurityContext{Privileged: &yes}}}}
	req := request(t, admissionv1.Update, dbg, pod)
	req.SubResource = "ephemeralcontainers"
	if resp := h[PathValidatePod].Handle(ctx, req); resp.Allowed || !strings.Contains(resp.Result.Message, `ephemeral container "dbg" is privileged`) {
		t.Errorf("privileged debug container: %+v", resp.Result)
	}
	dbg.Spec.EphemeralContainers[0].SecurityContext = nil
	req = request(t, admissionv1.Update, dbg, pod)
	req.SubResource = "ephemeralcontainers"
	if resp := h[PathValidatePod].Handle(ctx, req); !resp.Allowed {
		t.Errorf("plain debug container denied: %+v", resp.Result)
	}
	dbg.Spec.EphemeralContainers[0].SecurityContext = &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
	req = request(t, admissionv1.Update, dbg, pod)
	req.SubResource = "ephemeralcontainers"
	if resp := h[PathValidatePod].Handle(ctx, req); resp.Allowed || !strings.Contains(resp.Result.Message, `ephemeral container "dbg" sets securityContext.seccompProfile Unconfined`) {
		t.Errorf("unconfined debug container: %+v", resp.Result)
	}
}

func TestHandlerDenials(t *testing.T) {
	ctx := context.Background()
	h := handlers(t, mutation.Config{})
	cases := []struct {
		path string
		op   admissionv1.Operation
		obj  any
		old  any
		want string
	}{
		{PathMutatePod, admissionv1.Create, gpuPod("79Gi"), nil, "ask for at most 71903Mi"},
		{PathValidatePod, admissionv1.Create, gpuPod("79Gi"), nil, "ask for at most 71903Mi"},
		{PathValidatePod, admissionv1.Update, gpuPod("2Gi"), gpuPod("1Gi"), "cannot change on an existing pod"},
		{PathMutateJob, admissionv1.Create, &batchv1.Job{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: gpuPod("x").ObjectMeta, Spec: gpuPod("x").Spec}}}, nil, "not a quantity"},
	}
	for _, tc := range cases {
		resp := h[tc.path].Handle(ctx, asAdmin(request(t, tc.op, tc.obj, tc.old)))
		if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, tc.want) {
			t.Errorf("%s %s: allowed=%v result=%v, want denial %q", tc.path, tc.op, resp.Allowed, resp.Result, tc.want)
		}
	}
	// Updates are not mutated.
	if resp := h[PathMutatePod].Handle(ctx, request(t, admissionv1.Update, gpuPod("79Gi"), gpuPod("79Gi"))); !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("update mutated: %+v", resp)
	}
}

func TestWebhookConfigurationsGolden(t *testing.T) {
	mwc, vwc := WebhookConfigurations(DefaultServeOptions())
	var b strings.Builder
	for _, o := range []any{mwc, vwc} {
		y, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	golden := filepath.Join("deploy", "webhook-configurations.yaml")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), b.String()); d != "" {
		t.Errorf("%s is stale; run go test ./webhooks -run Golden -update (-want +got):\n%s", golden, d)
	}
	for _, w := range mwc.Webhooks {
		if *w.FailurePolicy != "Fail" || len(w.MatchConditions) != 1 || w.NamespaceSelector.MatchExpressions[0].Values[0] != "kube-system" {
			t.Errorf("%s: failurePolicy %v, conditions %d, nsSel %v", w.Name, *w.FailurePolicy, len(w.MatchConditions), w.NamespaceSelector)
		}
	}
}

// measure runs fn b.N times and reports wall p99 and, because the shared
// build machines are heavily oversubscribed, the thread CPU time per call
// (mean and p99), which waiting for a core does not inflate.
func measure(b *testing.B, fn func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	wall := make([]time.Duration, 0, b.N)
	cpu := make([]time.Duration, 0, b.N)
	var ts unix.Timespec
	threadCPU := func() time.Duration {
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		return time.Duration(ts.Nano())
	}
	b.ReportAllocs()
	b.ResetTimer()
	var cpuSum time.Duration
	for i := 0; i < b.N; i++ {
		t0, c0 := time.Now(), threadCPU()
		fn()
		c := threadCPU() - c0
		wall = append(wall, time.Since(t0))
		cpu = append(cpu, c)
		cpuSum += c
	}
	b.StopTimer()
	p99 := func(d []time.Duration) float64 {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return float64(d[len(d)*99/100].Nanoseconds())
	}
	b.ReportMetric(p99(wall), "p99-ns")
	b.ReportMetric(float64(cpuSum.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(p99(cpu), "p99-cpu-ns")
}

// BenchmarkPodHandler measures one mutating admission of a fractional GPU
// pod (decode, mutate, marshal, JSON patch).
func BenchmarkPodHandler(b *testing.B) {
	h := handlers(b, mutation.Config{})[PathMutatePod]
	req := request(b, admissionv1.Create, gpuPod("20Gi", corev1.EnvVar{Name: "HOME", Value: "/root"}), nil)
	ctx := context.Background()
	measure(b, func() {
		if resp := h.Handle(ctx, req); !resp.Allowed {
			b.Fatal(resp.Result)
		}
	})
}

// BenchmarkPodValidator measures the validating admission of the mutated pod.
func BenchmarkPodValidator(b *testing.B) {
	hs := handlers(b, mutation.Config{})
	req := request(b, admissionv1.Create, gpuPod("20Gi"), nil)
	var mutated corev1.Pod
	apply(b, req, hs[PathMutatePod].Handle(context.Background(), req), &mutated)
	vreq := request(b, admissionv1.Create, &mutated, nil)
	measure(b, func() {
		if resp := hs[PathValidatePod].Handle(context.Background(), vreq); !resp.Allowed {
			b.Fatal(resp.Result)
		}
	})
}

// Pod creations reach the validating webhook only when asked for; jobs are
// always validated at creation (their templates are not reinvoked).
func TestValidatePodCreateOption(t *testing.T) {
	for _, strict := range []bool{false, true} {
		o := DefaultServeOptions()
		o.ValidatePodCreate = strict
		_, vwc := WebhookConfigurations(o)
		for _, w := range vwc.Webhooks {
			got := fmt.Sprint(w.Rules[0].Operations)
			want := "[CREATE UPDATE]"
			if w.Name == "vpod.gpupack.io" && !strict {
				want = "[UPDATE]"
			}
			if got != want {
				t.Errorf("ValidatePodCreate=%v: %s operations %s, want %s", strict, w.Name, got, want)
			}
		}
	}
}

// The pod webhook stamps a Kueue pod group's pod with the requesting user
// (review 14 F3), replacing a forged stamp; a pod of no group gets none.
func TestPodHandlerStampsPodGroupCreator(t *testing.T) {
	ctx := context.Background()
	h := handlers(t, mutation.Config{Kueue: mutation.KueueConfig{ManageJobsWithoutQueueName: true, Frameworks: []string{"pod"}}})
	for _, tc := range []struct {
		name  string
		group bool
		want  string
	}{
		{"a pod-group pod with bob's stamp, created by alice", true, "alice"},
		{"a pod of no group", false, "bob"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: map[string]string{v1alpha1.AnnotationCreatedBy: "bob"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}}}}
			if tc.group {
				pod.Labels = map[string]string{"kueue.x-k8s.io/pod-group-name": "g"}
			}
			req := asTenant(request(t, admissionv1.Create, pod, nil))
			resp := h[PathMutatePod].Handle(ctx, req)
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			var got corev1.Pod
			apply(t, req, resp, &got)
			if s := got.Annotations[v1alpha1.AnnotationCreatedBy]; s != tc.want {
				t.Errorf("%s = %q, want %q (annotations %v)", v1alpha1.AnnotationCreatedBy, s, tc.want, got.Annotations)
			}
		})
	}
}
