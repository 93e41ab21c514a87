// Package manifest is gpupack's on-disk checkpoint format, shared by the
// in-pod agent (gpupack-ckpt), Go trainers and the Python helper
// (checkpoint/python/gpupack_ckpt.py).
//
// Layout of a checkpoint directory:
//
//	<dir>/step-<step, 12 digits>/<files…>
//	<dir>/step-<step, 12 digits>/gpupack-manifest.json
//	<dir>/.tmp-…            (a save in progress, or one that crashed; ignored)
//
// A save writes every file and the manifest into a fresh temporary directory,
// fsyncs each file and the directory, renames it to its step-… name and
// fsyncs the parent. A step directory therefore either exists complete or not
// at all; Latest still re-hashes every file before naming a step, so a
// directory damaged afterwards (a disk, a user) is never named either.
package manifest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// Version is the manifest format version this package writes and reads.
	Version = 1
	// FileName is the manifest's name inside a step directory.
	FileName = "gpupack-manifest.json"
	// StepPrefix starts every step directory's name.
	StepPrefix = "step-"
	// TempPrefix starts every directory a save is still writing.
	TempPrefix = ".tmp-"
	stepDigits = 12
	// MaxStep keeps step directory names fixed-width (and JSON numbers exact
	// for readers that parse them as doubles).
	MaxStep = 999_999_999_999
)

// File is one checkpoint file listed in a manifest.
type File struct {
	// Path is relative to the step directory, slash-separated.
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest describes one complete checkpoint.
type Manifest struct {
	Version int    `json:"version"`
	Step    int64  `json:"step"`
	Files   []File `json:"files"`
	// SavedAt is when the save finished (RFC 3339, UTC). Together with the
	// step it tells a re-save of the same step apart from the old one.
	SavedAt string `json:"savedAt"`
	// Rank and WorldSize are set (both) in a rank directory
	// (<dir>/step-<N>/rank-<r>/): the step is consistent once every rank
	// 0..WorldSize-1 has a verified manifest naming the same WorldSize.
	Rank      *int `json:"rank,omitempty"`
	WorldSize *int `json:"worldSize,omitempty"`
}

// Checkpoint is a verified step directory.
type Checkpoint struct {
	Dir      string
	Manifest Manifest
	// ID is the sha256 of the manifest's bytes: it changes whenever the step
	// is saved again, so "a new checkpoint" is "an ID not seen before".
	ID string
}

// StepDirName is the directory name of a step.
func StepDirName(step int64) string {
	return fmt.Sprintf("%s%0*d", StepPrefix, stepDigits, step)
}

// ParseStepDirName returns the step a directory name stands for.
func ParseStepDirName(name string) (int64, bool) {
	rest, ok := strings.CutPrefix(name, StepPrefix)
	if !ok || len(rest) != stepDigits {
		return 0, false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	return n, err == nil
}

// ValidatePath rejects file names that could escape the step directory or
// shadow the manifest.
func ValidatePath(p string) error {
	switch {
	case p == "":
		return errors.New("empty file name")
	case strings.ContainsRune(p, 0) || strings.ContainsRune(p, '\\'):
		return fmt.Errorf("file name %q: NUL and backslash are not allowed", p)
	case path.IsAbs(p) || path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../"):
		return fmt.Errorf("file name %q must be a clean relative path inside the step directory", p)
	case p == FileName:
		return fmt.Errorf("file name %q is reserved for the manifest", p)
	}
	return nil
}

// Parse decodes and checks a manifest. It rejects unknown fields and
// anything that would make verification meaningless.
func Parse(b []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("manifest: %w", err)
	}
	if dec.More() {
		return Manifest{}, errors.New("manifest: trailing data after the JSON object")
	}
	if m.Version != Version {
		return Manifest{}, fmt.Errorf("manifest: version %d, want %d", m.Version, Version)
	}
	if m.Step < 0 || m.Step > MaxStep {
		return Manifest{}, fmt.Errorf("manifest: step %d out of range [0, %d]", m.Step, int64(MaxStep))
	}
	if _, err := time.Parse(time.RFC3339Nano, m.SavedAt); err != nil {
		return Manifest{}, fmt.Errorf("manifest: savedAt %q is not RFC 3339", m.SavedAt)
	}
	switch {
	case (m.Rank == nil) != (m.WorldSize == nil):
		return Manifest{}, errors.New("manifest: rank and worldSize come together")
	case m.WorldSize != nil && (*m.WorldSize < 1 || *m.WorldSize > MaxWorldSize):
		return Manifest{}, fmt.Errorf("manifest: worldSize %d out of range [1, %d]", *m.WorldSize, MaxWorldSize)
	case m.Rank != nil && (*m.Rank < 0 || *m.Rank >= *m.WorldSize):
		return Manifest{}, fmt.Errorf("manifest: rank %d out of range [0, worldSize %d)", *m.Rank, *m.WorldSize)
	}
	seen := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		if err := ValidatePath(f.Path); err != nil {
			return Manifest{}, fmt.Errorf("manifest: %w", err)
		}
		if seen[f.Path] {
			return Manifest{}, fmt.Errorf("manifest: file %q listed twice", f.Path)
		}
		seen[f.Path] = true
		if f.Size < 0 {
			return Manifest{}, fmt.Errorf("manifest: file %q has size %d", f.Path, f.Size)
		}
		if len(f.SHA256) != 64 || strings.ToLower(f.SHA256) != f.SHA256 {
			return Manifest{}, fmt.Errorf("manifest: file %q: sha256 %q is not 64 lower-case hex digits", f.Path, f.SHA256)
		}
		if _, err := hex.DecodeString(f.SHA256); err != nil {
			return Manifest{}, fmt.Errorf("manifest: file %q: sha256 %q is not hex", f.Path, f.SHA256)
		}
	}
	return m, nil
}

