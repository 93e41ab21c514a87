package framework

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

// kueueMetricsCertDir is hard-coded in Kueue's main when internal cert
// management is off: it exits unless a key pair is there.
const kueueMetricsCertDir = "/etc/kueue/metrics/certs"

func (e *Env) startKueue(t TB, opts Options) {
	t.Helper()
	if err := ensureSelfSignedPair(kueueMetricsCertDir); err != nil {
		t.Fatalf("Kueue needs a metrics key pair in %s: %v", kueueMetricsCertDir, err)
	}
	wh := e.testEnv.WebhookInstallOptions
	waitForPodsReady := ""
	if opts.WaitForPodsReady {
		waitForPodsReady = "waitForPodsReady:\n  enable: true\n  timeout: 30s\n  blockAdmission: false\n"
	}
	frameworks := ""
	for _, f := range opts.KueueFrameworks() {
		frameworks += "  - " + f + "\n"
	}
	clientConnection := ""
	if opts.KueueClientQPS > 0 {
		clientConnection = fmt.Sprintf("clientConnection:\n  qps: %g\n  burst: %d\n", opts.KueueClientQPS, max(opts.KueueClientBurst, 1))
	}
	if sel := opts.KueueManagedJobsNamespaceSelector; sel != nil {
		raw, err := json.Marshal(sel)
		if err != nil {
			t.Fatalf("managedJobsNamespaceSelector: %v", err)
		}
		clientConnection += "managedJobsNamespaceSelector: " + string(raw) + "\n" // JSON is YAML
	}
	// No health-probe server ("0"): on a random port (127.0.0.1:0) the
	// kernel could hand it the webhook port envtest had just picked and
	// released, and Kueue then exited "listen tcp …: bind: address
	// already in use" (seen in a full run). Readiness is its webhook.
	cfg := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: "0"
metrics:
  bindAddress: "0"
webhook:
  host: %s
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
%s%sintegrations:
  frameworks:
%s`, wh.LocalServingHost, wh.LocalServingPort, wh.LocalServingCertDir, clientConnection, waitForPodsReady, frameworks)
	cfgPath := filepath.Join(e.Dir, "kueue-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	gates := "VisibilityOnDemand=false"
	if opts.KueueFeatureGates != "" {
		gates += "," + opts.KueueFeatureGates
	}
	p := e.StartProcess(t, "kueue", filepath.Join(ToolsDir(), "kueue"),
		"--config="+cfgPath, "--kubeconfig="+e.userKubeconfig(t, UserKueue), "--feature-gates="+gates, "--zap-log-level=2")
	// Kueue is ready when its webhooks answer: a dry-run create goes
	// through its ResourceFlavor mutating webhook.
	deadline := time.Now().Add(60 * time.Second)
	for {
		rf := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: "readiness-probe"}}
		err := e.Client.Create(e.Ctx, rf, client.DryRunAll)
		// Only Kueue's defaulting webhook adds its finalizer: a dry run
		// that comes back without it passed an apiserver whose admission
		// has not seen Kueue's webhook configuration yet.
		if err == nil && controllerutil.ContainsFinalizer(rf, kueue.ResourceInUseFinalizerName) {
			return
		}
		if err == nil {
			err = fmt.Errorf("the dry-run ResourceFlavor came back without %s: Kueue's webhook not called yet", kueue.ResourceInUseFinalizerName)
		}
		if p.Exited() {
			t.Fatalf("kueue exited:\n%s", p.Tail(30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("kueue webhooks not answering after 60s: %v\n%s", err, p.Tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *Env) startScheduling(t TB, opts Options) {
	t.Helper()
	tools := ToolsDir()
	controllers := "job-controller,garbage-collector-controller,node-lifecycle-controller,pod-garbage-collector-controller,taint-eviction-controller,replicaset-controller,deployment-controller"
	if opts.LWSController {
		controllers += ",statefulset-controller" // LWS makes StatefulSets
	}
	e.StartProcess(t, "kube-scheduler", filepath.Join(tools, "kube-scheduler"),
		"--kubeconfig="+e.Kubeconfig, "--authentication-kubeconfig="+e.Kubeconfig,
		"--authorization-kubeconfig="+e.Kubeconfig, "--secure-port=0", "--leader-elect=false", "--v=1")
	e.StartProcess(t, "kube-controller-manager", filepath.Join(tools, "kube-controller-manager"),
		"--kubeconfig="+e.userKubeconfig(t, UserKubeControllerManager), "--secure-port=0", "--leader-elect=false", "--v=1",
		"--use-service-account-credentials=false",
		"--controllers="+controllers,
		"--node-monitor-grace-period=40s", "--concurrent-job-syncs=10", "--concurrent-gc-syncs=10")
	stages, err := kwokStages()
	if err != nil {
		t.Fatalf("%v", err)
	}
	if opts.JobPodsKeepRunning {
		keep := stages[:0]
		for _, s := range stages {
			if filepath.Base(s) != "pod-complete.yaml" {
				keep = append(keep, s)
			}
		}
		stages = keep
	}
	args := []string{"--kubeconfig=" + e.Kubeconfig,
		"--manage-all-nodes=false",
		// A label selector, which the apiserver applies to kwok's watch: a
		// node whose label is taken off leaves the watch and kwok lets go of
		// it (SetKubelet). kwok checks an annotation selector only on its
		// side and never drops a node that stops matching.
		"--manage-nodes-with-label-selector=" + KwokNodeLabel + "=" + KwokNodeLabelValue,
		"--node-lease-duration-seconds=40",
		"--server-address=127.0.0.1:0",
	}
	for _, s := range stages {
		args = append(args, "--config="+s)
	}
	e.StartProcess(t, "kwok", filepath.Join(tools, "kwok"), args...)
}

// kwokStages are the "fast" node and pod stages kwok ships: nodes become
// Ready at once, pods run at once and Job pods complete.
func kwokStages() ([]string, error) {
	dir := filepath.Join(ToolsDir(), "kwok-stages")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("kwok stages missing in %s (run hack/build-tools.sh): %v", dir, err)
	}
	return files, nil
}

// ensureSelfSignedPair makes a self-signed key pair in dir unless a
// matching one is there. Two test packages run at once (make test's -p 2)
// and may both find none on a fresh machine: each writes its pair into a
// directory of its own and renames it into place, so dir never holds one
// package's key next to the other's certificate (the loser keeps the
// winner's pair).
func ensureSelfSignedPair(dir string) error {
	if pairOK(dir) {
		return nil
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // gone after a successful rename
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	pk, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kueue-metrics-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &pk.PublicKey, pk)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalECPrivateKey(pk)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	// rename(2) replaces a missing or empty directory; a full one means
	// another package got there first.
	if err := os.Rename(tmp, dir); err != nil && !pairOK(dir) {
		return fmt.Errorf("%s holds no matching tls.crt/tls.key and cannot be replaced (%v); remove it", dir, err)
	}
	return nil
}

// pairOK: dir holds a tls.crt and tls.key that belong together.
func pairOK(dir string) bool {
	_, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	return err == nil
}

func (e *Env) startTrainingOperator(t TB) {
	t.Helper()
	// Its cert rotator updates (never creates) this Secret and exits
	// without it; its webhooks are not installed here, the certs go unused.
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "training-operator-webhook-cert", Namespace: "kubeflow"}}
	if err := e.Client.Create(e.Ctx, sec); err != nil {
		t.Fatalf("training-operator secret: %v", err)
	}
	// It also waits for its serving certificate on disk (a mounted Secret in
	// a cluster) and for CA injection into its webhook configuration.
	if err := ensureSelfSignedPair("/tmp/k8s-webhook-server/serving-certs"); err != nil {
		t.Fatalf("training-operator certs: %v", err)
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "validator.training-operator.kubeflow.org"}}
	if err := e.Client.Create(e.Ctx, vwc); err != nil {
		t.Fatalf("training-operator webhook configuration: %v", err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatalf("%v", err)
	}
	e.StartProcess(t, "training-operator", filepath.Join(ToolsDir(), "training-operator"),
		"--kubeconfig="+e.userKubeconfig(t, UserTrainingOperator), "--enable-scheme=pytorchjob",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		fmt.Sprintf("--webhook-server-port=%d", port), "--zap-log-level=info")
}
