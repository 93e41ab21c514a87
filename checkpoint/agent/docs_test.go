package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupack/gpupack/webhooks/mutation"
)

// The opt-in example of docs/preemption.md, run through the real webhook,
// must give gpupack-ckpt the timeout it asks for and a checkpoint directory
// (issue 16 item 8: it produced the 20 s default and no directory).
func TestDocsOptInExampleProducesTheAskedTimeoutAndADirectory(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "preemption.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, after, ok := strings.Cut(doc, "## Opting a job in")
	if !ok {
		t.Fatal(`docs/preemption.md has no "## Opting a job in" section`)
	}
	_, block, ok := strings.Cut(after, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("no yaml block in the opt-in section")
	}
	var job kftraining.PyTorchJob
	if err := yaml.UnmarshalStrict([]byte(block), &job); err != nil {
		t.Fatalf("the example does not parse as a PyTorchJob: %v\n%s", err, block)
	}
	m, err := mutation.New(mutation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.PyTorchJob(&job); err != nil {
		t.Fatalf("webhook rejects the example: %v", err)
	}
	for role, rs := range job.Spec.PyTorchReplicaSpecs {
		tpl := rs.Template
		pod := &corev1.Pod{ObjectMeta: tpl.ObjectMeta, Spec: tpl.Spec}
		if _, err := m.Pod(pod, mutation.PodContext{}); err != nil {
			t.Fatalf("%s pod: %v", role, err)
		}
		if len(pod.Spec.Containers) == 0 {
			t.Fatalf("%s template has no container to wrap", role)
		}
		cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
		for _, want := range []string{"--checkpoint-timeout=4m0s", "--checkpoint-dir=/ckpt", "-- torchrun --nproc_per_node=8 train.py"} {
			if !strings.Contains(cmd, want) {
				t.Errorf("%s container command %q lacks %q", role, cmd, want)
			}
		}
		if !strings.HasPrefix(cmd, mutation.CkptBinary+" ") {
			t.Errorf("%s container does not run under gpupack-ckpt: %q", role, cmd)
		}
		if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g < 240 {
			t.Errorf("%s terminationGracePeriodSeconds %v, want >= the 4m timeout", role, g)
		}
	}
}
