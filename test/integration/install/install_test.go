package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
)

const fieldOwner = "gpupack-install-check"

// apply server-side applies objs in dependency order (namespaces and CRDs
// first, then everything else) and reports every object the apiserver
// rejects.
func apply(t *testing.T, env *framework.Env, what string, objs []*unstructured.Unstructured) {
	t.Helper()
	first := func(u *unstructured.Unstructured) int {
		switch u.GetKind() {
		case "Namespace":
			return 0
		case "CustomResourceDefinition":
			return 1
		}
		return 2
	}
	objs = append([]*unstructured.Unstructured(nil), objs...)
	sort.SliceStable(objs, func(i, j int) bool { return first(objs[i]) < first(objs[j]) })
	// A fresh client: its REST mapper discovers CRDs applied by earlier steps.
	c := newClient(t, env)
	var rejected []string
	crdsWaited := false
	for _, o := range objs {
		if first(o) == 2 && !crdsWaited {
			crdsWaited = true
			waitCRDsEstablished(t, env, objs)
		}
		u := o.DeepCopy()
		var err error
		// A CRD applied a moment ago may not be in discovery yet.
		for try := 0; try < 50; try++ {
			err = c.Apply(env.Ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(fieldOwner), client.ForceOwnership)
			if err == nil || !meta.IsNoMatchError(err) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			rejected = append(rejected, fmt.Sprintf("%s: %v", key(o), err))
		}
	}
	if len(rejected) > 0 {
		t.Errorf("%s: the apiserver rejected %d of %d objects:\n  %s", what, len(rejected), len(objs), strings.Join(rejected, "\n  "))
	} else {
		t.Logf("%s: %d objects applied", what, len(objs))
	}
}

// newClient has the framework's types plus CRDs.
func newClient(t *testing.T, env *framework.Env) client.Client {
	t.Helper()
	s := framework.NewScheme()
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitCRDsEstablished(t *testing.T, env *framework.Env, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		env.Eventually(t, 30*time.Second, "CRD "+o.GetName()+" established", func() (bool, string) {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := newClient(t, env).Get(env.Ctx, client.ObjectKey{Name: o.GetName()}, &crd); err != nil {
				return false, err.Error()
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, ""
				}
			}
			return false, "not established"
		})
	}
}

// thirdPartyCRDs are the CRDs the optional overlays need (cert-manager, the
// Prometheus operator), copied from their Go modules by
// hack/build-install-tools.sh.
func thirdPartyCRDs(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(tools(t), "install-crds", "*", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no third-party CRDs under %s/install-crds: %v", tools(t), err)
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decode(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, objs...)
	}
	return out
}

// TestInstallCheck is make install-check: every rendering is applied to the
// real apiserver (with real Kueue and its webhooks), the GPU webhooks are
// seen to fail closed for GPU objects only, and the built gpupack-manager
// runs with the Deployment's arguments under the manifests' RBAC.
func TestInstallCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	tools(t)
	mgrBin := os.Getenv("GPUPACK_MANAGER_BIN") // a prebuilt manager, for debugging
	if mgrBin == "" {
		mgrBin = buildBinary(t, "gpupack-manager")
	}
	env := framework.Start(t, framework.Options{OperatorCRDs: true}) // manifests/examples has a TrainJob, Ray and MPI jobs

	apply(t, env, "cert-manager and ServiceMonitor CRDs", thirdPartyCRDs(t))
	// The examples first: once the gpupack webhooks are registered, GPU
	// jobs need a manager serving them.
	apply(t, env, "manifests/examples", Kustomize(t, "manifests/examples"))
	apply(t, env, "kustomize manifests/overlays/default", Kustomize(t, "manifests/overlays/default"))
	if t.Failed() {
		t.FailNow()
	}

	t.Run("GPU webhooks fail closed for GPU objects only", func(t *testing.T) {
		webhookScope(t, env)
	})
	t.Run("gpupack-manager runs under the manifests' RBAC", func(t *testing.T) {
		runManager(t, env, mgrBin, find(t, Kustomize(t, "manifests/overlays/default"), "Deployment", "gpupack-manager"))
	})

	// Every other variant on top (switching overlays is an upgrade path too).
	for _, r := range renderings[1:] {
		apply(t, env, "kustomize "+r.overlay, Kustomize(t, r.overlay))
	}
	apply(t, env, "helm template (defaults)", Helm(t))
	for _, r := range renderings[1:] {
		apply(t, env, "helm template "+strings.Join(r.helm, " "), Helm(t, r.helm...))
	}
	apply(t, env, "helm template (all options)", Helm(t, "--set", "certManager.enabled=true,volcano.enabled=true,metrics.serviceMonitor.enabled=true,webhook.failurePolicy=Ignore,webhook.envPolicy=Deny",
		"--set-json", `admissionCheck.topologyLevels=["network.topology.nvidia.com/spine","network.topology.nvidia.com/leaf","gpupack.io/nvlink-domain"]`,
		"--set", "admissionCheck.requiredLevel=network.topology.nvidia.com/leaf"))
}

func gpuPod(name, ns string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "busybox",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}},
		}}},
	}
}

