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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
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
	// RunID names the run (one start of the job: the helper's rank 0 draws
	// it and broadcasts it to every rank) that wrote this rank's
	// checkpoint. Optional; when any rank of a step has one, every rank of
	// that step must name the same: a step whose ranks come from two runs
	// (a restart re-saved some ranks of it) is not consistent.
	RunID string `json:"runId,omitempty"`
	// JobID names the job (its UID, GPUPACK_JOB_UID) that wrote the rank.
	// Optional; a Verifier with a JobID ignores steps naming another one
	// (two jobs sharing a checkpoint directory).
	JobID string `json:"jobId,omitempty"`
	// Tier says where this copy of the rank's shard lives (tiered
	// checkpoints): TierLocal for the node-local fast directory the helper
	// writes first, TierShared for the copy gpupack-ckpt uploaded to the
	// shared directory. Absent: a checkpoint written straight to its
	// directory. Node is the node of the local copy; LocalWorldSize the
	// number of ranks that write to the same local directory (one pod), so
	// the agent knows when its pod's part of a step is complete.
	Tier           string `json:"tier,omitempty"`
	Node           string `json:"node,omitempty"`
	LocalWorldSize *int   `json:"localWorldSize,omitempty"`
}

// Tiers of Manifest.Tier.
const (
	TierLocal  = "local"
	TierShared = "shared"
)

// MaxRunIDLen bounds Manifest.RunID.
const MaxRunIDLen = 128

// ValidateRunID accepts 1..MaxRunIDLen characters of [A-Za-z0-9._:-].
func ValidateRunID(id string) error {
	if id == "" || len(id) > MaxRunIDLen {
		return fmt.Errorf("runId %q: want 1..%d characters", id, MaxRunIDLen)
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return fmt.Errorf("runId %q: only letters, digits and . _ : - are allowed", id)
		}
	}
	return nil
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
	// encoding/json matches keys case-insensitively, keeps the last of
	// duplicate keys and replaces invalid UTF-8: Python's reader does none
	// of that, and the two verifiers must agree on every manifest.
	if !utf8.Valid(b) {
		return Manifest{}, errors.New("manifest: not valid UTF-8")
	}
	if err := strictKeys(b, manifestKeys); err != nil {
		return Manifest{}, fmt.Errorf("manifest: %w", err)
	}
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
	// An explicit empty runId is refused (as the Python helper does); an
	// absent one is a manifest written before run ids.
	// null is no value: a field is there with a value or absent (as the
	// Python helper reads it), so "rank":null cannot pass for absent.
	var present map[string]json.RawMessage
	if err := json.Unmarshal(b, &present); err != nil {
		return Manifest{}, fmt.Errorf("manifest: %w", err)
	}
	for k, v := range present {
		if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			return Manifest{}, fmt.Errorf("manifest: %s is null", k)
		}
	}
	if _, ok := present["runId"]; ok {
		if err := ValidateRunID(m.RunID); err != nil {
			return Manifest{}, fmt.Errorf("manifest: %w", err)
		}
	}
	if _, ok := present["jobId"]; ok {
		if err := ValidateRunID(m.JobID); err != nil {
			return Manifest{}, fmt.Errorf("manifest: jobId: %w", err)
		}
	}
	if _, ok := present["tier"]; ok && m.Tier != TierLocal && m.Tier != TierShared {
		return Manifest{}, fmt.Errorf("manifest: tier %q, want %q or %q", m.Tier, TierLocal, TierShared)
	}
	switch {
	case m.Tier != "" && m.Tier != TierLocal && m.Tier != TierShared:
		return Manifest{}, fmt.Errorf("manifest: tier %q, want %q or %q", m.Tier, TierLocal, TierShared)
	case len(m.Node) > 253 || strings.ContainsFunc(m.Node, func(c rune) bool { return c < 0x20 || c == 0x7f }):
		return Manifest{}, fmt.Errorf("manifest: node %q: at most 253 printable characters", m.Node)
	case m.LocalWorldSize != nil && (m.WorldSize == nil || *m.LocalWorldSize < 1 || *m.LocalWorldSize > *m.WorldSize):
		return Manifest{}, errors.New("manifest: localWorldSize must be in [1, worldSize] of a rank manifest")
	}
	if len(m.Files) == 0 {
		// A checkpoint of nothing: named consistent, a restart would resume
		// from it and crash-loop (no writer of ours produces one).
		return Manifest{}, errors.New("manifest: lists no files")
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
	if isRank {
		if fi, err := os.Lstat(filepath.Dir(d)); err != nil {
			return Checkpoint{}, err
		} else if !fi.IsDir() {
			return Checkpoint{}, fmt.Errorf("%s: the step directory is a symlink or not a directory", filepath.Dir(d))
		}
	}
	if err := noSymlinks(d, FileName); err != nil {
		return Checkpoint{}, err
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
		if err := noSymlinks(d, f.Path); err != nil {
			return Checkpoint{}, err
		}
		if err := verifyFile(ctx, filepath.Join(d, filepath.FromSlash(f.Path)), f); err != nil {
			return Checkpoint{}, fmt.Errorf("%s: %w", d, err)
		}
	}
	sum := sha256.Sum256(raw)
	return Checkpoint{Dir: d, Manifest: m, ID: hex.EncodeToString(sum[:])}, nil
}

