package manifest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A Verifier remembers what it hashed, but never past a change of the
// files: a shard rewritten in place at the same size, or removed, after the
// step was verified makes the same Verifier refuse the step (issue 16 review
// H1: the agent's one long-lived Verifier reported a torn step as Saved).
func TestVerifierNoticesFilesChangedAfterVerification(t *testing.T) {
	for name, damage := range map[string]func(p string) error{
		"rewritten in place, same size": func(p string) error {
			time.Sleep(10 * time.Millisecond) // a later mtime/ctime on coarse clocks
			return os.WriteFile(p, []byte("shard-X"), 0o644)
		},
		"removed": os.Remove,
		"replaced by a new file": func(p string) error {
			if err := os.WriteFile(p+".new", []byte("shard1"), 0o644); err != nil {
				return err
			}
			return os.Rename(p+".new", p) // same content: a new inode still re-hashes (and verifies)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for r := 0; r < 2; r++ {
				saveRankRun(t, dir, 5, r, 2, "run1", "shard"+string(rune('0'+r)))
			}
			v := &Verifier{}
			if g, ok, err := v.LatestConsistent(context.Background(), dir); err != nil || !ok || g.Step != 5 {
				t.Fatalf("first scan: %v %v %v", g.Step, ok, err)
			}
			p := filepath.Join(dir, StepDirName(5), RankDirName(1), "model.pt")
			if err := damage(p); err != nil {
				t.Fatal(err)
			}
			g, ok, err := v.LatestConsistent(context.Background(), dir)
			_, fresh, _ := LatestConsistent(context.Background(), dir)
			if err != nil || ok != fresh {
				t.Fatalf("same Verifier after the damage: step %d consistent=%v (%v); a fresh one says %v", g.Step, ok, err, fresh)
			}
		})
	}
}

// Unchanged is the agent's no-hashing last look (second review N1: a big
// shard rewritten after its verification, with no time left to hash it
// again, was still reported Saved): true only for a step every manifest of
// which this Verifier hashed and whose files still look the same.
func TestUnchangedNeedsNoHashingAndSeesEveryChange(t *testing.T) {
	dir := t.TempDir()
	for r := 0; r < 2; r++ {
		saveRankRun(t, dir, 5, r, 2, "run1", "shard"+string(rune('0'+r)))
	}
	v := &Verifier{}
	if v.Unchanged(dir, 5) {
		t.Fatal("never verified by this Verifier, yet Unchanged")
	}
	if _, ok, err := v.LatestConsistent(context.Background(), dir); err != nil || !ok {
		t.Fatalf("scan: %v %v", ok, err)
	}
	if !v.Unchanged(dir, 5) {
		t.Fatal("verified and untouched, yet not Unchanged")
	}
	if v.Unchanged(dir, 6) {
		t.Error("a step that does not exist is Unchanged")
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(dir, StepDirName(5), RankDirName(1), "model.pt"), []byte("shard-X"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v.Unchanged(dir, 5) {
		t.Error("a shard rewritten in place after its verification is Unchanged")
	}
}
