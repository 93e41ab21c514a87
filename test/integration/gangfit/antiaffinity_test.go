package gangfit

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

// startPlacing: the control plane with kube-scheduler and kwok, gpupack's
// webhooks, check and placement ungater, nodes a1..aN of gpus H100s each,
// and a ClusterQueue "cq" (quota 8) with the check behind LocalQueue "lq".
func startPlacing(t *testing.T, opts framework.Options, nodes, gpus int) *suite {
	t.Helper()
	env := framework.Start(t, opts)
	for i := 1; i <= nodes; i++ {
		env.CreateNode(t, framework.MakeNode(fmt.Sprintf("a%d", i)).GPUs(gpus, framework.H100).Obj())
	}
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"},
		Spec: v1alpha1.GangFitParametersSpec{RetryBackoff: v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)}}})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))
	cfg := webhooks.Config{Kueue: mutation.KueueConfig{Frameworks: opts.KueueFrameworks()}}
	wopts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		if err := webhooks.Setup(mgr, cfg); err != nil {
			return err
		}
		if err := admissioncheck.Setup(mgr, admissioncheck.Options{}); err != nil {
			return err
		}
		return placement.Setup(mgr)
	}, wopts)
	serve, err := webhooks.DefaultServeOptions().WithFastPath(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mwc, vwc := webhooks.WebhookConfigurations(serve)
	env.InstallWebhooks(t, wopts, mwc, vwc)
	env.WaitForAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 8, framework.H100).AdmissionChecks("gang-fit").Obj())
	s := &suite{env: env, ns: env.Namespace(t, "team")}
	env.MustCreate(t, framework.MakeLocalQueue("lq", s.ns, "cq"))
	return s
}

// TestPodAntiAffinityReplicasBind: a Deployment of three one-GPU inference
// replicas, one per node, through Kueue's pod integration — one Workload
// per pod, decided side by side before any pod is bound — on four nodes of
// two GPUs: every replica binds, each on its own node. Each replica's plan
// records its pods' labels and terms (gpupack.io/pod-affinity), so the
// next decision keeps apart from a plan whose pod is not bound yet;
// without that record BestFit puts the second replica beside the first.
func TestPodAntiAffinityReplicasBind(t *testing.T) {
	s := startPlacing(t, framework.Options{Scheduler: true, PodIntegration: true, JobPodsKeepRunning: true}, 4, 2)
	env := s.env
	labels := map[string]string{"app": "infer"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "infer", Namespace: s.ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "lq"}},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Tolerations:                   []corev1.Toleration{framework.KwokToleration},
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
						TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}}}},
					Containers: []corev1.Container{{Name: "server", Image: "vllm/vllm-openai",
						Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}},
				}}},
	}
	env.MustCreate(t, d)
	env.Eventually(t, 120*time.Second, "3 replicas bound, one per node", func() (bool, string) {
		var pods corev1.PodList
		_ = env.Client.List(env.Ctx, &pods, client.InNamespace(s.ns), client.MatchingLabels(labels))
		bound := map[string]bool{}
		var where []string
		for _, p := range pods.Items {
			where = append(where, fmt.Sprintf("%s on %q (%s, gates %d, plan %q)", p.Name, p.Spec.NodeName, p.Status.Phase, len(p.Spec.SchedulingGates), p.Annotations[v1alpha1.AnnotationPlan]))
			if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				bound[p.Spec.NodeName] = true
			}
		}
		sort.Strings(where)
		return len(bound) == 3, strings.Join(where, "; ")
	})
}

// TestPodAntiAffinityPodsBind (issue 17 item 5): a PyTorchJob of one
// master and two workers, one GPU each, whose pods repel each other per
// node (required pod anti-affinity, kubernetes.io/hostname, on their own
// label, as NCCL-over-IB and inference replicas are often written), on
// four nodes of two GPUs. A pod with the same label already runs on a1. The
// whole path runs — webhooks, the check, Kueue, the placement gate and
// ungater pinning each pod to its planned node, kube-scheduler, kwok — and
// every pod must bind: three nodes, none of them a1. A plan that packs two
// pods onto one node (the engine without Apart) or uses a1 (without the
// running pods' side) leaves a pinned pod the scheduler refuses for ever.
func TestPodAntiAffinityPodsBind(t *testing.T) {
	s := startPlacing(t, framework.Options{Scheduler: true, TrainingOperator: true}, 4, 2)
	env := s.env
	ring := map[string]string{"app": "ring"}
	anti := &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: ring}}}}}
	// Already running on a1 (bound directly, no GPU): the scheduler keeps
	// every ring pod off a1.
	env.MustCreate(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ring-old", Namespace: s.ns, Labels: ring},
		Spec: corev1.PodSpec{NodeName: "a1", Tolerations: []corev1.Toleration{framework.KwokToleration},
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}})
	env.Eventually(t, 60*time.Second, "ring-old running on a1", func() (bool, string) {
		var p corev1.Pod
		if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: "ring-old"}, &p); err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})

	job := framework.MakePyTorchJob("ring", s.ns, "lq", 2, 1).Obj()
	for _, rs := range job.Spec.PyTorchReplicaSpecs {
		rs.Template.Labels = ring
		rs.Template.Spec.Affinity = anti
	}
	env.MustCreate(t, job)
	wl := s.env.WaitForWorkloadOf(t, s.ns, "ring", "PyTorchJob", admitted)
	var plan v1alpha1.GPUPlan
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: s.ns, Name: wl.Name}, &plan); err != nil {
		t.Fatal(err)
	}
	planned := map[string]int{}
	for _, a := range plan.Spec.Assignments {
		planned[a.Node]++
	}
	t.Logf("plan: %v", planned)
	if len(planned) != 3 || planned["a1"] > 0 {
		t.Errorf("plan puts the 3 pods on %v; want 3 nodes other than a1", planned)
	}
	env.Eventually(t, 120*time.Second, "the 3 pods bound, one per node, none on a1", func() (bool, string) {
		pods := s.podsOf(t, "ring")
		var where []string
		bound := map[string]bool{}
		for _, p := range pods {
			where = append(where, fmt.Sprintf("%s on %q (%s, gates %d)", p.Name, p.Spec.NodeName, p.Status.Phase, len(p.Spec.SchedulingGates)))
			if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning {
				bound[p.Spec.NodeName] = true
			}
		}
		sort.Strings(where)
		return len(bound) == 3 && !bound["a1"] && running(pods) == 3, strings.Join(where, "; ")
	})
}
