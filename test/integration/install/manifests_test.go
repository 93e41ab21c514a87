package install

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/yaml"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/preemption"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// Every CRD hack/codegen.sh writes must be installed by the base.
func TestEveryGeneratedCRDIsInTheBase(t *testing.T) {
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(readFile(t, "manifests/base/kustomization.yaml"), &k); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, r := range k.Resources {
		listed[r] = true
	}
	files, err := filepath.Glob(filepath.Join(framework.RepoRoot(), "manifests", "base", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in manifests/base/crds (run make codegen): %v", err)
	}
	for _, f := range files {
		if r := "crds/" + filepath.Base(f); !listed[r] {
			t.Errorf("manifests/base/kustomization.yaml does not list %s", r)
		}
	}
	// The chart's crds/ is a link to the same folder, so Helm installs the same CRDs.
	if dst, err := os.Readlink(filepath.Join(framework.RepoRoot(), "manifests", "helm", "gpupack", "crds")); err != nil || dst != "../../base/crds" {
		t.Errorf("manifests/helm/gpupack/crds should link to ../../base/crds: %q, %v", dst, err)
	}
}

// comparable strips what legitimately differs between a kustomize and a Helm
// rendering (labels, the ConfigMap's hash suffix and comments, the pod
// template's checksum annotation, the Namespace object Helm leaves to
// --create-namespace) so the rest must be equal.
func comparable(t *testing.T, objs []*unstructured.Unstructured) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, o := range objs {
		c := o.DeepCopy()
		if c.GetKind() == "Namespace" {
			continue
		}
		unstructured.RemoveNestedField(c.Object, "metadata", "labels")
		unstructured.RemoveNestedField(c.Object, "spec", "template", "metadata")
		if c.GetKind() == "ConfigMap" && strings.HasPrefix(c.GetName(), "gpupack-config") {
			c.SetName("gpupack-config")
			cfg := webhookConfigFile(t, []*unstructured.Unstructured{o})
			_ = unstructured.SetNestedField(c.Object, map[string]any{"webhook.yaml": cfg}, "data")
		}
		vols, _, _ := unstructured.NestedSlice(c.Object, "spec", "template", "spec", "volumes")
		for _, v := range vols {
			if cm, ok := v.(map[string]any)["configMap"].(map[string]any); ok && strings.HasPrefix(cm["name"].(string), "gpupack-config") {
				cm["name"] = "gpupack-config"
			}
		}
		if len(vols) > 0 {
			_ = unstructured.SetNestedSlice(c.Object, vols, "spec", "template", "spec", "volumes")
		}
		if strings.HasSuffix(c.GetKind(), "WebhookConfiguration") {
			// Entries of different resources do not depend on each other's
			// order (kustomize's merge puts patched-in entries first).
			ws, _, _ := unstructured.NestedSlice(c.Object, "webhooks")
			slices.SortFunc(ws, func(a, b any) int {
				return strings.Compare(fmt.Sprint(a.(map[string]any)["name"]), fmt.Sprint(b.(map[string]any)["name"]))
			})
			_ = unstructured.SetNestedSlice(c.Object, ws, "webhooks")
		}
		out[key(c)] = c.Object
	}
	return out
}

// The Helm chart installs the same objects as the matching overlay.
func TestHelmChartMatchesKustomize(t *testing.T) {
	for _, r := range renderings {
		t.Run(r.name, func(t *testing.T) {
			kust := comparable(t, Kustomize(t, r.overlay))
			helm := comparable(t, Helm(t, append([]string{"--set", "admissionCheck.create=false"}, r.helm...)...))
			keys := map[string]bool{}
			for name := range kust {
				keys[name] = true
			}
			for name := range helm {
				keys[name] = true
			}
			for name := range keys {
				if diff := cmp.Diff(kust[name], helm[name]); diff != "" {
					t.Errorf("%s: kustomize %s (-) and helm %v (+) differ:\n%s", name, r.overlay, r.helm, diff)
				}
			}
		})
	}
}

