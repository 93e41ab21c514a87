package installer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

func fakeLib(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "src.so")
	if err := os.WriteFile(p, []byte("\x7fELF"+body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestInstall(t *testing.T) {
	srcDir, host := t.TempDir(), filepath.Join(t.TempDir(), "usr/local/gpupack")
	v1 := fakeLib(t, srcDir, "one")

	steps := []struct {
		name        string
		prep        func()
		version     string
		wantChanged bool
		wantBody    string
	}{
		{"fresh host", func() {}, "v1", true, "one"},
		{"again: nothing to do", func() {}, "v1", false, "one"},
		{"new version", func() {}, "v2", true, "one"},
		{"library replaced by someone", func() { os.WriteFile(filepath.Join(host, v1alpha1.HookLibraryName), []byte("junk"), 0o755) }, "v2", true, "one"},
		{"preload removed", func() { os.Remove(filepath.Join(host, PreloadFile)) }, "v2", true, "one"},
		{"new library, same version string", func() { fakeLib(t, srcDir, "two") }, "v2", true, "two"},
	}
	for _, s := range steps {
		s.prep()
		res, err := Install(v1, host, s.version)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if res.Changed != s.wantChanged {
			t.Errorf("%s: changed = %v, want %v", s.name, res.Changed, s.wantChanged)
		}
		lib, _ := os.ReadFile(filepath.Join(host, v1alpha1.HookLibraryName))
		if string(lib) != "\x7fELF"+s.wantBody {
			t.Errorf("%s: library = %q", s.name, lib)
		}
		pre, _ := os.ReadFile(filepath.Join(host, PreloadFile))
		if string(pre) != filepath.Join(host, v1alpha1.HookLibraryName)+"\n" {
			t.Errorf("%s: ld.so.preload = %q", s.name, pre)
		}
		stamp, _ := Installed(host)
		if !strings.HasPrefix(stamp, s.version+" sha256:") || stamp+"\n" != res.Stamp {
			t.Errorf("%s: VERSION = %q, result stamp %q", s.name, stamp, res.Stamp)
		}
		ents, _ := os.ReadDir(host)
		for _, e := range ents {
			if strings.Contains(e.Name(), ".tmp-") {
				t.Errorf("%s: temporary file left: %s", s.name, e.Name())
			}
		}
	}
}

func TestInstallRejects(t *testing.T) {
	dir := t.TempDir()
	if _, err := Install(filepath.Join(dir, "missing.so"), dir, "v1"); err == nil || !strings.Contains(err.Error(), "missing.so") {
		t.Errorf("missing source: %v", err)
	}
	notELF := filepath.Join(dir, "x.so")
	os.WriteFile(notELF, []byte("#!/bin/sh"), 0o644)
	if _, err := Install(notELF, dir, "v1"); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Errorf("not ELF: %v", err)
	}
}

// TestWriteAtomicKeepsOldInode: a process that opened the old file (as a
// running container mapped the old library) keeps reading the old content.
func TestWriteAtomicKeepsOldInode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := WriteAtomic(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := WriteAtomic(p, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "old" {
		t.Errorf("open handle reads %q, %v; want old", buf, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "new" {
		t.Errorf("path reads %q, want new", b)
	}
}
