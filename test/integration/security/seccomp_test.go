package security

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// seccomp profiles as a pod or container sets them.
func profile(t corev1.SeccompProfileType) *corev1.SeccompProfile {
	p := &corev1.SeccompProfile{Type: t}
	if t == corev1.SeccompProfileTypeLocalhost {
		p.LocalhostProfile = ptr.To("profiles/gpu.json")
	}
	return p
}

func withProfile(c corev1.Container, t corev1.SeccompProfileType) corev1.Container {
	c.SecurityContext = &corev1.SecurityContext{SeccompProfile: profile(t)}
	return c
}

// unconfinedCases put seccomp Unconfined on each level of a GPU pod (the
// pod itself with confined containers, a regular container, an init
// container, a native sidecar); want is how gpupack's webhook names it.
func unconfinedCases() []struct {
	name, want string
	set        func(*corev1.Pod)
} {
	always := corev1.ContainerRestartPolicyAlways
	u := corev1.SeccompProfileTypeUnconfined
	return []struct {
		name, want string
		set        func(*corev1.Pod)
	}{
		{"pod", "the pod asks for GPUs and sets securityContext.seccompProfile Unconfined", func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: profile(u)}
			p.Spec.Containers[0] = withProfile(p.Spec.Containers[0], corev1.SeccompProfileTypeRuntimeDefault)
		}},
		{"container", `container "trainer" sets securityContext.seccompProfile Unconfined`, func(p *corev1.Pod) {
			p.Spec.Containers[0] = withProfile(p.Spec.Containers[0], u)
		}},
		{"init container", `init container "init" sets securityContext.seccompProfile Unconfined`, func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{withProfile(corev1.Container{Name: "init", Image: "busybox"}, u)}
		}},
		{"sidecar", `sidecar container "side" sets securityContext.seccompProfile Unconfined`, func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{withProfile(corev1.Container{Name: "side", Image: "busybox", RestartPolicy: &always}, u)}
		}},
	}
}

// debugPod adds an ephemeral container to a pod as alice, by the
// subresource's update (kubectl debug's older path) or by a strategic
// merge patch of it (what kubectl debug sends today).
func (c *cluster) debugPod(t *testing.T, ns, pod string, ec corev1.EphemeralContainerCommon, patch bool) error {
	t.Helper()
	ctx := c.env.Ctx
	if ec.Image == "" {
		ec.Image = "busybox"
	}
	if patch {
		raw, _ := json.Marshal(map[string]any{"spec": map[string]any{"ephemeralContainers": []corev1.EphemeralContainer{{EphemeralContainerCommon: ec}}}})
		_, err := c.aliceCS.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, raw, metav1.PatchOptions{}, "ephemeralcontainers")
		return err
	}
	cur, err := c.aliceCS.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cur.Spec.EphemeralContainers = append(cur.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: ec})
	_, err = c.aliceCS.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, pod, cur, metav1.UpdateOptions{})
	return err
}

// deniedBy fails unless err is a refusal by the named admission step (a
// webhook's or a policy's name) whose message contains want.
func deniedBy(t *testing.T, what string, err error, by, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want denied by %s (%q)", what, by, want)
		return
	}
	if !strings.Contains(err.Error(), by) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: err = %v, want a denial by %s containing %q", what, err, by, want)
	}
}

