// Package gangfit tests the gpupack.io/gang-fit AdmissionCheck against a real
// kube-apiserver and the real Kueue manager (and, where pods must run,
// kube-scheduler, kwok and the Kubeflow training operator).
package gangfit

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
)

type suite struct {
	env  *framework.Env
	ns   string
	stop func()
}

// setup starts the control plane, creates the nodes, a GangFitParameters
// with short retry backoff, the gang-fit AdmissionCheck, a ClusterQueue with
// enough quota for two jobs of `gpus` GPUs each (Kueue alone would reserve
// quota for both) and a LocalQueue "lq", then starts gpupack's check.
func setup(t *testing.T, opts framework.Options, spec v1alpha1.GangFitParametersSpec, gpus int64, nodes ...*corev1.Node) *suite {
	t.Helper()
	env := framework.Start(t, opts)
	for _, n := range nodes {
		env.CreateNode(t, n)
	}
	if spec.RetryBackoff.MinSeconds == nil {
		spec.RetryBackoff = v1alpha1.RetryBackoff{MinSeconds: ptr.To[int32](1), MaxSeconds: ptr.To[int32](2)}
	}
	env.MustCreate(t, &v1alpha1.GangFitParameters{ObjectMeta: metav1.ObjectMeta{Name: "gf"}, Spec: spec})
	env.MustCreate(t, framework.MakeGangFitCheck("gang-fit", "gf"))
	s := &suite{env: env}
	s.startManager(t)
	env.WaitForAdmissionCheckActive(t, "gang-fit")
	env.MustCreate(t, framework.MakeResourceFlavor("gpu"))
	env.MustCreate(t, framework.MakeClusterQueue("cq").GPUFlavor("gpu", 2*gpus, framework.H100).AdmissionChecks("gang-fit").Obj())
	s.ns = env.Namespace(t, "team")
	env.MustCreate(t, framework.MakeLocalQueue("lq", s.ns, "cq"))
	return s
}

func (s *suite) startManager(t *testing.T) {
	s.stop = s.env.StartManager(t, func(mgr ctrl.Manager) error {
		return admissioncheck.Setup(mgr, admissioncheck.Options{})
	})
}

func checkState(wl *kueue.Workload) *kueue.AdmissionCheckState {
	for i := range wl.Status.AdmissionChecks {
		if wl.Status.AdmissionChecks[i].Name == "gang-fit" {
			return &wl.Status.AdmissionChecks[i]
		}
	}
	return nil
}

func admitted(wl *kueue.Workload) bool {
	return apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted)
}

// events returns the messages of Events with a reason on an object.
func (s *suite) events(t *testing.T, name, reason string) []string {
	t.Helper()
	var evs corev1.EventList
	if err := s.env.Client.List(s.env.Ctx, &evs, client.InNamespace(s.ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}

// podsOf lists the pods of a PyTorchJob (training operator labels).
func (s *suite) podsOf(t *testing.T, job string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := s.env.Client.List(s.env.Ctx, &pods, client.InNamespace(s.ns), client.MatchingLabels{"training.kubeflow.org/job-name": job}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func running(pods []corev1.Pod) int {
	n := 0
	for _, p := range pods {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
