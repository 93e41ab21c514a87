package gpureq

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

func TestParseMemoryMiB(t *testing.T) {
	cases := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "20Gi", want: 20480},
		{in: "20480", want: 20480},
		{in: " 512 ", want: 512},
		{in: "512Mi", want: 512},
		{in: "1.5Gi", want: 1536},
		{in: "1G", want: 954}, // 1e9 bytes = 953.67 MiB, rounded up
		{in: "1Mi", want: 1},
		{in: "1Ki", wantErr: "less than 1 MiB"},
		{in: "1025Ki", want: 2}, // rounded up to a whole MiB
		{in: "0", wantErr: "more than 0"},
		{in: "0Gi", wantErr: "more than 0"},
		{in: "-1Gi", wantErr: "more than 0"},
		{in: "1.5", wantErr: "whole number"},
		{in: "", wantErr: "empty"},
		{in: "twenty", wantErr: "not a quantity"},
		{in: "20 Gi", wantErr: "not a quantity"},
		{in: "99999999999999999999", wantErr: "too large"},
		{in: "17Ti", wantErr: "too large"},
		{in: "1e100", wantErr: "not a sensible quantity"},
		{in: "1e999999999", wantErr: "not a sensible quantity"},
		{in: "1e-999999999", wantErr: "not a sensible quantity"},
		{in: "1e10", want: 9537},
		{in: "1E", wantErr: "too large"},
		{in: "16Ti", want: 16 << 20},
		{in: "100m", wantErr: "less than 1 MiB"},
	}
	for _, tc := range cases {
		got, err := ParseMemoryMiB(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseMemoryMiB(%q) = %d, %v; want error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseMemoryMiB(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParsePercent(t *testing.T) {
	for in, want := range map[string]int32{"1": 1, "30": 30, "100": 100, " 50": 50} {
		if got, err := ParsePercent("cores", in); err != nil || got != want {
			t.Errorf("ParsePercent(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"0", "101", "-5", "50%", "1.5", "", "x", "99999999999"} {
		if got, err := ParsePercent("cores", in); err == nil {
			t.Errorf("ParsePercent(%q) = %d, want error", in, got)
		}
	}
}

func TestEffective(t *testing.T) {
	const (
		mem  = v1alpha1.AnnotationGPUMemory
		core = v1alpha1.AnnotationGPUCores
		hmem = v1alpha1.AnnotationHAMiGPUMem
		hpct = v1alpha1.AnnotationHAMiGPUMemPercentage
		hcor = v1alpha1.AnnotationHAMiGPUCores
	)
	cases := []struct {
		name      string
		job, tmpl map[string]string
		want      Spec
		wantErr   string
	}{
		{name: "nothing"},
		{name: "job default", job: map[string]string{mem: "20Gi", core: "30"}, want: Spec{MemoryMiB: 20480, Cores: 30}},
		{name: "template overrides memory only", job: map[string]string{mem: "20Gi", core: "30"}, tmpl: map[string]string{mem: "10Gi"}, want: Spec{MemoryMiB: 10240, Cores: 30}},
		{name: "template HAMi percent overrides job absolute", job: map[string]string{mem: "20Gi"}, tmpl: map[string]string{hpct: "50"}, want: Spec{MemoryPercent: 50}},
		{name: "template cores override", job: map[string]string{hcor: "30"}, tmpl: map[string]string{core: "60"}, want: Spec{Cores: 60}},
		{name: "HAMi names", tmpl: map[string]string{hmem: "3000", hcor: "25"}, want: Spec{MemoryMiB: 3000, Cores: 25}},
		{name: "agreeing gpupack and HAMi", tmpl: map[string]string{hmem: "20480", mem: "20Gi"}, want: Spec{MemoryMiB: 20480}},
		{name: "conflicting memory", tmpl: map[string]string{hmem: "3000", mem: "20Gi"}, wantErr: "template annotations conflict: gpupack.io/gpu-memory is 20480 MiB but nvidia.com/gpumem is 3000 MiB"},
		{name: "conflicting cores at job level", job: map[string]string{hcor: "30", core: "40"}, wantErr: "job annotations conflict"},
		{name: "percent with absolute", tmpl: map[string]string{hpct: "50", mem: "1Gi"}, wantErr: "conflict"},
		{name: "bad job value even when template overrides", job: map[string]string{mem: "lots"}, tmpl: map[string]string{mem: "1Gi"}, wantErr: "job annotation gpupack.io/gpu-memory"},
		{name: "cores out of range", tmpl: map[string]string{core: "150"}, wantErr: "outside 1–100"},
		{name: "cores zero", tmpl: map[string]string{core: "0"}, wantErr: "outside 1–100"},
		{name: "percent out of range", tmpl: map[string]string{hpct: "0"}, wantErr: "outside 1–100"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Effective(tc.job, tc.tmpl)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Effective = %+v, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("Effective (-want +got):\n%s", d)
			}
		})
	}
}

func ctr(name string, limits map[string]string) *corev1.Container {
	c := &corev1.Container{Name: name}
	if limits != nil {
		c.Resources.Limits = corev1.ResourceList{}
		for k, v := range limits {
			c.Resources.Limits[corev1.ResourceName(k)] = resource.MustParse(v)
		}
	}
	return c
}

func TestContainerRequest(t *testing.T) {
	const (
		gpu   = v1alpha1.ResourceNvidiaGPU
		vgpu  = v1alpha1.ResourceVGPU
		gmem  = v1alpha1.ResourceGPUMemory
		gcor  = v1alpha1.ResourceGPUCores
		hmem  = v1alpha1.AnnotationHAMiGPUMem
		hpct  = v1alpha1.AnnotationHAMiGPUMemPercentage
		hcore = v1alpha1.AnnotationHAMiGPUCores
	)
	cases := []struct {
		name    string
		tmpl    Spec
		c       *corev1.Container
		want    Request
		wantErr string
	}{
		{name: "cpu only", c: ctr("a", map[string]string{"cpu": "1"}), want: Request{Kind: NoGPU}},
		{name: "cpu only with template annotations", tmpl: Spec{MemoryMiB: 10}, c: ctr("a", nil), want: Request{Kind: NoGPU}},
		{name: "whole", c: ctr("a", map[string]string{gpu: "2"}), want: Request{Kind: Whole, GPUs: 2}},
		{name: "zero gpus", c: ctr("a", map[string]string{gpu: "0"}), want: Request{Kind: NoGPU}},
		{name: "fractional from template", tmpl: Spec{MemoryMiB: 20480, Cores: 30}, c: ctr("a", map[string]string{gpu: "2"}), want: Request{Kind: Fractional, GPUs: 2, Spec: Spec{MemoryMiB: 20480, Cores: 30}}},
		{name: "HAMi resources override template", tmpl: Spec{MemoryMiB: 20480, Cores: 30}, c: ctr("a", map[string]string{gpu: "1", hmem: "3000", hcore: "50"}), want: Request{Kind: Fractional, GPUs: 1, Spec: Spec{MemoryMiB: 3000, Cores: 50}}},
		{name: "HAMi percent resource", c: ctr("a", map[string]string{gpu: "1", hpct: "25"}), want: Request{Kind: Fractional, GPUs: 1, Spec: Spec{MemoryPercent: 25}}},
		// What the webhook's hami mode writes: per-GPU values (not × N), read
		// back as the same Fractional request, so hami mode is a fixed point.
		{name: "HAMi form, several GPUs", c: ctr("a", map[string]string{gpu: "2", hmem: "20480", hcore: "30"}), want: Request{Kind: Fractional, GPUs: 2, Spec: Spec{MemoryMiB: 20480, Cores: 30}}},
		{name: "HAMi mem and percent", c: ctr("a", map[string]string{gpu: "1", hpct: "25", hmem: "10"}), wantErr: "conflict"},
		{name: "HAMi resources without gpu", c: ctr("a", map[string]string{hmem: "3000"}), wantErr: "without nvidia.com/gpu"},
		{name: "cores without memory", tmpl: Spec{Cores: 30}, c: ctr("a", map[string]string{gpu: "1"}), wantErr: "exclusive"},
		{name: "converted", tmpl: Spec{MemoryMiB: 20480}, c: ctr("a", map[string]string{vgpu: "2", gmem: "40960", gcor: "60"}), want: Request{Kind: Converted, GPUs: 2, Spec: Spec{MemoryMiB: 20480, Cores: 30}}},
		{name: "converted disagrees with annotation", tmpl: Spec{MemoryMiB: 10240}, c: ctr("a", map[string]string{vgpu: "1", gmem: "20480"}), wantErr: "annotations ask for 10240 MiB"},
		{name: "vgpu without memory", c: ctr("a", map[string]string{vgpu: "1"}), wantErr: "every shared GPU needs a memory limit"},
		{name: "vgpu uneven", c: ctr("a", map[string]string{vgpu: "2", gmem: "3"}), wantErr: "multiples"},
		{name: "vgpu and gpu", c: ctr("a", map[string]string{vgpu: "1", gpu: "1", gmem: "3"}), wantErr: "both"},
		{name: "gpu-memory without vgpu", c: ctr("a", map[string]string{gmem: "3"}), wantErr: "without gpupack.io/vgpu"},
		{name: "fractional gpu count", c: ctr("a", map[string]string{gpu: "500m"}), wantErr: "whole number"},
		{name: "too many gpus", c: ctr("a", map[string]string{gpu: "5000"}), wantErr: "whole number from 0 to 1024"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ContainerRequest(tc.tmpl, tc.c)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ContainerRequest = %+v, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("ContainerRequest (-want +got):\n%s", d)
			}
		})
	}
}

func TestContainerRequestRequestsOnly(t *testing.T) {
	c := &corev1.Container{Name: "a", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{v1alpha1.ResourceNvidiaGPU: resource.MustParse("1")}}}
	got, err := ContainerRequest(Spec{MemoryMiB: 5}, c)
	if err != nil || got.Kind != Fractional || got.GPUs != 1 {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestDemandFromResources(t *testing.T) {
	rl := func(kv ...string) corev1.ResourceList {
		out := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	cases := []struct {
		name    string
		rl      corev1.ResourceList
		want    Demand
		wantErr bool
	}{
		{name: "none", rl: rl("cpu", "1")},
		{name: "whole", rl: rl(v1alpha1.ResourceNvidiaGPU, "8"), want: Demand{GPUs: 8, Exclusive: true}},
		{name: "shared", rl: rl(v1alpha1.ResourceVGPU, "2", v1alpha1.ResourceGPUMemory, "40960", v1alpha1.ResourceGPUCores, "60"), want: Demand{GPUs: 2, MemoryMiB: 20480, Cores: 30}},
		{name: "shared no cores", rl: rl(v1alpha1.ResourceVGPU, "1", v1alpha1.ResourceGPUMemory, "100"), want: Demand{GPUs: 1, MemoryMiB: 100}},
		{name: "shared no memory", rl: rl(v1alpha1.ResourceVGPU, "1"), wantErr: true},
		{name: "both", rl: rl(v1alpha1.ResourceVGPU, "1", v1alpha1.ResourceNvidiaGPU, "1", v1alpha1.ResourceGPUMemory, "100"), wantErr: true},
		// HAMi form (the webhook's hami mode): per-GPU memory and cores.
		{name: "HAMi shared", rl: rl(v1alpha1.ResourceNvidiaGPU, "2", v1alpha1.AnnotationHAMiGPUMem, "20480", v1alpha1.AnnotationHAMiGPUCores, "30"), want: Demand{GPUs: 2, MemoryMiB: 20480, Cores: 30}},
		{name: "HAMi percentage", rl: rl(v1alpha1.ResourceNvidiaGPU, "1", v1alpha1.AnnotationHAMiGPUMemPercentage, "25"), want: Demand{GPUs: 1, MemoryPercent: 25}},
		{name: "HAMi cores without memory", rl: rl(v1alpha1.ResourceNvidiaGPU, "1", v1alpha1.AnnotationHAMiGPUCores, "30"), wantErr: true},
		{name: "HAMi memory and percentage", rl: rl(v1alpha1.ResourceNvidiaGPU, "1", v1alpha1.AnnotationHAMiGPUMem, "100", v1alpha1.AnnotationHAMiGPUMemPercentage, "25"), wantErr: true},
		{name: "HAMi percentage over 100", rl: rl(v1alpha1.ResourceNvidiaGPU, "1", v1alpha1.AnnotationHAMiGPUMemPercentage, "150"), wantErr: true},
		{name: "vgpu and HAMi", rl: rl(v1alpha1.ResourceVGPU, "1", v1alpha1.ResourceGPUMemory, "100", v1alpha1.AnnotationHAMiGPUMem, "100"), wantErr: true},
	}
	for _, tc := range cases {
		got, err := DemandFromResources(tc.rl)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err = %v, wantErr %v", tc.name, err, tc.wantErr)
			continue
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}
