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
	// Verified are the ranks whose manifest and files verified.
	Verified map[int]Checkpoint
	// Problems says why the step is not consistent (missing or damaged
	// ranks, disagreeing world sizes); empty when it is.
	Problems []string
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
	g := Gang{Step: s.Step, WorldSize: s.WorldSize, Ranks: make([]Checkpoint, s.WorldSize)}
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
		}
		return st, nil
	}
	ents, err := os.ReadDir(sd)
	if err != nil {
		st.Problems = append(st.Problems, err.Error())
		return st, nil
	}
	worlds := map[int]bool{}
	for _, e := range ents {
		r, ok := ParseRankDirName(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		cp, err := v.VerifyContext(ctx, filepath.Join(sd, e.Name()))
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if err != nil {
			st.Problems = append(st.Problems, err.Error())
			continue
		}
		st.Verified[r] = cp
		worlds[*cp.Manifest.WorldSize] = true
	}
	switch len(worlds) {
	case 0:
		if len(st.Problems) == 0 {
			st.Problems = append(st.Problems, sd+": no rank has a verified manifest")
		}
		return st, nil
	case 1:
		for w := range worlds {
			st.WorldSize = w
		}
	default:
		ws := make([]int, 0, len(worlds))
		for w := range worlds {
			ws = append(ws, w)
		}
		sort.Ints(ws)
		st.Problems = append(st.Problems, fmt.Sprintf("%s: ranks disagree on worldSize %v", sd, ws))
		for w := range worlds {
			st.WorldSize = max(st.WorldSize, w)
		}
		return st, nil
	}
	for r := 0; r < st.WorldSize; r++ {
		if _, ok := st.Verified[r]; !ok {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: rank %d of %d has no verified manifest", sd, r, st.WorldSize))
			if len(st.Problems) > 8 {
				break
			}
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
	return saveDir(dir, step, &rank, &worldSize, files, nowFunc())
}