// Verify checks one step directory of the single-rank layout
// (<dir>/step-<N>/gpupack-manifest.json): its manifest parses, names the
// step of the directory, and every listed file has its size and sha256.
// Rank directories are checked by VerifyRank.
func Verify(stepDir string) (Checkpoint, error) {
	return verifyDir(context.Background(), stepDir)
}

// VerifyRank checks one rank directory <dir>/step-<N>/rank-<r>: as Verify,
// and the manifest must name that step and rank.
func VerifyRank(rankDir string) (Checkpoint, error) {
	return verifyDir(context.Background(), rankDir)
}

// verifyDir verifies a step directory (single-rank layout) or a rank
// directory (its parent is the step directory). Hashing stops when ctx is
// done, so a caller with a deadline is never held up by a large file.
func verifyDir(ctx context.Context, d string) (Checkpoint, error) {
	rank, isRank := ParseRankDirName(filepath.Base(d))
	stepName := filepath.Base(d)
	if isRank {
		stepName = filepath.Base(filepath.Dir(d))
	}
	step, ok := ParseStepDirName(stepName)
	if !ok {
		return Checkpoint{}, fmt.Errorf("%s: not a step directory (want %s<%d digits>[/%s<rank>])", d, StepPrefix, stepDigits, RankPrefix)
	}
	raw, err := os.ReadFile(filepath.Join(d, FileName))
	if err != nil {
		return Checkpoint{}, err
	}
	m, err := Parse(raw)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%s: %w", d, err)
	}
	if m.Step != step {
		return Checkpoint{}, fmt.Errorf("%s: manifest names step %d", d, m.Step)
	}
	switch {
	case isRank && m.Rank == nil:
		return Checkpoint{}, fmt.Errorf("%s: manifest names no rank", d)
	case isRank && *m.Rank != rank:
		return Checkpoint{}, fmt.Errorf("%s: manifest names rank %d", d, *m.Rank)
	case !isRank && m.Rank != nil:
		return Checkpoint{}, fmt.Errorf("%s: a rank manifest (rank %d) outside a %s<r> directory", d, *m.Rank, RankPrefix)
	}
	for _, f := range m.Files {
		if err := verifyFile(ctx, filepath.Join(d, filepath.FromSlash(f.Path)), f); err != nil {
			return Checkpoint{}, fmt.Errorf("%s: %w", d, err)
		}
	}
	sum := sha256.Sum256(raw)
	return Checkpoint{Dir: d, Manifest: m, ID: hex.EncodeToString(sum[:])}, nil
}

func verifyFile(ctx context.Context, p string, f File) error {
	fh, err := os.Open(p)
	if err != nil {
		return err
	}
	defer fh.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("file %q: verification stopped: %w", f.Path, err)
		}
		k, err := fh.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("file %q: %w", f.Path, err)
		}
		if n > f.Size {
			break // longer than listed: no need to hash the rest
		}
	}
	if n != f.Size {
		return fmt.Errorf("file %q: %d bytes, manifest says %d", f.Path, n, f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return fmt.Errorf("file %q: sha256 %s, manifest says %s", f.Path, got, f.SHA256)
	}
	return nil
}

