package framework

import (
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Controller identities of the MPI operator and KubeRay's operator.
const (
	UserMPIOperator = "system:serviceaccount:mpi-operator:mpi-operator"
	UserKubeRay     = "system:serviceaccount:ray-system:kuberay-operator"
)

// startMPIOperator runs the real MPI operator (built by
// `hack/build-tools.sh mpi-operator`): per MPIJob the worker pods (its
// own, controlled by the MPIJob), the launcher Job (whose pod
// kube-controller-manager's Job controller makes), a Service, a ConfigMap
// and an SSH Secret. It elects a leader in namespace mpi-operator, and
// serves its health check on :8080 (fixed in v0.8.0: two suites running
// it at once on one machine would collide).
func (e *Env) startMPIOperator(t TB) {
	t.Helper()
	bin := filepath.Join(ToolsDir(), "mpi-operator")
	e.createNamespace(t, "mpi-operator")
	e.StartProcess(t, "mpi-operator", bin, "--kubeConfig="+e.userKubeconfig(t, UserMPIOperator),
		"--lock-namespace=mpi-operator", "--kube-api-qps=100", "--kube-api-burst=200", "--v=2")
}

// startKubeRay runs KubeRay's real operator (built by
// `hack/build-tools.sh kuberay`): the RayCluster of a RayJob, and the head
// and worker pods of a RayCluster (each controlled by the RayCluster). It
// also runs a RayService controller, whose CRD is installed here (it waits
// for that informer). No Ray process runs in kwok's pods, so a RayJob's
// job is never submitted (InteractiveMode RayJobs wait for a job id).
func (e *Env) startKubeRay(t TB) {
	t.Helper()
	bin := filepath.Join(ToolsDir(), "kuberay")
	rayDir, err := moduleDir("github.com/ray-project/kuberay/ray-operator")
	if err != nil {
		t.Fatalf("%v", err)
	}
	if _, err := envtest.InstallCRDs(e.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(rayDir, "config", "crd", "bases", "ray.io_rayservices.yaml")}, ErrorIfPathMissing: true,
	}); err != nil {
		t.Fatalf("installing the RayService CRD: %v", err)
	}
	e.StartProcess(t, "kuberay", "/usr/bin/env", "KUBECONFIG="+e.userKubeconfig(t, UserKubeRay), bin,
		"--metrics-addr=0", "--health-probe-bind-address=0", "--enable-leader-election=false",
		"--log-stdout-encoder=console", "--qps=100", "--burst=200")
}

func (e *Env) createNamespace(t TB, name string) {
	t.Helper()
	if err := e.Client.Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("namespace %s: %v", name, err)
	}
}
