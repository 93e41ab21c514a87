package webhooks

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// TestPodCreateThroughput creates GPU pods through the real apiserver with
// and without gpupack's webhooks in the same run (interleaved batches, one
// namespace per variant) and reports the ratios. Besides gpupack's default
// and strict (ValidatePodCreate) setups it measures allow-all webhooks with
// the same rules and matchConditions, which separates what calling *any*
// webhook costs the apiserver from what gpupack adds, and the CPU each
// process spent per pod. Opt in with GPUPACK_BENCH=1 (it measures; it does
// not assert speed).
func TestPodCreateThroughput(t *testing.T) {
	if os.Getenv("GPUPACK_BENCH") == "" {
		t.Skip("set GPUPACK_BENCH=1 to run the pod-create throughput measurement")
	}
	// Many small interleaved batches: the shared box's load moves within a
	// run, and each batch of every variant sees about the same.
	// GPUPACK_BENCH_PODS: pods per variant (default 2 000, in batches of
	// 200); more pods, more batches, less noise from the shared box.
	total, workers := 2000, 16
	if n, err := strconv.Atoi(os.Getenv("GPUPACK_BENCH_PODS")); err == nil && n >= 400 {
		total = n / 200 * 200
	}
	batches := total / 200
	env := framework.Start(t, framework.Options{NoKueue: true})
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		allow := &webhook.Admission{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })}
		mgr.GetWebhookServer().Register("/allow", allow)
		// Allows with a one-label patch: what any patching webhook costs
		// (the apiserver applies the patch and re-runs admission).
		pt := admissionv1.PatchTypeJSONPatch
		label := &webhook.Admission{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
			r := admission.Allowed("")
			r.PatchType = &pt
			r.Patches = []jsonpatch.JsonPatchOperation{{Operation: "add", Path: "/metadata/labels", Value: map[string]string{"patched": "true"}}}
			return r
		})}
		mgr.GetWebhookServer().Register("/label", label)
		// A controller-runtime defaulter, as LWS's and Kueue's pod webhooks
		// are: decode the pod, set one label, answer the JSON patch from
		// the raw object.
		defaulter := &webhook.Admission{Handler: admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
			p := &corev1.Pod{}
			if err := json.Unmarshal(req.Object.Raw, p); err != nil {
				return admission.Errored(http.StatusBadRequest, err)
			}
			if p.Labels == nil {
				p.Labels = map[string]string{}
			}
			p.Labels["defaulted"] = "true"
			raw, err := json.Marshal(p)
			if err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
			return admission.PatchResponseFromRaw(req.Object.Raw, raw)
		})}
		mgr.GetWebhookServer().Register("/default-label", defaulter)
		return webhooks.Setup(mgr, benchConfig)
	}, opts)

	// Bare pods (a user creates them); job pods (the Job controller
	// creates them from a template gpupack injected when the job was
	// applied); JobSet pods (Job pods of a Job the JobSet controller made
	// from a replicated Job template gpupack's JobSet webhook injected, the
	// Job through gpupack's Job webhook); LWS pods (the StatefulSet
	// controller's, for an LWS group's StatefulSet): each kind against its
	// own no-webhook baseline.
	type variant struct {
		name, ns string
		// kind of pod created: "" (a tenant's bare GPU pod), "job",
		// "jobset", "lws", "cpu"; base is the variant it is compared to.
		kind string
		base int
	}
	variants := []variant{{name: "no webhook"}, {name: "gpupack (default)"}, {name: "gpupack, ValidatePodCreate"}, {name: "allow-all mutating"}, {name: "mutating, one-label patch"}, {name: "allow-all mutating + validating"},
		{name: "in-process MutatingAdmissionPolicy, one-label patch"},
		{name: "job pods: no webhook", kind: "job"}, {name: "job pods: gpupack (default, fast path)", kind: "job"}, {name: "job pods: gpupack, fast path off", kind: "job"},
		{name: "CPU pods: no webhook", kind: "cpu"}, {name: "CPU pods: gpupack installed", kind: "cpu"},
		{name: "JobSet pods: no webhook", kind: "jobset"}, {name: "JobSet pods: gpupack (default, fast path)", kind: "jobset"},
		{name: "LWS pods: no webhook", kind: "lws"}, {name: "LWS pods: gpupack (default, fast path)", kind: "lws"},
		{name: "LWS pods: a one-label defaulter webhook on every pod (stand-in for LWS's and Kueue's pod webhooks)", kind: "lws"},
		{name: "LWS pods: that stand-in + gpupack (default, fast path)", kind: "lws"}}
	const jobBase, jobFast, jobSlow, cpuBase, cpuGpupack = 7, 8, 9, 10, 11
	const jobSetBase, jobSetFast, lwsBase, lwsGpupack, lwsStandIn, lwsStandInGpupack = 12, 13, 14, 15, 16, 17
	for i := range variants {
		variants[i].ns = env.Namespace(t, fmt.Sprintf("v%d", i))
		switch variants[i].kind {
		case "job":
			variants[i].base = jobBase
		case "cpu":
			variants[i].base = cpuBase
		case "jobset":
			variants[i].base = jobSetBase
		case "lws":
			variants[i].base = lwsBase
		}
	}
	// The stand-in with gpupack is compared to the stand-in alone: what
	// gpupack adds where LWS's and Kueue's pod webhooks already run.
	variants[lwsStandInGpupack].base = lwsStandIn
	// Each variant's pod webhooks, scoped to its namespace by name.
	fast, err := webhooks.DefaultServeOptions().WithFastPath(benchConfig)
	if err != nil {
		t.Fatal(err)
	}
	strict := fast
	strict.ValidatePodCreate = true
	// With the StatefulSet kind (the LWS integration's StatefulSets): the
	// StatefulSet clause, as the manager writes it where its StatefulSet
	// entry holds.
	fastSTS := fast
	fastSTS.JobKinds = []string{webhooks.KindStatefulSet}
	scoped := func(prefix, ns, path string, so webhooks.ServeOptions, validating bool) []client.Object {
		mwc, vwc := webhooks.WebhookConfigurations(so)
		sel := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
		m, v := mwc.Webhooks[0], vwc.Webhooks[0] // the pod webhooks
		m.Name, m.NamespaceSelector = prefix+m.Name, sel
		v.Name, v.NamespaceSelector = prefix+v.Name, sel
		if path != "" {
			m.ClientConfig.Service.Path, v.ClientConfig.Service.Path = &path, &path
			v.Rules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
		}
		mwc.Name, vwc.Name = prefix+"m", prefix+"v"
		mwc.Webhooks, vwc.Webhooks = []admissionregistrationv1.MutatingWebhook{m}, []admissionregistrationv1.ValidatingWebhook{v}
		if !validating {
			return []client.Object{mwc}
		}
		return []client.Object{mwc, vwc}
	}
	var objs []client.Object
	objs = append(objs, scoped("", variants[1].ns, "", fast, true)...)
	objs = append(objs, scoped("strict-", variants[2].ns, "", strict, true)...)
	objs = append(objs, scoped("allow-", variants[3].ns, "/allow", fast, false)...)
	objs = append(objs, scoped("label-", variants[4].ns, "/label", fast, false)...)
	objs = append(objs, scoped("allow2-", variants[5].ns, "/allow", fast, true)...)
	objs = append(objs, scoped("job-", variants[jobFast].ns, "", fast, true)...)
	objs = append(objs, scoped("slow-", variants[jobSlow].ns, "", webhooks.DefaultServeOptions(), true)...)
	objs = append(objs, scoped("cpu-", variants[cpuGpupack].ns, "", fast, true)...)
	objs = append(objs, scoped("jobset-", variants[jobSetFast].ns, "", fast, true)...)
	objs = append(objs, scoped("lws-", variants[lwsGpupack].ns, "", fastSTS, true)...)
	objs = append(objs, scoped("lwsg-", variants[lwsStandInGpupack].ns, "", fastSTS, true)...)
	// LWS's pod webhook (objectSelector: the LWS name label) and Kueue's
	// (pod integration: every pod of a managed namespace) have no match
	// conditions and patch every LWS pod; named after gpupack's
	// configuration, as kueue-… and lws-… sort after gpupack-…, so
	// gpupack's pod webhook (IfNeeded) is reinvoked after their patch, as in
	// a cluster.
	for _, i := range []int{lwsStandIn, lwsStandInGpupack} {
		standIn := scoped(fmt.Sprintf("zz-standin-%d-", i), variants[i].ns, "/default-label", fast, false)[0].(*admissionregistrationv1.MutatingWebhookConfiguration)
		standIn.Webhooks[0].MatchConditions = nil
		standIn.Webhooks[0].ReinvocationPolicy = nil
		objs = append(objs, standIn)
	}
	env.InstallWebhooks(t, opts, objs...)
	// gpupack's shipped ValidatingAdmissionPolicies (manifests/base/policy),
	// bound to the gpupack variants' namespaces only, so the baselines stay
	// without them.
	installPolicies(t, env, []string{variants[1].ns, variants[2].ns, variants[jobFast].ns, variants[jobSlow].ns, variants[cpuGpupack].ns,
		variants[jobSetFast].ns, variants[lwsGpupack].ns, variants[lwsStandInGpupack].ns})
	// The same one-label mutation without any webhook: a CEL policy the
	// apiserver applies in-process (no round trip, no JSON review), which
	// bounds what any pod mutation at creation costs here.
	fail := admissionregistrationv1.Fail
	scope := admissionregistrationv1.NamespacedScope
	env.MustCreate(t, &admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "label"}, Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: &scope}}}}},
		MatchConditions:    webhooks.MatchConditions("Pod", false),
		FailurePolicy:      &fail,
		ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		Mutations: []admissionregistrationv1.Mutation{{PatchType: admissionregistrationv1.PatchTypeApplyConfiguration, ApplyConfiguration: &admissionregistrationv1.ApplyConfiguration{
			Expression: `Object{metadata: Object.metadata{labels: {"patched": "true"}}}`}}},
	}})
	env.MustCreate(t, &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "label"}, Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{
		PolicyName: "label", MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": variants[6].ns}}}}})
	oneGPU := limits(v1alpha1.ResourceNvidiaGPU, "1")
	env.Eventually(t, 30*time.Second, "the policy applies", func() (bool, string) {
		p := gpuPod(variants[6].ns, fmt.Sprintf("probe-%d", time.Now().UnixNano()), map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, corev1.Container{Resources: oneGPU})
		if err := env.Client.Create(env.Ctx, p); err != nil {
			return false, err.Error()
		}
		return p.Labels["patched"] == "true", fmt.Sprint(p.Labels)
	})

	// The job: applied through gpupack's job mutation (what its job webhook
	// does), so the template is injected and marked. Its pods come from
	// the Job controller's user.
	m, err := mutation.New(benchConfig)
	if err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", UID: "job-uid", Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: gpuPod("", "", nil, corev1.Container{Resources: oneGPU}).Spec}}}
	// As Kueue starts it: podSetUpdates name the GPUPlan (a fractional pod
	// without one is denied, and never takes the fast path).
	job.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationPlan: "plan-train"}
	if _, err := m.Job(job); err != nil {
		t.Fatal(err)
	}
	kcm := env.UserConfig(t, framework.UserKubeControllerManager, "system:masters")
	kcm.QPS, kcm.Burst = env.Config.QPS, env.Config.Burst
	controller, err := client.New(kcm, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	env.Eventually(t, 30*time.Second, "job pods take the fast path", func() (bool, string) {
		job.Namespace = variants[jobFast].ns
		p := podFromTemplate(job, fmt.Sprintf("probe-%d", time.Now().UnixNano()))
		before := podMutations(t)
		if err := controller.Create(env.Ctx, p); err != nil {
			return false, err.Error()
		}
		return podMutations(t) == before, "mutated"
	})

	// The JobSet: through gpupack's JobSet mutation (its webhook), with the
	// plan Kueue's podSetUpdates write into the replicated Job's template
	// when it starts the JobSet; the JobSet controller's Job (its labels
	// and annotations on the Job and the pod template, v0.11.1's
	// constructJob) through gpupack's Job mutation, as the Job webhook sees
	// the JobSet controller's create. The Job controller makes the pods.
	jsJob := benchJobSetJob(t, m)
	env.Eventually(t, 30*time.Second, "JobSet pods take the fast path", func() (bool, string) {
		j := jsJob.DeepCopy()
		j.Namespace = variants[jobSetFast].ns
		p := jobSetPod(j, fmt.Sprintf("probe-%d", time.Now().UnixNano()))
		before := podMutations(t)
		if err := controller.Create(env.Ctx, p); err != nil {
			return false, err.Error()
		}
		return podMutations(t) == before, "mutated"
	})

	// The LWS: through gpupack's LWS mutation, then Kueue's LWS webhook
	// (after gpupack's) marks its templates as its pod integration's; the
	// LWS controller's leader StatefulSet (no leader template: the worker
	// template, with the LWS controller's labels and annotations). No
	// controller runs here: the StatefulSet controller's identity makes
	// the pods.
	lwsObj := benchLWS(t, m)
	lwsSets := map[string]*appsv1.StatefulSet{}
	for _, i := range []int{lwsBase, lwsGpupack, lwsStandIn, lwsStandInGpupack} {
		// Stored, so the pod webhook's owner walks (pod → StatefulSet →
		// LWS, for the unmanaged-GPU rule and the resume step) read real
		// objects, as in a cluster.
		l := lwsObj.DeepCopy()
		l.Namespace, l.UID = variants[i].ns, ""
		env.MustCreate(t, l)
		sts := lwsLeaderStatefulSet(t, m, l, variants[i].ns)
		env.MustCreate(t, sts)
		lwsSets[variants[i].ns] = sts
	}
	stsCfg := env.UserConfig(t, userStatefulSetController, "system:masters")
	stsCfg.QPS, stsCfg.Burst = env.Config.QPS, env.Config.Burst
	stsController, err := client.New(stsCfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	create := func(v variant, from, n int) time.Duration {
		ns := v.ns
		var next atomic.Int64
		next.Store(int64(from))
		end := int64(from + n)
		var wg sync.WaitGroup
		var firstErr atomic.Value
		t0 := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= end {
						return
					}
					name := fmt.Sprintf("p-%d", i)
					// A bare fractional pod as Kueue's pod integration admits
					// it: with its plan (one without is denied).
					p, c := gpuPod(ns, name, map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationPlan: "plan-bench"}, corev1.Container{Resources: oneGPU}), env.Client
					switch v.kind {
					case "cpu":
						p = gpuPod(ns, name, nil, corev1.Container{Resources: limits("cpu", "1")})
					case "job":
						j := job.DeepCopy()
						j.Namespace = ns
						p, c = podFromTemplate(j, name), controller
					case "jobset":
						j := jsJob.DeepCopy()
						j.Namespace = ns
						p, c = jobSetPod(j, name), controller
					case "lws":
						p, c = statefulSetPod(lwsSets[ns], name), stsController
					}
					if err := c.Create(env.Ctx, p); err != nil {
						firstErr.CompareAndSwap(nil, err)
					}
				}
			}()
		}
		wg.Wait()
		if err := firstErr.Load(); err != nil {
			t.Fatalf("create in %s: %v", ns, err)
		}
		return time.Since(t0)
	}
	// Warm up every path (connections, webhook TLS, CEL programs).
	for _, v := range variants {
		create(v, 1_000_000, 50)
	}
	took := make([]time.Duration, len(variants))
	batchTook := make([][]time.Duration, len(variants))
	cpu := make([]map[string]time.Duration, len(variants))
	calls := make([]float64, len(variants)) // gpupack pod webhook answers
	per := total / batches
	for b := 0; b < batches; b++ {
		// Every other batch in reverse order: a variant's batch otherwise
		// always follows the same neighbour, and inherits its leftovers
		// (the apiserver's and etcd's garbage, watch fan-out, compaction).
		order := make([]int, len(variants))
		for i := range order {
			order[i] = i
			if b%2 == 1 {
				order[i] = len(variants) - 1 - i
			}
		}
		for _, i := range order {
			v := variants[i]
			c0 := processCPU()
			n0 := podMutations(t)
			d := create(v, b*per, per)
			calls[i] += podMutations(t) - n0
			took[i] += d
			batchTook[i] = append(batchTook[i], d)
			c1 := processCPU()
			if cpu[i] == nil {
				cpu[i] = map[string]time.Duration{}
			}
			for k := range c1 {
				cpu[i][k] += c1[k] - c0[k]
			}
		}
	}
	rate := func(i int) float64 { return float64(total) / took[i].Seconds() }
	perPod := func(d time.Duration) string {
		return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000/float64(total))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d pods per variant, %d workers, load average %s\n", total, workers, loadAverage())
	fmt.Fprintf(&b, "| variant | pods/s | ratio | per-batch ratio: median (min–max) | CPU ms/pod: kube-apiserver | etcd | test process (clients + webhook server) | gpupack pod webhook answers/pod |\n|---|---|---|---|---|---|---|---|\n")
	for i, v := range variants {
		base := v.base
		// Batch k of every variant ran back to back: their ratio is the
		// least disturbed by load that comes and goes.
		rs := make([]float64, batches)
		for k := range rs {
			rs[k] = batchTook[base][k].Seconds() / batchTook[i][k].Seconds()
		}
		sort.Float64s(rs)
		med := (rs[batches/2-1] + rs[batches/2]) / 2
		fmt.Fprintf(&b, "| %s | %.0f | %.3f | %.3f (%.2f–%.2f) | %s | %s | %s | %.2f |\n", v.name, rate(i), rate(i)/rate(base), med, rs[0], rs[batches-1],
			perPod(cpu[i]["kube-apiserver"]), perPod(cpu[i]["etcd"]), perPod(cpu[i]["self"]), calls[i]/float64(total))
	}
	fmt.Fprintf(&b, "(job, JobSet, LWS and CPU pods: ratio to the same pods without webhooks; the stand-in + gpupack: to the stand-in alone)\n")
	p50, p99 := webhookLatency(t, env, "mpod.gpupack.io")
	n50, n99 := webhookLatency(t, env, "allow-mpod.gpupack.io")
	fmt.Fprintf(&b, "apiserver-observed gpupack mutating call p50 ≤ %s, p99 ≤ %s (allow-all: p50 ≤ %s, p99 ≤ %s)", p50, p99, n50, n99)
	t.Log("\n" + b.String())
	// What the fast path promises, asserted (the timings are not): the
	// pod webhook saw none of the job, JobSet or LWS pods.
	for _, i := range []int{jobFast, jobSetFast, lwsGpupack, lwsStandInGpupack} {
		if calls[i] != 0 {
			t.Errorf("%s: the pod webhook answered %v times for %d pods, want 0", variants[i].name, calls[i], total)
		}
	}
}

