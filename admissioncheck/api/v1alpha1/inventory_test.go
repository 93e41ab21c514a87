package v1alpha1

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseDevices(t *testing.T) {
	cases := []struct {
		in      string
		want    []DeviceAssignment
		wantErr string
	}{
		{in: "GPU-a:20480", want: []DeviceAssignment{{"GPU-a", 20480}}},
		{in: "GPU-a:1, GPU-b:2", want: []DeviceAssignment{{"GPU-a", 1}, {"GPU-b", 2}}},
		{in: "MIG-GPU-x/1/0:5", want: []DeviceAssignment{{"MIG-GPU-x/1/0", 5}}},
		{in: "", wantErr: "empty"},
		{in: "GPU-a", wantErr: "not <uuid>:<MiB>"},
		{in: "GPU-a:", wantErr: "not <uuid>:<MiB>"},
		{in: ":5", wantErr: "not <uuid>:<MiB>"},
		{in: "GPU-a:0", wantErr: "must be > 0"},
		{in: "GPU-a:-3", wantErr: "not a positive integer"},
		{in: "GPU-a:99999999999999999999999", wantErr: "not a positive integer"},
		{in: "GPU-a:1,GPU-a:2", wantErr: "listed twice"},
	}
	for _, tc := range cases {
		got, err := ParseDevices(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseDevices(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseDevices(%q): %v", tc.in, err)
			continue
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("ParseDevices(%q) (-want +got):\n%s", tc.in, d)
		}
		if again, err := ParseDevices(FormatDevices(got)); err != nil || !cmp.Equal(again, got) {
			t.Errorf("round trip of %q: %v %v", tc.in, again, err)
		}
	}
}

func TestParseGPUs(t *testing.T) {
	good := `[{"uuid":"GPU-0","index":0,"model":"NVIDIA H100 80GB HBM3","memoryMiB":81559,"health":"Healthy"},{"uuid":"GPU-1","index":1,"model":"x","memoryMiB":1,"numa":1}]`
	gpus, err := ParseGPUs(good)
	if err != nil || len(gpus) != 2 || !gpus[1].Healthy() || gpus[0].MemoryMiB != 81559 {
		t.Fatalf("ParseGPUs(good) = %+v, %v", gpus, err)
	}
	for in, want := range map[string]string{
		`{}`:                           "not a JSON array",
		`[{"uuid":"","memoryMiB":1}]`:  "no uuid",
		`[{"uuid":"a","memoryMiB":0}]`: "memoryMiB 0",
		`[{"uuid":"a","memoryMiB":1},{"uuid":"a","memoryMiB":1}]`: "duplicate",
		`[{"uuid":"a","memoryMiB":1,"health":"Sick"}]`:            "health",
		`[{"uuid":"a","memoryMiB":1,"colour":"red"}]`:             "unknown field",
		`[] []`: "trailing",
	} {
		if _, err := ParseGPUs(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseGPUs(%s) error = %v, want %q", in, err, want)
		}
	}
}

func FuzzParseDevices(f *testing.F) {
	for _, s := range []string{"GPU-a:20480", "a:1,b:2", "", ":", "a:0", "a:1,a:1", "x:18446744073709551617"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ds, err := ParseDevices(s)
		if err != nil {
			return
		}
		for _, d := range ds {
			if d.MemoryMiB <= 0 || d.UUID == "" {
				t.Fatalf("ParseDevices(%q) accepted %+v", s, d)
			}
		}
		again, err := ParseDevices(FormatDevices(ds))
		if err != nil || !cmp.Equal(again, ds) {
			t.Fatalf("round trip of %q: %v, %v", s, again, err)
		}
	})
}

func FuzzParseGPUs(f *testing.F) {
	f.Add(`[{"uuid":"GPU-0","memoryMiB":81559}]`)
	f.Add(`[{"uuid":"a","memoryMiB":-1}]`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, s string) {
		gpus, err := ParseGPUs(s)
		if err != nil {
			return
		}
		for _, g := range gpus {
			if g.UUID == "" || g.MemoryMiB <= 0 {
				t.Fatalf("ParseGPUs(%q) accepted %+v", s, g)
			}
		}
		if _, err := ParseGPUs(FormatGPUs(gpus)); err != nil {
			t.Fatalf("round trip failed: %v", err)
		}
	})
}