// noSymlinks checks that d and every component of rel below it are no
// symlinks, and rel is a regular file: a checkpoint is only what lies
// inside its own directory (a link may leave it, or point at another run's
// shard), and the Python helper refuses the same.
func noSymlinks(d, rel string) error {
	p := d
	parts := append([]string{""}, strings.Split(rel, "/")...)
	for i, part := range parts {
		if part != "" {
			p = filepath.Join(p, part)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			return fmt.Errorf("%s: is a symlink; a checkpoint must not link outside its directory", p)
		case i < len(parts)-1 && !fi.IsDir():
			return fmt.Errorf("%s: not a directory", p)
		case i == len(parts)-1 && !fi.Mode().IsRegular():
			return fmt.Errorf("%s: not a regular file", p)
		}
	}
	return nil
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
// bytes it has already verified is not re-hashed while none of its files
// changed (each lookup lstats them: size, mtime, ctime, device, inode). The agent verifies in the
// background with one while it waits for a new checkpoint, so a 100 GB
// checkpoint is hashed once. A Verifier is safe for concurrent use.
type Verifier struct {
	// JobID: when set, a step any rank of which names another jobId is
	// not consistent (another job's checkpoint in a shared directory).
	JobID    string
	mu       sync.Mutex
	verified map[string]cached // key: dir + "\x00" + manifest sha256
}

// cached is a verified checkpoint with what its files looked like when they
// were hashed: a later lookup lstats every listed file and re-hashes the
// directory when any of them changed (rewritten in place, replaced,
// removed), so a remembered result never outlives the files it was about.
type cached struct {
	cp    Checkpoint
	stats []fileStat
}

// fileStat is what changes when a file is written, replaced or removed.
type fileStat struct {
	size, mtime, ctime int64
	dev, ino           uint64
}

// statFiles lstats every file m lists under d (no symlinks on the way).
func statFiles(d string, m Manifest) ([]fileStat, error) {
	out := make([]fileStat, 0, len(m.Files))
	for _, f := range m.Files {
		if err := noSymlinks(d, f.Path); err != nil {
			return nil, err
		}
		fi, err := os.Lstat(filepath.Join(d, filepath.FromSlash(f.Path)))
		if err != nil {
			return nil, err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil, fmt.Errorf("%s: no stat information for %q", d, f.Path)
		}
		out = append(out, fileStat{size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), dev: uint64(st.Dev), ino: st.Ino})
	}
	return out, nil
}

