package manifest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func saveRankRun(t *testing.T, dir string, step int64, rank, world int, run, content string) {
	t.Helper()
	if _, err := SaveRankRun(dir, step, rank, world, run, map[string]WriteFunc{"model.pt": Bytes([]byte(content))}); err != nil {
		t.Fatal(err)
	}
}

// A restart (run B) saves rank 0 of a torn step 2 of run A and dies before
// rank 1 does: both rank manifests of step 2 verify, but they are two runs'
// shards.
func TestGangMixingTwoRunsIsNotConsistent(t *testing.T) {
	dir := t.TempDir()
	for r := 0; r < 2; r++ {
		saveRankRun(t, dir, 1, r, 2, "run-a", "one")
	}
	saveRankRun(t, dir, 2, 1, 2, "run-a", "two") // run-a died before rank 0 saved step 2
	g, ok, err := LatestConsistent(context.Background(), dir)
	if err != nil || !ok || g.Step != 1 || g.RunID != "run-a" {
		t.Fatalf("LatestConsistent = %+v %v %v, want step 1 of run-a", g, ok, err)
	}
	saveRankRun(t, dir, 2, 0, 2, "run-b", "two, again")
	if got := latestConsistent(t, dir); got != 1 {
		t.Fatalf("LatestConsistent = %d with rank 0 of step 2 from run-b and rank 1 from run-a, want 1", got)
	}
	st, _ := (&Verifier{}).StepState(context.Background(), dir, 2)
	if len(st.Problems) == 0 || !strings.Contains(strings.Join(st.Problems, ";"), "different runs") {
		t.Errorf("StepState problems %q, want one naming the different runs", st.Problems)
	}
	// A manifest without a run id does not match one with.
	saveRank(t, dir, 2, 1, 2, "two, again")
	if got := latestConsistent(t, dir); got != 1 {
		t.Fatalf("LatestConsistent = %d with one rank of run-b and one without a run id, want 1", got)
	}
	saveRankRun(t, dir, 2, 1, 2, "run-b", "two, again")
	if got := latestConsistent(t, dir); got != 2 {
		t.Fatalf("LatestConsistent = %d once every rank of step 2 is run-b's, want 2", got)
	}
}

func TestParseRunID(t *testing.T) {
	base := `{"version":1,"step":1,"files":[{"path":"m","size":1,"sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}],"savedAt":"2026-01-01T00:00:00Z","rank":0,"worldSize":1`
	for _, bad := range []string{`""`, `null`, `7`, `"a b"`, `"` + strings.Repeat("x", MaxRunIDLen+1) + `"`, `"a/b"`, `"\u00e9"`} {
		if _, err := Parse([]byte(base + `,"runId":` + bad + `}`)); err == nil {
			t.Errorf("Parse accepted runId %s", bad)
		}
	}
	m, err := Parse([]byte(base + `,"runId":"0f3a:job-uid_1.attempt-2"}`))
	if err != nil || m.RunID != "0f3a:job-uid_1.attempt-2" {
		t.Errorf("Parse = %+v, %v", m, err)
	}
	if _, err := SaveRankRun(t.TempDir(), 1, 0, 1, "bad id", nil); err == nil {
		t.Error("SaveRankRun accepted a bad run id")
	}
}

// A rank directory that is a symlink (to another job's or step's shard) or
// holds a symlinked file is not part of the checkpoint, in Go and Python alike.
func TestSymlinksAreRefusedByBothVerifiers(t *testing.T) {
	py := python3(t)
	for name, link := range map[string]func(t *testing.T, dir, other string){
		"rank dir links to another checkpoint dir": func(t *testing.T, dir, other string) {
			rd := filepath.Join(dir, StepDirName(2), RankDirName(1))
			os.RemoveAll(rd)
			if err := os.Symlink(filepath.Join(other, StepDirName(2), RankDirName(1)), rd); err != nil {
				t.Fatal(err)
			}
		},
		"file links outside the rank dir": func(t *testing.T, dir, other string) {
			f := filepath.Join(dir, StepDirName(2), RankDirName(1), "model.pt")
			os.Remove(f)
			if err := os.Symlink(filepath.Join(other, StepDirName(2), RankDirName(1), "model.pt"), f); err != nil {
				t.Fatal(err)
			}
		},
		"manifest links outside the rank dir": func(t *testing.T, dir, other string) {
			f := filepath.Join(dir, StepDirName(2), RankDirName(1), FileName)
			os.Remove(f)
			if err := os.Symlink(filepath.Join(other, StepDirName(2), RankDirName(1), FileName), f); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir, other := t.TempDir(), t.TempDir()
			for r := 0; r < 2; r++ {
				saveRank(t, dir, 1, r, 2, "one")
				saveRank(t, dir, 2, r, 2, "two")
				saveRank(t, other, 2, r, 2, "two") // same content: only the link is wrong
			}
			link(t, dir, other)
			if got := latestConsistent(t, dir); got != 1 {
				t.Errorf("Go LatestConsistent = %d, want 1", got)
			}
			out, err := exec.Command(py, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c; print(c.latest_consistent(sys.argv[2]))", pythonDir(t), dir).CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != "1" {
				t.Errorf("Python latest_consistent = %s, want 1 (as Go)", got)
			}
		})
	}
}

