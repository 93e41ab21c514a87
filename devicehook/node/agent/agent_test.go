package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/gpupack/gpupack/devicehook/node/bypass"
	"github.com/gpupack/gpupack/devicehook/node/inventory"
	"github.com/gpupack/gpupack/devicehook/node/metrics"
	"github.com/gpupack/gpupack/devicehook/node/nvmlfake"
	"github.com/gpupack/gpupack/devicehook/node/toolkit"
	"github.com/gpupack/gpupack/flavors"
)

func TestParseFlags(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
		check   func(o Options) bool
	}{
		{"defaults", []string{"--node-name=n1"}, "", func(o Options) bool {
			return o.NodeName == "n1" && o.SlotsPerGPU == 10 && o.Buffer == flavors.DefaultBuffer() && o.BypassPolicy == bypass.PolicyEnforce &&
				o.PluginMounts && o.LimitsDir == "/var/lib/gpupack/limits" && o.SlackMiB == 512 && !o.VisibleDevicesEnv &&
				o.ContextReserve.For("NVIDIA H200") == "512m"
		}},
		{"warn and buffer", []string{"--node-name=n1", "--bypass-policy=warn", "--buffer-percent=5", "--driver-overhead-mib=1000"}, "", func(o Options) bool {
			return o.BypassPolicy == bypass.PolicyWarn && o.Buffer == flavors.Buffer{DriverOverheadMiB: 1000, BufferPercent: 5}
		}},
		{"context reserve table", []string{"--node-name=n1", "--context-reserve=B200=1g,*=256m"}, "", func(o Options) bool {
			return o.ContextReserve.For("NVIDIA B200") == "1g" && o.ContextReserve.For("NVIDIA H100") == "256m"
		}},
		{"bad context reserve", []string{"--node-name=n1", "--context-reserve=H100"}, "--context-reserve", nil},
		{"evict is gone", []string{"--node-name=n1", "--bypass-policy=evict"}, "use enforce", nil},
		{"bad policy", []string{"--node-name=n1", "--bypass-policy=maybe"}, `want warn, kill or enforce`, nil},
		{"no slots", []string{"--node-name=n1", "--slots-per-gpu=0"}, "want at least 1", nil},
		{"no node", []string{"--node-name="}, "--node-name is empty", nil},
	}
	for _, tc := range cases {
		o, _, err := ParseFlags(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !tc.check(o) {
			t.Errorf("%s: %+v, %v", tc.name, o, err)
		}
	}
}

