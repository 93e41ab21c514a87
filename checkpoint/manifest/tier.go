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
	"slices"
	"time"
)

// Tiered checkpoints (a model too big to write to shared storage within
// the grace period): the helper writes each rank's shard to a fast
// node-local directory first (manifest tier "local", with localWorldSize),
// gpupack-ckpt uploads each verified local rank directory to the same
// place under the shared directory (manifest tier "shared"), in the
// background while training runs, before the pod ends where the grace
// period allows, else when the job next starts on that node. A restart
// reads the shared directory only, so a step is consistent only once every
// rank's shard is readable there.

// SameShard reports whether two manifests describe the same save of the
// same rank (a local copy and its upload): step, rank, world size, run,
// save time and every file's size and checksum agree.
func SameShard(a, b Manifest) bool {
	eqInt := func(x, y *int) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.Step == b.Step && eqInt(a.Rank, b.Rank) && eqInt(a.WorldSize, b.WorldSize) &&
		a.RunID == b.RunID && a.SavedAt == b.SavedAt && slices.Equal(a.Files, b.Files)
}

// Uploaded reports whether shared holds a verified copy of the local rank
// checkpoint src.
func (v *Verifier) Uploaded(ctx context.Context, src Checkpoint, shared string) bool {
	if src.Manifest.Rank == nil {
		return false
	}
	dst := filepath.Join(shared, StepDirName(src.Manifest.Step), RankDirName(*src.Manifest.Rank))
	cp, err := v.VerifyContext(ctx, dst)
	return err == nil && SameShard(cp.Manifest, src.Manifest)
}

// Upload copies the verified local rank checkpoint src to
// <shared>/step-<N>/rank-<r>: files are copied into a temporary directory
// and checked against src's manifest as they are copied (a local file that
// changed meanwhile fails the upload), fsynced, given the manifest with
// tier "shared", and swapped into place atomically as a save is. It does
// nothing when shared already holds this shard. Copying stops when ctx ends.
func (v *Verifier) Upload(ctx context.Context, src Checkpoint, shared string) (Checkpoint, error) {
	m := src.Manifest
	if m.Rank == nil || m.WorldSize == nil {
		return Checkpoint{}, fmt.Errorf("upload %s: not a rank checkpoint", src.Dir)
	}
	if v.Uploaded(ctx, src, shared) {
		return v.VerifyContext(ctx, filepath.Join(shared, StepDirName(m.Step), RankDirName(*m.Rank)))
	}
	if err := v.uploadWanted(ctx, m, shared); err != nil {
		return Checkpoint{}, fmt.Errorf("upload %s: %w", src.Dir, err)
	}
	parent := filepath.Join(shared, StepDirName(m.Step))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Checkpoint{}, fmt.Errorf("upload: %w", err)
	}
	if err := syncDir(shared); err != nil {
		return Checkpoint{}, fmt.Errorf("upload: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, TempPrefix+RankDirName(*m.Rank)+"-upload-")
	if err != nil {
		return Checkpoint{}, fmt.Errorf("upload: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	syncDirs := map[string]bool{tmp: true}
	for _, f := range m.Files {
		p := filepath.Join(tmp, filepath.FromSlash(f.Path))
		if d := filepath.Dir(p); d != tmp {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return Checkpoint{}, fmt.Errorf("upload: %w", err)
			}
			for ; d != tmp; d = filepath.Dir(d) {
				syncDirs[d] = true
			}
		}
		if err := copyChecked(ctx, filepath.Join(src.Dir, filepath.FromSlash(f.Path)), p, f); err != nil {
			return Checkpoint{}, fmt.Errorf("upload %s: %w", src.Dir, err)
		}
	}
	m.Tier = TierShared
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Checkpoint{}, fmt.Errorf("upload: %w", err)
	}
	raw = append(raw, '\n')
	if _, err := writeFile(filepath.Join(tmp, FileName), FileName, Bytes(raw)); err != nil {
		return Checkpoint{}, fmt.Errorf("upload: manifest: %w", err)
	}
	for d := range syncDirs {
		if err := syncDir(d); err != nil {
			return Checkpoint{}, fmt.Errorf("upload: %w", err)
		}
	}
	final := filepath.Join(parent, RankDirName(*m.Rank))
	old, err := replaceDir(tmp, final)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("upload: %w", err)
	}
	done = true
	if old != "" {
		defer os.RemoveAll(old)
	}
	if err := syncDir(parent); err != nil {
		return Checkpoint{}, fmt.Errorf("upload: %w", err)
	}
	sum := sha256.Sum256(raw)
	cp := Checkpoint{Dir: final, Manifest: m, ID: hex.EncodeToString(sum[:])}
	// Hashed while copied: the next Uploaded need not read it again.
	if stats, err := statFiles(final, m); err == nil {
		v.remember(final+"\x00"+cp.ID, cp, stats)
	}
	return cp, nil
}