// Steps lists the step directories under dir, newest step first. It does
// not verify them. A missing dir has no steps.
func Steps(dir string) ([]int64, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var steps []int64
	for _, e := range ents {
		if s, ok := ParseStepDirName(e.Name()); ok && e.IsDir() {
			steps = append(steps, s)
		}
	}
	// Names are fixed-width, so ReadDir's lexical order is step order.
	for i, j := 0, len(steps)-1; i < j; i, j = i+1, j-1 {
		steps[i], steps[j] = steps[j], steps[i]
	}
	return steps, nil
}

// Latest returns the newest step under dir that verifies. ok is false when
// there is none. Directories that fail verification are skipped, never
// returned.
func Latest(dir string) (cp Checkpoint, ok bool, err error) {
	return (&Verifier{}).Latest(dir)
}

// Verifier is Latest with memory: a step or rank directory whose manifest
// bytes it has already verified is not re-hashed. The agent verifies in the
// background with one while it waits for a new checkpoint, so a 100 GB
// checkpoint is hashed once. A Verifier is safe for concurrent use.
type Verifier struct {
	mu       sync.Mutex
	verified map[string]Checkpoint // key: dir + "\x00" + manifest sha256
}

// Verify is the package-level Verify, skipping the hashing when this
// manifest was verified before.
func (v *Verifier) Verify(stepDir string) (Checkpoint, error) {
	return v.VerifyContext(context.Background(), stepDir)
}

// VerifyContext verifies a step directory (single-rank layout) or a rank
// directory, remembering the result; hashing stops when ctx is done.
func (v *Verifier) VerifyContext(ctx context.Context, d string) (Checkpoint, error) {
	raw, err := os.ReadFile(filepath.Join(d, FileName))
	if err != nil {
		return Checkpoint{}, err
	}
	sum := sha256.Sum256(raw)
	key := d + "\x00" + hex.EncodeToString(sum[:])
	v.mu.Lock()
	cp, ok := v.verified[key]
	v.mu.Unlock()
	if ok {
		return cp, nil
	}
	cp, err = verifyDir(ctx, d)
	if err != nil {
		return Checkpoint{}, err
	}
	if cp.ID != hex.EncodeToString(sum[:]) {
		return Checkpoint{}, fmt.Errorf("%s: manifest changed while it was verified", d)
	}
	v.mu.Lock()
	if v.verified == nil {
		v.verified = map[string]Checkpoint{}
	}
	v.verified[key] = cp
	v.mu.Unlock()
	return cp, nil
}

// Latest is the package-level Latest, remembering what it verified.
func (v *Verifier) Latest(dir string) (Checkpoint, bool, error) {
	cps, err := v.verifiedSteps(dir, 1)
	if err != nil || len(cps) == 0 {
		return Checkpoint{}, false, err
	}
	return cps[0], true, nil
}

// Verified returns up to limit verified checkpoints under dir, newest first
// (all of them when limit <= 0).
func (v *Verifier) Verified(dir string, limit int) ([]Checkpoint, error) {
	return v.verifiedSteps(dir, limit)
}

func (v *Verifier) verifiedSteps(dir string, limit int) ([]Checkpoint, error) {
	steps, err := Steps(dir)
	if err != nil {
		return nil, err
	}
	var out []Checkpoint
	for _, s := range steps {
		cp, err := v.Verify(filepath.Join(dir, StepDirName(s)))
		if err != nil {
			continue // torn, damaged, or replaced while we read it
		}
		out = append(out, cp)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out, nil
}

// NewestID returns the ID (manifest sha256) of the newest step directory
// that has a manifest, without verifying its files: it is the cheap
// "what was there before" mark a waiter compares new checkpoints against.
func NewestID(dir string) (string, bool) {
	steps, err := Steps(dir)
	if err != nil {
		return "", false
	}
	for _, s := range steps {
		raw, err := os.ReadFile(filepath.Join(dir, StepDirName(s), FileName))
		if err != nil {
			continue
		}
		sum := sha256.Sum256(raw)
		return hex.EncodeToString(sum[:]), true
	}
	return "", false
}
