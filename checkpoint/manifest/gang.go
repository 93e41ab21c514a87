package manifest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// The per-rank layout a distributed job writes (the Python helper's
// Checkpointer, SaveRank):
//
//	<dir>/step-<N>/rank-<r>/<files…>
//	<dir>/step-<N>/rank-<r>/gpupack-manifest.json   (rank, worldSize set)
//	<dir>/step-<N>/.tmp-rank-<r>-…                  (a rank's save in progress)
//
// Each rank's directory is written and renamed into place atomically by that
// rank alone; ranks never write into each other's directories. A step is
// gang-consistent when every rank 0..worldSize-1 has a verified manifest and
// all of them name the same worldSize. A step directory holding a manifest
// itself (the single-rank layout of Save) is a gang of one.
const (
	// RankPrefix starts every rank directory's name: rank-<r>, r in
	// decimal without leading zeros.
	RankPrefix = "rank-"
	// MaxWorldSize bounds worldSize in a manifest.
	MaxWorldSize = 1 << 20
)

// RankDirName is the directory name of a rank inside a step directory.
func RankDirName(rank int) string { return RankPrefix + strconv.Itoa(rank) }

// ParseRankDirName returns the rank a directory name stands for (canonical
// decimal only, so one rank has one name).
func ParseRankDirName(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, RankPrefix)
	if !ok || rest == "" || len(rest) > 7 || (len(rest) > 1 && rest[0] == '0') {
		return 0, false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n >= MaxWorldSize {
		return 0, false
	}
	return n, true
}

// Gang is a gang-consistent step: every rank's checkpoint verified.
type Gang struct {
	Step      int64
	WorldSize int
	// RunID is the run every rank's manifest names ("" for manifests
	// written without one).
	RunID string
	// Ranks[r] is rank r's verified checkpoint.
	Ranks []Checkpoint
}

// IDs are the manifest IDs of the gang's ranks.
func (g Gang) IDs() []string {
	out := make([]string, len(g.Ranks))
	for i, cp := range g.Ranks {
		out[i] = cp.ID
	}
	return out
}

// StepState is what one step directory holds.
type StepState struct {
	Step int64
	// WorldSize is the worldSize the rank manifests name (1 for the
	// single-rank layout; 0 when no manifest could be read).
	WorldSize int
	// RunID is the runId the verified rank manifests name (when they agree).
	RunID string
	// Verified are the ranks whose manifest and files verified.
	Verified map[int]Checkpoint
	// Problems says why the step is not consistent (missing or damaged
	// ranks, disagreeing world sizes); empty when it is.
	Problems []string
	// Broken counts rank directories that failed verification (damaged,
	// symlinked), as opposed to ranks that are simply absent.
	Broken int
}

// LocalComplete reports whether this step, read in a node-local directory
// of a tiered checkpoint, holds its pod's whole part: every rank manifest
// verifies, all name the same localWorldSize L and runId, and there are L.
func (s StepState) LocalComplete() bool {
	if s.Broken > 0 || len(s.Verified) == 0 {
		return false
	}
	l, run := -1, ""
	for _, cp := range s.Verified {
		m := cp.Manifest
		if m.LocalWorldSize == nil || (l >= 0 && (*m.LocalWorldSize != l || m.RunID != run)) {
			return false
		}
		l, run = *m.LocalWorldSize, m.RunID
	}
	return len(s.Verified) == l
}

// Consistent reports whether every rank of the step verified.
func (s StepState) Consistent() bool {
	return len(s.Problems) == 0 && s.WorldSize > 0 && len(s.Verified) == s.WorldSize
}

// Gang returns the step as a Gang; ok is false when it is not consistent.
func (s StepState) Gang() (Gang, bool) {
	if !s.Consistent() {
		return Gang{}, false
	}
	g := Gang{Step: s.Step, WorldSize: s.WorldSize, RunID: s.RunID, Ranks: make([]Checkpoint, s.WorldSize)}
	for r, cp := range s.Verified {
		g.Ranks[r] = cp
	}
	return g, true
}

