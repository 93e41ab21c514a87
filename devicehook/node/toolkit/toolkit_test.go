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
		{"default.toml", noSpecs, SettingEnvvar + "," + SettingCDI},
		{"default.toml", []string{withSpec}, SettingEnvvar}, // CDI through the CRI
		{"envvar-true.toml", noSpecs, SettingEnvvar},
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
		if v, ok := cfg[SettingEnvvar]; ok && v == "false" && cfg["nvidia-container-runtime.mode"] == `"cdi"` && (cfg[SettingVolumeMounts] == "" || cfg[SettingVolumeMounts] == "false") && !r.Safe() {
			t.Fatalf("safe settings reported unsafe: %v", r.Findings)
		}
	})
}
