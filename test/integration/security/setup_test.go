// Package security runs the API-side attacks of issue 14 through a real
// kube-apiserver (its PodSecurity admission is on), as tenant users with
// the `edit` ClusterRole in one namespace, against gpupack's webhooks and
// the shipped RBAC and ValidatingAdmissionPolicies (manifests/base/rbac,
// manifests/base/policy). Each attack must be denied or have no effect.
// nodepath_test.go follows one tenant pod through the node side too (the
// device plugin against its fake kubelet, then the real hook under the
// limits file and a hostile environment); the node side's own cases are in
// test/integration/node and devicehook.
package security

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
)

const (
	managerUser = "system:serviceaccount:gpupack-system:gpupack-manager"
	nodeUser    = "system:serviceaccount:gpupack-system:gpupack-node"
	nodeClaim   = "authentication.kubernetes.io/node-name"
	h100        = "NVIDIA-H100-80GB-HBM3"
)

// cluster is one control plane with gpupack's webhooks, RBAC and policies.
type cluster struct {
	env *framework.Env
	// baseline enforces Pod Security "baseline"; open has no Pod Security
	// label, so only gpupack stands between a tenant and the node.
	baseline, open string
	// alice has `edit` in both namespaces. A planned pod she creates
	// through it is created as her Job's controller would create it
	// (throughJob); aliceSelf is alice creating it herself.
	alice, aliceSelf client.Client
	// aliceCS is alice as a clientset (subresources).
	aliceCS *kubernetes.Clientset
}

func startCluster(t *testing.T) *cluster { return startClusterWith(t, nil) }

// startClusterWith also installs the webhook entries of jobKinds
// (webhooks.ServeOptions.JobKinds).
func startClusterWith(t *testing.T, jobKinds []string) *cluster {
	return startClusterOpts(t, framework.Options{NoKueue: true}, jobKinds)
}

// startClusterOpts is startClusterWith on a control plane started with
// opts. With OperatorCRDs (the Ray, MPI and Trainer CRDs too) tenants
// may write every job kind, as the operators' installs let them (their
// editor roles aggregate to edit).
func startClusterOpts(t *testing.T, opts framework.Options, jobKinds []string) *cluster {
	t.Helper()
	return startClusterCfg(t, opts, jobKinds, webhooks.Config{})
}

// startClusterCfg is startClusterOpts with gpupack's webhook configuration
// cfg (its JobKinds, when unset, are jobKinds: the manager sets both from
// --job-kinds).
func startClusterCfg(t *testing.T, opts framework.Options, jobKinds []string, cfg webhooks.Config) *cluster {
	t.Helper()
	if cfg.JobKinds == nil {
		cfg.JobKinds = jobKinds
	}
	serve := webhooks.DefaultServeOptions()
	serve.JobKinds = jobKinds
	return startClusterServing(t, opts, serve, func(_ *framework.Env, mgr ctrl.Manager) error { return webhooks.Setup(mgr, cfg) })
}

