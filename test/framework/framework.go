// Package framework starts a real control plane for gpupack's integration
// tests and demo: kube-apiserver + etcd (through controller-runtime's
// envtest), the real Kueue manager as a subprocess, and — when asked —
// kube-scheduler, kube-controller-manager and kwok so pods are bound and run
// on fake GPU nodes. Binaries come from hack/build-tools.sh (built from the Go
// module proxy into _output/tools, once).
//
// Use:
//
//	env := framework.Start(t, framework.Options{Scheduler: true})
//	env.Client.Create(env.Ctx, framework.MakeNode("n1").GPUs(8, framework.H100).Obj())
//	stop := env.StartManager(t, func(mgr ctrl.Manager) error { return mycontroller.Setup(mgr) })
//
// Every component logs to a file under env.Dir; when a test fails the tail
// of each log is printed. Components are stopped by PID (process group) in
// t.Cleanup, also when the test fails or panics.
//
// gpupack's own webhooks are served by a manager started with
// env.WebhookServer() options and registered with env.InstallWebhooks, which
// points their configurations at the test process over loopback TLS.
package framework

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanoscheduling "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	volcanotopology "volcano.sh/apis/pkg/apis/topology/v1alpha1"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	gpupackv1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Options choose the components beyond kube-apiserver + etcd + Kueue.
type Options struct {
	// Scheduler starts kube-scheduler, kube-controller-manager and kwok, so
	// pods are bound and run on fake nodes (those labelled by MakeNode).
	Scheduler bool
	// NoKueue skips the Kueue manager (for tests of gpupack parts alone).
	NoKueue bool
	// KueueFeatureGates are extra --feature-gates for Kueue (k=v,…).
	KueueFeatureGates string
	// KueueManagedJobsNamespaceSelector, when set, is Kueue's
	// managedJobsNamespaceSelector (default: Kueue's own).
	KueueManagedJobsNamespaceSelector *metav1.LabelSelector
	// TrainingOperator starts the Kubeflow training operator, which creates
	// the pods of admitted PyTorchJobs.
	TrainingOperator bool
	// WaitForPodsReady turns on Kueue's waitForPodsReady (seed §1's
	// all-or-nothing timeout), for the "without gpupack" comparison.
	WaitForPodsReady bool
	// JobSet enables Kueue's jobset.x-k8s.io/jobset integration (and its
	// webhooks). The JobSet and LeaderWorkerSet CRDs are always installed;
	// without a controller or a Kueue integration they are inert.
	JobSet bool
	// OperatorCRDs installs the CRDs of KubeRay (RayJob, RayCluster), the
	// MPI operator (MPIJob) and Kubeflow Trainer (TrainJob, TrainingRuntime,
	// ClusterTrainingRuntime), inert without their controllers. Off by
	// default: they are large (slow to install on a busy box), and the other
	// suites run on a cluster without them.
	OperatorCRDs bool
	// RayMPI enables Kueue's ray.io/rayjob, ray.io/raycluster and
	// kubeflow.org/mpijob integrations (and their webhooks), with
	// OperatorCRDs. No KubeRay or MPI operator runs.
	RayMPI bool
	// PodIntegration enables Kueue's pod and deployment integrations (and
	// their webhooks): plain pods and Deployments with a queue-name label
	// are gated by Kueue, and the podSetUpdates of their admission reach
	// them by an update (docs/security.md, finding 5). Off by default: every
	// pod creation then goes through Kueue's pod webhook as well.
	PodIntegration bool
	// KueueClientQPS / KueueClientBurst raise Kueue's client limits (its
	// clientConnection; 0: Kueue's defaults, qps 20 / burst 30), as a
	// throughput benchmark must: at the defaults Kueue alone admits ~4/s.
	KueueClientQPS   float32
	KueueClientBurst int32
	// JobSetController starts the real JobSet controller (and its JobSet
	// webhooks); built only when named: hack/build-tools.sh jobset.
	JobSetController bool
	// LWS enables Kueue's leaderworkerset.x-k8s.io/leaderworkerset
	// integration (with the pod integration it needs, for pods with a
	// queue name or an LWS owner only) and its webhooks.
	LWS bool
	// LWSController starts the real LeaderWorkerSet controller (and its
	// webhooks); built only when named: hack/build-tools.sh lws.
	LWSController bool
	// MPIOperator starts the real MPI operator (with RayMPI); built only
	// when named: hack/build-tools.sh mpi-operator.
	MPIOperator bool
	// KubeRay starts KubeRay's real operator (with RayMPI); built only
	// when named: hack/build-tools.sh kuberay.
	KubeRay bool
	// JobPodsKeepRunning leaves out kwok's pod-complete stage: Job pods
	// (a JobSet's trainers) run until deleted instead of succeeding at once.
	JobPodsKeepRunning bool
	// TrainJob enables Kueue's trainer.kubeflow.org/trainjob integration
	// (and its webhooks), with OperatorCRDs (Trainer's CRDs).
	TrainJob bool
	// TrainerController starts the real Kubeflow Trainer v2 controller
	// manager (TrainJob → JobSet) and its webhooks; built only when named:
	// hack/build-tools.sh trainer. Needs JobSetController for pods.
	TrainerController bool
}

