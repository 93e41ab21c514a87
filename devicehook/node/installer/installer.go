// Package installer puts the hook library into the host folder that GPU
// containers mount (DefaultHookHostPath): libgpupack-hook.so, an
// ld.so.preload naming it, and a VERSION stamp. Every file is written to a
// temporary name, fsynced and renamed, so a container starting at any moment
// sees either the old complete file or the new one — never a torn library.
// Processes already running keep the old inode they mapped.
package installer

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// File names inside the host folder.
const (
	PreloadFile = "ld.so.preload"
	VersionFile = "VERSION"
)

// Result says what Install did.
type Result struct {
	Changed bool   // something was (re)written
	Stamp   string // contents of VERSION
}

// Install copies src (the library shipped in the agent image) into hostDir
// as libgpupack-hook.so with its ld.so.preload and VERSION. It is idempotent:
// when VERSION already names this version and checksum and the files are
// intact, nothing is written.
func Install(src, hostDir, version string) (Result, error) {
	lib, err := os.ReadFile(src)
	if err != nil {
		return Result{}, fmt.Errorf("read hook library %s: %w", src, err)
	}
	if len(lib) < 4 || string(lib[1:4]) != "ELF" {
		return Result{}, fmt.Errorf("hook library %s is not an ELF file", src)
	}
	sum := sha256.Sum256(lib)
	stamp := fmt.Sprintf("%s sha256:%s\n", version, hex.EncodeToString(sum[:]))
	libPath := filepath.Join(hostDir, v1alpha1.HookLibraryName)
	preload := libPath + "\n"

	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		return Result{}, fmt.Errorf("create %s: %w", hostDir, err)
	}
	if current(filepath.Join(hostDir, VersionFile), stamp) && sameHash(libPath, sum) && sameContent(filepath.Join(hostDir, PreloadFile), preload) {
		return Result{Stamp: stamp}, nil
	}
	// Library first, VERSION last: a stamp never names a file not yet there.
	if err := WriteAtomic(libPath, lib, 0o755); err != nil {
		return Result{}, err
	}
	if err := WriteAtomic(filepath.Join(hostDir, PreloadFile), []byte(preload), 0o644); err != nil {
		return Result{}, err
	}
	if err := WriteAtomic(filepath.Join(hostDir, VersionFile), []byte(stamp), 0o644); err != nil {
		return Result{}, err
	}
	return Result{Changed: true, Stamp: stamp}, nil
}

func current(path, want string) bool { return sameContent(path, want) }

func sameContent(path, want string) bool {
	b, err := os.ReadFile(path)
	return err == nil && string(b) == want
}

func sameHash(path string, want [32]byte) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false
	}
	var got [32]byte
	copy(got[:], h.Sum(nil))
	return got == want
}

// WriteAtomic writes data to path through a temporary file in the same
// folder: write, fsync, chmod, rename, fsync the folder.
func WriteAtomic(path string, data []byte, mode os.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), mode)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// Installed reads the VERSION stamp in hostDir ("" when none).
func Installed(hostDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(hostDir, VersionFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return strings.TrimSpace(string(b)), err
}