// StepState verifies every rank of one step (remembering what it hashed).
// It returns an error only when ctx ended before the step was checked.
func (v *Verifier) StepState(ctx context.Context, dir string, step int64) (StepState, error) {
	st := StepState{Step: step, Verified: map[int]Checkpoint{}}
	sd := filepath.Join(dir, StepDirName(step))
	if _, err := os.Stat(filepath.Join(sd, FileName)); err == nil {
		cp, err := v.VerifyContext(ctx, sd)
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		st.WorldSize = 1
		if err != nil {
			st.Problems = append(st.Problems, err.Error())
		} else {
			st.Verified[0] = cp
			st.RunID = cp.Manifest.RunID
		}
		return st, nil
	}
	ents, err := os.ReadDir(sd)
	if err != nil {
		st.Problems = append(st.Problems, err.Error())
		return st, nil
	}
	found, problems := map[int]Checkpoint{}, map[int]string{}
	for _, e := range ents {
		r, ok := ParseRankDirName(e.Name())
		if !ok {
			continue
		}
		if e.Type()&os.ModeSymlink != 0 {
			// The Python helper refuses it too: a linked rank directory
			// may hold another step's or another job's shard.
			problems[r] = fmt.Sprintf("%s: %s is a symlink", sd, e.Name())
			st.Broken++
			continue
		}
		if !e.IsDir() {
			continue
		}
		cp, err := v.VerifyContext(ctx, filepath.Join(sd, e.Name()))
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if err != nil {
			problems[r] = err.Error()
			st.Broken++
			continue
		}
		if j := cp.Manifest.JobID; v.JobID != "" && j != "" && j != v.JobID {
			problems[r] = fmt.Sprintf("%s: rank %d belongs to another job (jobId %q)", sd, r, j)
			continue
		}
		found[r] = cp
	}
	// The step's world size and run are rank 0's: ranks 0..worldSize-1
	// must all name them, and rank directories at or above that world size
	// are an older, larger run's leftovers (the job shrank) that no rank of
	// this world writes, so they are ignored rather than making a complete
	// save of the new run inconsistent forever. No mix of runs, jobs or world
	// sizes is ever consistent: the ranks counted are exactly 0..w-1.
	anchor, ok := found[0]
	if !ok {
		rs := make([]int, 0, len(problems))
		for r := range problems {
			rs = append(rs, r)
		}
		sort.Ints(rs)
		for _, r := range rs {
			st.Problems = append(st.Problems, problems[r])
		}
		if len(st.Problems) == 0 {
			st.Problems = append(st.Problems, sd+": rank 0 has no verified manifest")
		}
		for r, cp := range found {
			st.Verified[r] = cp
			st.WorldSize = max(st.WorldSize, *cp.Manifest.WorldSize)
		}
		return st, nil
	}
	st.WorldSize, st.RunID = *anchor.Manifest.WorldSize, anchor.Manifest.RunID
	for r := 0; r < st.WorldSize && len(st.Problems) <= 8; r++ {
		cp, ok := found[r]
		if !ok {
			p := problems[r]
			if p == "" {
				p = fmt.Sprintf("%s: rank %d of %d has no verified manifest", sd, r, st.WorldSize)
			}
			st.Problems = append(st.Problems, p)
			continue
		}
		st.Verified[r] = cp // its own shard checks out; whether it fits the step:
		switch m := cp.Manifest; {
		case *m.WorldSize != st.WorldSize:
			st.Problems = append(st.Problems, fmt.Sprintf("%s: ranks disagree on worldSize [%d, %d] (rank 0 and rank %d)", sd, st.WorldSize, *m.WorldSize, r))
		case m.RunID != st.RunID:
			st.Problems = append(st.Problems, fmt.Sprintf("%s: ranks come from different runs (runId %q, %q: rank 0 and rank %d)", sd, st.RunID, m.RunID, r))
		case m.JobID != anchor.Manifest.JobID:
			st.Problems = append(st.Problems, fmt.Sprintf("%s: ranks come from different jobs (jobId %q, %q: rank 0 and rank %d)", sd, anchor.Manifest.JobID, m.JobID, r))
		}
	}
	return st, nil
}

// Scan returns the state of the newest limit steps under dir (all when
// limit <= 0), newest first. It stops early, with ctx's error, when ctx
// ends; the states it finished are returned.
func (v *Verifier) Scan(ctx context.Context, dir string, limit int) ([]StepState, error) {
	steps, err := Steps(dir)
	if err != nil {
		return nil, err
	}
	var out []StepState
	for _, s := range steps {
		if limit > 0 && len(out) == limit {
			break
		}
		st, err := v.StepState(ctx, dir, s)
		if err != nil {
			return out, err
		}
		out = append(out, st)
	}
	return out, nil
}