// KueueFrameworks is the integrations.frameworks list the test Kueue runs
// with these options. gpupack's webhook configuration (kueue.frameworks,
// the unmanaged-GPU policy) must say the same as the cluster's Kueue: tests
// pass this list to it.
func (o Options) KueueFrameworks() []string {
	fw := []string{"batch/job", "kubeflow.org/pytorchjob"}
	if o.JobSet {
		fw = append(fw, "jobset.x-k8s.io/jobset")
	}
	if o.LWS {
		// Kueue's LWS integration runs on its pod integration (pod groups).
		fw = append(fw, "leaderworkerset.x-k8s.io/leaderworkerset")
	}
	if o.LWS || o.PodIntegration {
		fw = append(fw, "pod")
	}
	if o.RayMPI {
		fw = append(fw, "ray.io/rayjob", "ray.io/raycluster", "kubeflow.org/mpijob")
	}
	if o.PodIntegration {
		fw = append(fw, "deployment")
	}
	if o.TrainJob {
		fw = append(fw, "trainer.kubeflow.org/trainjob")
	}
	return fw
}

// Env is a running control plane.
type Env struct {
	Ctx        context.Context
	Config     *rest.Config
	Client     client.Client
	Clientset  *kubernetes.Clientset
	Scheme     *runtime.Scheme
	Dir        string // logs, kubeconfig, component configs
	Kubeconfig string

	testEnv *envtest.Environment
	dir     string
	cancel  context.CancelFunc
	mu      sync.Mutex
	procs   []*Process
	// scheduling: kube-scheduler, kube-controller-manager and kwok run.
	scheduling bool
}

// Scheme returns a scheme with every type gpupack's tests touch.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(kueue.AddToScheme(s))
	utilruntime.Must(gpupackv1alpha1.AddToScheme(s))
	utilruntime.Must(kftraining.AddToScheme(s))
	utilruntime.Must(volcanoscheduling.AddToScheme(s))
	utilruntime.Must(volcanotopology.AddToScheme(s))
	utilruntime.Must(jobset.AddToScheme(s))
	utilruntime.Must(lws.AddToScheme(s))
	utilruntime.Must(mpi.AddToScheme(s))
	utilruntime.Must(ray.AddToScheme(s))
	return s
}

// RepoRoot is the directory holding gpupack's go.mod.
func RepoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// ToolsDir is where hack/build-tools.sh puts the control-plane binaries.
func ToolsDir() string {
	if d := os.Getenv("GPUPACK_TOOLS_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "_output", "tools")
}

var buildOnce sync.Once
var buildErr error

// EnsureTools builds the control-plane binaries if they are missing (a no-op
// when the pinned versions are already there).
//
// GPUPACK_SKIP_TOOLS_BUILD=1 skips the check (the binaries must be there).
func EnsureTools() error {
	if os.Getenv("GPUPACK_SKIP_TOOLS_BUILD") != "" {
		return nil
	}
	buildOnce.Do(func() {
		cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "build-tools.sh"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("hack/build-tools.sh: %v\n%s", err, out.String())
		}
	})
	return buildErr
}

