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
		{"lws-inference", []string{`gpupack.io/gpu-memory: "30720"`, "gpupack.io/injected: "}},
		{"deployment-inference", []string{`gpupack.io/gpu-memory: "17976"`, `gpupack.io/vgpu: "1"`}},
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
}