type bufferSeen struct {
	where                string
	overheadMiB, percent string
}

// buffers collects every place a rendering states the memory buffer.
func buffers(t *testing.T, objs []*unstructured.Unstructured) []bufferSeen {
	t.Helper()
	var out []bufferSeen
	cfg := webhookConfigFile(t, objs)
	b, _ := cfg["buffer"].(map[string]any)
	out = append(out, bufferSeen{"webhook config", str(b["driverOverheadMiB"]), str(b["bufferPercent"])})
	for _, o := range objs {
		switch o.GetKind() {
		case "DaemonSet":
			args := containerArgs(t, o)
			oh, _ := flagValue(args, "driver-overhead-mib")
			pc, _ := flagValue(args, "buffer-percent")
			out = append(out, bufferSeen{"gpupack-node flags", oh, pc})
		case "GangFitParameters":
			var p v1alpha1.GangFitParameters
			into(t, o, &p)
			out = append(out, bufferSeen{"GangFitParameters " + o.GetName(), ptrStr(p.Spec.Buffer.DriverOverheadMiB), ptrStr(p.Spec.Buffer.BufferPercent)})
		}
	}
	return out
}

func str(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	default:
		return fmt.Sprint(x)
	}
}

func ptrStr[T int32 | int64](p *T) string {
	if p == nil {
		return ""
	}
	return strconv.FormatInt(int64(*p), 10)
}

// The webhook, the node agent and the check must use one buffer (DESIGN:
// "the same figure is used by the check, the webhook's validation, the node
// agent's advertised capacity"), in every rendering and after changing the
// Helm values.
func TestOneBufferEverywhere(t *testing.T) {
	cases := []struct {
		name        string
		objs        func(t *testing.T) []*unstructured.Unstructured
		overheadMiB string
		percent     string
		wantSources int
	}{
		{"helm defaults", func(t *testing.T) []*unstructured.Unstructured { return Helm(t) }, "1500", "10", 3},
		{"helm buffer values", func(t *testing.T) []*unstructured.Unstructured {
			return Helm(t, "--set", "buffer.driverOverheadMiB=2048", "--set", "buffer.bufferPercent=15")
		}, "2048", "15", 3},
		{"helm hami", func(t *testing.T) []*unstructured.Unstructured {
			return Helm(t, "-f", "manifests/helm/gpupack/values-hami.yaml")
		}, "1500", "10", 2},
		{"kustomize default + examples", func(t *testing.T) []*unstructured.Unstructured {
			return append(append([]*unstructured.Unstructured{}, Kustomize(t, "manifests/overlays/default")...), Kustomize(t, "manifests/examples")...)
		}, "1500", "10", 3},
	}
	for _, r := range renderings {
		cases = append(cases, struct {
			name        string
			objs        func(t *testing.T) []*unstructured.Unstructured
			overheadMiB string
			percent     string
			wantSources int
		}{"kustomize " + r.name, func(t *testing.T) []*unstructured.Unstructured { return Kustomize(t, r.overlay) }, "1500", "10", map[bool]int{true: 1, false: 2}[r.name == "hami"]})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seen := buffers(t, tc.objs(t))
			if len(seen) != tc.wantSources {
				t.Errorf("found the buffer in %d places, want %d: %+v", len(seen), tc.wantSources, seen)
			}
			for _, s := range seen {
				if s.overheadMiB != tc.overheadMiB || s.percent != tc.percent {
					t.Errorf("%s: driverOverheadMiB %q bufferPercent %q, want %s and %s", s.where, s.overheadMiB, s.percent, tc.overheadMiB, tc.percent)
				}
			}
		})
	}
}

