package inventory

import (
	"regexp"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
	"github.com/gpupack/gpupack/flavors"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

func TestLabelValue(t *testing.T) {
	long := strings.Repeat("gpu-node.", 40)
	cases := []struct{ in, want string }{
		{"node-1", "node-1"},
		{"Node_1.example.com", "node-1-example-com"},
		{"--x--", "x"},
		{"", "node"},
		{"...", "node"},
	}
	for _, tc := range cases {
		if got := LabelValue(tc.in); got != tc.want {
			t.Errorf("LabelValue(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	a, b := LabelValue(long+"a"), LabelValue(long+"b")
	if a == b || len(a) > 63 || !dnsLabel.MatchString(a) {
		t.Errorf("long names: %q, %q must differ, be ≤63 and DNS labels", a, b)
	}
}

func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"node-1", "", "Ä.b_c", strings.Repeat("a.", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := LabelValue(s)
		if len(v) > 63 || !dnsLabel.MatchString(v) {
			t.Fatalf("LabelValue(%q) = %q is not a DNS label", s, v)
		}
	})
}

func TestFabricDomain(t *testing.T) {
	u := nvmlfake.ClusterUUID(0x1f)
	cases := []struct {
		name string
		f    *Fabric
		want string
		ok   bool
	}{
		{"nil", nil, "", false},
		{"not supported", &Fabric{State: nvml.GPU_FABRIC_STATE_NOT_SUPPORTED}, "", false},
		{"in progress", &Fabric{ClusterUUID: u, State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}, "", false},
		{"failed", &Fabric{ClusterUUID: u, State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.ERROR_UNKNOWN)}, "", false},
		{"zero cluster", &Fabric{State: nvml.GPU_FABRIC_STATE_COMPLETED}, "", false},
		{"completed", &Fabric{ClusterUUID: u, CliqueID: 32767, State: nvml.GPU_FABRIC_STATE_COMPLETED}, "1f1f1f1f-1f1f-1f1f-1f1f-1f1f1f1f1f1f-32767", true},
	}
	for _, tc := range cases {
		got, ok := FabricDomain(tc.f)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: FabricDomain = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
		if ok && (len(got) > 63 || !dnsLabel.MatchString(got)) {
			t.Errorf("%s: %q is not a DNS label", tc.name, got)
		}
	}
}

func fab(b byte, clique uint32) *Fabric {
	return &Fabric{ClusterUUID: nvmlfake.ClusterUUID(b), CliqueID: clique, State: nvml.GPU_FABRIC_STATE_COMPLETED}
}

func gpu(uuid string, idx int, mem int64, health string, f *Fabric) GPU {
	return GPU{GPUInfo: v1alpha1.GPUInfo{UUID: uuid, Index: idx, MemoryMiB: mem, Health: health}, Fabric: f}
}

func TestNodeDomain(t *testing.T) {
	cases := []struct {
		name string
		now  []GPU
		want string
	}{
		{"no GPUs", nil, "n1"},
		{"HGX", []GPU{gpu("a", 0, 1, "Healthy", nil), gpu("b", 1, 1, "Healthy", nil)}, "n1"},
		{"one clique", []GPU{gpu("a", 0, 1, "Healthy", fab(2, 5)), gpu("b", 1, 1, "Healthy", fab(2, 5))}, "02020202-0202-0202-0202-020202020202-5"},
		{"two cliques on one node", []GPU{gpu("a", 0, 1, "Healthy", fab(2, 5)), gpu("b", 1, 1, "Healthy", fab(2, 6))}, "n1"},
		{"one GPU without fabric", []GPU{gpu("a", 0, 1, "Healthy", fab(2, 5)), gpu("b", 1, 1, "Healthy", nil)}, "n1"},
	}
	for _, tc := range cases {
		if got := NodeDomain(tc.now, "N1"); got != tc.want {
			t.Errorf("%s: NodeDomain = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestMerge(t *testing.T) {
	prev := []v1alpha1.GPUInfo{
		{UUID: "a", Index: 0, MemoryMiB: 100, NVLinkDomain: "n1", Health: "Healthy"},
		{UUID: "gone", Index: 1, MemoryMiB: 100, NVLinkDomain: "n1", Health: "Healthy"},
	}
	now := []GPU{gpu("a", 0, 100, "Healthy", nil), gpu("c", 2, 100, "Unhealthy", fab(1, 1))}
	want := []v1alpha1.GPUInfo{
		{UUID: "a", Index: 0, MemoryMiB: 100, NVLinkDomain: "n1", Health: "Healthy"},
		{UUID: "gone", Index: 1, MemoryMiB: 100, NVLinkDomain: "n1", Health: "Unhealthy"},
		{UUID: "c", Index: 2, MemoryMiB: 100, NVLinkDomain: "01010101-0101-0101-0101-010101010101-1", Health: "Unhealthy"},
	}
	if d := cmp.Diff(want, Merge(now, prev, "n1")); d != "" {
		t.Errorf("Merge (-want +got):\n%s", d)
	}
}

func TestDesiredCapacity(t *testing.T) {
	buf := flavors.DefaultBuffer()
	h100 := int64(81559)
	cases := []struct {
		name  string
		now   []GPU
		prev  []v1alpha1.GPUInfo
		slots int
		want  map[string]int64
	}{
		{"8 healthy, 4 slots", func() []GPU {
			var g []GPU
			for i := range 8 {
				g = append(g, gpu(string(rune('a'+i)), i, h100, "Healthy", nil))
			}
			return g
		}(), nil, 4, map[string]int64{
			v1alpha1.ResourceGPUMemory: 8 * buf.Allocatable(h100), v1alpha1.ResourceVGPU: 32, v1alpha1.ResourceGPUCores: 800,
		}},
		{"unhealthy and vanished GPUs count for nothing", []GPU{gpu("a", 0, h100, "Healthy", nil), gpu("b", 1, h100, "Unhealthy", nil)},
			[]v1alpha1.GPUInfo{{UUID: "c", Index: 2, MemoryMiB: h100, Health: "Healthy"}}, 10, map[string]int64{
				v1alpha1.ResourceGPUMemory: buf.Allocatable(h100), v1alpha1.ResourceVGPU: 10, v1alpha1.ResourceGPUCores: 100,
			}},
		{"no GPUs", nil, nil, 10, map[string]int64{v1alpha1.ResourceGPUMemory: 0, v1alpha1.ResourceVGPU: 0, v1alpha1.ResourceGPUCores: 0}},
	}
	for _, tc := range cases {
		st := Desired(tc.now, tc.prev, "n1", buf, tc.slots)
		if d := cmp.Diff(tc.want, st.Capacity); d != "" {
			t.Errorf("%s: capacity (-want +got):\n%s", tc.name, d)
		}
		// Every published inventory must parse back.
		if _, err := v1alpha1.ParseGPUs(v1alpha1.FormatGPUs(st.GPUs)); err != nil {
			t.Errorf("%s: published annotation does not parse: %v", tc.name, err)
		}
	}
}