// TB is the part of testing.TB the framework needs; the demo passes its own.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	Failed() bool
	TempDir() string
}

var _ TB = (testing.TB)(nil)

// Start brings the control plane up and registers its teardown.
func Start(t TB, opts Options) *Env {
	t.Helper()
	if err := EnsureTools(); err != nil {
		t.Fatalf("building control-plane tools: %v", err)
	}
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false), zap.Level(zapLevel())))
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	e := &Env{Ctx: ctx, cancel: cancel, Dir: dir, Scheme: NewScheme()}
	t.Cleanup(func() { e.stop(t) })

	crds, err := crdPaths(opts.OperatorCRDs || opts.RayMPI || opts.TrainJob || opts.TrainerController)
	if err != nil {
		t.Fatalf("%v", err)
	}
	wh := envtest.WebhookInstallOptions{}
	if !opts.NoKueue {
		m, v, err := kueueWebhooks(opts.JobSet, opts.RayMPI, opts.PodIntegration, opts.LWS, opts.TrainJob)
		if err != nil {
			t.Fatalf("%v", err)
		}
		wh.MutatingWebhooks, wh.ValidatingWebhooks = m, v
	}
	e.testEnv = &envtest.Environment{
		BinaryAssetsDirectory: ToolsDir(),
		// The operators' CRDs (OperatorCRDs) are large; on a busy 2-core
		// box they take longer than envtest's default 10 s to appear.
		CRDInstallOptions:     envtest.CRDInstallOptions{Paths: crds, ErrorIfPathMissing: true, Scheme: e.Scheme, MaxTime: time.Minute},
		WebhookInstallOptions: wh,
		Scheme:                e.Scheme,
	}
	e.testEnv.ControlPlane.GetAPIServer().Configure().
		Set("service-cluster-ip-range", "10.96.0.0/16")
	cfg, err := e.testEnv.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver + etcd: %v", err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	e.Config = cfg
	if e.Client, err = client.New(cfg, client.Options{Scheme: e.Scheme}); err != nil {
		t.Fatalf("client: %v", err)
	}
	if e.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatalf("clientset: %v", err)
	}
	admin, err := e.testEnv.AddUser(envtest.User{Name: "gpupack-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatalf("admin user: %v", err)
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		t.Fatalf("kubeconfig: %v", err)
	}
	e.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kc, 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	e.dir = dir
	for _, ns := range []string{"kueue-system", "gpupack-system", "kubeflow"} {
		if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("namespace %s: %v", ns, err)
		}
	}
	if !opts.NoKueue {
		e.startKueue(t, opts)
	}
	if opts.Scheduler {
		e.startScheduling(t, opts)
		e.scheduling = true
	}
	if opts.TrainingOperator {
		e.startTrainingOperator(t)
	}
	if opts.JobSetController {
		e.startJobSetController(t)
	}
	if opts.LWSController {
		e.startLWSController(t)
	}
	if opts.TrainerController {
		e.startTrainerController(t)
	}
	if opts.MPIOperator {
		e.startMPIOperator(t)
	}
	if opts.KubeRay {
		e.startKubeRay(t)
	}
	return e
}

func zapLevel() zapcore.Level {
	if os.Getenv("GPUPACK_TEST_VERBOSE") != "" {
		return -2
	}
	if os.Getenv("GPUPACK_QUIET") != "" {
		return 4 // panics only (the demo's screen)
	}
	return 2 // errors only: component logs go to files
}