// webhookScope: no manager serves the webhooks yet, so the Service has no
// endpoints. A GPU pod in a user namespace must be refused by gpupack's
// webhook; a CPU pod there, and a GPU pod in kube-system, must be admitted.
func webhookScope(t *testing.T, env *framework.Env) {
	cpuPod := gpuPod("cpu", "ml-team")
	cpuPod.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	annotated := gpuPod("annotated", "ml-team")
	annotated.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	annotated.Annotations = map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	cases := []struct {
		name    string
		pod     *corev1.Pod
		refused string // the webhook that must refuse it; "" = admitted
	}{
		{"GPU pod in a user namespace", gpuPod("gpu", "ml-team"), "mpod.gpupack.io"},
		{"pod with only a gpu-memory annotation", annotated, "mpod.gpupack.io"},
		{"CPU pod in a user namespace", cpuPod, ""},
		{"GPU pod in kube-system", gpuPod("gpu", "kube-system"), ""},
		{"GPU pod in gpupack-system", gpuPod("gpu", Namespace), ""},
	}
	for _, tc := range cases {
		err := env.Client.Create(env.Ctx, tc.pod, client.DryRunAll)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.refused != "" && err == nil:
			t.Errorf("%s: admitted, want refused by %s (failurePolicy Fail)", tc.name, tc.refused)
		case tc.refused != "" && !strings.Contains(err.Error(), tc.refused):
			t.Errorf("%s: refused, but not by %s: %v", tc.name, tc.refused, err)
		}
	}
}

var (
	buildMu   sync.Mutex
	buildDir  string
	buildErrs = map[string]error{}
)

// buildBinary builds ./cmd/NAME as make build does (the Go build cache
// makes a second build cheap).
func buildBinary(t *testing.T, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir == "" {
		d, err := os.MkdirTemp("", "gpupack-install-check-")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = d
	}
	out := filepath.Join(buildDir, name)
	if _, err := os.Stat(out); err == nil {
		return out
	}
	if err, ok := buildErrs[name]; ok {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = framework.RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		buildErrs[name] = fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, b)
		t.Fatal(buildErrs[name])
	}
	return out
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var flagRE = regexp.MustCompile(`(?m)^\s+-([a-z0-9][a-z0-9-]*)`)

// binaryFlags lists the flags a Go binary prints for -help.
func binaryFlags(t *testing.T, bin string) map[string]bool {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, "-help")
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // -help exits 0 or 2 depending on the flag set
	flags := map[string]bool{}
	for _, m := range flagRE.FindAllStringSubmatch(out.String(), -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("%s -help listed no flags:\n%s", bin, out.String())
	}
	return flags
}

// The Deployment and DaemonSet pass only flags their binaries define, in
// every rendering (a renamed flag would crash-loop the pods).
func TestManifestFlagsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bins := map[string]string{"Deployment/gpupack-manager": "gpupack-manager", "DaemonSet/gpupack-node": "gpupack-node"}
	known := map[string]map[string]bool{}
	for _, bin := range bins {
		if _, err := os.Stat(filepath.Join(framework.RepoRoot(), "cmd", bin, "main.go")); err != nil {
			t.Logf("cmd/%s/main.go not there yet: its flags are not checked", bin)
			continue
		}
		known[bin] = binaryFlags(t, buildBinary(t, bin))
	}
	var all [][]*unstructured.Unstructured
	for _, r := range renderings {
		all = append(all, Kustomize(t, r.overlay), Helm(t, r.helm...))
	}
	for _, objs := range all {
		for _, o := range objs {
			bin, ok := bins[o.GetKind()+"/"+o.GetName()]
			if !ok || known[bin] == nil {
				continue
			}
			for _, a := range containerArgs(t, o) {
				name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if !known[bin][name] {
					t.Errorf("%s passes %s, which %s does not define", key(o), a, bin)
				}
			}
		}
	}
}

// mountVolumes materialises the container's Secret and ConfigMap volumes in
// temp dirs, as the kubelet does, and keeps Secrets in sync until the test
// ends. It returns mountPath → dir.
func mountVolumes(t *testing.T, env *framework.Env, ns string, vols []corev1.Volume, vms []corev1.VolumeMount) map[string]string {
	t.Helper()
	byName := map[string]corev1.Volume{}
	for _, v := range vols {
		byName[v.Name] = v
	}
	out := map[string]string{}
	for _, vm := range vms {
		v, ok := byName[vm.Name]
		if !ok {
			t.Fatalf("volumeMount %s names no volume", vm.Name)
		}
		dir := t.TempDir()
		out[vm.MountPath] = dir
		switch {
		case v.ConfigMap != nil:
			var cm corev1.ConfigMap
			if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: v.ConfigMap.Name}, &cm); err != nil {
				t.Fatalf("volume %s: %v", v.Name, err)
			}
			for k, d := range cm.Data {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(d), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		case v.Secret != nil:
			name := v.Secret.SecretName
			sync := func() error {
				var s corev1.Secret
				if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
					return err
				}
				for k, d := range s.Data {
					p := filepath.Join(dir, k)
					if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, d) {
						continue
					}
					if err := os.WriteFile(p+".tmp", d, 0o600); err != nil {
						return err
					}
					if err := os.Rename(p+".tmp", p); err != nil {
						return err
					}
				}
				return nil
			}
			if err := sync(); err != nil {
				t.Fatalf("volume %s: %v", v.Name, err)
			}
			ctx, cancel := context.WithCancel(env.Ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-ctx.Done():
						return
					case <-time.After(300 * time.Millisecond):
						_ = sync()
					}
				}
			}()
			t.Cleanup(func() { cancel(); <-done })
		default:
			t.Fatalf("volume %s: only Secret and ConfigMap volumes are emulated", v.Name)
		}
	}
	return out
}

// impersonatingKubeconfig is the admin kubeconfig acting as a ServiceAccount.
func impersonatingKubeconfig(t *testing.T, env *framework.Env, ns, sa string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + ns + ":" + sa
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig-"+sa)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	// The impersonated identity really is restricted: it may not list secrets
	// cluster-wide (a smoke test of the setup itself).
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.List(context.Background(), &corev1.SecretList{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing secrets in all namespaces as %s: %v, want forbidden", sa, err)
	}
	return path
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