// startClusterServing is startClusterOpts with the manager's setup and the
// installed configurations (WebhookConfigurations(serve), as shipped)
// chosen by the test; setup runs before the configurations are installed.
func startClusterServing(t *testing.T, opts framework.Options, serve webhooks.ServeOptions, setup func(env *framework.Env, mgr ctrl.Manager) error) *cluster {
	t.Helper()
	env := framework.Start(t, opts)
	c := &cluster{env: env}
	if opts.OperatorCRDs {
		env.MustCreate(t, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "job-kinds-edit", Labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
			Rules: []rbacv1.PolicyRule{{APIGroups: jobKindGroups, Resources: []string{"*"},
				Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
		})
	}
	// The shipped RBAC and policies, as written (no kustomize needed: the
	// base files name gpupack-system themselves).
	applyObjects(t, env, "manifests/base/rbac/*.yaml", "manifests/base/policy/*.yaml")
	whOpts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error { return setup(env, mgr) }, whOpts)
	mwc, vwc := webhooks.WebhookConfigurations(serve)
	env.InstallWebhooks(t, whOpts, mwc, vwc)

	env.AggregateClusterRole(t, "view") // edit aggregates view
	env.AggregateClusterRole(t, "edit")
	c.baseline = env.Namespace(t, "team-a")
	c.open = env.Namespace(t, "team-b")
	ns := &corev1.Namespace{}
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: c.baseline}, ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels["pod-security.kubernetes.io/enforce"] = "baseline"
	if err := env.Client.Update(env.Ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{c.baseline, c.open} {
		env.MustCreate(t, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "alice-edit", Namespace: n},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
			Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}},
		})
	}
	// kubectl debug: `edit` does not grant ephemeral containers; a
	// platform that lets tenants debug adds this.
	env.MustCreate(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "debug", Namespace: c.open},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/ephemeralcontainers"}, Verbs: []string{"update", "patch"}}}})
	env.MustCreate(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-debug", Namespace: c.open},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "debug"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}},
	})
	cfg := env.UserConfig(t, "alice")
	var err error
	if c.aliceSelf, err = client.New(cfg, client.Options{Scheme: env.Scheme}); err != nil {
		t.Fatal(err)
	}
	c.alice = &throughJob{Client: c.aliceSelf, c: c, controller: c.as(t, jobControllerUser, []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, nil), jobs: map[string]*batchv1.Job{}}
	if c.aliceCS, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	c.waitForPolicies(t)
	return c
}

// jobKindGroups are the API groups of the job kinds besides batch and apps.
var jobKindGroups = []string{"kubeflow.org", "jobset.x-k8s.io", "leaderworkerset.x-k8s.io", "ray.io", "trainer.kubeflow.org"}

// waitForPolicies type-checks every shipped policy against the
// apiserver's own schemas (what kube-controller-manager's status
// controller does, which this control plane does not run) and waits until
// the apiserver enforces them.
func (c *cluster) waitForPolicies(t *testing.T) {
	t.Helper()
	env := c.env
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	checker := &validating.TypeChecker{
		SchemaResolver: &resolver.ClientDiscoveryResolver{Discovery: dc},
		RestMapper:     env.Client.RESTMapper(),
	}
	var list admissionregistrationv1.ValidatingAdmissionPolicyList
	if err := env.Client.List(env.Ctx, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) < 4 {
		t.Fatalf("%d policies installed, want gpupack's 4", len(list.Items))
	}
	for i := range list.Items {
		if w := checker.Check(&list.Items[i]); len(w) > 0 {
			t.Fatalf("policy %s does not type-check: %+v", list.Items[i].Name, w)
		}
	}
	// Enforced: a CPU pod carrying gpupack.io/devices is refused.
	env.Eventually(t, 30*time.Second, "placement policy enforced", func() (bool, string) {
		p := cpuPod(c.open, "probe")
		p.GenerateName, p.Name = "probe-", ""
		p.Annotations = map[string]string{v1alpha1.AnnotationDevices: "GPU-x:1"}
		err := c.alice.Create(env.Ctx, p)
		if err == nil {
			_ = env.Client.Delete(env.Ctx, p)
			return false, "created"
		}
		return strings.Contains(err.Error(), "gpupack-placement"), err.Error()
	})
}

