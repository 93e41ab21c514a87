package preemption

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
)

// Reporting without wide RBAC: with manifests/examples/
// checkpoint-report-own-pod.yaml, a training pod's service account (which
// holds "patch pods" so its agent can report) may set
// gpupack.io/checkpoint-step on its own pod only — not on a neighbour's
// pod, and nothing else on its own.
func TestReportOnlyOnOwnPod(t *testing.T) {
	env := framework.Start(t, framework.Options{NoKueue: true})
	raw, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "manifests", "examples", "checkpoint-report-own-pod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if len(u.Object) == 0 {
			continue
		}
		env.MustCreate(t, &u)
	}
	ns := env.Namespace(t, "ml")
	nsObj := &corev1.Namespace{}
	if err := env.Client.Get(env.Ctx, types.NamespacedName{Name: ns}, nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["gpupack.io/checkpoint-report"] = "own-pod"
	if err := env.Client.Update(env.Ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	env.MustCreate(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: ns}})
	env.MustCreate(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "reporter", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}}}})
	env.MustCreate(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reporter", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "reporter"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "trainer", Namespace: ns}}})
	mk := func(name string, ann map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann, Labels: map[string]string{"app": "train"}},
			Spec: corev1.PodSpec{ServiceAccountName: "trainer", Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}}
		env.MustCreate(t, p)
		return p
	}
	own := mk("rank-0", map[string]string{v1alpha1.AnnotationCheckpoint: "true"})
	other := mk("rank-1", map[string]string{v1alpha1.AnnotationCheckpoint: "true"})
	bare := mk("bare", nil)
	probe := mk("probe", nil)

	// The token the kubelet would mount into rank-0 (bound to the pod).
	tokenFor := func(p *corev1.Pod) *kubernetes.Clientset {
		tr, err := env.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(env.Ctx, "trainer", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for %s: %v", p.Name, err)
		}
		cfg := rest.AnonymousClientConfig(env.Config)
		cfg.BearerToken = tr.Status.Token
		return kubernetes.NewForConfigOrDie(cfg)
	}
	asOwn, asBare := tokenFor(own), tokenFor(bare)
	patch := func(c *kubernetes.Clientset, pod, body string) error {
		_, err := c.CoreV1().Pods(ns).Patch(env.Ctx, pod, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	step := func(n int) string {
		return fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}}}`, v1alpha1.AnnotationCheckpointStep, n)
	}
	// Policies take effect after a moment: wait for the first denial.
	env.Eventually(t, 30*time.Second, "policy in force (a probe pod refused)", func() (bool, string) {
		err := patch(asOwn, probe.Name, step(1))
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), fmt.Sprint(err)
	})
	if err := patch(asOwn, own.Name, step(1200)); err != nil {
		t.Errorf("the agent's report on its own pod: %v, want allowed", err)
	}
	// A pod without annotations reports its first annotation.
	if err := patch(asBare, bare.Name, step(7)); err != nil {
		t.Errorf("report on its own pod without annotations: %v, want allowed", err)
	}
	for name, body := range map[string]string{
		"another annotation":        `{"metadata":{"annotations":{"gpupack.io/last-consistent-checkpoint":"99999"}}}`,
		"dropping the opt-in":       fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, v1alpha1.AnnotationCheckpoint),
		"a label":                   `{"metadata":{"labels":{"app":"x"}}}`,
		"devices (placement)":       fmt.Sprintf(`{"metadata":{"annotations":{%q:"GPU-x:1"}}}`, v1alpha1.AnnotationDevices),
		"the request (coordinator)": fmt.Sprintf(`{"metadata":{"annotations":{%q:"now"}}}`, v1alpha1.AnnotationCheckpointRequest),
	} {
		if err := patch(asOwn, own.Name, body); err == nil {
			t.Errorf("own pod, %s: allowed, want denied", name)
		}
	}
	if err := patch(asOwn, other.Name, step(5)); err == nil {
		t.Error("report on the neighbour's pod allowed")
	}
	var got corev1.Pod
	if err := env.Client.Get(env.Ctx, types.NamespacedName{Namespace: ns, Name: other.Name}, &got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Annotations[v1alpha1.AnnotationCheckpointStep]; ok {
		t.Errorf("neighbour's pod carries a forged step: %v", got.Annotations)
	}
	// The manager (not a pod-bound token of this namespace) is unaffected.
	if err := env.Client.Patch(env.Ctx, &got, clientRawMerge(`{"metadata":{"labels":{"app":"moved"}}}`)); err != nil {
		t.Errorf("admin patch blocked: %v", err)
	}
}

func clientRawMerge(body string) client.Patch {
	return client.RawPatch(types.MergePatchType, []byte(body))
}
