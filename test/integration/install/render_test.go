// Package install is `make install-check`: it renders manifests/ (every
// kustomize overlay, the examples and the Helm chart with several values),
// checks that the renderings agree with each other and with the Go code they
// configure, and applies them with server-side apply to a real kube-apiserver
// with real Kueue, where any rejected object fails the test. It then runs the
// built gpupack-manager with the Deployment's own arguments under the
// manifests' ServiceAccount and RBAC, and waits until it is ready and leading.
//
// kustomize and helm are built from pinned Go modules by
// hack/build-install-tools.sh (skipped when already built).
package install

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/gpupack/gpupack/test/framework"
)

// Namespace is where every rendering installs gpupack.
const Namespace = "gpupack-system"

var (
	toolsOnce sync.Once
	toolsErr  error
)

// tools builds kustomize and helm (and copies third-party CRDs) once.
func tools(t testing.TB) string {
	t.Helper()
	toolsOnce.Do(func() {
		cmd := exec.Command(filepath.Join(framework.RepoRoot(), "hack", "build-install-tools.sh"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			toolsErr = fmt.Errorf("hack/build-install-tools.sh: %v\n%s", err, out.String())
		}
	})
	if toolsErr != nil {
		t.Fatal(toolsErr)
	}
	return framework.ToolsDir()
}

var (
	renderMu    sync.Mutex
	renderCache = map[string][]*unstructured.Unstructured{}
)

// run runs a rendering tool in the repo root and returns its stdout.
func run(t testing.TB, name string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(tools(t), name), args...)
	cmd.Dir = framework.RepoRoot()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, errb.String())
	}
	return out.Bytes(), nil
}

// render returns the objects of `kustomize build DIR` or `helm template …`,
// cached by command line (objects are shared: deep-copy before changing).
func render(t testing.TB, name string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	key := name + " " + strings.Join(args, " ")
	renderMu.Lock()
	defer renderMu.Unlock()
	if objs, ok := renderCache[key]; ok {
		return objs
	}
	out, err := run(t, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	renderCache[key] = objs
	return objs
}

// Kustomize renders a folder of the repo (e.g. manifests/overlays/default).
func Kustomize(t testing.TB, dir string) []*unstructured.Unstructured {
	return render(t, "kustomize", "build", dir)
}

// Helm renders the chart with CRDs, released as "gpupack" into Namespace.
func Helm(t testing.TB, args ...string) []*unstructured.Unstructured {
	return render(t, "helm", append([]string{"template", "gpupack", "manifests/helm/gpupack", "--namespace", Namespace, "--include-crds"}, args...)...)
}

// decode splits a YAML stream into objects.
func decode(data []byte) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("object without kind, apiVersion or name: %v", m)
		}
		objs = append(objs, u)
	}
}

func key(u *unstructured.Unstructured) string {
	return u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()
}

// find returns the one object of kind and name (namespace ignored).
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	var have []string
	for _, o := range objs {
		have = append(have, key(o))
	}
	sort.Strings(have)
	t.Fatalf("no %s %q in the rendering; have %s", kind, name, strings.Join(have, ", "))
	return nil
}

func has(objs []*unstructured.Unstructured, kind, name string) bool {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return true
		}
	}
	return false
}

// into converts an unstructured object to a typed one.
func into(t testing.TB, u *unstructured.Unstructured, obj any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, obj, true); err != nil {
		t.Fatalf("%s: %v", key(u), err)
	}
}

// containerArgs returns the args of the first container of a Deployment or DaemonSet.
func containerArgs(t testing.TB, u *unstructured.Unstructured) []string {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatalf("%s has no containers", key(u))
	}
	args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	return args
}

// flagValue returns the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// webhookConfigFile returns the parsed webhook.yaml of the gpupack-config
// ConfigMap (kustomize adds a hash suffix to its name).
func webhookConfigFile(t testing.TB, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "gpupack-config") {
			s, _, _ := unstructured.NestedString(o.Object, "data", "webhook.yaml")
			var m map[string]any
			if err := yaml.Unmarshal([]byte(s), &m); err != nil {
				t.Fatalf("%s webhook.yaml: %v", key(o), err)
			}
			return m
		}
	}
	t.Fatalf("no gpupack-config ConfigMap in the rendering")
	return nil
}

// renderings are every install variant the repo ships: each kustomize
// overlay and the Helm values that should give the same objects.
var renderings = []struct {
	name    string
	overlay string
	helm    []string
}{
	{"default", "manifests/overlays/default", nil},
	{"volcano", "manifests/overlays/volcano", []string{"--set", "volcano.enabled=true"}},
	{"hami", "manifests/overlays/hami", []string{"-f", "manifests/helm/gpupack/values-hami.yaml"}},
	{"cert-manager", "manifests/overlays/cert-manager", []string{"--set", "certManager.enabled=true"}},
	{"prometheus", "manifests/overlays/prometheus", []string{"--set", "metrics.serviceMonitor.enabled=true"}},
	{"job-kinds", "manifests/overlays/job-kinds", []string{"--set-json", `jobKinds.integrations=["jobset.x-k8s.io/jobset","trainer.kubeflow.org/trainjob","leaderworkerset.x-k8s.io/leaderworkerset","ray.io/rayjob","ray.io/raycluster","kubeflow.org/mpijob","deployment","statefulset"]`}},
}

func readFile(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(framework.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
