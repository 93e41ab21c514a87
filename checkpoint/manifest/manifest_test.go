package manifest

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)

func save(t *testing.T, dir string, step int64, files map[string]string) Checkpoint {
	t.Helper()
	fs := map[string]WriteFunc{}
	for k, v := range files {
		fs[k] = Bytes([]byte(v))
	}
	cp, err := SaveAt(dir, step, fs, t0.Add(time.Duration(step)*time.Second))
	if err != nil {
		t.Fatalf("SaveAt(%d): %v", step, err)
	}
	return cp
}

func TestSaveThenVerify(t *testing.T) {
	dir := t.TempDir()
	cp := save(t, dir, 7, map[string]string{"model.pt": "weights", "sub/optim.pt": "moments", "empty": ""})
	got, err := Verify(filepath.Join(dir, StepDirName(7)))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cp, got); diff != "" {
		t.Errorf("Verify differs from what Save returned (-save +verify):\n%s", diff)
	}
	want := []File{
		{Path: "empty", Size: 0, SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{Path: "model.pt", Size: 7},
		{Path: "sub/optim.pt", Size: 7},
	}
	// Checksums of the non-empty files are checked by Verify above (it
	// re-hashes them); here the listing itself.
	for i := range want {
		if got.Manifest.Files[i].Path != want[i].Path || got.Manifest.Files[i].Size != want[i].Size {
			t.Errorf("file %d = %+v, want path %q size %d", i, got.Manifest.Files[i], want[i].Path, want[i].Size)
		}
	}
	if got.Manifest.Files[0].SHA256 != want[0].SHA256 {
		t.Errorf("sha256 of the empty file = %s, want the well-known %s", got.Manifest.Files[0].SHA256, want[0].SHA256)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), TempPrefix) {
			t.Errorf("temporary directory %s left behind", e.Name())
		}
	}
}

// damage mutates a saved step directory the way a crash, a disk or a user
// could.
type damage func(t *testing.T, stepDir string)