// TestSeccomp: open finding 3. A GPU process that may create a nested user
// + mount namespace (seccomp Unconfined) can mount its own file over the
// read-only limits file there, so gpupack's pod webhook confines GPU pods
// (RuntimeDefault on the pod when it names no profile) and refuses
// Unconfined at every level, and the gpupack-seccomp policy refuses what
// the webhooks never saw. Pod Security baseline refuses an explicit
// Unconfined but admits a pod that names no profile — which the runtime
// then runs unconfined; the namespace without Pod Security has gpupack
// alone.
func TestSeccomp(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx

	t.Run("the webhook confines GPU pods", func(t *testing.T) {
		for _, ns := range []string{c.baseline, c.open} {
			p := gpuPod(ns, "confined")
			if err := c.alice.Create(ctx, p); err != nil {
				t.Fatalf("%s: %v", ns, err)
			}
			if sc := p.Spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: stored GPU pod's securityContext %+v, want seccompProfile RuntimeDefault", ns, sc)
			}
			// A debug container with no profile of its own inherits it.
			if ns == c.open {
				if err := c.debugPod(t, ns, p.Name, corev1.EphemeralContainerCommon{Name: "dbg-ok"}, false); err != nil {
					t.Errorf("a plain debug container in a confined GPU pod: %v", err)
				}
			}
		}
		// A Job's template is confined when it is applied, so its pods
		// arrive confined.
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "confined", Namespace: c.open, Labels: map[string]string{mutation.LabelQueueName: "gpu"}},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "trainer", Image: "trainer:test", Resources: corev1.ResourceRequirements{Limits: rl("nvidia.com/gpu", "1")}}}}}},
		}
		if err := c.alice.Create(ctx, job); err != nil {
			t.Fatal(err)
		}
		if sc := job.Spec.Template.Spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("stored GPU Job template's securityContext %+v, want seccompProfile RuntimeDefault", sc)
		}
		// A CPU pod is none of gpupack's business.
		cpu := cpuPod(c.open, "cpu-unconfined")
		cpu.Spec.Containers[0] = withProfile(cpu.Spec.Containers[0], corev1.SeccompProfileTypeUnconfined)
		if err := c.alice.Create(ctx, cpu); err != nil {
			t.Errorf("an unconfined CPU pod: %v", err)
		}
	})

	t.Run("the webhook refuses Unconfined", func(t *testing.T) {
		for _, tc := range unconfinedCases() {
			p := gpuPod(c.open, "unconfined")
			tc.set(p)
			deniedBy(t, "Unconfined on the "+tc.name, c.alice.Create(ctx, p), `admission webhook "mpod.gpupack.io"`, tc.want)
			job := &batchv1.Job{
				ObjectMeta: metav1.ObjectMeta{Name: "unconfined", Namespace: c.open, Labels: map[string]string{mutation.LabelQueueName: "gpu"}},
				Spec:       batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{ObjectMeta: *p.ObjectMeta.DeepCopy(), Spec: *p.Spec.DeepCopy()}},
			}
			job.Spec.Template.Name, job.Spec.Template.Namespace = "", ""
			delete(job.Spec.Template.Annotations, v1alpha1.AnnotationPlan) // Kueue writes it when it starts the job
			job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
			deniedBy(t, "Unconfined on a Job template's "+tc.name, c.alice.Create(ctx, job), `admission webhook "mjob.gpupack.io"`, "pod template: "+tc.want)
		}
		// Localhost is the node administrator's profile: allowed.
		local := gpuPod(c.open, "localhost")
		local.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: profile(corev1.SeccompProfileTypeLocalhost)}
		if err := c.alice.Create(ctx, local); err != nil {
			t.Errorf("a GPU pod under a Localhost profile: %v", err)
		}

		// kubectl debug, by update and by patch of the subresource. The
		// policy answers ephemeral containers before the validating
		// webhook does, so the webhook's own answer is tried with the
		// policy unbound.
		target := gpuPod(c.open, "debug-unconfined")
		if err := c.alice.Create(ctx, target); err != nil {
			t.Fatal(err)
		}
		c.withoutPolicy(t, "gpupack-seccomp")
		for _, patch := range []bool{false, true} {
			ec := corev1.EphemeralContainerCommon{Name: "dbg-u", SecurityContext: &corev1.SecurityContext{SeccompProfile: profile(corev1.SeccompProfileTypeUnconfined)}}
			if patch {
				ec.Name = "dbg-u-patched"
			}
			var last error
			env.Eventually(t, 30*time.Second, "the policy is unbound", func() (bool, string) {
				last = c.debugPod(t, c.open, target.Name, ec, patch)
				return last == nil || !strings.Contains(last.Error(), "gpupack-seccomp"), fmt.Sprint(last)
			})
			deniedBy(t, "an Unconfined ephemeral container (patch "+map[bool]string{false: "no", true: "yes"}[patch]+")", last,
				`admission webhook "vpod.gpupack.io"`, `ephemeral container "`+ec.Name+`" sets securityContext.seccompProfile Unconfined`)
		}
	})

	// The backstop: gpupack's pod webhooks taken out of the way (as an
	// admin could by mistake, a webhook ordering or reinvocation could
	// undo, or a pod created past them would be), the policy alone refuses
	// every unconfined GPU container.
	t.Run("the policy alone", func(t *testing.T) {
		c.withoutPodWebhooks(t)
		plain := gpuPod(c.open, "plain")
		env.Eventually(t, 30*time.Second, "the pod webhook is gone and the policy refuses an unconfined GPU pod", func() (bool, string) {
			p := plain.DeepCopy()
			p.Name, p.GenerateName = "", "plain-"
			err := c.alice.Create(ctx, p)
			if err == nil {
				_ = env.Client.Delete(ctx, p)
				return false, "created"
			}
			return strings.Contains(err.Error(), "gpupack-seccomp"), err.Error()
		})
		deniedBy(t, "a GPU pod that names no profile", c.alice.Create(ctx, plain.DeepCopy()), "gpupack-seccomp", "and trainer would not")
		for _, tc := range unconfinedCases() {
			p := gpuPod(c.open, "unconfined")
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: profile(corev1.SeccompProfileTypeRuntimeDefault)}
			tc.set(p)
			want := map[string]string{"pod": "may not set seccompProfile Unconfined", "container": "and trainer would not", "init container": "and init would not", "sidecar": "and side would not"}[tc.name]
			deniedBy(t, "Unconfined on the "+tc.name, c.alice.Create(ctx, p), "gpupack-seccomp", want)
		}
		// The Job controller's pods are held to it too.
		ctl, err := client.New(env.UserConfig(t, "system:kube-controller-manager", "system:masters"), client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		fromJob := gpuPod(c.open, "from-job")
		fromJob.Spec.Containers[0] = withProfile(fromJob.Spec.Containers[0], corev1.SeccompProfileTypeUnconfined)
		deniedBy(t, "the Job controller's unconfined GPU pod", ctl.Create(ctx, fromJob), "gpupack-seccomp", "and trainer would not")

		confined := gpuPod(c.open, "confined-alone")
		confined.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: profile(corev1.SeccompProfileTypeRuntimeDefault)}
		if err := c.alice.Create(ctx, confined); err != nil {
			t.Fatalf("a confined GPU pod: %v", err)
		}
		local := gpuPod(c.open, "localhost-alone")
		local.Spec.Containers[0] = withProfile(local.Spec.Containers[0], corev1.SeccompProfileTypeLocalhost)
		if err := c.alice.Create(ctx, local); err != nil {
			t.Errorf("a GPU pod whose container runs under Localhost: %v", err)
		}
		for _, patch := range []bool{false, true} {
			name := map[bool]string{false: "dbg-u", true: "dbg-u-patched"}[patch]
			deniedBy(t, "an Unconfined ephemeral container", c.debugPod(t, c.open, confined.Name,
				corev1.EphemeralContainerCommon{Name: name, SecurityContext: &corev1.SecurityContext{SeccompProfile: profile(corev1.SeccompProfileTypeUnconfined)}}, patch),
				"gpupack-seccomp", "and "+name+" would not")
		}
		if err := c.debugPod(t, c.open, confined.Name, corev1.EphemeralContainerCommon{Name: "dbg-ok"}, true); err != nil {
			t.Errorf("a debug container that inherits the pod's RuntimeDefault: %v", err)
		}
		// Other updates of a GPU pod are not the policy's business, even of
		// a pod stored unconfined before it was installed (an annotation:
		// a planned pod's labels are gpupack-placement's, review 11 F2).
		if err := c.alice.Patch(ctx, confined.DeepCopy(), annPatch("team", "a")); err != nil {
			t.Errorf("annotating a GPU pod: %v", err)
		}
	})
}