func crdPaths(operators bool) ([]string, error) {
	kueueDir, err := moduleDir("sigs.k8s.io/kueue")
	if err != nil {
		return nil, err
	}
	kfDir, err := moduleDir("github.com/kubeflow/training-operator")
	if err != nil {
		return nil, err
	}
	jsDir, err := moduleDir("sigs.k8s.io/jobset")
	if err != nil {
		return nil, err
	}
	lwsDir, err := moduleDir("sigs.k8s.io/lws")
	if err != nil {
		return nil, err
	}
	root := RepoRoot()
	var ops []string
	if operators {
		rayDir, err := moduleDir("github.com/ray-project/kuberay/ray-operator")
		if err != nil {
			return nil, err
		}
		mpiDir, err := moduleDir("github.com/kubeflow/mpi-operator")
		if err != nil {
			return nil, err
		}
		trainerDir, err := downloadedModuleDir(TrainerModule)
		if err != nil {
			return nil, err
		}
		trainerCRDs := filepath.Join(trainerDir, "manifests", "base", "crds")
		ops = []string{
			filepath.Join(rayDir, "config", "crd", "bases", "ray.io_rayjobs.yaml"),
			filepath.Join(rayDir, "config", "crd", "bases", "ray.io_rayclusters.yaml"),
			filepath.Join(mpiDir, "manifests", "base", "kubeflow.org_mpijobs.yaml"),
			filepath.Join(trainerCRDs, "trainer.kubeflow.org_trainjobs.yaml"),
			filepath.Join(trainerCRDs, "trainer.kubeflow.org_trainingruntimes.yaml"),
			filepath.Join(trainerCRDs, "trainer.kubeflow.org_clustertrainingruntimes.yaml"),
		}
	}
	return append([]string{
		filepath.Join(jsDir, "config", "components", "crd", "bases", "jobset.x-k8s.io_jobsets.yaml"),
		filepath.Join(lwsDir, "config", "crd", "bases", "leaderworkerset.x-k8s.io_leaderworkersets.yaml"),
		filepath.Join(kueueDir, "config", "components", "crd", "bases"),
		filepath.Join(kfDir, "manifests", "base", "crds", "kubeflow.org_pytorchjobs.yaml"),
		filepath.Join(root, "test", "framework", "crds", "volcano"),
		filepath.Join(root, "manifests", "base", "crds"),
	}, ops...), nil
}

var modDirs sync.Map

// TrainerModule is Kubeflow Trainer at the release Kueue v0.17.0 requires.
// It is not in gpupack's build list (its API package does not compile
// against k8s.io/api v0.37: webhooks/mutation/trainerapi), so its CRDs come
// from the module cache (go mod download), not from go list.
const TrainerModule = "github.com/kubeflow/trainer/v2@v2.2.0"

// downloadedModuleDir is moduleDir for a module@version outside the build list.
func downloadedModuleDir(modVersion string) (string, error) {
	if d, ok := modDirs.Load(modVersion); ok {
		return d.(string), nil
	}
	cmd := exec.Command("go", "mod", "download", "-json", modVersion)
	cmd.Dir = RepoRoot()
	out, err := cmd.Output()
	var m struct{ Dir string }
	if err != nil || json.Unmarshal(out, &m) != nil || m.Dir == "" {
		return "", fmt.Errorf("downloading module %s: %v %s", modVersion, err, out)
	}
	modDirs.Store(modVersion, m.Dir)
	return m.Dir, nil
}

// moduleDir finds a module of gpupack's build list in the module cache.
func moduleDir(mod string) (string, error) {
	if d, ok := modDirs.Load(mod); ok {
		return d.(string), nil
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", mod)
	cmd.Dir = RepoRoot()
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("locating module %s: %v", mod, err)
	}
	d := strings.TrimSpace(string(out))
	modDirs.Store(mod, d)
	return d, nil
}

