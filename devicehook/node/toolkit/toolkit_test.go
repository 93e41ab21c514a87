package toolkit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func settings(r Result) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.Setting)
	}
	return out
}

func TestCheckFixtures(t *testing.T) {
	noSpecs := []string{t.TempDir()}
	withSpec := t.TempDir()
	if err := os.WriteFile(filepath.Join(withSpec, "nvidia.yaml"), []byte("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		file  string
		specs []string
		want  string // settings found, comma separated
	}{
		{"safe.toml", noSpecs, ""},
		{"default.toml", noSpecs, SettingEnvvar + "," + SettingCDI + "," + SettingAnnotationPrefixes},
		{"default.toml", []string{withSpec}, SettingEnvvar + "," + SettingAnnotationPrefixes}, // CDI through the CRI
		{"envvar-true.toml", noSpecs, SettingEnvvar + "," + SettingAnnotationPrefixes},
		{"volume-mounts-true.toml", noSpecs, SettingVolumeMounts},
		{"absent.toml", noSpecs, SettingConfig},
	}
	for _, tc := range cases {
		r := CheckFile(filepath.Join("testdata", tc.file), tc.specs)
		if got := strings.Join(settings(r), ","); got != tc.want {
			t.Errorf("%s: findings %q, want %q (%s)", tc.file, got, tc.want, r.Message())
		}
		if r.Safe() != (tc.want == "") || !strings.Contains(r.Message(), tc.file) {
			t.Errorf("%s: Safe %v, message %q", tc.file, r.Safe(), r.Message())
		}
	}
}

// TestAnnotationPrefixes: only an empty annotation-prefixes array is safe;
// unset means the toolkit's default ["cdi.k8s.io/"], under which a pod
// annotation could ask the runtime for nvidia.com/gpu=all.
func TestAnnotationPrefixes(t *testing.T) {
	safe, err := os.ReadFile(filepath.Join("testdata", "safe.toml"))
	if err != nil {
		t.Fatal(err)
	}
	const line = "annotation-prefixes = [] # gpupack: devices by the CRI's CDIDevices only"
	if !strings.Contains(string(safe), line) {
		t.Fatalf("safe.toml lacks %q", line)
	}
	for _, tc := range []struct {
		with   string // replaces line; "" drops it
		unsafe bool
	}{
		{"annotation-prefixes = []", false},
		{"annotation-prefixes = [ ]", false},
		{"", true},
		{`annotation-prefixes = ["cdi.k8s.io/"]`, true},
		{`annotation-prefixes = ["gpupack.io/"]`, true},
		{`annotation-prefixes = [""]`, true},
		{`annotation-prefixes = "[]"`, true},
	} {
		r := Check("x", []byte(strings.Replace(string(safe), line, tc.with, 1)), false)
		if got := strings.Join(settings(r), ","); (got == SettingAnnotationPrefixes) != tc.unsafe || (!tc.unsafe && got != "") {
			t.Errorf("%q: findings %q (%s)", tc.with, got, r.Message())
		}
	}
}

func TestParse(t *testing.T) {
	cfg, err := Parse([]byte("a = true # c\n[t.u]\n\"k\" = \"x # not a comment\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg["a"] != "true" || cfg["t.u.k"] != `"x # not a comment"` {
		t.Errorf("parsed %v", cfg)
	}
	for _, bad := range []string{"[t\n", "novalue\n", "k = \"open\n", "[[array]]\n", "[]\n"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"safe.toml", "default.toml", "envvar-true.toml"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := Parse(b)
		if err != nil {
			return
		}
		r := Check("x", b, false)
		if v, ok := cfg[SettingEnvvar]; ok && v == "false" && cfg["nvidia-container-runtime.mode"] == `"cdi"` && (cfg[SettingVolumeMounts] == "" || cfg[SettingVolumeMounts] == "false") && emptyArray(cfg[SettingAnnotationPrefixes]) && !r.Safe() {
			t.Fatalf("safe settings reported unsafe: %v", r.Findings)
		}
	})
}
