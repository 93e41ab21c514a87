package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupack/gpupack/checkpoint/manifest"
)

// tieredTrainer saves step 5 to the local tier when asked, then exits 0.
const tieredTrainer = `
import sys, time; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c
k = c.Checkpointer(sys.argv[2], rank=0, world_size=1, local_dir=sys.argv[3])
print("ready", flush=True)
while not k.should_stop():
    time.sleep(0.02)
k.save(5, {"model.pt": b"five" * 1000, "optim/state.pt": b"m"})
sys.exit(0)
`

func tieredFlags(shared, local, tlog string) []string {
	return []string{"--checkpoint-dir", shared, "--local-checkpoint-dir", local, "--checkpoint-timeout", "5s",
		"--grace", "8s", "--kill-margin", "1s", "--exit-wait", "1s", "--annotations-file", "", "--termination-log", tlog, "--poll", "50ms"}
}

// The trainer saves to the local tier; the agent counts that as saved at
// once, uploads it, and reports the step only once the shared directory
// (where any restart looks) holds it.
func TestTieredSaveIsUploadedBeforeThePodEnds(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	shared, local, tlog := filepath.Join(dir, "shared"), filepath.Join(dir, "local"), filepath.Join(dir, "tlog")
	a := startAgent(t, tieredFlags(shared, local, tlog), py, "-c", tieredTrainer, mustAbs(t, "../python"), shared, local)
	a.waitReady(t)
	t0 := time.Now()
	a.cmd.Process.Signal(syscall.SIGTERM)
	a.wait(t, 15*time.Second)
	if a.code != ExitPreempted {
		t.Fatalf("exit %d, want %d; log:\n%s", a.code, ExitPreempted, a.stderr)
	}
	if took := time.Since(t0); took > 8*time.Second {
		t.Errorf("took %v, more than the grace period", took)
	}
	rep := readReport(t, tlog)
	if rep.Outcome != OutcomeSaved || rep.CheckpointStep == nil || *rep.CheckpointStep != 5 ||
		rep.LocalStep == nil || *rep.LocalStep != 5 || rep.UploadPending {
		t.Fatalf("report %+v, want Saved, step 5 saved locally and uploaded; log:\n%s", rep, a.stderr)
	}
	if len(rep.VerifiedSteps) == 0 || rep.VerifiedSteps[0] != 5 {
		t.Errorf("report verifiedSteps %v, want 5 first (consistent in the shared directory)", rep.VerifiedSteps)
	}
	g, ok, err := manifest.LatestConsistent(context.Background(), shared)
	if err != nil || !ok || g.Step != 5 || g.Ranks[0].Manifest.Tier != manifest.TierShared {
		t.Fatalf("shared LatestConsistent = %+v %v %v, want step 5 uploaded", g, ok, err)
	}
	if !strings.Contains(a.stderr.String(), "checkpoint-verified step=5 ranks=1 dir=local") ||
		!strings.Contains(a.stderr.String(), "checkpoint-uploaded step=5") {
		t.Errorf("log lacks the local verification or the upload:\n%s", a.stderr)
	}
}

// The shared directory cannot take the upload before the grace period
// ends: the step is not reported (nothing names a step a restart cannot
// read), the report says the upload is pending, and the next start of the
// job on this node uploads it before the trainer looks for it.
func TestTieredUploadPendingIsFinishedAtTheNextStart(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	shared, local, tlog := filepath.Join(dir, "shared"), filepath.Join(dir, "local"), filepath.Join(dir, "tlog")
	if err := os.WriteFile(shared, []byte("not a directory yet"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, tieredFlags(shared, local, tlog), py, "-c", tieredTrainer, mustAbs(t, "../python"), shared, local)
	a.waitReady(t)
	a.cmd.Process.Signal(syscall.SIGTERM)
	a.wait(t, 15*time.Second)
	rep := readReport(t, tlog)
	if a.code != ExitPreempted || rep.Outcome != OutcomeSaved || rep.CheckpointStep != nil ||
		rep.LocalStep == nil || *rep.LocalStep != 5 || !rep.UploadPending {
		t.Fatalf("exit %d, report %+v; want %d, Saved, local step 5, no checkpointStep, uploadPending; log:\n%s", a.code, rep, ExitPreempted, a.stderr)
	}

	// The next start on this node, the shared volume back.
	os.Remove(shared)
	os.Mkdir(shared, 0o755)
	out := filepath.Join(dir, "resumed")
	resume := `import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c
open(sys.argv[3], "w").write(str(c.latest_consistent(sys.argv[2])))`
	b := startAgent(t, tieredFlags(shared, local, filepath.Join(dir, "tlog2")), py, "-c", resume, mustAbs(t, "../python"), shared, out)
	b.wait(t, 30*time.Second)
	got, _ := os.ReadFile(out)
	if b.code != 0 || string(got) != "5" {
		t.Fatalf("restart: exit %d, the trainer found latest_consistent = %q, want 0 and 5; log:\n%s", b.code, got, b.stderr)
	}
	if !strings.Contains(b.stderr.String(), "uploaded-at-start ranks=1") {
		t.Errorf("log lacks the upload at start:\n%s", b.stderr)
	}
}

func TestTieredFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--local-checkpoint-dir", "/l", "--", "true"},
		{"--local-checkpoint-dir", "/c", "--checkpoint-dir", "/c/", "--", "true"},
		{"--local-checkpoint-dir", "/l", "--checkpoint-dir", "/c", "--upload-timeout", "0s", "--", "true"},
	} {
		if _, err := ParseArgs(args, &lockedBuf{}); err == nil {
			t.Errorf("ParseArgs(%q) accepted", args)
		}
	}
}
