package manifest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func saveRank(t *testing.T, dir string, step int64, rank, world int, content string) Checkpoint {
	t.Helper()
	cp, err := SaveRank(dir, step, rank, world, map[string]WriteFunc{"model.pt": Bytes([]byte(content))})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

func latestConsistent(t *testing.T, dir string) int64 {
	t.Helper()
	g, ok, err := LatestConsistent(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return -1
	}
	return g.Step
}

func TestGangConsistentNeedsEveryRank(t *testing.T) {
	dir := t.TempDir()
	for r := 0; r < 2; r++ {
		saveRank(t, dir, 1, r, 2, "one")
	}
	saveRank(t, dir, 2, 0, 2, "two")
	if got := latestConsistent(t, dir); got != 1 {
		t.Fatalf("LatestConsistent = %d with rank 1 of step 2 missing, want 1", got)
	}
	saveRank(t, dir, 2, 1, 2, "two")
	if got := latestConsistent(t, dir); got != 2 {
		t.Fatalf("LatestConsistent = %d, want 2", got)
	}
	damages := map[string]func(){
		"rank file changed": func() {
			os.WriteFile(filepath.Join(dir, StepDirName(2), RankDirName(1), "model.pt"), []byte("TWO"), 0o644)
		},
		"rank dir gone":        func() { os.RemoveAll(filepath.Join(dir, StepDirName(2), RankDirName(1))) },
		"world size disagrees": func() { saveRank(t, dir, 2, 1, 3, "two") },
		"manifest of rank 0 copied into rank 1": func() {
			b, _ := os.ReadFile(filepath.Join(dir, StepDirName(2), RankDirName(0), FileName))
			os.WriteFile(filepath.Join(dir, StepDirName(2), RankDirName(1), FileName), b, 0o644)
		},
		"non-canonical rank name": func() {
			os.Rename(filepath.Join(dir, StepDirName(2), RankDirName(1)), filepath.Join(dir, StepDirName(2), "rank-01"))
		},
	}
	for name, damage := range damages {
		t.Run(name, func(t *testing.T) {
			os.RemoveAll(filepath.Join(dir, StepDirName(2)))
			saveRank(t, dir, 2, 0, 2, "two")
			saveRank(t, dir, 2, 1, 2, "two")
			damage()
			if got := latestConsistent(t, dir); got != 1 {
				t.Errorf("LatestConsistent = %d after %s, want 1", got, name)
			}
		})
	}
}

func TestGangSingleRankLayoutIsAGangOfOne(t *testing.T) {
	dir := t.TempDir()
	if _, err := Save(dir, 7, map[string]WriteFunc{"m": Bytes([]byte("x"))}); err != nil {
		t.Fatal(err)
	}
	g, ok, err := LatestConsistent(context.Background(), dir)
	if err != nil || !ok || g.Step != 7 || g.WorldSize != 1 {
		t.Fatalf("LatestConsistent = %+v %v %v, want step 7 of one rank", g, ok, err)
	}
}

func TestVerifyStopsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	saveRank(t, dir, 1, 0, 1, strings.Repeat("x", 3<<20))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := &Verifier{}
	if _, err := v.StepState(ctx, dir, 1); err == nil {
		t.Fatal("StepState with a done context hashed anyway")
	}
	st, err := v.StepState(context.Background(), dir, 1)
	if err != nil || !st.Consistent() {
		t.Fatalf("StepState = %+v, %v; want consistent (a cancelled verification is not cached as failed)", st, err)
	}
}

func TestParseRankFields(t *testing.T) {
	base := `{"version":1,"step":1,"files":[{"path":"m","size":1,"sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}],"savedAt":"2026-01-01T00:00:00Z"`
	for _, bad := range []string{
		base + `,"rank":0}`, base + `,"worldSize":2}`, base + `,"rank":2,"worldSize":2}`,
		base + `,"rank":-1,"worldSize":2}`, base + `,"rank":0,"worldSize":0}`,
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) accepted", bad)
		}
	}
	if _, err := Parse([]byte(base + `,"rank":1,"worldSize":2}`)); err != nil {
		t.Error(err)
	}
	for name, want := range map[string]int{"rank-0": 0, "rank-17": 17} {
		if got, ok := ParseRankDirName(name); !ok || got != want {
			t.Errorf("ParseRankDirName(%q) = %d, %v", name, got, ok)
		}
	}
	for _, name := range []string{"rank-", "rank-01", "rank--1", "rank-1a", "rank-99999999", "Rank-1"} {
		if _, ok := ParseRankDirName(name); ok {
			t.Errorf("ParseRankDirName(%q) accepted", name)
		}
	}
}

// The Python Checkpointer and Go agree on the consistent step, both ways.
func TestGangCrossLanguage(t *testing.T) {
	py := python3(t)
	dir := t.TempDir()
	script := `
import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c
d = sys.argv[2]
for r in range(3):
    c.Checkpointer(d, rank=r, world_size=3, install_handler=False).save(4, {"m": b"four"})
c.Checkpointer(d, rank=0, world_size=3, install_handler=False).save(5, {"m": b"five"})
print(c.latest_consistent(d))
`
	out, err := exec.Command(py, "-c", script, pythonDir(t), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.TrimSpace(string(out)) != "4" {
		t.Fatalf("python latest_consistent = %s, want 4", out)
	}
	if got := latestConsistent(t, dir); got != 4 {
		t.Fatalf("Go LatestConsistent = %d of the Python gang, want 4", got)
	}
	for r := 1; r < 3; r++ {
		saveRank(t, dir, 5, r, 3, "five")
	}
	out, err = exec.Command(py, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c; print(c.latest_consistent(sys.argv[2]))", pythonDir(t), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(string(out))); n != 5 {
		t.Fatalf("python latest_consistent = %s after Go saved ranks 1, 2 of step 5, want 5", out)
	}
}
