package framework

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Controller identities of the job controllers the framework can start.
const (
	UserJobSetController = "system:serviceaccount:jobset-system:jobset-controller-manager"
	UserLWSController    = "system:serviceaccount:lws-system:lws-controller-manager"
)

// startJobSetController runs the real JobSet controller (built by
// `hack/build-tools.sh jobset`), which makes the Jobs of admitted JobSets
// (kube-controller-manager's job controller then makes their pods). Its
// JobSet webhooks (defaulting, validation) are installed, pointed at it
// over loopback TLS with envtest's certificate.
func (e *Env) startJobSetController(t TB) {
	t.Helper()
	port := e.startJobController(t, "jobset", "config.jobset.x-k8s.io/v1alpha1", UserJobSetController)
	e.installJobSetWebhooks(t, port)
}

// startLWSController runs the real LeaderWorkerSet controller (built by
// `hack/build-tools.sh lws`): leader StatefulSets, and per leader pod the
// worker StatefulSet. Its webhooks (defaulting the LWS, labelling its pods
// with group and worker indexes, which its pod controller needs) are
// installed, pointed at it over loopback TLS with envtest's certificate.
func (e *Env) startLWSController(t TB) {
	t.Helper()
	port := e.startJobController(t, "lws", "config.lws.x-k8s.io/v1alpha1", UserLWSController)
	e.installLWSWebhooks(t, port)
}

func (e *Env) startJobController(t TB, name, configAPI, user string) int {
	t.Helper()
	bin := filepath.Join(ToolsDir(), name)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("the %s controller is not built (run hack/build-tools.sh %s): %v", name, name, err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatalf("%v", err)
	}
	wh := e.testEnv.WebhookInstallOptions
	cfg := fmt.Sprintf(`apiVersion: %s
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
health:
  healthProbeBindAddress: "0"
metrics:
  bindAddress: "0"
webhook:
  host: %s
  port: %d
  certDir: %s
`, configAPI, wh.LocalServingHost, port, wh.LocalServingCertDir)
	cfgPath := filepath.Join(e.Dir, name+"-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatalf("%v", err)
	}
	e.StartProcess(t, name, bin, "--config="+cfgPath, "--kubeconfig="+e.userKubeconfig(t, user), "--zap-log-level=info")
	return port
}

// controllerWebhooks reads a controller's kubebuilder webhook manifests
// (module-relative path), keeps the webhooks keep accepts, renames the
// configurations (prefix) and points them at 127.0.0.1:port with envtest's
// CA. Pod webhooks get objectSelector (the controller's own kustomize
// patch adds one; the base manifests select every pod). module may be the
// module's directory (an absolute path) for one outside the build list.
func (e *Env) controllerWebhooks(t TB, module, rel, prefix string, port int, keep func(path string) bool, podSelector *metav1.LabelSelector) []client.Object {
	t.Helper()
	dir := module
	if !filepath.IsAbs(module) {
		var err error
		if dir, err = moduleDir(module); err != nil {
			t.Fatalf("%v", err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, rel))
	if err != nil {
		t.Fatalf("%v", err)
	}
	codecs := serializer.NewCodecFactory(NewScheme())
	ca := e.testEnv.WebhookInstallOptions.LocalServingCAData
	host := e.testEnv.WebhookInstallOptions.LocalServingHost
	point := func(cc *admissionregistrationv1.WebhookClientConfig) bool {
		if cc.Service == nil || cc.Service.Path == nil || !keep(*cc.Service.Path) {
			return false
		}
		u := fmt.Sprintf("https://%s%s", net.JoinHostPort(host, fmt.Sprint(port)), *cc.Service.Path)
		cc.URL, cc.Service, cc.CABundle = &u, nil, ca
		return true
	}
	isPod := func(rules []admissionregistrationv1.RuleWithOperations) bool {
		for _, r := range rules {
			for _, res := range r.Resources {
				if res == "pods" {
					return true
				}
			}
		}
		return false
	}
	var out []client.Object
	for _, doc := range strings.Split(string(raw), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, _, err := codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s webhook manifest: %v", module, err)
		}
		switch o := obj.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			var ws []admissionregistrationv1.MutatingWebhook
			for _, w := range o.Webhooks {
				if point(&w.ClientConfig) {
					if isPod(w.Rules) {
						w.ObjectSelector = podSelector
					}
					ws = append(ws, w)
				}
			}
			o.Name, o.Webhooks = prefix+o.Name, ws
			out = append(out, o)
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			var ws []admissionregistrationv1.ValidatingWebhook
			for _, w := range o.Webhooks {
				if point(&w.ClientConfig) {
					if isPod(w.Rules) {
						w.ObjectSelector = podSelector
					}
					ws = append(ws, w)
				}
			}
			o.Name, o.Webhooks = prefix+o.Name, ws
			out = append(out, o)
		}
	}
	return out
}

func (e *Env) installLWSWebhooks(t TB, port int) {
	t.Helper()
	objs := e.controllerWebhooks(t, "sigs.k8s.io/lws", "config/webhook/manifests.yaml", "lws-", port,
		func(string) bool { return true },
		&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "leaderworkerset.sigs.k8s.io/name", Operator: metav1.LabelSelectorOpExists}}})
	e.createAndWaitWebhooks(t, "lws", port, objs)
}

func (e *Env) installJobSetWebhooks(t TB, port int) {
	t.Helper()
	// The JobSet object webhooks only (defaulting and validation); its pod
	// webhooks serve exclusive placement, which no test uses.
	objs := e.controllerWebhooks(t, "sigs.k8s.io/jobset", "config/components/webhook/manifests.yaml", "jobset-", port,
		func(p string) bool { return strings.Contains(p, "-jobset-x-k8s-io-") }, nil)
	e.createAndWaitWebhooks(t, "jobset", port, objs)
}

// createAndWaitWebhooks waits for the controller's webhook server, then
// installs its configurations.
func (e *Env) createAndWaitWebhooks(t TB, name string, port int, objs []client.Object) {
	t.Helper()
	addr := net.JoinHostPort(e.testEnv.WebhookInstallOptions.LocalServingHost, fmt.Sprint(port))
	deadline := time.Now().Add(60 * time.Second)
	for !tcpOpen(addr) {
		if time.Now().After(deadline) {
			t.Fatalf("the %s controller's webhook server is not listening on %s after 60s", name, addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, o := range objs {
		if err := e.Client.Create(e.Ctx, o); err != nil {
			t.Fatalf("installing %s: %v", o.GetName(), err)
		}
	}
}

func tcpOpen(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