// Re-saving an existing rank of a step: after every rename the save makes
// (a crash could stop it after any of them), the step is still consistent.
func TestResaveOfAStepIsAtomic(t *testing.T) {
	dir := t.TempDir()
	for r := 0; r < 2; r++ {
		saveRank(t, dir, 1, r, 2, "one")
		saveRank(t, dir, 2, r, 2, "two")
	}
	origRename, origExchange := rename, exchange
	t.Cleanup(func() { rename, exchange = origRename, origExchange })
	var calls []string
	check := func(op string, err error) error {
		calls = append(calls, op)
		if got := latestConsistent(t, dir); got != 2 {
			t.Errorf("after %s (calls %v): LatestConsistent = %d, want 2 (old or new step 2)", op, calls, got)
		}
		return err
	}
	rename = func(a, b string) error {
		return check("rename "+filepath.Base(a)+" "+filepath.Base(b), origRename(a, b))
	}
	exchange = func(a, b string) error { return check("exchange", origExchange(a, b)) }
	saveRank(t, dir, 2, 1, 2, "two, again")
	b, _ := os.ReadFile(filepath.Join(dir, StepDirName(2), RankDirName(1), "model.pt"))
	if string(b) != "two, again" {
		t.Errorf("rank 1 of step 2 holds %q after the re-save", b)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, StepDirName(2)))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), TempPrefix) {
			t.Errorf("%s left behind", e.Name())
		}
	}
}

