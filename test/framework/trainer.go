package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// UserTrainerController is the Kubeflow Trainer v2 controller manager's
// identity (its ServiceAccount in Trainer's manifests).
const UserTrainerController = "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"

// startTrainerController runs the real Kubeflow Trainer v2 controller
// manager (built by `hack/build-tools.sh trainer`), which makes the JobSet
// of each unsuspended TrainJob from its (Cluster)TrainingRuntime (the
// JobSet controller then makes the Jobs, kube-controller-manager the
// pods). Its webhooks (TrainJob defaulting and validation, runtime
// validation) are installed, pointed at it over loopback TLS with
// envtest's certificate. Its own certificate management is off; its
// configuration has no certificate directory, so it reads
// controller-runtime's default, $TMPDIR/k8s-webhook-server/serving-certs,
// under a TMPDIR of its own holding envtest's pair.
func (e *Env) startTrainerController(t TB) {
	t.Helper()
	bin := filepath.Join(ToolsDir(), "trainer")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("the trainer controller is not built (run hack/build-tools.sh trainer): %v", err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatalf("%v", err)
	}
	wh := e.testEnv.WebhookInstallOptions
	tmp := filepath.Join(e.Dir, "trainer-tmp")
	certs := filepath.Join(tmp, "k8s-webhook-server", "serving-certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		t.Fatalf("%v", err)
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		raw, err := os.ReadFile(filepath.Join(wh.LocalServingCertDir, f))
		if err != nil {
			t.Fatalf("envtest serving certificate: %v", err)
		}
		if err := os.WriteFile(filepath.Join(certs, f), raw, 0o600); err != nil {
			t.Fatalf("%v", err)
		}
	}
	cfg := fmt.Sprintf(`apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
certManagement:
  enable: false
health:
  healthProbeBindAddress: "0"
metrics:
  bindAddress: "0"
  secureServing: false
webhook:
  host: %s
  port: %d
`, wh.LocalServingHost, port)
	cfgPath := filepath.Join(e.Dir, "trainer-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	e.startProcessEnv(t, "trainer", bin, []string{"TMPDIR=" + tmp},
		"--config="+cfgPath, "--kubeconfig="+e.userKubeconfig(t, UserTrainerController), "--zap-log-level=info")
	dir, err := downloadedModuleDir(TrainerModule)
	if err != nil {
		t.Fatalf("%v", err)
	}
	objs := e.controllerWebhooks(t, dir, "manifests/base/webhook/manifests.yaml", "trainer-", port,
		func(string) bool { return true }, nil)
	e.createAndWaitWebhooks(t, "trainer", port, objs)
	// Its TrainJob controller starts its workers after its caches sync,
	// which on loaded cores can be seconds after its webhook answers: a
	// TrainJob Kueue admitted in between gets its JobSet made unsuspended
	// at once, which no cluster where the Trainer has been running sees.
	// controller-runtime says when the workers start (the Trainer has no
	// readiness probe of its own here).
	log := filepath.Join(e.Dir, "trainer.log")
	e.Eventually(t, 2*time.Minute, "the Trainer's TrainJob controller running", func() (bool, string) {
		raw, err := os.ReadFile(log)
		if err != nil {
			return false, err.Error()
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, `"msg":"Starting workers"`) && strings.Contains(line, `"controller":"trainjob_controller"`) {
				return true, ""
			}
		}
		return false, log + " does not say the trainjob_controller's workers started"
	})
}