// processCPU is the CPU time used so far by kube-apiserver, etcd and this
// process (which runs both the creating clients and the webhook server).
func processCPU() map[string]time.Duration {
	out := map[string]time.Duration{}
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		s := string(raw)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		name := s[open+1 : closing]
		if filepath.Base(filepath.Dir(path)) == self {
			name = "self"
		} else if name != "kube-apiserver" && name != "etcd" {
			continue
		}
		f := strings.Fields(s[closing+2:])
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		// USER_HZ is 100 on every Linux this runs on.
		out[name] += time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return out
}

func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(raw))[:3], " ")
}

// webhookLatency reads the apiserver's admission webhook histogram for the
// pod webhooks and returns the bucket bounds holding p50 and p99.
func webhookLatency(t *testing.T, env *framework.Env, name string) (string, string) {
	raw, err := env.Clientset.RESTClient().Get().AbsPath("/metrics").DoRaw(env.Ctx)
	if err != nil {
		t.Logf("apiserver metrics: %v", err)
		return "?", "?"
	}
	type bucket struct {
		le    string
		count float64
	}
	var bs []bucket
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "apiserver_admission_webhook_admission_duration_seconds_bucket{") || !strings.Contains(l, `name="`+name+`"`) {
			continue
		}
		i := strings.Index(l, `le="`)
		le := l[i+4 : i+4+strings.IndexByte(l[i+4:], '"')]
		var c float64
		fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &c)
		// Sum over operation/rejected label combinations per bound.
		found := false
		for k := range bs {
			if bs[k].le == le {
				bs[k].count += c
				found = true
			}
		}
		if !found {
			bs = append(bs, bucket{le, c})
		}
	}
	if len(bs) == 0 {
		return "?", "?"
	}
	totalCount := bs[len(bs)-1].count
	q := func(f float64) string {
		for _, b := range bs {
			if b.count >= f*totalCount {
				return b.le + "s"
			}
		}
		return "+Inf"
	}
	return q(0.5), q(0.99)
}