func TestPruneRankLayout(t *testing.T) {
	dir := t.TempDir()
	for s := int64(1); s <= 4; s++ {
		for r := 0; r < 2; r++ {
			saveRank(t, dir, s, r, 2, "x")
		}
	}
	saveRank(t, dir, 5, 0, 2, "x") // rank 1 still saving step 5
	os.MkdirAll(filepath.Join(dir, StepDirName(5), TempPrefix+"rank-1-inflight"), 0o755)
	os.MkdirAll(filepath.Join(dir, StepDirName(4), TempPrefix+"rank-1-crashed"), 0o755)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(dir, StepDirName(4), TempPrefix+"rank-1-crashed"), old, old)
	// Step 3 is torn (rank 1 damaged): it is not one of the kept steps.
	os.WriteFile(filepath.Join(dir, StepDirName(3), RankDirName(1), "model.pt"), []byte("y"), 0o644)

	if err := Prune(dir, 2, time.Minute); err != nil {
		t.Fatal(err)
	}
	steps, _ := Steps(dir)
	// Kept: the two newest consistent (4, 2), the torn 3 between them, and
	// 5 (newer: a save in progress) with its in-flight temp dir.
	if diff := cmp.Diff([]int64{5, 4, 3, 2}, steps); diff != "" {
		t.Errorf("steps after Prune (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(dir, StepDirName(5), TempPrefix+"rank-1-inflight")); err != nil {
		t.Errorf("Prune removed a save in progress: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, StepDirName(4), TempPrefix+"rank-1-crashed")); !os.IsNotExist(err) {
		t.Errorf("a crashed save's temp dir survived Prune: %v", err)
	}
	// keep=1 never removes the newest consistent step.
	if err := Prune(dir, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := latestConsistent(t, dir); got != 4 {
		t.Errorf("after Prune(keep=1) LatestConsistent = %d, want 4", got)
	}
	steps, _ = Steps(dir)
	if diff := cmp.Diff([]int64{5, 4}, steps); diff != "" {
		t.Errorf("steps after Prune(keep=1) (-want +got):\n%s", diff)
	}
}

// Run B resumes from step 2, which run A completed, re-saves it at the top
// of its loop and is killed after rank 0: with Prune(keep=1) step 2 is the
// only checkpoint, so replacing rank 0 would lose everything. The re-save
// is a no-op.
func TestResaveOfAConsistentStepByAnotherRunIsANoOp(t *testing.T) {
	dir := t.TempDir()
	for _, s := range []int64{1, 2} {
		for r := 0; r < 2; r++ {
			saveRankRun(t, dir, s, r, 2, "run-a", "a")
		}
	}
	if err := Prune(dir, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	cp, err := SaveRankRun(dir, 2, 0, 2, "run-b", map[string]WriteFunc{"model.pt": Bytes([]byte("b"))})
	if err != nil {
		t.Fatal(err)
	}
	if cp.Dir != filepath.Join(dir, StepDirName(2), RankDirName(0)) || cp.Manifest.RunID != "run-a" {
		t.Errorf("re-save returned %s of run %q, want the existing rank-0 of run-a", cp.Dir, cp.Manifest.RunID)
	}
	g, ok, err := LatestConsistent(context.Background(), dir)
	if err != nil || !ok || g.Step != 2 || g.RunID != "run-a" {
		t.Fatalf("LatestConsistent = %+v %v %v after run-b's partial re-save, want step 2 of run-a", g, ok, err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, StepDirName(2)))
	if len(ents) != 2 {
		t.Errorf("step 2 holds %d entries, want rank-0 and rank-1 only (no temporary left)", len(ents))
	}
	// The same run may re-save its own consistent step.
	saveRankRun(t, dir, 2, 1, 2, "run-a", "a, again")
	if b, _ := os.ReadFile(filepath.Join(dir, StepDirName(2), RankDirName(1), "model.pt")); string(b) != "a, again" {
		t.Errorf("run-a's own re-save left %q", b)
	}
}

func TestEmptyRankCheckpointIsRefused(t *testing.T) {
	dir := t.TempDir()
	if _, err := SaveRankRun(dir, 1, 0, 1, "a", map[string]WriteFunc{}); err == nil {
		t.Fatal("SaveRankRun with no files succeeded, want it refused")
	}
	if got := latestConsistent(t, dir); got != -1 {
		t.Errorf("LatestConsistent = %d after a refused empty save, want none", got)
	}
}

// A hand-made manifest listing no files is refused by Parse and by both
// verifiers (it would be named consistent and resumed from), and no save
// writes one.
func TestManifestListingNoFilesIsRefused(t *testing.T) {
	py := python3(t)
	dir := t.TempDir()
	saveRankRun(t, dir, 1, 0, 1, "a", "one")
	rd := filepath.Join(dir, StepDirName(2), RankDirName(0))
	if err := os.MkdirAll(rd, 0o755); err != nil {
		t.Fatal(err)
	}
	empty := `{"version":1,"step":2,"files":[],"savedAt":"2026-11-30T05:00:00Z","rank":0,"worldSize":1,"runId":"a"}`
	if err := os.WriteFile(filepath.Join(rd, FileName), []byte(empty), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse([]byte(empty)); err == nil || !strings.Contains(err.Error(), "no files") {
		t.Errorf("Parse(%s) = %v, want refused: lists no files", empty, err)
	}
	if got := latestConsistent(t, dir); got != 1 {
		t.Errorf("Go LatestConsistent = %d, want 1 (step 2 lists no files)", got)
	}
	out, err := exec.Command(py, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c; print(c.latest_consistent(sys.argv[2]))", pythonDir(t), dir).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Errorf("Python latest_consistent = %s (%v), want 1", out, err)
	}
	if _, err := Save(t.TempDir(), 3, map[string]WriteFunc{}); err == nil {
		t.Error("Save with no files succeeded, want it refused")
	}
}

// Run A (4 ranks) died saving step 5: ranks 1..3 saved, rank 0 not. Run B
// (the job shrank to 2 ranks) saves step 5: run A's rank-2 and rank-3 must
// not keep run B's complete save from being consistent (they are at or
// above B's world size, which rank 0's manifest names), in Go and Python
// alike; a mix of the two runs below that is never consistent.
func TestShrunkJobSavesOverALargerRunsLeftoverRanks(t *testing.T) {
	py := python3(t)
	dir := t.TempDir()
	for r := 0; r < 4; r++ {
		saveRankRun(t, dir, 1, r, 4, "run-a", "one")
	}
	for r := 1; r < 4; r++ {
		saveRankRun(t, dir, 5, r, 4, "run-a", "five, a")
	}
	both := func(want int64, why string) {
		t.Helper()
		if got := latestConsistent(t, dir); got != want {
			t.Errorf("Go LatestConsistent = %d, want %d (%s)", got, want, why)
		}
		out, err := exec.Command(py, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c; s = c.latest_consistent(sys.argv[2]); print(-1 if s is None else s)", pythonDir(t), dir).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != strconv.FormatInt(want, 10) {
			t.Errorf("Python latest_consistent = %s (%v), want %d (%s)", out, err, want, why)
		}
	}
	saveRankRun(t, dir, 5, 0, 2, "run-b", "five, b")
	both(1, "run b's rank 0 next to run a's rank 1")
	saveRankRun(t, dir, 5, 1, 2, "run-b", "five, b")
	both(5, "run b saved ranks 0 and 1 of 2")
	st, err := (&Verifier{}).StepState(context.Background(), dir, 5)
	if err != nil || !st.Consistent() || st.WorldSize != 2 || st.RunID != "run-b" || len(st.Verified) != 2 {
		t.Errorf("StepState(5) = %+v, %v; want consistent, 2 ranks of run-b", st, err)
	}
	if g, ok := st.Gang(); !ok || len(g.Ranks) != 2 {
		t.Errorf("Gang = %+v, %v", g, ok)
	}
}