func TestLatestSkipsDamagedSteps(t *testing.T) {
	write := func(rel, content string) damage {
		return func(t *testing.T, d string) {
			if err := os.WriteFile(filepath.Join(d, rel), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	remove := func(rel string) damage {
		return func(t *testing.T, d string) {
			if err := os.Remove(filepath.Join(d, rel)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := map[string]struct {
		damage   damage
		wantStep int64
		wantOK   bool
	}{
		"intact":                 {damage: func(*testing.T, string) {}, wantStep: 3, wantOK: true},
		"file truncated":         {damage: write("model.pt", "weig"), wantStep: 2, wantOK: true},
		"file same size changed": {damage: write("model.pt", "WEIGHTS"), wantStep: 2, wantOK: true},
		"file missing":           {damage: remove("model.pt"), wantStep: 2, wantOK: true},
		"manifest missing":       {damage: remove(FileName), wantStep: 2, wantOK: true},
		"manifest truncated":     {damage: write(FileName, `{"version":1,"step":3,"fi`), wantStep: 2, wantOK: true},
		"manifest names other step": {damage: func(t *testing.T, d string) {
			raw, _ := os.ReadFile(filepath.Join(d, FileName))
			write(FileName, strings.Replace(string(raw), `"step": 3`, `"step": 4`, 1))(t, d)
		}, wantStep: 2, wantOK: true},
		"every step damaged": {damage: func(t *testing.T, d string) {
			for _, s := range []int64{1, 2, 3} {
				remove("model.pt")(t, filepath.Join(filepath.Dir(d), StepDirName(s)))
			}
		}, wantOK: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for s := int64(1); s <= 3; s++ {
				save(t, dir, s, map[string]string{"model.pt": "weights"})
			}
			tc.damage(t, filepath.Join(dir, StepDirName(3)))
			cp, ok, err := Latest(dir)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.wantOK || (ok && cp.Manifest.Step != tc.wantStep) {
				t.Errorf("Latest = step %d ok %v, want step %d ok %v", cp.Manifest.Step, ok, tc.wantStep, tc.wantOK)
			}
		})
	}
}

func TestLatestIgnoresTempAndForeignEntries(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 5, map[string]string{"a": "1"})
	// A crashed save of a newer step, a file that looks like a step, and a
	// directory with a bad name.
	if err := os.MkdirAll(filepath.Join(dir, TempPrefix+StepDirName(9)+"-x"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, StepDirName(8)), []byte("not a dir"), 0o644)
	os.MkdirAll(filepath.Join(dir, "step-12"), 0o755)
	cp, ok, err := Latest(dir)
	if err != nil || !ok || cp.Manifest.Step != 5 {
		t.Fatalf("Latest = %d %v %v, want step 5", cp.Manifest.Step, ok, err)
	}
	if _, ok, err := Latest(filepath.Join(dir, "missing")); ok || err != nil {
		t.Errorf("Latest(missing dir) = ok %v err %v, want nothing and no error", ok, err)
	}
}

func TestResaveSameStepGetsNewID(t *testing.T) {
	dir := t.TempDir()
	first := save(t, dir, 4, map[string]string{"a": "old"})
	fs := map[string]WriteFunc{"a": Bytes([]byte("new"))}
	second, err := SaveAt(dir, 4, fs, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if first.ID == second.ID {
		t.Error("re-save of step 4 kept the manifest ID; the agent could not tell it is new")
	}
	got, ok, err := Latest(dir)
	if err != nil || !ok || got.ID != second.ID {
		t.Fatalf("Latest = %+v %v %v, want the re-saved step", got, ok, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries after re-save, want 1", len(ents))
	}
}

func TestSaveRejectsBadInput(t *testing.T) {
	cases := map[string]struct {
		step  int64
		files map[string]WriteFunc
	}{
		"negative step": {step: -1},
		"huge step":     {step: MaxStep + 1},
		"escaping name": {step: 1, files: map[string]WriteFunc{"../x": Bytes(nil)}},
		"absolute name": {step: 1, files: map[string]WriteFunc{"/x": Bytes(nil)}},
		"manifest name": {step: 1, files: map[string]WriteFunc{FileName: Bytes(nil)}},
		"unclean name":  {step: 1, files: map[string]WriteFunc{"a//b": Bytes(nil)}},
		"writer fails":  {step: 1, files: map[string]WriteFunc{"a": func(io.Writer) error { return os.ErrClosed }}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := Save(dir, tc.step, tc.files); err == nil {
				t.Fatal("Save succeeded, want an error")
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) != 0 {
				t.Errorf("failed save left %d entries behind", len(ents))
			}
		})
	}
}

func TestPrune(t *testing.T) {
	dir := t.TempDir()
	for s := int64(1); s <= 5; s++ {
		save(t, dir, s, map[string]string{"a": "x"})
	}
	os.Remove(filepath.Join(dir, StepDirName(5), "a")) // newest is torn
	os.MkdirAll(filepath.Join(dir, TempPrefix+"crashed"), 0o755)
	if err := Prune(dir, 2, 0); err != nil {
		t.Fatal(err)
	}
	steps, _ := Steps(dir)
	// Keep the two newest verified (4, 3) and the torn 5 (newer than
	// anything kept; the next save of 5 replaces it).
	if diff := cmp.Diff([]int64{5, 4, 3}, steps); diff != "" {
		t.Errorf("steps after Prune (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(dir, TempPrefix+"crashed")); !os.IsNotExist(err) {
		t.Errorf("crashed temp dir survived Prune: %v", err)
	}
}

func TestParseRejects(t *testing.T) {
	good := `{"version":1,"step":3,"files":[{"path":"a","size":1,"sha256":"` + strings.Repeat("a", 64) + `"}],"savedAt":"2026-11-30T05:00:00Z"}`
	if _, err := Parse([]byte(good)); err != nil {
		t.Fatalf("Parse(good) = %v", err)
	}
	cases := map[string]string{
		"version":     strings.Replace(good, `"version":1`, `"version":2`, 1),
		"neg step":    strings.Replace(good, `"step":3`, `"step":-3`, 1),
		"unknown":     strings.Replace(good, `"step":3`, `"step":3,"x":1`, 1),
		"short sha":   strings.Replace(good, strings.Repeat("a", 64), "abc", 1),
		"upper sha":   strings.Replace(good, strings.Repeat("a", 64), strings.Repeat("A", 64), 1),
		"non-hex sha": strings.Replace(good, strings.Repeat("a", 64), strings.Repeat("g", 64), 1),
		"neg size":    strings.Replace(good, `"size":1`, `"size":-1`, 1),
		"dup file":    strings.Replace(good, `}]`, `},{"path":"a","size":1,"sha256":"`+strings.Repeat("a", 64)+`"}]`, 1),
		"bad path":    strings.Replace(good, `"path":"a"`, `"path":"../a"`, 1),
		"bad time":    strings.Replace(good, `2026-11-30T05:00:00Z`, `yesterday`, 1),
		"trailing":    good + `{}`,
		"not json":    `step 3`,
	}
	for name, in := range cases {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: Parse accepted %s", name, in)
		}
	}
}

func TestStepDirName(t *testing.T) {
	for _, s := range []int64{0, 1, 42, MaxStep} {
		got, ok := ParseStepDirName(StepDirName(s))
		if !ok || got != s {
			t.Errorf("ParseStepDirName(StepDirName(%d)) = %d %v", s, got, ok)
		}
	}
	for _, bad := range []string{"step-1", "step-0000000000001", "step-00000000000a", "x-000000000001", "step--00000000001"} {
		if _, ok := ParseStepDirName(bad); ok {
			t.Errorf("ParseStepDirName(%q) accepted", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"version":1,"step":3,"files":[],"savedAt":"2026-11-30T05:00:00Z"}`))
	f.Add([]byte(`{"version":1,"step":3,"files":[{"path":"a/b","size":0,"sha256":"` + strings.Repeat("0", 64) + `"}],"savedAt":"2026-11-30T05:00:00.5Z"}`))
	f.Add([]byte(`{"version":1,"step":3,"files":[],"savedAt":"2026-11-30T05:00:00Z","rank":1,"worldSize":2,"runId":"r:1","tier":"local","node":"n","localWorldSize":2}`))
	f.Add([]byte(`{"version":1,"step":3,"files":[],"savedAt":"2026-11-30T05:00:00Z","rank":null,"worldSize":null,"runId":null,"tier":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			return
		}
		// Whatever parses must be safe to verify against: no path escapes.
		for _, file := range m.Files {
			if ValidatePath(file.Path) != nil {
				t.Fatalf("Parse accepted path %q", file.Path)
			}
		}
		if m.Step < 0 || m.Step > MaxStep {
			t.Fatalf("Parse accepted step %d", m.Step)
		}
		if m.RunID != "" && ValidateRunID(m.RunID) != nil {
			t.Fatalf("Parse accepted runId %q", m.RunID)
		}
		if m.LocalWorldSize != nil && (m.WorldSize == nil || *m.LocalWorldSize < 1 || *m.LocalWorldSize > *m.WorldSize) {
			t.Fatalf("Parse accepted localWorldSize %d", *m.LocalWorldSize)
		}
	})
}
