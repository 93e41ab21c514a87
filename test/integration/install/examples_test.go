package install

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// The example PyTorchJobs do what their comments say once the webhook (its
// pure core, with the default overlay's configuration) has seen them.
func TestExampleJobsThroughTheWebhook(t *testing.T) {
	var cfgData string
	for _, o := range Kustomize(t, "manifests/overlays/default") {
		if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "gpupack-config") {
			cfgData, _, _ = unstructured.NestedString(o.Object, "data", "webhook.yaml")
		}
	}
	cfg, err := mutation.ParseConfig([]byte(cfgData))
	if err != nil {
		t.Fatal(err)
	}
	m, err := mutation.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	examples := Kustomize(t, "manifests/examples")

	// GPU resources of every replica's containers after mutation.
	type res map[string]string
	cases := []struct {
		job        string
		want       map[string]res // replica type → limits of gpupack/nvidia resources
		checkpoint bool
	}{
		{"finetune-small", map[string]res{
			"Master": {v1alpha1.ResourceVGPU: "1", v1alpha1.ResourceGPUMemory: "20480", v1alpha1.ResourceGPUCores: "30"},
			"Worker": {v1alpha1.ResourceVGPU: "1", v1alpha1.ResourceGPUMemory: "20480", v1alpha1.ResourceGPUCores: "30"},
		}, false},
		{"pretrain-large", map[string]res{
			"Master": {v1alpha1.ResourceNvidiaGPU: "8"},
			"Worker": {v1alpha1.ResourceNvidiaGPU: "8"},
		}, false},
		{"train-resumable", map[string]res{
			"Master": {v1alpha1.ResourceVGPU: "1", v1alpha1.ResourceGPUMemory: "40960"},
			"Worker": {v1alpha1.ResourceVGPU: "1", v1alpha1.ResourceGPUMemory: "40960"},
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.job, func(t *testing.T) {
			var job kftraining.PyTorchJob
			into(t, find(t, examples, "PyTorchJob", tc.job), &job)
			if warn, err := m.PyTorchJob(&job); err != nil {
				t.Fatalf("the webhook denies the example: %v (warnings %v)", err, warn)
			}
			if err := m.ValidatePyTorchJob(&job); err != nil {
				t.Fatalf("the mutated example does not validate: %v", err)
			}
			got := map[string]res{}
			for rt, rs := range job.Spec.PyTorchReplicaSpecs {
				r := res{}
				for name, q := range rs.Template.Spec.Containers[0].Resources.Limits {
					if strings.HasPrefix(string(name), "gpupack.io/") || strings.HasPrefix(string(name), "nvidia.com/") {
						r[string(name)] = q.String()
					}
				}
				got[string(rt)] = r
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("GPU limits after the webhook (-want +got):\n%s", diff)
			}
			// A pod of the first replica, as the training operator creates it.
			rs := job.Spec.PyTorchReplicaSpecs[kftraining.PyTorchJobReplicaTypeMaster]
			pod := &corev1.Pod{ObjectMeta: *rs.Template.ObjectMeta.DeepCopy(), Spec: *rs.Template.Spec.DeepCopy()}
			pod.Name, pod.Namespace = tc.job+"-master-0", job.Namespace
			if _, err := m.Pod(pod, mutation.PodContext{}); err != nil {
				t.Fatalf("the webhook denies the example's pod: %v", err)
			}
			cmd := pod.Spec.Containers[0].Command
			wrapped := len(cmd) > 0 && cmd[0] == mutation.CkptBinary
			if wrapped != tc.checkpoint {
				t.Errorf("pod command %v: wrapped by gpupack-ckpt = %v, want %v", cmd, wrapped, tc.checkpoint)
			}
			if tc.checkpoint && pod.Spec.ServiceAccountName == "" {
				t.Errorf("a checkpointing pod needs a ServiceAccount bound to gpupack-checkpoint-reporter")
			}
		})
	}
}