// ErrSuperseded: the shared directory holds a newer or complete save of
// the step under another run; uploading this local shard would only make
// that step inconsistent, so it is not uploaded (issue 16 review M1).
var ErrSuperseded = errors.New("superseded")

// uploadWanted says whether the local shard m may replace what shared holds
// for its step and rank: not when that rank directory names another job
// (an error: another job's checkpoint is never replaced), not when the
// shared step is already consistent under another run or job, and not when
// the shared rank 0 was saved by another run after m (a newer run is
// writing the step) — both ErrSuperseded, the shared step is kept.
func (v *Verifier) uploadWanted(ctx context.Context, m Manifest, shared string) error {
	dst := filepath.Join(shared, StepDirName(m.Step), RankDirName(*m.Rank))
	if err := OtherJob(dst, m.JobID); err != nil {
		return err
	}
	st, err := v.StepState(ctx, shared, m.Step)
	if err != nil {
		return err
	}
	if st.Consistent() {
		if anchor := st.Verified[0].Manifest; anchor.RunID != m.RunID || anchor.JobID != m.JobID {
			return fmt.Errorf("%w: step %d is consistent in the shared directory under run %q (job %q); not replacing rank %d with run %q's shard",
				ErrSuperseded, m.Step, anchor.RunID, anchor.JobID, *m.Rank, m.RunID)
		}
	}
	if r0, ok := st.Verified[0]; ok && r0.Manifest.RunID != m.RunID {
		theirs, err1 := time.Parse(time.RFC3339Nano, r0.Manifest.SavedAt)
		ours, err2 := time.Parse(time.RFC3339Nano, m.SavedAt)
		if err1 == nil && err2 == nil && theirs.After(ours) {
			return fmt.Errorf("%w: run %q saved rank 0 of step %d in the shared directory at %s, after this shard of run %q (%s)",
				ErrSuperseded, r0.Manifest.RunID, m.Step, r0.Manifest.SavedAt, m.RunID, m.SavedAt)
		}
	}
	return nil
}

// OtherJob returns an error when the rank directory d holds a manifest
// naming a jobId other than job (both known): a save, upload or prune
// never replaces or removes another job's checkpoint (issue 16 review H2).
// The manifest is parsed, no file is hashed.
func OtherJob(d, job string) error {
	raw, err := os.ReadFile(filepath.Join(d, FileName))
	if err != nil || job == "" {
		return nil
	}
	m, err := Parse(raw)
	if err != nil || m.JobID == "" || m.JobID == job {
		return nil
	}
	return fmt.Errorf("%s belongs to another job (jobId %q, this job's is %q): refusing to replace it", d, m.JobID, job)
}

// copyChecked copies src to dst (a new file), hashing as it goes, and
// fails unless the copy has f's size and sha256.
func copyChecked(ctx context.Context, src, dst string, f File) error {
	if err := noSymlinks(filepath.Dir(src), filepath.Base(src)); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var n int64
	var werr error
	for werr == nil {
		if err := ctx.Err(); err != nil {
			werr = fmt.Errorf("file %q: upload stopped: %w", f.Path, err)
			break
		}
		k, rerr := in.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			n += int64(k)
			if _, err := out.Write(buf[:k]); err != nil {
				werr = err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil && werr == nil {
			werr = rerr
		}
		if n > f.Size {
			break
		}
	}
	if werr == nil {
		werr = out.Sync()
	}
	if cerr := out.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return werr
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != f.Size || got != f.SHA256 {
		return fmt.Errorf("file %q changed since its manifest was written (%d bytes, sha256 %s; manifest %d, %s)", f.Path, n, got, f.Size, f.SHA256)
	}
	return nil
}

// LocalRanks returns the verified rank checkpoints under a node-local
// directory, newest step first.
func (v *Verifier) LocalRanks(ctx context.Context, local string) ([]Checkpoint, error) {
	steps, err := Steps(local)
	if err != nil {
		return nil, err
	}
	var out []Checkpoint
	for _, s := range steps {
		st, err := v.StepState(ctx, local, s)
		if err != nil {
			return out, err
		}
		ranks := make([]int, 0, len(st.Verified))
		for r := range st.Verified {
			ranks = append(ranks, r)
		}
		slices.Sort(ranks)
		for _, r := range ranks {
			out = append(out, st.Verified[r])
		}
	}
	return out, nil
}

// UploadAll uploads every verified rank checkpoint under local that shared
// does not hold yet, newest step first; it returns the checkpoints now in
// shared and the first error (it goes on after one).
func (v *Verifier) UploadAll(ctx context.Context, local, shared string) ([]Checkpoint, error) {
	srcs, err := v.LocalRanks(ctx, local)
	var out []Checkpoint
	for _, src := range srcs {
		cp, uerr := v.Upload(ctx, src, shared)
		if uerr != nil {
			if err == nil {
				err = uerr
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		out = append(out, cp)
	}
	return out, err
}