// TestRunWithoutNVML: a node without libnvidia-ml says so (metric, Event)
// and publishes nothing.
func TestRunWithoutNVML(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	o := DefaultOptions()
	o.NodeName, o.MetricsAddr, o.NVMLRetry, o.ToolkitConfig = "n1", "", 10*time.Millisecond, ""
	a := New(o, lib, cs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()

	deadline := time.Now().Add(10 * time.Second)
	var ev *corev1.Event
	for ev == nil && time.Now().Before(deadline) {
		evs, _ := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		for i := range evs.Items {
			if evs.Items[i].Reason == "NVMLUnavailable" {
				ev = &evs.Items[i]
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ev == nil || !strings.Contains(ev.Message, "libnvidia-ml.so.1 not found") || ev.InvolvedObject.Name != "n1" {
		t.Fatalf("event = %+v, want NVMLUnavailable on node n1 naming the library", ev)
	}
	for _, act := range cs.Actions() {
		if _, ok := act.(k8stesting.PatchAction); ok && act.GetResource().Resource == "nodes" {
			t.Errorf("published without NVML: %v", act)
		}
	}
	if v, err := metrics.Value(a.Registry(), "gpupack_node_nvml_available", map[string]string{}); err != nil || v != 0 {
		t.Errorf("nvml_available = %v, %v; want 0", v, err)
	}
}

// TestToolkitCheck: unsafe toolkit settings become a False node condition,
// a Warning Event and the metric; safe ones a True condition.
func TestToolkitCheck(t *testing.T) {
	old := toolkit.CDISpecDirs
	toolkit.CDISpecDirs = []string{t.TempDir()}
	t.Cleanup(func() { toolkit.CDISpecDirs = old })
	for _, tc := range []struct {
		file   string
		status corev1.ConditionStatus
		unsafe map[string]float64
	}{
		{"default.toml", corev1.ConditionFalse, map[string]float64{toolkit.SettingEnvvar: 1, toolkit.SettingCDI: 1, toolkit.SettingConfig: 0, toolkit.SettingVolumeMounts: 0, toolkit.SettingAnnotationPrefixes: 1}},
		{"safe.toml", corev1.ConditionTrue, map[string]float64{toolkit.SettingEnvvar: 0, toolkit.SettingCDI: 0, toolkit.SettingConfig: 0, toolkit.SettingVolumeMounts: 0, toolkit.SettingAnnotationPrefixes: 0}},
		// Outside review rev14: volume-mounts was never exported.
		{"volume-mounts-true.toml", corev1.ConditionFalse, map[string]float64{toolkit.SettingEnvvar: 0, toolkit.SettingCDI: 0, toolkit.SettingConfig: 0, toolkit.SettingVolumeMounts: 1, toolkit.SettingAnnotationPrefixes: 0}},
	} {
		cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
		o := DefaultOptions()
		o.NodeName, o.ToolkitConfig = "n1", "../toolkit/testdata/"+tc.file
		a := New(o, nil, cs)
		rec := record.NewFakeRecorder(10)
		a.recorder = rec
		a.checkToolkit(context.Background())
		n, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got *corev1.NodeCondition
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == ConditionToolkitSafe {
				got = &n.Status.Conditions[i]
			}
		}
		if got == nil || got.Status != tc.status {
			t.Errorf("%s: condition %+v, want status %s", tc.file, got, tc.status)
		}
		if len(tc.unsafe) != len(toolkit.Settings) {
			t.Fatalf("%s: the case names %d settings, toolkit.Settings %d", tc.file, len(tc.unsafe), len(toolkit.Settings))
		}
		for _, setting := range toolkit.Settings {
			want, ok := tc.unsafe[setting]
			if v, err := metrics.Value(a.Registry(), "gpupack_node_toolkit_unsafe", map[string]string{"setting": setting}); !ok || err != nil || v != want {
				t.Errorf("%s: toolkit_unsafe{%s} = %v (%v), want %v", tc.file, setting, v, err, want)
			}
		}
		events := len(rec.Events)
		if (tc.status == corev1.ConditionFalse) != (events == 1) {
			t.Errorf("%s: %d events", tc.file, events)
		}
	}
}

// TestMIGMetric: a GPU in MIG mode is exported as such, so operators see
// that SM limits (gpupack.io/gpu-cores) do not apply on it; the others
// read 0, and leaving MIG mode clears it.
func TestMIGMetric(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	n := nvmlfake.DGXH100()
	n.GPUs[1].Device().SetMigMode(nvml.DEVICE_MIG_ENABLE)
	o := DefaultOptions()
	o.NodeName, o.MetricsAddr, o.ToolkitConfig = "n1", "", ""
	a := New(o, n, cs)
	if err := inventory.Init(n); err != nil {
		t.Fatal(err)
	}
	check := func(migGPU int) {
		t.Helper()
		if _, err := a.PublishOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i, g := range n.GPUs {
			want := 0.0
			if i == migGPU {
				want = 1
			}
			if v, err := metrics.Value(a.Registry(), "gpupack_node_gpu_mig_enabled", map[string]string{"gpu": g.UUID()}); err != nil || v != want {
				t.Errorf("GPU %d: gpupack_node_gpu_mig_enabled = %v, %v; want %v", i, v, err, want)
			}
		}
	}
	check(1)
	n.GPUs[1].Device().SetMigMode(0)
	check(-1)
}