// LatestConsistent returns the newest gang-consistent step under dir: the
// newest step whose every rank's manifest verifies. This is the one answer
// to "which step does a restart resume from" for Go (the agent, the
// coordinator's tests) and, with the same rules, gpupack_ckpt.py's
// latest_consistent().
func (v *Verifier) LatestConsistent(ctx context.Context, dir string) (Gang, bool, error) {
	steps, err := Steps(dir)
	if err != nil {
		return Gang{}, false, err
	}
	for _, s := range steps {
		st, err := v.StepState(ctx, dir, s)
		if err != nil {
			return Gang{}, false, err
		}
		if g, ok := st.Gang(); ok {
			return g, true, nil
		}
	}
	return Gang{}, false, nil
}

// LatestConsistent is Verifier.LatestConsistent without memory.
func LatestConsistent(ctx context.Context, dir string) (Gang, bool, error) {
	return (&Verifier{}).LatestConsistent(ctx, dir)
}

// ManifestIDs returns the IDs of every manifest under dir (both layouts)
// without verifying any file: the cheap "what was there before" mark the
// agent takes at a request.
func ManifestIDs(dir string) map[string]bool {
	out := map[string]bool{}
	steps, _ := Steps(dir)
	for _, s := range steps {
		sd := filepath.Join(dir, StepDirName(s))
		if id, ok := manifestID(sd); ok {
			out[id] = true
			continue
		}
		ents, _ := os.ReadDir(sd)
		for _, e := range ents {
			if _, ok := ParseRankDirName(e.Name()); ok {
				if id, ok := manifestID(filepath.Join(sd, e.Name())); ok {
					out[id] = true
				}
			}
		}
	}
	return out
}

func manifestID(d string) (string, bool) {
	raw, err := os.ReadFile(filepath.Join(d, FileName))
	if err != nil {
		return "", false
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:]), true
}

// SaveRank writes rank's checkpoint of step under dir
// (<dir>/step-<N>/rank-<r>/) atomically, like Save does for a step.
func SaveRank(dir string, step int64, rank, worldSize int, files map[string]WriteFunc) (Checkpoint, error) {
	if worldSize < 1 || worldSize > MaxWorldSize || rank < 0 || rank >= worldSize {
		return Checkpoint{}, fmt.Errorf("save: rank %d / worldSize %d out of range", rank, worldSize)
	}
	return saveDir(dir, step, &RankInfo{Rank: rank, WorldSize: worldSize}, files, nowFunc())
}

// RankInfo is what a rank manifest says about its writer.
type RankInfo struct {
	Rank, WorldSize int
	RunID, JobID    string
	Tier, Node      string
	LocalWorldSize  int // 0: not recorded
}

// SaveRankRun is SaveRank with the run id (Manifest.RunID) recorded.
func SaveRankRun(dir string, step int64, rank, worldSize int, runID string, files map[string]WriteFunc) (Checkpoint, error) {
	if err := ValidateRunID(runID); err != nil {
		return Checkpoint{}, fmt.Errorf("save: %w", err)
	}
	return SaveRankWith(dir, step, RankInfo{Rank: rank, WorldSize: worldSize, RunID: runID}, files)
}

// SaveRankWith is SaveRank with every field of RankInfo recorded.
//
// A rank save (SaveRank, SaveRankRun, SaveRankWith) of a step that is
// already consistent under another runId is a no-op returning the existing
// rank checkpoint: replacing one rank would mix two runs in the step and
// make it non-consistent (a restart re-saving the step it resumed from,
// then killed before its other ranks saved, would lose it).
func SaveRankWith(dir string, step int64, info RankInfo, files map[string]WriteFunc) (Checkpoint, error) {
	if info.WorldSize < 1 || info.WorldSize > MaxWorldSize || info.Rank < 0 || info.Rank >= info.WorldSize {
		return Checkpoint{}, fmt.Errorf("save: rank %d / worldSize %d out of range", info.Rank, info.WorldSize)
	}
	if info.RunID != "" {
		if err := ValidateRunID(info.RunID); err != nil {
			return Checkpoint{}, fmt.Errorf("save: %w", err)
		}
	}
	return saveDir(dir, step, &info, files, nowFunc())
}
