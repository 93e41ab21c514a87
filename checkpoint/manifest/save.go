package manifest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
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
// Saving a step that already exists replaces it (but see SaveRankWith); for the instant between
// the two renames that step is absent (older steps are still there), never
// torn.
func Save(dir string, step int64, files map[string]WriteFunc) (Checkpoint, error) {
	return SaveAt(dir, step, files, time.Now())
}

var nowFunc = time.Now

// SaveAt is Save with the manifest's savedAt given (tests).
func SaveAt(dir string, step int64, files map[string]WriteFunc, now time.Time) (Checkpoint, error) {
	return saveDir(dir, step, nil, files, now)
}

// saveDir writes <dir>/step-<N> (rank nil) or <dir>/step-<N>/rank-<r>.
func saveDir(dir string, step int64, info *RankInfo, files map[string]WriteFunc, now time.Time) (Checkpoint, error) {
	if step < 0 || step > MaxStep {
		return Checkpoint{}, fmt.Errorf("save: step %d out of range [0, %d]", step, int64(MaxStep))
	}
	if len(files) == 0 {
		// Named consistent, an empty checkpoint would be resumed from and
		// the trainer crash-loop on it; Parse refuses a manifest listing no
		// files (the Python helper refuses both too).
		return Checkpoint{}, errors.New("save: no files: refusing to commit an empty checkpoint")
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
	if info != nil {
		parent, prefix, finalName = filepath.Join(dir, StepDirName(step)), TempPrefix+RankDirName(info.Rank)+"-", RankDirName(info.Rank)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Checkpoint{}, fmt.Errorf("save: %w", err)
	}
	if info != nil {
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

	m := Manifest{Version: Version, Step: step, Files: make([]File, 0, len(names))}
	if info != nil {
		rank, world := info.Rank, info.WorldSize
		m.Rank, m.WorldSize, m.RunID, m.Tier, m.Node = &rank, &world, info.RunID, info.Tier, info.Node
		m.JobID = info.JobID
		if info.LocalWorldSize > 0 {
			lws := info.LocalWorldSize
			m.LocalWorldSize = &lws
		}
	}
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
	if info != nil {
		if err := OtherJob(final, info.JobID); err != nil {
			return Checkpoint{}, fmt.Errorf("save: %w", err)
		}
		if _, err := os.Lstat(final); err == nil {
			// A later run re-saving a step an earlier run completed (it
			// resumed from it): swapping this one rank would leave the step
			// mixing two runs, not consistent, and Prune(keep=1) may have
			// removed every older step. Keep the existing step: a no-op.
			st, err := (&Verifier{}).StepState(context.Background(), dir, step)
			if err == nil && st.Consistent() && st.RunID != info.RunID {
				if cp, ok := st.Verified[info.Rank]; ok {
					return cp, nil
				}
			}
		}
	}
	old, err := replaceDir(tmp, final)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("save: %w", err)
	}
	if old != "" {
		defer os.RemoveAll(old)
	}
	done = true
	if err := syncDir(parent); err != nil {
		return Checkpoint{}, fmt.Errorf("save: %w", err)
	}
	sum := sha256.Sum256(raw)
	return Checkpoint{Dir: final, Manifest: m, ID: hex.EncodeToString(sum[:])}, nil
}

// Seams for the crash tests: every rename of a save goes through them.
var (
	rename   = os.Rename
	exchange = func(a, b string) error {
		return unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	}
)

// replaceDir puts the complete directory tmp at final. When final exists
// (a re-save of the same step or rank), the two are swapped in one
// renameat2(RENAME_EXCHANGE), so at every instant final is either the old
// checkpoint or the new one, also across a crash; the old one is then at
// tmp, returned for removal. On a file system without RENAME_EXCHANGE the
// old one is moved aside first and final is absent (never torn) for the
// instant between the two renames.
func replaceDir(tmp, final string) (old string, err error) {
	err = rename(tmp, final)
	if err == nil {
		return "", nil
	}
	if _, statErr := os.Lstat(final); statErr != nil {
		return "", err
	}
	err = exchange(tmp, final)
	if err == nil {
		return tmp, nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EOPNOTSUPP) {
		return "", fmt.Errorf("swap in the new checkpoint: %w", err)
	}
	old = tmp + ".old"
	if err := rename(final, old); err != nil {
		return "", fmt.Errorf("move the old checkpoint aside: %w", err)
	}
	if err := rename(tmp, final); err != nil {
		return "", err
	}
	return old, nil
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

// Prune removes every step older than the newest keep gang-consistent
// steps (both layouts: a step-<N> with its own manifest is a gang of one,
// a step-<N>/rank-<r>/… one is consistent when every rank verifies), and
// leftover temporary directories of saves that are not running any more
// (older than minAge), under dir and inside the kept step directories. It
// never removes the newest consistent step, nor any step newer than the
// oldest one kept (a save in progress, a torn step a restart may still
// complete); without a consistent step it removes no step at all.
func Prune(dir string, keep int, minAge time.Duration) error {
	return PruneContext(context.Background(), dir, keep, minAge)
}

// PruneContext is Prune with a context bounding the verification.
func PruneContext(ctx context.Context, dir string, keep int, minAge time.Duration) error {
	if keep < 1 {
		keep = 1
	}
	steps, err := Steps(dir)
	if err != nil {
		return err
	}
	v := &Verifier{}
	var kept []int64
	for _, s := range steps {
		st, err := v.StepState(ctx, dir, s)
		if err != nil {
			return err
		}
		if st.Consistent() {
			kept = append(kept, s)
			if len(kept) == keep {
				break
			}
		}
	}
	if len(kept) == 0 {
		return nil
	}
	oldest := kept[len(kept)-1]
	var errs []error
	for _, s := range steps {
		if s < oldest {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, StepDirName(s))))
			continue
		}
		errs = append(errs, removeStaleTemps(filepath.Join(dir, StepDirName(s)), minAge))
	}
	errs = append(errs, removeStaleTemps(dir, minAge))
	return errors.Join(errs...)
}

func removeStaleTemps(dir string, minAge time.Duration) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // gone meanwhile, or a step being created
	}
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), TempPrefix) {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) >= minAge {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}
