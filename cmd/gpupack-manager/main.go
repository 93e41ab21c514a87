// Command gpupack-manager runs gpupack's cluster-side parts in one
// controller-runtime manager: the gang-fit AdmissionCheck, the webhooks and
// placement ungater, the preemption coordinator and the Volcano bridge.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
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
	"github.com/gpupack/gpupack/cmd/internal/version"
	"github.com/gpupack/gpupack/preemption"
)

func main() {
	var (
		metricsAddr   = flag.String("metrics-bind-address", ":8080", "metrics endpoint (0 disables)")
		probeAddr     = flag.String("health-probe-bind-address", ":8081", "health probe endpoint")
		leaderElect   = flag.Bool("leader-elect", true, "elect a leader so only one replica decides (required with more than one replica)")
		leaderNS      = flag.String("leader-election-namespace", "", "namespace of the leader election lease (default: in-cluster namespace)")
		webhookPort   = flag.Int("webhook-port", 9443, "webhook server port")
		certDir       = flag.String("cert-dir", "/tmp/k8s-webhook-server/serving-certs", "webhook serving certificate directory")
		enableCheck   = flag.Bool("enable-gang-fit", true, "run the gpupack.io/gang-fit admission check")
		enablePreempt = flag.Bool("enable-preemption", true, "run the preemption coordinator")
		evictionHook  = flag.Bool("enable-eviction-webhook", false, "serve the pods/eviction webhook that delays drains of checkpointing pods")
		showVersion   = flag.Bool("version", false, "print the version and exit")
	)
	zopts := zap.Options{}
	zopts.BindFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.String())
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts)))
	log := ctrl.Log.WithName("setup")
	log.Info("starting", "version", version.String())

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
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "gpupack-manager.gpupack.io",
		LeaderElectionNamespace: *leaderNS,
		WebhookServer:           webhook.NewServer(webhook.Options{Port: *webhookPort, CertDir: *certDir}),
	})
	if err != nil {
		log.Error(err, "creating manager")
		os.Exit(1)
	}
	if *enableCheck {
		if err := admissioncheck.Setup(mgr, admissioncheck.Options{}); err != nil {
			log.Error(err, "setting up the gang-fit check")
			os.Exit(1)
		}
	}
	if *enablePreempt {
		if err := preemption.SetupWithManager(mgr, preemption.Options{EvictionWebhook: *evictionHook}); err != nil {
			log.Error(err, "setting up the preemption coordinator")
			os.Exit(1)
		}
	}
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	utilruntime.Must(mgr.AddReadyzCheck("readyz", healthz.Ping))
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager exited")
		os.Exit(1)
	}
}