// withoutPolicy deletes a policy's binding until the test ends.
func (c *cluster) withoutPolicy(t *testing.T, name string) {
	t.Helper()
	env, ctx := c.env, c.env.Ctx
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, b); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		restored := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: b.Labels}, Spec: b.Spec}
		if err := env.Client.Create(ctx, restored); err != nil {
			t.Error(err)
		}
	})
}

// withoutPodWebhooks removes gpupack's pod entries from its webhook
// configurations until the test ends, and waits until the apiserver calls
// them again afterwards.
func (c *cluster) withoutPodWebhooks(t *testing.T) {
	t.Helper()
	env, ctx := c.env, c.env.Ctx
	o := webhooks.DefaultServeOptions()
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: o.MutatingName}, mwc); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: o.ValidatingName}, vwc); err != nil {
		t.Fatal(err)
	}
	savedM, savedV := mwc.Webhooks, vwc.Webhooks
	var m []admissionregistrationv1.MutatingWebhook
	for _, w := range savedM {
		if w.Name != "mpod.gpupack.io" {
			m = append(m, w)
		}
	}
	var v []admissionregistrationv1.ValidatingWebhook
	for _, w := range savedV {
		if w.Name != "vpod.gpupack.io" {
			v = append(v, w)
		}
	}
	if len(m) == len(savedM) || len(v) == len(savedV) {
		t.Fatalf("no pod webhooks in %s / %s", mwc.Name, vwc.Name)
	}
	mwc.Webhooks, vwc.Webhooks = m, v
	if err := env.Client.Update(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Update(ctx, vwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, obj := range []client.Object{mwc, vwc} {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				t.Error(err)
			}
		}
		mwc.Webhooks, vwc.Webhooks = savedM, savedV
		if err := env.Client.Update(ctx, mwc); err != nil {
			t.Error(err)
		}
		if err := env.Client.Update(ctx, vwc); err != nil {
			t.Error(err)
		}
		env.Eventually(t, 30*time.Second, "the pod webhook is back", func() (bool, string) {
			p := gpuPod(c.open, "")
			p.GenerateName = "back-"
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: profile(corev1.SeccompProfileTypeRuntimeDefault)}
			if err := c.alice.Create(ctx, p); err != nil {
				return false, err.Error()
			}
			_ = env.Client.Delete(ctx, p)
			_, converted := p.Spec.Containers[0].Resources.Limits["gpupack.io/vgpu"]
			return converted, "stored unconverted"
		})
	})
}
