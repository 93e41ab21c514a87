package mutation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// HAMi's selection annotations are refused wherever they are written, in
// both modes, with what to use instead; never silently ignored.
func TestHAMiSelectionAnnotationsRefused(t *testing.T) {
	withAnn := func(k, v string) map[string]string { return map[string]string{k: v} }
	for _, k := range HAMiSelectionAnnotations {
		for _, cfg := range []Config{{}, {Resources: ResourcesHAMi}} {
			for _, tc := range []struct {
				name   string
				mutate func(m *Mutator) error
				where  string
			}{
				{"pod", func(m *Mutator) error {
					_, err := m.Pod(makePod("p").ann(k, "A100").ctr(makeCtr("c").gpus("1").obj()).obj(), PodContext{})
					return err
				}, "pod: "},
				{"fractional pod", func(m *Mutator) error {
					_, err := m.Pod(makePod("p").ann(k, "GPU-0b1d").ann(v1alpha1.AnnotationGPUMemory, "10Gi").ctr(makeCtr("c").gpus("1").obj()).obj(), PodContext{})
					return err
				}, "pod: "},
				{"job-level on a Job", func(m *Mutator) error {
					j := &batchv1.Job{}
					j.Annotations = withAnn(k, "A100")
					j.Spec.Template = template(nil, makeCtr("c").gpus("1").obj())
					_, err := m.Job(j)
					return err
				}, "pod template: "},
				{"Deployment pod template", func(m *Mutator) error {
					_, err := m.Deployment(makeDeployment(nil, template(withAnn(k, "A100"), makeCtr("c").gpus("1").obj())))
					return err
				}, "pod template: "},
				{"JobSet replicated Job", func(m *Mutator) error {
					_, err := m.JobSet(makeJobSet(nil, rjob{name: "w", t: template(withAnn(k, "A100"), makeCtr("c").gpus("1").obj())}))
					return err
				}, "replicatedJobs[w].template: "},
				{"TrainJob", func(m *Mutator) error {
					_, err := m.TrainJob(makeTrainJob(withAnn(k, "A100"), limits(gpu, "1")))
					return err
				}, "trainer.resourcesPerNode: "},
			} {
				m := mustNew(t, cfg)
				err := tc.mutate(m)
				if err == nil {
					t.Errorf("%s %s (%s mode): admitted", k, tc.name, cfg.Resources)
					continue
				}
				want := []string{tc.where, k}
				if strings.Contains(k, "gputype") {
					want = append(want, "nodeSelector nvidia.com/gpu.product", "ResourceFlavor")
				} else {
					want = append(want, "by UUID", "ResourceFlavor")
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s %s: error %q does not say %q", k, tc.name, err, w)
					}
				}
			}
		}
	}
	// The validating webhooks refuse them too (they re-run the mutation).
	m := mustNew(t, Config{})
	if err := m.ValidatePod(makePod("p").ann(AnnotationHAMiUseGPUUUID, "GPU-1").ctr(makeCtr("c").gpus("1").obj()).obj()); err == nil {
		t.Error("ValidatePod admits nvidia.com/use-gpuuuid")
	}
	if err := m.ValidateTemplates(nil, DeploymentTemplates(makeDeployment(map[string]string{AnnotationHAMiNoUseGPUType: "T4"}, template(nil, makeCtr("c").gpus("1").obj())))); err == nil {
		t.Error("ValidateTemplates admits nvidia.com/nouse-gputype")
	}
}

// HAMi's own example manifests work unchanged: in hami mode they stay
// HAMi's resources; in gpupack mode they become gpupack.io/* (a percentage
// needs the GPU model, here the configuration's defaultGPUModel).
func TestHAMiExampleManifests(t *testing.T) {
	read := func(name string, into any) {
		b, err := os.ReadFile(filepath.Join("testdata", "hami-examples", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, into); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		example string
		cfg     Config
		want    corev1.ResourceList // limits of the first container
	}{
		{"default_use, gpupack mode", "default_use.yaml", Config{}, rl(vgpu, "2", gmem, "6000", gcor, "60")},
		{"default_use, hami mode", "default_use.yaml", Config{Resources: ResourcesHAMi}, rl(gpu, "2", hmem, "3000", hcor, "30")},
		{"percentage Deployment, gpupack mode with a default model", "memory_percentage_deployment.yaml", Config{DefaultGPUModel: h100}, rl(vgpu, "1", gmem, "35952")},
		{"percentage Deployment, hami mode", "memory_percentage_deployment.yaml", Config{Resources: ResourcesHAMi}, rl(gpu, "1", v1alpha1.AnnotationHAMiGPUMemPercentage, "50")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.cfg)
			var got corev1.ResourceList
			switch {
			case strings.Contains(tc.example, "deployment"):
				d := &appsv1.Deployment{}
				read(tc.example, d)
				if _, err := m.Deployment(d); err != nil {
					t.Fatal(err)
				}
				if err := m.ValidateTemplates(d.Annotations, DeploymentTemplates(d)); err != nil {
					t.Fatalf("converted Deployment refused: %v", err)
				}
				// Its pods, as the ReplicaSet controller makes them.
				p := podFrom(&d.Spec.Template)
				before := p.DeepCopy()
				if _, err := m.Pod(p, PodContext{}); err != nil || !equality.Semantic.DeepEqual(before.Spec, p.Spec) {
					t.Errorf("pod from the converted template: %v\n%s", err, cmp.Diff(before.Spec, p.Spec))
				}
				got = d.Spec.Template.Spec.Containers[0].Resources.Limits
			default:
				p := &corev1.Pod{}
				read(tc.example, p)
				if _, err := m.Pod(p, PodContext{}); err != nil {
					t.Fatal(err)
				}
				if err := m.ValidatePod(p); err != nil {
					t.Fatalf("converted pod refused: %v", err)
				}
				got = p.Spec.Containers[0].Resources.Limits
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("limits (-want +got):\n%s", d)
			}
		})
	}
	p := &corev1.Pod{}
	read("specify_card_type_to_use.yaml", p)
	if _, err := mustNew(t, Config{Resources: ResourcesHAMi}).Pod(p, PodContext{}); err == nil || !strings.Contains(err.Error(), "nvidia.com/use-gputype=\"A100,V100\"") {
		t.Errorf("HAMi's card type example: %v", err)
	}
}