// as returns a client for user impersonated with extra (the admin may
// impersonate; RBAC and the policies see the impersonated user).
func (c *cluster) as(t *testing.T, user string, groups []string, extra map[string][]string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(c.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups, Extra: extra}
	cl, err := client.New(cfg, client.Options{Scheme: c.env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// jobControllerUser is kube-controller-manager's Job controller, which
// creates a Job's pods (unmanagedGPUs.ownerControllers).
const jobControllerUser = "system:serviceaccount:kube-system:job-controller"

// throughJob is alice's client, except that a pod carrying gpupack.io/plan
// with no controller is created as the Job controller creates the pods of
// alice's Job (jobOf: the plan's, a real suspended Job): only a trusted
// controller, for its owner, may create a planned pod (issue 14,
// finding 6), and that is how a tenant's planned pods come to exist — her
// template, the controller's create. The pod's spec is still what alice
// wrote, and Pod Security, the webhooks and the policies judge it.
type throughJob struct {
	client.Client
	c          *cluster
	controller client.Client
	mu         sync.Mutex
	jobs       map[string]*batchv1.Job
}

func (j *throughJob) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Annotations[v1alpha1.AnnotationPlan] == "" || metav1.GetControllerOf(p) != nil {
		return j.Client.Create(ctx, obj, opts...)
	}
	job, err := j.jobOf(ctx, p.Namespace, p.Annotations[v1alpha1.AnnotationPlan])
	if err != nil {
		return err
	}
	p.OwnerReferences = append(p.OwnerReferences, *metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job")))
	return j.controller.Create(ctx, p, opts...)
}

// jobOf is the suspended Job of plan in ns (created once, by the admin:
// no GPUs, so no webhook), which the plan's pods and Workload belong to.
func (j *throughJob) jobOf(ctx context.Context, ns, plan string) (*batchv1.Job, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	key := ns + "/" + plan
	if job, ok := j.jobs[key]; ok {
		return job, nil
	}
	// Queued: a planned pod counts only under a job Kueue manages.
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "job-" + strings.Trim(plan, "-"), Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "gpu"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}
	if err := j.c.env.Client.Create(ctx, job); err != nil {
		return nil, fmt.Errorf("the Job of plan %s: %w", plan, err)
	}
	j.jobs[key] = job
	return job, nil
}

// workloadOf creates the Workload of plan as Kueue makes it for the Job
// of the plan's pods (jobOf): named plan.Spec.WorkloadName, controlled by
// the Job. The ungater binds only pods of the plan's Workload.
func (c *cluster) workloadOf(t *testing.T, plan *v1alpha1.GPUPlan) {
	t.Helper()
	job, err := c.alice.(*throughJob).jobOf(c.env.Ctx, plan.Namespace, plan.Name)
	if err != nil {
		t.Fatal(err)
	}
	wl := &kueue.Workload{ObjectMeta: metav1.ObjectMeta{Name: plan.Spec.WorkloadName, Namespace: plan.Namespace,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}},
		Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{Name: kueue.DefaultPodSetName, Count: 1, Template: job.Spec.Template}}}}
	c.env.MustCreate(t, wl)
}

func (c *cluster) manager(t *testing.T) client.Client {
	return c.as(t, managerUser, []string{"system:serviceaccounts", "system:serviceaccounts:gpupack-system", "system:authenticated"}, nil)
}

func (c *cluster) node(t *testing.T, name string) client.Client {
	var extra map[string][]string
	if name != "" {
		extra = map[string][]string{nodeClaim: {name}}
	}
	return c.as(t, nodeUser, []string{"system:serviceaccounts", "system:serviceaccounts:gpupack-system", "system:authenticated"}, extra)
}

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

// gpuPod is a fractional GPU pod that Pod Security baseline admits. It
// carries a plan, as the pods of a workload the gang-fit check admitted
// do: a fractional pod that can never get one is denied (unplannedPod).
func gpuPod(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "4Gi", v1alpha1.AnnotationPlan: "plan-" + name}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{flavors.LabelGPUProduct: h100},
			Containers: []corev1.Container{{Name: "trainer", Image: "trainer:test",
				Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, "1")}}},
		},
	}
}

// wholeGPUPod asks for gpus whole GPUs, no queue name, no plan.
func wholeGPUPod(ns, name, gpus string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "trainer", Image: "trainer:test",
			Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, gpus)}}}},
	}
}

func cpuPod(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

// denied fails unless err is a refusal whose message contains want.
func denied(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want denied (%q)", what, want)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: err = %v, want one containing %q", what, err, want)
	}
}

// applyObjects creates the objects of the manifests at globs (those that
// exist already are kept).
func applyObjects(t *testing.T, env *framework.Env, globs ...string) {
	t.Helper()
	for _, glob := range globs {
		for _, u := range framework.ReadObjects(t, glob) {
			if err := env.Client.Create(env.Ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
}
