package agent

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupack/gpupack/checkpoint/manifest"
)

// lateWriter saves with saving() on the request, then, after the agent has
// verified the step, rewrites model.pt in place at the same size (an async
// writer not awaited) and exits. The agent must not report that step as
// Saved (issue 16 review H1: its long-lived Verifier remembered the hash).
const lateWriter = `
import os, sys, time, threading
sys.path.insert(0, sys.argv[1])
import gpupack_ckpt as g
ck = g.Checkpointer(sys.argv[2], rank=0, world_size=1)
step = ck.resume(lambda p: None)
print("ready", flush=True)
while True:
    time.sleep(0.02); step += 1
    if ck.should_stop():
        with ck.saving(step) as p:
            with open(p + "/model.pt", "wb") as f:
                f.write(b"A" * 4096)
        time.sleep(0.6)   # the agent's 50 ms scans hash it meanwhile
        with open(ck.path(step) + "/model.pt", "r+b") as f:
            f.write(b"B" * 4096)
        sys.exit(0)
`

func TestTornAfterVerificationIsNotReportedSaved(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	ckdir, tlog, script := filepath.Join(dir, "ckpt"), filepath.Join(dir, "termination-log"), filepath.Join(dir, "late.py")
	if err := os.WriteFile(script, []byte(lateWriter), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, []string{
		"--checkpoint-dir", ckdir, "--checkpoint-timeout", "20s", "--grace", "40s",
		"--annotations-file", "", "--termination-log", tlog, "--poll", "50ms",
	}, py, script, mustAbs(t, "../python"), ckdir)
	a.waitReady(t)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.wait(t, 40*time.Second)
	if !strings.Contains(a.stderr.String(), "checkpoint-verified") {
		t.Fatalf("the agent never verified the step before it tore (the test proves nothing); log:\n%s", a.stderr)
	}
	rep := readReport(t, tlog)
	if _, ok, _ := manifest.LatestConsistent(t.Context(), ckdir); ok {
		t.Fatalf("a fresh verifier names a consistent step: the trainer did not tear it")
	}
	if rep.Outcome == OutcomeSaved || rep.CheckpointStep != nil || len(rep.VerifiedSteps) != 0 || a.code == ExitPreempted {
		t.Fatalf("torn step reported: outcome %s step %v verified %v exit %d; log:\n%s", rep.Outcome, rep.CheckpointStep, rep.VerifiedSteps, a.code, a.stderr)
	}
}

// A stale local shard an earlier run (r1) left on this node for a step
// that another run (r2) has since saved consistently in the shared
// directory is not uploaded, neither at start nor by the uploader, and is
// not an upload failure the exit waits on (issue 16 review M1).
func TestStaleLocalShardIsNotUploadedOverAConsistentStep(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	shared, local, tlog := filepath.Join(dir, "shared"), filepath.Join(dir, "local"), filepath.Join(dir, "tlog")
	save := func(d string, info manifest.RankInfo, content string) {
		if _, err := manifest.SaveRankWith(d, 1000, info, map[string]manifest.WriteFunc{"model.pt": manifest.Bytes([]byte(content))}); err != nil {
			t.Fatal(err)
		}
	}
	save(local, manifest.RankInfo{Rank: 1, WorldSize: 2, RunID: "r1", Tier: manifest.TierLocal, Node: "b", LocalWorldSize: 1}, "r1-rank1")
	save(shared, manifest.RankInfo{Rank: 0, WorldSize: 2, RunID: "r2"}, "r2-rank0")
	save(shared, manifest.RankInfo{Rank: 1, WorldSize: 2, RunID: "r2"}, "r2-rank1")
	out := filepath.Join(dir, "resumed")
	resume := `import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c
open(sys.argv[3], "w").write(str(c.latest_consistent(sys.argv[2])))`
	b := startAgent(t, tieredFlags(shared, local, tlog), py, "-c", resume, mustAbs(t, "../python"), shared, out)
	b.wait(t, 30*time.Second)
	got, _ := os.ReadFile(out)
	if b.code != 0 || string(got) != "1000" {
		t.Fatalf("exit %d, the trainer found latest_consistent = %q, want 0 and 1000 (r2's step kept); log:\n%s", b.code, got, b.stderr)
	}
	if g, ok, _ := manifest.LatestConsistent(t.Context(), shared); !ok || g.RunID != "r2" {
		t.Fatalf("after the agent exited: latest consistent %d %v %q, want 1000 of r2; log:\n%s", g.Step, ok, g.RunID, b.stderr)
	}
	if s := b.stderr.String(); !strings.Contains(s, "upload-skipped at=start") || strings.Contains(s, "upload-failed") {
		t.Errorf("want upload-skipped at start and no upload-failed; log:\n%s", s)
	}
}