// kueueWebhooks returns Kueue's webhook configurations, keeping only the
// webhooks of the integrations the test Kueue serves (batch/job, PyTorchJob)
// and of Kueue's own types: a webhook for a kind nobody serves would reject
// every object of that kind (pods included).
func kueueWebhooks(jobSet, rayMPI, podIntegration, lws, trainJob bool) ([]*admissionregistrationv1.MutatingWebhookConfiguration, []*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	dir, err := moduleDir("sigs.k8s.io/kueue")
	if err != nil {
		return nil, nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config", "components", "webhook", "manifests.yaml"))
	if err != nil {
		return nil, nil, err
	}
	keep := func(path *string) bool {
		if path == nil {
			return false
		}
		paths := []string{"-kueue-x-k8s-io-", "-batch-v1-job", "-kubeflow-org-v1-pytorchjob"}
		if jobSet {
			paths = append(paths, "-jobset-x-k8s-io-")
		}
		if rayMPI {
			paths = append(paths, "-ray-io-v1-rayjob", "-ray-io-v1-raycluster", "-kubeflow-org-v2beta1-mpijob")
		}
		if podIntegration {
			paths = append(paths, "--v1-pod", "-apps-v1-deployment")
		}
		if lws {
			paths = append(paths, "-leaderworkerset-x-k8s-io-", "--v1-pod")
		}
		if trainJob {
			paths = append(paths, "-trainer-kubeflow-org-v1alpha1-trainjob")
		}
		for _, p := range paths {
			if strings.Contains(*path, p) {
				return true
			}
		}
		return false
	}
	codecs := serializer.NewCodecFactory(NewScheme())
	var muts []*admissionregistrationv1.MutatingWebhookConfiguration
	var vals []*admissionregistrationv1.ValidatingWebhookConfiguration
	for _, doc := range strings.Split(string(raw), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, _, err := codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("kueue webhook manifest: %w", err)
		}
		switch o := obj.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			var ws []admissionregistrationv1.MutatingWebhook
			for _, w := range o.Webhooks {
				if w.ClientConfig.Service != nil && keep(w.ClientConfig.Service.Path) {
					ws = append(ws, w)
				}
			}
			o.Webhooks = ws
			muts = append(muts, o)
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			var ws []admissionregistrationv1.ValidatingWebhook
			for _, w := range o.Webhooks {
				if w.ClientConfig.Service != nil && keep(w.ClientConfig.Service.Path) {
					ws = append(ws, w)
				}
			}
			o.Webhooks = ws
			vals = append(vals, o)
		}
	}
	return muts, vals, nil
}

// FreePort returns a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WebhookServer returns options for a webhook server the real apiserver can
// call: loopback, a free port, and envtest's serving certificate.
func (e *Env) WebhookServer() webhook.Options {
	port, err := FreePort()
	if err != nil {
		panic(err)
	}
	o := e.testEnv.WebhookInstallOptions
	return webhook.Options{Host: o.LocalServingHost, Port: port, CertDir: o.LocalServingCertDir}
}

// InstallWebhooks creates webhook configurations whose webhooks are served by
// a server started with opts (from WebhookServer): every clientConfig is
// pointed at https://host:port<service path> with envtest's CA.
func (e *Env) InstallWebhooks(t TB, opts webhook.Options, objs ...client.Object) {
	t.Helper()
	ca := e.testEnv.WebhookInstallOptions.LocalServingCAData
	url := func(cc *admissionregistrationv1.WebhookClientConfig) {
		path := ""
		if cc.Service != nil && cc.Service.Path != nil {
			path = *cc.Service.Path
		}
		u := fmt.Sprintf("https://%s%s", net.JoinHostPort(opts.Host, fmt.Sprint(opts.Port)), path)
		cc.URL, cc.Service, cc.CABundle = &u, nil, ca
	}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			for i := range o.Webhooks {
				url(&o.Webhooks[i].ClientConfig)
			}
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			for i := range o.Webhooks {
				url(&o.Webhooks[i].ClientConfig)
			}
		default:
			t.Fatalf("InstallWebhooks: %T is not a webhook configuration", obj)
		}
		if err := e.Client.Create(e.Ctx, obj); err != nil {
			t.Fatalf("installing %s: %v", obj.GetName(), err)
		}
	}
}

