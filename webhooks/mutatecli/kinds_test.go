package mutatecli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The job-kind examples under manifests/examples, as `gpupack mutate`
// prints them; a second pass changes nothing and warns about nothing.
func TestMain_JobKindExamples(t *testing.T) {
	for _, tc := range []struct {
		example string
		want    []string // in the output
	}{
		{"jobset-fractional", []string{`gpupack.io/gpu-memory: "20480"`, `gpupack.io/gpu-cores: "30"`, "gpupack.io/injected: "}},
		// No marker with the defaults: Kueue's pod integration is off, so
		// the pod webhook would refuse the LWS's fractional pods (with it
		// on, TestMain_LWSWithPodIntegration).
		{"lws-inference", []string{`gpupack.io/gpu-memory: "30720"`}},
		{"deployment-inference", []string{`gpupack.io/gpu-memory: "17976"`, `gpupack.io/vgpu: "1"`}},
		{"trainjob-fractional", []string{`gpupack.io/gpu-memory: "20480"`, "gpupack.io/injected: ", "kind: TrainJob"}},
		{"rayjob-fractional", []string{`gpupack.io/gpu-memory: "16384"`, `gpupack.io/gpu-cores: "50"`, "gpupack.io/injected: "}},
		{"raycluster-fractional", []string{`gpupack.io/gpu-memory: "6144"`, "gpupack.io/injected: "}},
		{"mpijob-fractional", []string{`gpupack.io/gpu-memory: "10240"`, "gpupack.io/injected: "}},
	} {
		t.Run(tc.example, func(t *testing.T) {
			code, stdout, stderr := run(t, "", "-f", filepath.Join("..", "..", "manifests", "examples", tc.example+".yaml"))
			if code != ExitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("output lacks %q", w)
				}
			}
			if strings.Contains(stdout, "nvidia.com/gpu: ") || strings.Contains(stdout, "nvidia.com/gpumem") {
				t.Errorf("HAMi or whole-GPU resources left:\n%s", stdout)
			}
			golden := filepath.Join("testdata", tc.example+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(stdout), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(string(want), stdout); d != "" {
				t.Errorf("output (-want +got):\n%s", d)
			}
			code, again, stderr := run(t, stdout, "-f", "-")
			if code != ExitOK || again != stdout || stderr != "" {
				t.Errorf("second pass: exit %d, stderr %q, diff %s", code, stderr, cmp.Diff(stdout, again))
			}
		})
	}
	// A denial names the template.
	bad := "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata:\n  name: j\n  annotations:\n    gpupack.io/gpu-memory: 79Gi\nspec:\n  replicatedJobs:\n" +
		"  - name: workers\n    template:\n      spec:\n        template:\n          spec:\n            nodeSelector:\n              nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3\n" +
		"            containers:\n            - name: c\n              image: i\n              resources:\n                limits:\n                  nvidia.com/gpu: 1\n"
	if code, _, stderr := run(t, bad, "-f", "-"); code != ExitDenied || !strings.Contains(stderr, "denied: replicatedJobs[workers].template: container \"c\" asks for 80896 MiB") {
		t.Errorf("oversized JobSet: exit %d, %s", code, stderr)
	}
	if code, _, stderr := run(t, "apiVersion: apps/v1\nkind: Deployment\nspec:\n  bogus: 1\n", "-f", "-"); code != ExitUsage || !strings.Contains(stderr, "bogus") {
		t.Errorf("unknown field: %d %s", code, stderr)
	}
	// A TrainJob's own request converts its resourcesPerNode; without a GPU
	// there it is refused, naming where to put it.
	tj := "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata:\n  name: t\n  annotations:\n    gpupack.io/gpu-memory: 20Gi\nspec:\n  runtimeRef:\n    name: torch-distributed\n" +
		"  trainer:\n    resourcesPerNode:\n      limits:\n        nvidia.com/gpu: 2\n"
	if code, stdout, stderr := run(t, tj, "-f", "-"); code != ExitOK || !strings.Contains(stdout, `gpupack.io/gpu-memory: "40960"`) || strings.Contains(stdout, "nvidia.com/gpu: ") {
		t.Errorf("TrainJob: exit %d, %s\n%s", code, stderr, stdout)
	}
	if code, _, stderr := run(t, strings.Replace(tj, "nvidia.com/gpu: 2", "cpu: 2", 1), "-f", "-"); code != ExitDenied || !strings.Contains(stderr, "trainer.resourcesPerNode asks for no nvidia.com/gpu") {
		t.Errorf("TrainJob without a GPU: exit %d, %s", code, stderr)
	}
	if code, _, stderr := run(t, "apiVersion: ray.io/v1\nkind: RayJob\nmetadata:\n  name: r\n  annotations:\n    nvidia.com/use-gputype: A100\nspec:\n  rayClusterSpec:\n    headGroupSpec:\n      template:\n        spec:\n          containers:\n          - name: h\n            resources:\n              limits:\n                nvidia.com/gpu: 1\n", "-f", "-"); code != ExitDenied || !strings.Contains(stderr, "rayClusterSpec.headGroupSpec.template: annotation nvidia.com/use-gputype") {
		t.Errorf("RayJob with HAMi's type selection: exit %d, %s", code, stderr)
	}
}

// With Kueue's pod integration on (as wherever LWS runs under Kueue), an
// LWS's templates carry the placement gate and the marker: its pods, a
// StatefulSet's, are pod groups that get their plan when Kueue admits them.
func TestMain_LWSWithPodIntegration(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("kueue:\n  frameworks: [batch/job, kubeflow.org/pytorchjob, pod, statefulset, leaderworkerset.x-k8s.io/leaderworkerset]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(t, "", "-config", cfg, "-f", filepath.Join("..", "..", "manifests", "examples", "lws-inference.yaml"))
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"gpupack.io/injected: ", "name: gpupack.io/placement"} {
		if strings.Count(stdout, w) != 2 {
			t.Errorf("output has %d × %q, want 2 (leader and worker templates):\n%s", strings.Count(stdout, w), w, stdout)
		}
	}
}
