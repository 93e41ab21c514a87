// Package colocation runs gpupack with Kueue's pod and deployment
// integrations on the real kube-apiserver + Kueue + kube-scheduler + kwok,
// under the shipped ValidatingAdmissionPolicies (manifests/base/policy),
// with gpupack's manager running as its own service account and Kueue as
// its own (the policies tell them apart by user name):
//   - a fractional Deployment with a queue name gets one Workload per pod,
//     the gang-fit check plans each, Kueue's update carries the plan into
//     the gated pod, the ungater pins it (TestFractionalDeployment);
//   - a tenant cannot add gpupack.io/plan to a gated pod of its own, also
//     while Kueue's gate is on (TestTenantCannotAddPlan);
//   - a whole-GPU pod Kueue admits outside the check by preempting an
//     opted-in pod waits at the placement gate while the coordinator has
//     that victim checkpointing or terminating, and a pod nobody preempted
//     for is not held by it (TestPreemptorOutsideTheCheckWaitsForItsVictims).
package colocation

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

const managerUser = "system:serviceaccount:gpupack-system:gpupack-manager"

// unselectedNamespace is a namespace the suite's Kueue does not manage:
// its managedJobsNamespaceSelector (mirrored in gpupack's webhook
// configuration) leaves it out, as an administrator leaves out system or
// CI namespaces.
const unselectedNamespace = "not-managed-by-kueue"

var unselectedByKueue = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
	Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "kueue-system", unselectedNamespace},
}}}

type cluster struct {
	env *framework.Env
	ns  string
	// alice may create and edit pods in ns (and nothing gpupack owns).
	alice client.Client
}

// startCluster: the control plane, the shipped policies, gpupack's check,
// webhooks and ungater as gpupack-manager, one node of 4 H100s, and a
// ClusterQueue "infer" with the gang-fit check behind LocalQueue "lq".
func startCluster(t *testing.T, extra func(ctrl.Manager) error) *cluster {
	t.Helper()
	kueueOpts := framework.Options{Scheduler: true, PodIntegration: true, JobPodsKeepRunning: true,
		KueueManagedJobsNamespaceSelector: unselectedByKueue}
	env := framework.Start(t, kueueOpts)
	for _, u := range framework.ReadObjects(t, "manifests/base/policy/*.yaml") {
		if err := env.Client.Create(env.Ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	// gpupack's manager as itself: the policies let only it pin pods.
	admin := env.Config
	env.Config = env.UserConfig(t, managerUser, "system:masters")
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		if err := admissioncheck.Setup(mgr, admissioncheck.Options{}); err != nil {
			return err
		}
		if err := webhooks.Setup(mgr, webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: kueueOpts.KueueFrameworks(),
			ManagedJobsNamespaceSelector: kueueOpts.KueueManagedJobsNamespaceSelector}}); err != nil {
			return err
		}
		if extra != nil {
			if err := extra(mgr); err != nil {
				return err
			}
		}
		return placement.Setup(mgr)
	}, opts)
	env.Config = admin
	mwc, vwc := webhooks.WebhookConfigurations(webhooks.DefaultServeOptions())
	env.InstallWebhooks(t, opts, mwc, vwc)

	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gang-fit"},
		Spec: v1alpha1.GangFitParametersSpec{RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](5)}}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gang-fit"))
	env.WaitForAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("infer").GPUFlavor("gpu", 4, framework.H100).AdmissionChecks("gang-fit").Obj())
	env.CreateNode(t, framework.MakeNode("gpu-node-a").GPUs(4, framework.H100).Obj())

	c := &cluster{env: env, ns: env.Namespace(t, "serving")}
	env.MustCreate(t, framework.MakeLocalQueue("lq", c.ns, "infer"))
	env.MustCreate(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: c.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}})
	env.MustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-pods", Namespace: c.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pods"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}}})
	var err error
	if c.alice, err = client.New(env.UserConfig(t, "alice"), client.Options{Scheme: env.Scheme}); err != nil {
		t.Fatal(err)
	}
	// The policies are enforced once a pod carrying gpupack.io/devices is refused.
	env.Eventually(t, 30*time.Second, "placement policy enforced", func() (bool, string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: c.ns,
			Annotations: map[string]string{v1alpha1.AnnotationDevices: "GPU-x:1"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		err := c.alice.Create(env.Ctx, p)
		if err == nil {
			_ = env.Client.Delete(env.Ctx, p)
			return false, "created"
		}
		return strings.Contains(err.Error(), "gpupack-placement"), err.Error()
	})
	return c
}

// gpuPodSpec is one container asking for gpus GPUs.
func gpuPodSpec(gpus int64) corev1.PodSpec {
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](5),
		Tolerations:                   []corev1.Toleration{framework.KwokToleration},
		Containers: []corev1.Container{{Name: "server", Image: "vllm/vllm-openai",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}}}},
	}
}

func gates(p *corev1.Pod) []string {
	var out []string
	for _, g := range p.Spec.SchedulingGates {
		out = append(out, g.Name)
	}
	return out
}

// workloads describes the Workloads of c.ns (for failure messages).
func workloads(c *cluster) []string {
	var wls kueue.WorkloadList
	_ = c.env.Client.List(c.env.Ctx, &wls, client.InNamespace(c.ns))
	var out []string
	for i := range wls.Items {
		out = append(out, framework.DescribeWorkload(&wls.Items[i]))
	}
	var evs corev1.EventList
	_ = c.env.Client.List(c.env.Ctx, &evs, client.InNamespace(c.ns))
	for _, e := range evs.Items {
		if e.Type == corev1.EventTypeWarning {
			out = append(out, "event "+e.InvolvedObject.Name+" "+e.Reason+": "+e.Message)
		}
	}
	return out
}