// Each Helm knob reaches every object it must.
func TestHelmKnobs(t *testing.T) {
	t.Run("envPolicy", func(t *testing.T) {
		if got := webhookConfigFile(t, Helm(t, "--set", "webhook.envPolicy=Deny"))["envPolicy"]; got != "Deny" {
			t.Errorf("envPolicy %v, want Deny", got)
		}
	})
	t.Run("resources", func(t *testing.T) {
		if got := webhookConfigFile(t, Helm(t))["resources"]; got != mutation.ResourcesGpupack {
			t.Errorf("default resources %v, want %s", got, mutation.ResourcesGpupack)
		}
		for _, objs := range [][]*unstructured.Unstructured{Helm(t, "--set", "webhook.resources=hami"), Helm(t, "-f", "manifests/helm/gpupack/values-hami.yaml"), Kustomize(t, "manifests/overlays/hami")} {
			if got := webhookConfigFile(t, objs)["resources"]; got != mutation.ResourcesHAMi {
				t.Errorf("resources %v, want %s", got, mutation.ResourcesHAMi)
			}
		}
	})
	t.Run("hook path", func(t *testing.T) {
		objs := Helm(t, "--set", "hook.hostPath=/opt/gpupack/hook")
		if got := webhookConfigFile(t, objs)["hook"].(map[string]any)["hostPath"]; got != "/opt/gpupack/hook" {
			t.Errorf("webhook config hook.hostPath %v", got)
		}
		ds := find(t, objs, "DaemonSet", "gpupack-node")
		if v, _ := flagValue(containerArgs(t, ds), "hook-dir"); v != "/opt/gpupack/hook" {
			t.Errorf("gpupack-node --hook-dir=%q", v)
		}
		vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
		found := false
		for _, v := range vols {
			if p, _, _ := unstructured.NestedString(v.(map[string]any), "hostPath", "path"); p == "/opt/gpupack/hook" {
				found = true
			}
		}
		if !found {
			t.Errorf("gpupack-node mounts no hostPath /opt/gpupack/hook: %v", vols)
		}
	})
	t.Run("topology levels", func(t *testing.T) {
		objs := Helm(t, "--set-json", `admissionCheck.topologyLevels=["example.com/spine","example.com/leaf"]`, "--set", "admissionCheck.requiredLevel=example.com/leaf")
		var p v1alpha1.GangFitParameters
		into(t, find(t, objs, "GangFitParameters", "default"), &p)
		want := v1alpha1.GangFitParametersSpec{
			TopologyLevels: []string{"example.com/spine", "example.com/leaf"}, RequiredLevel: "example.com/leaf",
			Buffer: v1alpha1.BufferSettings{DriverOverheadMiB: ptrTo[int64](1500), BufferPercent: ptrTo[int32](10)}, Policy: v1alpha1.PolicyBestFit,
		}
		if diff := cmp.Diff(want, p.Spec); diff != "" {
			t.Errorf("GangFitParameters spec (-want +got):\n%s", diff)
		}
		var ac kueue.AdmissionCheck
		into(t, find(t, objs, "AdmissionCheck", "gpupack-gang-fit"), &ac)
		if ac.Spec.ControllerName != v1alpha1.ControllerName || ac.Spec.Parameters == nil || ac.Spec.Parameters.Name != "default" || ac.Spec.Parameters.APIGroup != v1alpha1.GroupName {
			t.Errorf("AdmissionCheck spec %+v does not point gpupack.io/gang-fit at GangFitParameters default", ac.Spec)
		}
	})
	t.Run("bad values are refused", func(t *testing.T) {
		for _, set := range []string{"buffer.bufferPercent=95", "webhook.failurePolicy=Sometimes", "webhook.envPolicy=Keep", "hook.preload=Maybe", "webhook.resources=vgpu"} {
			if _, err := run(t, "helm", "template", "gpupack", "manifests/helm/gpupack", "--set", set); err == nil {
				t.Errorf("helm template --set %s succeeded, want a values schema error", set)
			} else if field := strings.Split(strings.Split(set, "=")[0], ".")[1]; !strings.Contains(err.Error(), field) {
				t.Errorf("helm template --set %s: error does not name %s: %v", set, field, err)
			}
		}
	})
}

func ptrTo[T any](v T) *T { return &v }

