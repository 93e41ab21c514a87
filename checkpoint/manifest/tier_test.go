package manifest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func saveLocal(t *testing.T, local string, step int64, rank, world, localWorld int, run, content string) Checkpoint {
	t.Helper()
	cp, err := SaveRankWith(local, step, RankInfo{Rank: rank, WorldSize: world, RunID: run, Tier: TierLocal, Node: "node-a", LocalWorldSize: localWorld},
		map[string]WriteFunc{"model.pt": Bytes([]byte(content)), "optim/state.pt": Bytes([]byte(content + " moments"))})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// A pod's part of a step is complete in its local directory once every
// one of its localWorldSize ranks verifies there, from one run.
func TestLocalComplete(t *testing.T) {
	local := t.TempDir()
	v := &Verifier{}
	state := func(step int64) StepState {
		st, err := v.StepState(context.Background(), local, step)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	saveLocal(t, local, 3, 2, 4, 2, "r", "x") // ranks 2, 3 of 4 live in this pod
	if state(3).LocalComplete() {
		t.Error("one of the pod's two ranks is not complete")
	}
	saveLocal(t, local, 3, 3, 4, 2, "r", "x")
	if st := state(3); !st.LocalComplete() || st.Consistent() {
		t.Errorf("LocalComplete %v Consistent %v, want the pod's part complete and the gang not", st.LocalComplete(), st.Consistent())
	}
	saveLocal(t, local, 3, 3, 4, 2, "other-run", "x")
	if state(3).LocalComplete() {
		t.Error("ranks of two runs are not complete")
	}
	saveLocal(t, local, 3, 3, 4, 2, "r", "x")
	os.WriteFile(filepath.Join(local, StepDirName(3), RankDirName(2), "model.pt"), []byte("y"), 0o644)
	v = &Verifier{} // a Verifier trusts what it hashed before
	if state(3).LocalComplete() {
		t.Error("a damaged rank is not complete")
	}
	if _, err := SaveRank(local, 4, 0, 1, map[string]WriteFunc{"m": Bytes(nil)}); err != nil {
		t.Fatal(err)
	}
	if state(4).LocalComplete() {
		t.Error("a manifest without localWorldSize is no local tier checkpoint")
	}
}

func TestUploadMakesTheStepConsistentWhereTheRestartLooks(t *testing.T) {
	local, shared := t.TempDir(), t.TempDir()
	v := &Verifier{}
	for r := 0; r < 2; r++ {
		saveLocal(t, local, 7, r, 2, 2, "run", "seven")
	}
	if got := latestConsistent(t, shared); got != -1 {
		t.Fatalf("shared LatestConsistent = %d before the upload, want none", got)
	}
	cps, err := v.UploadAll(context.Background(), local, shared)
	if err != nil || len(cps) != 2 {
		t.Fatalf("UploadAll = %d checkpoints, %v", len(cps), err)
	}
	g, ok, err := LatestConsistent(context.Background(), shared)
	if err != nil || !ok || g.Step != 7 || g.RunID != "run" {
		t.Fatalf("shared LatestConsistent = %+v %v %v, want step 7", g, ok, err)
	}
	for _, cp := range g.Ranks {
		if cp.Manifest.Tier != TierShared || cp.Manifest.Node != "node-a" {
			t.Errorf("uploaded manifest tier %q node %q, want %q, node-a", cp.Manifest.Tier, cp.Manifest.Node, TierShared)
		}
	}
	lr, _ := v.LocalRanks(context.Background(), local)
	for _, src := range lr {
		if !v.Uploaded(context.Background(), src, shared) {
			t.Errorf("%s not Uploaded after UploadAll", src.Dir)
		}
		if src.Manifest.Tier != TierLocal {
			t.Errorf("local manifest tier %q", src.Manifest.Tier)
		}
	}
	// Again: nothing to do, nothing changes.
	before, _ := os.ReadFile(filepath.Join(shared, StepDirName(7), RankDirName(0), FileName))
	if _, err := v.UploadAll(context.Background(), local, shared); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(shared, StepDirName(7), RankDirName(0), FileName))
	if string(before) != string(after) {
		t.Error("a second upload rewrote the shared copy")
	}
}

func TestUploadRefusesALocalShardThatChanged(t *testing.T) {
	local, shared := t.TempDir(), t.TempDir()
	v := &Verifier{}
	src := saveLocal(t, local, 2, 0, 1, 1, "run", "two")
	if _, err := v.VerifyContext(context.Background(), src.Dir); err != nil {
		t.Fatal(err)
	}
	// Changed after it was verified (a disk, a user): the copy is checked
	// as it is made, so the damage does not reach the shared directory.
	os.WriteFile(filepath.Join(src.Dir, "model.pt"), []byte("TWO"), 0o644)
	if _, err := v.Upload(context.Background(), src, shared); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("Upload of a changed shard = %v, want an error saying it changed", err)
	}
	if got := latestConsistent(t, shared); got != -1 {
		t.Errorf("shared LatestConsistent = %d, want none", got)
	}
	ents, _ := os.ReadDir(filepath.Join(shared, StepDirName(2)))
	for _, e := range ents {
		t.Errorf("left in the shared step dir: %s", e.Name())
	}
	// A cancelled upload leaves nothing either.
	src = saveLocal(t, local, 3, 0, 1, 1, "run", "three")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := v.Upload(ctx, src, shared); err == nil {
		t.Fatal("Upload with a done context succeeded")
	}
	if got := latestConsistent(t, shared); got != -1 {
		t.Errorf("shared LatestConsistent = %d after a cancelled upload, want none", got)
	}
}

// The Python helper's local tier and Go's upload: the restart (Python,
// reading the shared directory) sees the step only once it is uploaded.
func TestTieredCrossLanguage(t *testing.T) {
	py := python3(t)
	local, shared := t.TempDir(), t.TempDir()
	script := `
import sys, json, os; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c
local, shared = sys.argv[2], sys.argv[3]
for r in range(2):
    k = c.Checkpointer(shared, rank=r, world_size=2, install_handler=False, run_id="run", local_dir=local, local_world_size=2)
    with k.saving(9) as p:
        open(os.path.join(p, "model.pt"), "wb").write(b"nine")
print(c.latest_consistent(shared), c.latest_consistent(local))
`
	out, err := exec.Command(py, "-c", script, pythonDir(t), local, shared).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "None 9" {
		t.Fatalf("python latest_consistent(shared), (local) = %s, want None 9", got)
	}
	v := &Verifier{}
	st, _ := v.StepState(context.Background(), local, 9)
	if !st.LocalComplete() {
		t.Fatalf("Go: the Python local step is not LocalComplete: %+v", st.Problems)
	}
	if _, err := v.UploadAll(context.Background(), local, shared); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(py, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c; k = c.Checkpointer(sys.argv[2], rank=1, world_size=2, install_handler=False, run_id='next'); print(k.load())",
		pythonDir(t), shared).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if want := "(9, '" + filepath.Join(shared, StepDirName(9), RankDirName(1)) + "')"; strings.TrimSpace(string(out)) != want {
		t.Fatalf("python load() after the upload = %s, want %s", out, want)
	}
}