// StartManager runs a controller-runtime manager in this process with the
// components setup registers; it returns a function that stops it (and waits),
// so a test can kill and restart "the gpupack manager". The manager is also
// stopped at cleanup.
func (e *Env) StartManager(t TB, setup func(ctrl.Manager) error, webhookOpts ...webhook.Options) (stop func()) {
	t.Helper()
	o := ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		// Tests restart "the manager" in one process; names repeat.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if len(webhookOpts) > 0 {
		o.WebhookServer = webhook.NewServer(webhookOpts[0])
	}
	mgr, err := ctrl.NewManager(e.Config, o)
	if err != nil {
		t.Fatalf("manager: %v", err)
	}
	if err := setup(mgr); err != nil {
		t.Fatalf("manager setup: %v", err)
	}
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Logf("manager exited: %v", err)
		}
	}()
	if len(webhookOpts) > 0 {
		addr := fmt.Sprintf("%s:%d", webhookOpts[0].Host, webhookOpts[0].Port)
		if !waitTCP(addr, 60*time.Second) {
			cancel()
			<-done
			t.Fatalf("the manager's webhook server is not serving TLS on %s after 60s", addr)
		}
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// waitTCP reports whether a TLS server answers on addr within d.
func waitTCP(addr string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		// A full TLS handshake: a bare TCP probe makes the server log a
		// handshake error for every try.
		d := &net.Dialer{Timeout: 200 * time.Millisecond}
		if c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true}); err == nil { //nolint:gosec // readiness probe only
			c.Close()
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func (e *Env) stop(t TB) {
	e.mu.Lock()
	procs := append([]*Process(nil), e.procs...)
	e.mu.Unlock()
	if t.Failed() {
		for _, p := range procs {
			t.Logf("---- last lines of %s (%s) ----\n%s", p.Name, p.LogPath, p.Tail(15))
		}
	}
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}
	e.cancel()
	if e.testEnv != nil {
		if err := e.testEnv.Stop(); err != nil {
			t.Logf("stopping envtest: %v", err)
		}
	}
}

// Process is a component started by the framework.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
}

// StartProcess runs a binary in its own process group, logging to a file
// under env.Dir. It is stopped at cleanup.
func (e *Env) StartProcess(t TB, name, bin string, args ...string) *Process {
	t.Helper()
	return e.startProcessEnv(t, name, bin, nil, args...)
}

// startProcessEnv is StartProcess with extra environment (KEY=value).
func (e *Env) startProcessEnv(t TB, name, bin string, env []string, args ...string) *Process {
	t.Helper()
	logPath := filepath.Join(e.Dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after 5 s.
func (p *Process) Stop() {
	if p.Exited() {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

// Tail returns the last n lines of the process log.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Controller identities: components run as the users they are in a cluster,
// so admission sees the same request.userInfo (the pod webhook's fast path
// trusts these for pods made from job templates). Both are cluster admins
// here.
const (
	UserKubeControllerManager = "system:kube-controller-manager"
	UserTrainingOperator      = "system:serviceaccount:kubeflow:training-operator"
	// UserKueue is Kueue's controller manager: it writes the podSetUpdates
	// of an admission into the pods of its pod integration, which policy
	// gpupack-placement lets only this account do.
	UserKueue = "system:serviceaccount:kueue-system:kueue-controller-manager"
)

// UserConfig returns a client config authenticated as name (a client
// certificate, so no impersonation cost) in groups.
func (e *Env) UserConfig(t TB, name string, groups ...string) *rest.Config {
	t.Helper()
	u, err := e.testEnv.AddUser(envtest.User{Name: name, Groups: groups}, e.Config)
	if err != nil {
		t.Fatalf("user %s: %v", name, err)
	}
	return u.Config()
}

// userKubeconfig writes a kubeconfig for name (a cluster admin) and returns its path.
func (e *Env) userKubeconfig(t TB, name string) string {
	t.Helper()
	u, err := e.testEnv.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatalf("user %s: %v", name, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatalf("kubeconfig for %s: %v", name, err)
	}
	path := filepath.Join(e.dir, "kubeconfig-"+strings.NewReplacer(":", "-", "/", "-").Replace(name))
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	return path
}
