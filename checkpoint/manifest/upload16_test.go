package manifest

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func mustSave(t *testing.T, dir string, step int64, info RankInfo, content string) {
	t.Helper()
	if _, err := SaveRankWith(dir, step, info, map[string]WriteFunc{"model.pt": Bytes([]byte(content))}); err != nil {
		t.Fatal(err)
	}
}

// Run r1's rank 1 saved step 1000 to node B's local tier and was killed
// before the upload; run r2 re-saved 1000, both ranks, in the shared
// directory; run r3's rank-1 pod lands on node B and uploads at start. The
// stale shard must not replace r2's: the shared step stays consistent
// (issue 16 review M1).
func TestUploadKeepsASharedStepConsistentUnderAnotherRun(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	shared, local := filepath.Join(root, "shared"), filepath.Join(root, "local-b")
	mustSave(t, local, 1000, RankInfo{Rank: 1, WorldSize: 2, RunID: "r1", Tier: TierLocal, Node: "b", LocalWorldSize: 1}, "r1-rank1")
	mustSave(t, shared, 1000, RankInfo{Rank: 0, WorldSize: 2, RunID: "r1", Tier: TierShared}, "r1-rank0")
	mustSave(t, shared, 1000, RankInfo{Rank: 0, WorldSize: 2, RunID: "r2"}, "r2-rank0")
	mustSave(t, shared, 1000, RankInfo{Rank: 1, WorldSize: 2, RunID: "r2"}, "r2-rank1")
	if g, ok, _ := LatestConsistent(ctx, shared); !ok || g.Step != 1000 || g.RunID != "r2" {
		t.Fatalf("setup: latest consistent %d %v %q", g.Step, ok, g.RunID)
	}
	v := &Verifier{}
	_, err := v.UploadAll(ctx, local, shared)
	if !errors.Is(err, ErrSuperseded) {
		t.Errorf("UploadAll = %v, want ErrSuperseded", err)
	}
	if g, ok, _ := LatestConsistent(ctx, shared); !ok || g.Step != 1000 || g.RunID != "r2" {
		st, _ := (&Verifier{}).StepState(ctx, shared, 1000)
		t.Fatalf("after the upload: latest consistent %d %v %q, want 1000 of r2; problems %q", g.Step, ok, g.RunID, st.Problems)
	}
}

// A newer run (r2) is writing step 1000 in the shared directory (rank 0
// saved, rank 1 not yet): an older run's local shard of that step, saved
// before r2's rank 0, is not uploaded over it.
func TestUploadDoesNotMixAnOlderRunIntoANewerRunsStep(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	shared, local := filepath.Join(root, "shared"), filepath.Join(root, "local-b")
	mustSave(t, local, 1000, RankInfo{Rank: 1, WorldSize: 2, RunID: "r1", Tier: TierLocal, Node: "b", LocalWorldSize: 1}, "r1-rank1")
	mustSave(t, shared, 1000, RankInfo{Rank: 0, WorldSize: 2, RunID: "r2"}, "r2-rank0")
	if _, err := (&Verifier{}).UploadAll(ctx, local, shared); !errors.Is(err, ErrSuperseded) {
		t.Errorf("UploadAll = %v, want ErrSuperseded", err)
	}
	mustSave(t, shared, 1000, RankInfo{Rank: 1, WorldSize: 2, RunID: "r2"}, "r2-rank1")
	if g, ok, _ := LatestConsistent(ctx, shared); !ok || g.RunID != "r2" {
		t.Fatalf("latest consistent %d %v %q, want 1000 of r2", g.Step, ok, g.RunID)
	}
	// The same run's own shard still uploads (the normal tiered path).
	mustSave(t, local, 2000, RankInfo{Rank: 1, WorldSize: 2, RunID: "r2", Tier: TierLocal, Node: "b", LocalWorldSize: 1}, "r2-rank1-2000")
	mustSave(t, shared, 2000, RankInfo{Rank: 0, WorldSize: 2, RunID: "r2"}, "r2-rank0-2000")
	if _, err := (&Verifier{}).UploadAll(ctx, local, shared); err != nil && !errors.Is(err, ErrSuperseded) {
		t.Fatal(err)
	}
	if g, ok, _ := LatestConsistent(ctx, shared); !ok || g.Step != 2000 {
		t.Fatalf("latest consistent %d %v, want 2000 uploaded", g.Step, ok)
	}
}

// A save or an upload never replaces a rank directory whose manifest names
// another job (a re-created job, two jobs sharing a directory): it fails,
// loudly, and the other job's checkpoint stays (issue 16 review H2, the
// checkpoint side).
func TestAnotherJobsRankDirectoryIsNeverReplaced(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	shared, local := filepath.Join(root, "shared"), filepath.Join(root, "local")
	mustSave(t, shared, 3000, RankInfo{Rank: 0, WorldSize: 2, RunID: "ra", JobID: "uid-a"}, "a0")
	mustSave(t, shared, 3000, RankInfo{Rank: 1, WorldSize: 2, RunID: "ra", JobID: "uid-a"}, "a1")
	_, err := SaveRankWith(shared, 3000, RankInfo{Rank: 1, WorldSize: 2, RunID: "rb", JobID: "uid-b"}, map[string]WriteFunc{"model.pt": Bytes([]byte("b1"))})
	if err == nil || !strings.Contains(err.Error(), "another job") {
		t.Errorf("SaveRankWith over job A's rank = %v, want a refusal naming another job", err)
	}
	mustSave(t, local, 3000, RankInfo{Rank: 0, WorldSize: 2, RunID: "rb", JobID: "uid-b", Tier: TierLocal, LocalWorldSize: 1}, "b0")
	v := &Verifier{JobID: "uid-b"}
	if _, err := v.UploadAll(ctx, local, shared); err == nil || !strings.Contains(err.Error(), "another job") {
		t.Errorf("upload over job A's rank = %v, want a refusal naming another job", err)
	}
	if g, ok, _ := (&Verifier{JobID: "uid-a"}).LatestConsistent(ctx, shared); !ok || g.Step != 3000 || g.RunID != "ra" {
		t.Fatalf("job A's step 3000: %d %v %q, want it intact", g.Step, ok, g.RunID)
	}
}