func (v *Verifier) remember(key string, cp Checkpoint, stats []fileStat) {
	v.mu.Lock()
	if v.verified == nil {
		v.verified = map[string]cached{}
	}
	v.verified[key] = cached{cp: cp, stats: stats}
	v.mu.Unlock()
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
	c, ok := v.verified[key]
	v.mu.Unlock()
	if ok {
		// The manifest is the same; are its files? A file rewritten,
		// replaced or removed since it was hashed is hashed again.
		if now, err := statFiles(d, c.cp.Manifest); err == nil && slices.Equal(now, c.stats) {
			return c.cp, nil
		}
		v.mu.Lock()
		delete(v.verified, key)
		v.mu.Unlock()
	}
	// The files' state before hashing: a write during the hashing changes
	// it, so the next lookup hashes again.
	var before []fileStat
	if m, err := Parse(raw); err == nil {
		before, _ = statFiles(d, m)
	}
	cp, err := verifyDir(ctx, d)
	if err != nil {
		return Checkpoint{}, err
	}
	if cp.ID != hex.EncodeToString(sum[:]) {
		return Checkpoint{}, fmt.Errorf("%s: manifest changed while it was verified", d)
	}
	if before != nil {
		v.remember(key, cp, before)
	}
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

var (
	manifestKeys = map[string]bool{"version": true, "step": true, "files": true, "savedAt": true, "rank": true,
		"worldSize": true, "runId": true, "jobId": true, "tier": true, "node": true, "localWorldSize": true}
	fileKeys = map[string]bool{"path": true, "size": true, "sha256": true}
)

// strictKeys checks that the JSON object b names only allowed keys, spelt
// exactly, each once, and so do the entries of its "files" array.
func strictKeys(b []byte, allowed map[string]bool) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errors.New("not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		k, _ := tok.(string)
		if !allowed[k] {
			return fmt.Errorf("unknown field %q", k)
		}
		if seen[k] {
			return fmt.Errorf("field %q given twice", k)
		}
		seen[k] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		if k == "files" && len(allowed) == len(manifestKeys) {
			var entries []json.RawMessage
			if json.Unmarshal(v, &entries) == nil {
				for _, e := range entries {
					if err := strictKeys(e, fileKeys); err != nil {
						return fmt.Errorf("file entry: %w", err)
					}
				}
			}
		}
	}
	return nil
}

// Unchanged reports, without hashing, whether every manifest of step under
// dir (the single-rank layout, or each rank-<r> directory) was verified by
// this Verifier and still lists files that look exactly as they did when
// they were hashed (lstat: size, mtime, ctime, device, inode). false when
// any was never verified here, or changed, or cannot be read: the caller
// that has no time left to hash again must not name the step.
func (v *Verifier) Unchanged(dir string, step int64) bool {
	sd := filepath.Join(dir, StepDirName(step))
	dirs := []string{sd}
	if _, err := os.Stat(filepath.Join(sd, FileName)); err != nil {
		ents, err := os.ReadDir(sd)
		if err != nil {
			return false
		}
		dirs = dirs[:0]
		for _, e := range ents {
			if _, ok := ParseRankDirName(e.Name()); ok && e.IsDir() {
				dirs = append(dirs, filepath.Join(sd, e.Name()))
			}
		}
		if len(dirs) == 0 {
			return false
		}
	}
	for _, d := range dirs {
		raw, err := os.ReadFile(filepath.Join(d, FileName))
		if err != nil {
			return false
		}
		sum := sha256.Sum256(raw)
		v.mu.Lock()
		c, ok := v.verified[d+"\x00"+hex.EncodeToString(sum[:])]
		v.mu.Unlock()
		if !ok {
			return false
		}
		now, err := statFiles(d, c.cp.Manifest)
		if err != nil || !slices.Equal(now, c.stats) {
			return false
		}
	}
	return true
}
