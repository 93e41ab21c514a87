// Command gpupack-manager runs gpupack's cluster-side parts in one
// controller-runtime manager: the gang-fit AdmissionCheck, the webhooks and
// placement ungater, the preemption coordinator and the Volcano bridge.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanoscheduling "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	volcanotopology "volcano.sh/apis/pkg/apis/topology/v1alpha1"

	"github.com/gpupack/gpupack/admissioncheck"
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/topology"
	"github.com/gpupack/gpupack/admissioncheck/volcano"
	"github.com/gpupack/gpupack/cmd/internal/version"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/preemption/policy"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	var (
		metricsAddr    = flag.String("metrics-bind-address", ":8080", "metrics endpoint (0 disables)")
		probeAddr      = flag.String("health-probe-bind-address", ":8081", "health probe endpoint")
		pprofAddr      = flag.String("pprof-bind-address", "", "serve Go's net/http/pprof profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:8082; empty or 0 disables (default). Unauthenticated: bind it to loopback and reach it with kubectl port-forward")
		leaderElect    = flag.Bool("leader-elect", true, "elect a leader so only one replica decides (required with more than one replica)")
		leaderNS       = flag.String("leader-election-namespace", "", "namespace of the leader election lease (default: in-cluster namespace)")
		webhookPort    = flag.Int("webhook-port", 9443, "webhook server port")
		certDir        = flag.String("cert-dir", "/tmp/k8s-webhook-server/serving-certs", "webhook serving certificate directory")
		enableCheck    = flag.Bool("enable-gang-fit", true, "run the gpupack.io/gang-fit admission check")
		checkWorkers   = flag.Int("gang-fit-workers", admissioncheck.DefaultWorkers, "Workloads the gang-fit check decides at once (each assumes its GPUs under the model's lock; the API writes run in parallel)")
		enablePreempt  = flag.Bool("enable-preemption", true, "run the preemption coordinator")
		evictionHook   = flag.Bool("enable-eviction-webhook", false, "serve the pods/eviction webhook that delays drains of checkpointing pods")
		enableVolcano  = flag.Bool("enable-volcano", false, "create one Volcano PodGroup per admitted workload and keep HyperNodes (needs the volcano overlay's RBAC)")
		enableTopology = flag.Bool("enable-topology", true, "generate a Kueue Topology (and, with --enable-volcano, HyperNodes) from the GangFitParameters' levels")
		topologyParams = flag.String("topology-parameters", "", "GangFitParameters whose topologyLevels define the hierarchy (default: the first that has them)")
		enableWebhooks = flag.Bool("enable-webhooks", true, "serve the fractional-GPU mutating/validating webhooks and run the placement ungater")
		webhookConfig  = flag.String("webhook-config", "", "webhook configuration file (YAML; see docs/webhooks.md); empty = defaults")
		unmanagedGPUs  = flag.String("unmanaged-gpus", "", "GPU pods and jobs Kueue will not manage: Deny (namespaces labelled gpupack.io/unmanaged-gpus=allow excepted) or Allow; empty = the webhook configuration's unmanagedGPUs.policy (default Deny)")
		stsCreators    = flag.String("statefulset-pod-creators", strings.Join(webhooks.DefaultStatefulSetPodCreators, ","), "users whose pods made from a gpupack-injected StatefulSet template (LWS groups, with the StatefulSet kind in --job-kinds) skip the pod webhook while the StatefulSet entry holds (comma-separated; empty: every StatefulSet pod goes to the webhook)")
		podCreators    = flag.String("template-pod-creators", strings.Join(webhooks.DefaultTemplatePodCreators, ","), "users whose pods made from a gpupack-injected Job/PyTorchJob template skip the pod webhook (comma-separated; empty: every GPU pod goes to the webhook)")
		jobKinds       = flag.String("job-kinds", "auto", "job kinds besides Job and PyTorchJob whose webhook entries the manager keeps in its configurations: auto (those the cluster serves at start), all, none, or a comma-separated list of JobSet, LeaderWorkerSet, Deployment, StatefulSet, TrainJob, TrainingRuntime, ClusterTrainingRuntime, RayJob, RayCluster, MPIJob")
		certMode       = flag.String("cert-management", "internal", "webhook certificates: internal (cert-controller rotates them and injects the CA) or external (cert-manager or files in --cert-dir)")
		namespace      = flag.String("namespace", envOr("POD_NAMESPACE", "gpupack-system"), "namespace gpupack runs in")
		showVersion    = flag.Bool("version", false, "print the version and exit")
		ckptDefault    = flag.Duration("checkpoint-timeout-default", policy.DefaultTimeout, "checkpoint time a preempted or drained victim gets when it sets no gpupack.io/checkpoint-timeout")
		ckptMax        = flag.Duration("checkpoint-timeout-max", policy.DefaultMax, "longest checkpoint time any victim gets, whatever its annotation asks (unless an entry below names its class or queue)")
		ckptByPC       = flag.String("checkpoint-timeout-max-by-priority-class", "", "per (Workload or pod) priority class caps, name=duration,… (replace --checkpoint-timeout-max for that class)")
		ckptByCQ       = flag.String("checkpoint-timeout-max-by-cluster-queue", "", "per ClusterQueue caps, name=duration,… (with a priority-class cap too, the smaller wins)")
	)
	zopts := zap.Options{}
	zopts.BindFlags(flag.CommandLine)
	flag.Parse()
	ckptPolicy := policy.Policy{Default: *ckptDefault, Max: *ckptMax}
	if *showVersion {
		fmt.Println(version.String())
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts)))
	log := ctrl.Log.WithName("setup")
	log.Info("starting", "version", version.String())
	var perr error
	if ckptPolicy.MaxByPriorityClass, perr = policy.ParseCaps(*ckptByPC); perr == nil {
		ckptPolicy.MaxByClusterQueue, perr = policy.ParseCaps(*ckptByCQ)
	}
	if perr == nil {
		perr = ckptPolicy.Validate()
	}
	if perr != nil {
		log.Error(perr, "checkpoint policy flags")
		os.Exit(1)
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(kueue.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	utilruntime.Must(kftraining.AddToScheme(scheme))
	utilruntime.Must(volcanoscheduling.AddToScheme(scheme))
	utilruntime.Must(volcanotopology.AddToScheme(scheme))

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  *probeAddr,
		PprofBindAddress:        *pprofAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "gpupack-manager.gpupack.io",
		LeaderElectionNamespace: *leaderNS,
		WebhookServer:           webhook.NewServer(webhook.Options{Port: *webhookPort, CertDir: *certDir}),
	})
	if err != nil {
		log.Error(err, "creating manager")
		os.Exit(1)
	}
	certsReady := make(chan struct{})
	if *enableWebhooks {
		cfg, err := webhooks.LoadConfig(*webhookConfig)
		if err != nil {
			log.Error(err, "reading webhook configuration")
			os.Exit(1)
		}
		if *unmanagedGPUs != "" {
			cfg.UnmanagedGPUs.Policy = *unmanagedGPUs
			if err := cfg.Validate(); err != nil {
				log.Error(err, "--unmanaged-gpus")
				os.Exit(1)
			}
		}
		// One policy: the pod webhook must not refuse a timeout that some
		// priority class or ClusterQueue is allowed.
		if l := ckptPolicy.Longest(); cfg.Checkpoint.MaxTimeout.Duration < l {
			cfg.Checkpoint.MaxTimeout.Duration = l
		}
		// and caps a GPU pod's grace at its class's cap + the margin that
		// the coordinator's deletes use too.
		if cfg.Checkpoint.Margin.Duration > 0 {
			ckptPolicy.Margin = cfg.Checkpoint.Margin.Duration
		}
		cfg.Checkpoint.Policy = ckptPolicy
		// The fast-path marker hashes the enabled kinds and the
		// installation's salt too (docs/webhooks.md#fast-path); every
		// replica reads the same Secret, so they write the same marker.
		if cfg.JobKinds, err = webhooks.ResolveJobKinds(mgr.GetRESTMapper(), *jobKinds); err != nil {
			log.Error(err, "--job-kinds")
			os.Exit(1)
		}
		direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: scheme})
		if err != nil {
			log.Error(err, "creating a client")
			os.Exit(1)
		}
		if cfg.FastPathSalt, err = webhooks.EnsureFastPathSalt(context.Background(), direct, *namespace); err != nil {
			log.Error(err, "reading the fast-path salt", "secret", *namespace+"/"+webhooks.FastPathSecretName)
			os.Exit(1)
		}
		// The epoch (renewed by the leader's fast-path reconciler whenever
		// the configuration was changed by someone else) is followed by
		// every replica; until the leader made one, the salt's marker.
		cfg.FastPathEpoch = &mutation.FastPathEpoch{}
		if e, err := webhooks.ReadFastPathEpoch(context.Background(), direct, *namespace); err != nil {
			log.Error(err, "reading the fast-path epoch", "secret", *namespace+"/"+webhooks.FastPathSecretName)
			os.Exit(1)
		} else {
			cfg.FastPathEpoch.Set(e)
		}
		if err := webhooks.RefreshFastPathEpoch(mgr, *namespace, cfg.FastPathEpoch, 5*time.Second); err != nil {
			log.Error(err, "following the fast-path epoch")
			os.Exit(1)
		}
		serve, err := webhooks.DefaultServeOptions().WithFastPath(cfg)
		if err != nil {
			log.Error(err, "webhook configuration")
			os.Exit(1)
		}
		serve.Namespace = *namespace
		serve.TemplatePodCreators = nil
		for _, u := range strings.Split(*podCreators, ",") {
			if u = strings.TrimSpace(u); u != "" {
				serve.TemplatePodCreators = append(serve.TemplatePodCreators, u)
			}
		}
		serve.StatefulSetPodCreators = nil
		for _, u := range strings.Split(*stsCreators, ",") {
			if u = strings.TrimSpace(u); u != "" {
				serve.StatefulSetPodCreators = append(serve.StatefulSetPodCreators, u)
			}
		}
		if err := webhooks.CheckTemplatePodCreators(serve.TemplatePodCreators, cfg.UnmanagedGPUs.OwnerControllers); err != nil {
			log.Error(err, "--template-pod-creators")
			os.Exit(1)
		}
		if err := webhooks.CheckStatefulSetPodCreators(serve.StatefulSetPodCreators, cfg.UnmanagedGPUs.OwnerControllers); err != nil {
			log.Error(err, "--statefulset-pod-creators")
			os.Exit(1)
		}
		// The fast path's StatefulSet clause needs the kinds (the
		// StatefulSet entry it checks).
		serve.JobKinds = cfg.JobKinds
		if err := webhooks.SetupFastPath(mgr, serve); err != nil {
			log.Error(err, "setting up the pod webhook's fast path")
			os.Exit(1)
		}
		log.Info("job kinds with webhook entries", "kinds", serve.JobKinds)
		if err := webhooks.SetupJobKinds(mgr, serve); err != nil {
			log.Error(err, "setting up the job kinds' webhook entries")
			os.Exit(1)
		}
		if *certMode == "internal" {
			// Every replica keeps certificates (not only the leader): a standby
			// that never becomes ready would block drains under the PDB.
			ready, err := webhooks.SetupCerts(mgr, webhooks.CertOptions{ServeOptions: serve, SecretName: "gpupack-webhook-cert", CertDir: *certDir, EvictionWebhook: *evictionHook})
			if err != nil {
				log.Error(err, "setting up webhook certificates")
				os.Exit(1)
			}
			go func() { <-ready; close(certsReady) }()
		} else {
			close(certsReady)
		}
		// Registering a handler starts the webhook server; do it only once
		// the certificates are on disk, or the server exits at start.
		go func() {
			<-certsReady
			if err := webhooks.Setup(mgr, cfg); err != nil {
				log.Error(err, "setting up webhooks")
				os.Exit(1)
			}
			if *evictionHook {
				mgr.GetWebhookServer().Register(preemption.EvictionWebhookPath, &webhook.Admission{Handler: preemption.NewEvictionHandler(mgr, ckptPolicy)})
			}
		}()
		if err := placement.Setup(mgr); err != nil {
			log.Error(err, "setting up the placement ungater")
			os.Exit(1)
		}
	} else {
		close(certsReady)
	}
	if *evictionHook && !*enableWebhooks {
		log.Error(nil, "--enable-eviction-webhook needs --enable-webhooks (the webhook server and its certificates)")
		os.Exit(1)
	}
	if *enableCheck {
		if err := admissioncheck.Setup(mgr, admissioncheck.Options{Workers: *checkWorkers}); err != nil {
			log.Error(err, "setting up the gang-fit check")
			os.Exit(1)
		}
	}
	if *enablePreempt {
		if err := preemption.SetupWithManager(mgr, preemption.Options{Policy: ckptPolicy}); err != nil {
			log.Error(err, "setting up the preemption coordinator")
			os.Exit(1)
		}
	}
	if *enableVolcano {
		if err := volcano.Setup(mgr, volcano.Options{}); err != nil {
			log.Error(err, "setting up the Volcano PodGroup bridge")
			os.Exit(1)
		}
	}
	if *enableTopology {
		if err := topology.Setup(mgr, topology.Options{Parameters: *topologyParams, NoHyperNodes: !*enableVolcano}); err != nil {
			log.Error(err, "setting up topology generation")
			os.Exit(1)
		}
	}
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	// Ready once the webhook certificates are on disk: the Service must not
	// route admission calls to a server that cannot answer TLS yet.
	utilruntime.Must(mgr.AddReadyzCheck("readyz", func(_ *http.Request) error {
		select {
		case <-certsReady:
			return nil
		default:
			return fmt.Errorf("webhook certificates not ready")
		}
	}))
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager exited")
		os.Exit(1)
	}
}