// installPolicies creates gpupack's shipped ValidatingAdmissionPolicies
// with their bindings limited to namespaces, and waits until they apply.
func installPolicies(t *testing.T, env *framework.Env, namespaces []string) {
	t.Helper()
	sel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: namespaces}}}
	for _, u := range framework.ReadObjects(t, "manifests/base/policy/*.yaml") {
		if u.GetKind() == "ValidatingAdmissionPolicyBinding" {
			var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
			if err := runtimeConvert(u, &b); err != nil {
				t.Fatal(err)
			}
			b.Spec.MatchResources = &admissionregistrationv1.MatchResources{NamespaceSelector: sel}
			env.MustCreate(t, &b)
			continue
		}
		env.MustCreate(t, u)
	}
	env.Eventually(t, 30*time.Second, "the placement policy applies", func() (bool, string) {
		p := gpuPod(namespaces[0], fmt.Sprintf("probe-%d", time.Now().UnixNano()), nil, corev1.Container{})
		p.Annotations = map[string]string{v1alpha1.AnnotationDevices: "GPU-x:1"}
		err := env.Client.Create(env.Ctx, p)
		return err != nil && strings.Contains(err.Error(), "gpupack-placement"), fmt.Sprint(err)
	})
}

func runtimeConvert(u *unstructured.Unstructured, into any) error {
	return kruntime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
}
