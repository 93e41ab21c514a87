package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// WriteFunc writes the content of one checkpoint file.
type WriteFunc func(w io.Writer) error

// Bytes is a WriteFunc for content already in memory.
func Bytes(b []byte) WriteFunc {
	return func(w io.Writer) error { _, err := w.Write(b); return err }
}

// Save writes a checkpoint of step under dir atomically: files and manifest
// go into a temporary directory, are fsynced, and the directory is renamed
// into place and the parent fsynced. A crash at any moment leaves either the
// previous checkpoints alone or the new one complete.
//
// Saving a step that already exists replaces it; for the instant between
// the two renames that step is absent (older steps are still there), never
// torn.
func Save(dir string, step int64, files map[string]WriteFunc) (Checkpoint, error) {
	return SaveAt(dir, step, files, time.Now())
}

var nowFunc = time.Now

// SaveAt is Save with the manifest's savedAt given (tests).
func SaveAt(dir string, step int64, files map[string]WriteFunc, now time.Time) (Checkpoint, error) {
	return saveDir(dir, step, nil, nil, files, now)
}

// saveDir writes <dir>/step-<N> (rank nil) or <dir>/step-<N>/rank-<r>.
func saveDir(dir string, step int64, rank, worldSize *int, files map[string]WriteFunc, now time.Time) (Checkpoint, error) {
	if step < 0 || step > MaxStep {
		return Checkpoint{}, fmt.Errorf("save: step %d out of range [0, %d]", step, int64(MaxStep))
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if err := ValidatePath(name); err != nil {
			return Checkpoint{}, fmt.Errorf("save: %w", err)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	parent, prefix, finalName := dir, TempPrefix+StepDirName(step)+"-", StepDirName(step)
	if rank != nil {
		parent, prefix, finalName = filepath.Join(dir, StepDirName(step)), TempPrefix+RankDirName(*rank)+"-", RankDirName(*rank)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Checkpoint{}, fmt.Errorf("save: %w", err)
	}
	if rank != nil {
		// The step directory may be new: make its entry durable too.
		if err := syncDir(dir); err != nil {
			return Checkpoint{}, fmt.Errorf("save: %w", err)
		}
	}
	tmp, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("save: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()

	m := Manifest{Version: Version, Step: step, Files: make([]File, 0, len(names)), Rank: rank, WorldSize: worldSize}
	syncDirs := map[string]bool{tmp: true}
	for _, name := range names {
		p := filepath.Join(tmp, filepath.FromSlash(name))
		if d := filepath.Dir(p); d != tmp {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return Checkpoint{}, fmt.Errorf("save: %w", err)
			}
			for ; d != tmp; d = filepath.Dir(d) {
				syncDirs[d] = true
			}
		}
		f, err := writeFile(p, name, files[name])
		if err != nil {
			return Checkpoint{}, fmt.Errorf("save: %s: %w", name, err)
		}
		m.Files = append(m.Files, f)
	}
	m.SavedAt = now.UTC().Format(time.RFC3339Nano)
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Checkpoint{}, fmt.Errorf("save: %w", err)
	}
	raw = append(raw, '\n')
	if _, err := writeFile(filepath.Join(tmp, FileName), FileName, Bytes(raw)); err != nil {
		return Checkpoint{}, fmt.Errorf("save: manifest: %w", err)
	}
	for d := range syncDirs {
		if err := syncDir(d); err != nil {
			return Checkpoint{}, fmt.Errorf("save: %w", err)
		}
	}

	final := filepath.Join(parent, finalName)
	if err := os.Rename(tmp, final); err != nil {
		// The step exists: move it aside first (rename cannot replace a
		// non-empty directory), then put the new one in its place.
		if _, statErr := os.Stat(final); statErr != nil {
			return Checkpoint{}, fmt.Errorf("save: %w", err)
		}
		old := tmp + ".old"
		if err := os.Rename(final, old); err != nil {
			return Checkpoint{}, fmt.Errorf("save: move old step aside: %w", err)
		}
		if err := os.Rename(tmp, final); err != nil {
			return Checkpoint{}, fmt.Errorf("save: %w", err)
		}
		defer os.RemoveAll(old)
	}
	done = true
	if err := syncDir(parent); err != nil {
		return Checkpoint{}, fmt.Errorf("save: %w", err)
	}
	sum := sha256.Sum256(raw)
	return Checkpoint{Dir: final, Manifest: m, ID: hex.EncodeToString(sum[:])}, nil
}

func writeFile(p, name string, write WriteFunc) (File, error) {
	fh, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return File{}, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(fh, h)}
	werr := write(cw)
	if werr == nil {
		werr = fh.Sync()
	}
	if cerr := fh.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return File{}, werr
	}
	return File{Path: name, Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func syncDir(d string) error {
	fh, err := os.Open(d)
	if err != nil {
		return err
	}
	err = fh.Sync()
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

// Prune removes all but the newest keep verified steps, and leftover
// temporary directories of saves that are not running any more (older than
// minAge). It never removes the newest verified step.
func Prune(dir string, keep int, minAge time.Duration) error {
	if keep < 1 {
		keep = 1
	}
	v := &Verifier{}
	cps, err := v.Verified(dir, keep)
	if err != nil {
		return err
	}
	if len(cps) == 0 {
		return nil
	}
	oldest := cps[len(cps)-1].Manifest.Step
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if s, ok := ParseStepDirName(e.Name()); ok && s < oldest {
			errs = append(errs, os.RemoveAll(p))
			continue
		}
		if len(e.Name()) > len(TempPrefix) && e.Name()[:len(TempPrefix)] == TempPrefix {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) >= minAge {
				errs = append(errs, os.RemoveAll(p))
			}
		}
	}
	return errors.Join(errs...)
}