// The eviction webhook configuration is the one the preemption package
// describes, pointed at the gpupack-webhook Service.
func TestEvictionWebhookMatchesPreemption(t *testing.T) {
	want := preemption.EvictionWebhookConfiguration(Namespace, webhooks.DefaultServeOptions().ServiceName)
	// The manifests scope it like the GPU webhooks (issue 14): kube-system's
	// and gpupack's own pods are never held.
	for i := range want.Webhooks {
		want.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", Namespace}}}}
	}
	for name, objs := range map[string][]*unstructured.Unstructured{
		"kustomize": Kustomize(t, "manifests/overlays/default"),
		"helm":      Helm(t),
	} {
		var got admissionregistrationv1.ValidatingWebhookConfiguration
		into(t, find(t, objs, "ValidatingWebhookConfiguration", want.Name), &got)
		if diff := cmp.Diff(want.Webhooks, got.Webhooks); diff != "" {
			t.Errorf("%s: eviction webhook differs from preemption.EvictionWebhookConfiguration (-want +got):\n%s", name, diff)
		}
	}
}

// The GPU webhook configurations are the ones the webhooks package builds
// (the manager's cert rotator injects its CA into them by name), in every
// rendering and with the Helm knobs applied.
func TestWebhookConfigurationsMatchGo(t *testing.T) {
	statefulSets := func(o *webhooks.ServeOptions) { o.JobKinds = []string{webhooks.KindStatefulSet} }
	certManager := func(o *webhooks.ServeOptions) { o.CertManagerCertificate = Namespace + "/gpupack-webhook-cert" }
	cases := []struct {
		name   string
		objs   func(t *testing.T) []*unstructured.Unstructured
		opts   func(o *webhooks.ServeOptions)
		policy admissionregistrationv1.FailurePolicyType
	}{
		{"kustomize default", func(t *testing.T) []*unstructured.Unstructured { return Kustomize(t, "manifests/overlays/default") }, nil, admissionregistrationv1.Fail},
		{"kustomize cert-manager", func(t *testing.T) []*unstructured.Unstructured {
			return Kustomize(t, "manifests/overlays/cert-manager")
		}, certManager, admissionregistrationv1.Fail},
		{"helm defaults", func(t *testing.T) []*unstructured.Unstructured { return Helm(t) }, nil, admissionregistrationv1.Fail},
		{"helm cert-manager", func(t *testing.T) []*unstructured.Unstructured { return Helm(t, "--set", "certManager.enabled=true") }, certManager, admissionregistrationv1.Fail},
		{"helm knobs", func(t *testing.T) []*unstructured.Unstructured {
			return Helm(t, "--set", "webhook.failurePolicy=Ignore,webhook.timeoutSeconds=5", "--set-json", `webhook.extraExcludedNamespaces=["monitoring"]`)
		}, func(o *webhooks.ServeOptions) { o.ExcludedNamespaces = []string{"monitoring"}; o.TimeoutSeconds = 5 }, admissionregistrationv1.Ignore},
		{"helm validatePodCreate", func(t *testing.T) []*unstructured.Unstructured {
			return Helm(t, "--set", "webhook.validatePodCreate=true")
		},
			func(o *webhooks.ServeOptions) { o.ValidatePodCreate = true }, admissionregistrationv1.Fail},
		// The StatefulSet entries ship wherever LWS or StatefulSets are
		// enabled (the StatefulSet pods' fast path needs every template
		// admitted), and fail closed whatever webhook.failurePolicy says.
		{"kustomize job-kinds", func(t *testing.T) []*unstructured.Unstructured { return Kustomize(t, "manifests/overlays/job-kinds") }, statefulSets, admissionregistrationv1.Fail},
		{"helm leaderworkerset", func(t *testing.T) []*unstructured.Unstructured {
			return Helm(t, "--set-json", `jobKinds.integrations=["leaderworkerset.x-k8s.io/leaderworkerset"]`)
		}, statefulSets, admissionregistrationv1.Fail},
		{"helm statefulset, failurePolicy Ignore", func(t *testing.T) []*unstructured.Unstructured {
			return Helm(t, "--set", "webhook.failurePolicy=Ignore", "--set-json", `jobKinds.integrations=["statefulset"]`)
		}, statefulSets, admissionregistrationv1.Ignore},
		{"helm jobset only: no StatefulSet entries", func(t *testing.T) []*unstructured.Unstructured {
			return Helm(t, "--set-json", `jobKinds.integrations=["jobset.x-k8s.io/jobset"]`)
		}, nil, admissionregistrationv1.Fail},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := webhooks.DefaultServeOptions()
			if tc.opts != nil {
				tc.opts(&o)
			}
			wantM, wantV := webhooks.WebhookConfigurations(o)
			fail := admissionregistrationv1.Fail
			policyOf := func(name string) *admissionregistrationv1.FailurePolicyType {
				if strings.Contains(name, "statefulset") {
					return &fail
				}
				return &tc.policy
			}
			for i := range wantM.Webhooks {
				wantM.Webhooks[i].FailurePolicy = policyOf(wantM.Webhooks[i].Name)
			}
			for i := range wantV.Webhooks {
				wantV.Webhooks[i].FailurePolicy = policyOf(wantV.Webhooks[i].Name)
			}
			objs := tc.objs(t)
			var gotM admissionregistrationv1.MutatingWebhookConfiguration
			var gotV admissionregistrationv1.ValidatingWebhookConfiguration
			into(t, find(t, objs, "MutatingWebhookConfiguration", wantM.Name), &gotM)
			into(t, find(t, objs, "ValidatingWebhookConfiguration", wantV.Name), &gotV)
			// Entries of different resources do not depend on each other's
			// order (the component's patch puts StatefulSet's first).
			byName := func(a, b string) int { return strings.Compare(a, b) }
			slices.SortFunc(wantM.Webhooks, func(a, b admissionregistrationv1.MutatingWebhook) int { return byName(a.Name, b.Name) })
			slices.SortFunc(gotM.Webhooks, func(a, b admissionregistrationv1.MutatingWebhook) int { return byName(a.Name, b.Name) })
			slices.SortFunc(wantV.Webhooks, func(a, b admissionregistrationv1.ValidatingWebhook) int { return byName(a.Name, b.Name) })
			slices.SortFunc(gotV.Webhooks, func(a, b admissionregistrationv1.ValidatingWebhook) int { return byName(a.Name, b.Name) })
			if diff := cmp.Diff(wantM.Webhooks, gotM.Webhooks); diff != "" {
				t.Errorf("mutating webhooks differ from webhooks.WebhookConfigurations (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantV.Webhooks, gotV.Webhooks); diff != "" {
				t.Errorf("validating webhooks differ from webhooks.WebhookConfigurations (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantM.Annotations, gotM.Annotations); diff != "" {
				t.Errorf("mutating annotations (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantV.Annotations, gotV.Annotations); diff != "" {
				t.Errorf("validating annotations (-want +got):\n%s", diff)
			}
		})
	}
}

// Every rendering's webhook configuration file is one the manager accepts.
func TestWebhookConfigFilesLoad(t *testing.T) {
	objs := map[string][]*unstructured.Unstructured{}
	for _, r := range renderings {
		objs["kustomize "+r.name] = Kustomize(t, r.overlay)
		objs["helm "+strings.Join(r.helm, " ")] = Helm(t, r.helm...)
	}
	objs["helm deny, env preload"] = Helm(t, "--set", "webhook.envPolicy=Deny,hook.preload=Env")
	for name, o := range objs {
		for _, cm := range o {
			if cm.GetKind() != "ConfigMap" || !strings.HasPrefix(cm.GetName(), "gpupack-config") {
				continue
			}
			data, _, _ := unstructured.NestedString(cm.Object, "data", "webhook.yaml")
			if _, err := mutation.ParseConfig([]byte(data)); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

// The example ClusterQueue's gpupack.io/* quotas are what the flavor's
// nodes advertise under the example's buffer.
func TestExampleQuotaComesFromTheFlavorsHelper(t *testing.T) {
	objs := Kustomize(t, "manifests/examples")
	var cq kueue.ClusterQueue
	into(t, find(t, objs, "ClusterQueue", "gpu"), &cq)
	var p v1alpha1.GangFitParameters
	into(t, find(t, objs, "GangFitParameters", "default"), &p)
	buf := flavors.NewBuffer(p.Spec.Buffer.DriverOverheadMiB, p.Spec.Buffer.BufferPercent)
	slots, ok := flagValue(containerArgs(t, find(t, Kustomize(t, "manifests/overlays/default"), "DaemonSet", "gpupack-node")), "slots-per-gpu")
	if !ok {
		t.Fatal("gpupack-node has no --slots-per-gpu")
	}
	nSlots, _ := strconv.ParseInt(slots, 10, 64)

	if len(cq.Spec.ResourceGroups) != 1 {
		t.Fatalf("want one resource group, have %d", len(cq.Spec.ResourceGroups))
	}
	rg := cq.Spec.ResourceGroups[0]
	for _, fq := range rg.Flavors {
		var rf kueue.ResourceFlavor
		into(t, find(t, objs, "ResourceFlavor", string(fq.Name)), &rf)
		prof, ok := flavors.Lookup(rf.Spec.NodeLabels[flavors.LabelGPUProduct])
		if !ok {
			t.Fatalf("flavor %s: unknown GPU model %q", fq.Name, rf.Spec.NodeLabels[flavors.LabelGPUProduct])
		}
		quota := map[string]resource.Quantity{}
		for _, r := range fq.Resources {
			quota[string(r.Name)] = r.NominalQuota
		}
		gpus := quota[v1alpha1.ResourceNvidiaGPU]
		n := gpus.Value()
		want := map[string]int64{
			v1alpha1.ResourceGPUMemory: buf.GPUMemoryQuotaMiB(prof.MemoryMiB, n),
			v1alpha1.ResourceGPUCores:  100 * n,
			v1alpha1.ResourceVGPU:      nSlots * n,
		}
		for r, w := range want {
			q, ok := quota[r]
			if !ok {
				t.Errorf("flavor %s has no %s quota (a ClusterQueue that serves GPU jobs covers all gpupack.io resources)", fq.Name, r)
				continue
			}
			if q.Value() != w {
				t.Errorf("flavor %s: %s quota %s, want %d (%d GPUs of %s, %d MiB physical)", fq.Name, r, q.String(), w, n, prof.Model, prof.MemoryMiB)
			}
		}
	}
	if cq.Spec.AdmissionChecksStrategy == nil || len(cq.Spec.AdmissionChecksStrategy.AdmissionChecks) != 1 {
		t.Fatalf("ClusterQueue names no admission check: %+v", cq.Spec.AdmissionChecksStrategy)
	}
	var ac kueue.AdmissionCheck
	into(t, find(t, objs, "AdmissionCheck", string(cq.Spec.AdmissionChecksStrategy.AdmissionChecks[0].Name)), &ac)
	if ac.Spec.ControllerName != v1alpha1.ControllerName || ac.Spec.Parameters.Name != p.Name {
		t.Errorf("AdmissionCheck %s: controller %q parameters %+v", ac.Name, ac.Spec.ControllerName, ac.Spec.Parameters)
	}
}

// helm lint passes with the defaults and with every option on.
func TestHelmLint(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"-f", "manifests/helm/gpupack/values-hami.yaml", "--set", "certManager.enabled=true,volcano.enabled=true,metrics.serviceMonitor.enabled=true,webhook.envPolicy=Deny"},
	} {
		out, err := run(t, "helm", append([]string{"lint", "--strict", "manifests/helm/gpupack"}, args...)...)
		if err != nil {
			t.Errorf("helm lint %v: %v\n%s", args, err, out)
		}
	}
}
