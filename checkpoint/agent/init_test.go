package agent

// The agent as a container's init: processes outside the command's
// process group, orphans, hung checkpoint storage.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func shQuote(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// A launcher that starts its worker with setsid (torch's newer launchers
// do) and dies on the checkpoint signal, leaving the worker saving: the
// agent must reach the worker, wait for the orphan and report its save.
func TestOrphanedSetsidWorkerIsSignalledAndWaitedFor(t *testing.T) {
	py := python(t)
	setsid := "setsid"
	dir := t.TempDir()
	ckdir, tlog, ev := filepath.Join(dir, "ckpt"), filepath.Join(dir, "termination-log"), filepath.Join(dir, "events")
	worker := shQuote(setsid, py, trainerPath(t), "--mode", "cooperative", "--dir", ckdir, "--events", ev, "--save-delay", "1")
	a := startAgent(t, []string{
		"--checkpoint-dir", ckdir, "--checkpoint-timeout", "10s", "--grace", "20s",
		"--annotations-file", "", "--termination-log", tlog, "--poll", "50ms",
	}, "/bin/sh", "-c", `trap 'exit 0' USR1; `+worker+` & wait`)
	a.waitReady(t)
	// The launcher must have its trap in place too.
	time.Sleep(200 * time.Millisecond)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.wait(t, 30*time.Second)
	if a.code != ExitPreempted {
		t.Fatalf("exit %d, want %d; log:\n%s", a.code, ExitPreempted, a.stderr)
	}
	whats, at := events(t, ev)
	saved := ""
	for _, w := range whats {
		if strings.HasPrefix(w, "saved ") {
			saved = w
		}
	}
	if saved == "" || at[saved].After(a.exitAt) {
		t.Fatalf("worker events %q: no save before the agent exited; log:\n%s", whats, a.stderr)
	}
	rep := readReport(t, tlog)
	if rep.Outcome != OutcomeSaved || rep.CheckpointStep == nil || "saved "+strconv.FormatInt(*rep.CheckpointStep, 10) != saved {
		t.Errorf("report %+v, want the worker's %s", rep, saved)
	}
	if rep.CommandStatus == nil || *rep.CommandStatus != 0 {
		t.Errorf("launcher status %v, want 0 (it exits on its trap)", rep.CommandStatus)
	}
}

// The checkpoint signal goes only to processes that handle it: a launcher
// (here sh, like torchrun or a bash wrapper) would die of SIGUSR1.
func TestCheckpointSignalSparesProcessesWithoutAHandler(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	ckdir, tlog, ev := filepath.Join(dir, "ckpt"), filepath.Join(dir, "termination-log"), filepath.Join(dir, "events")
	a := startAgent(t, []string{
		"--checkpoint-dir", ckdir, "--checkpoint-timeout", "10s", "--grace", "20s",
		"--annotations-file", "", "--termination-log", tlog, "--poll", "50ms",
	}, "/bin/sh", "-c", shQuote(py, trainerPath(t), "--mode", "cooperative", "--dir", ckdir, "--events", ev)+"; echo launcher-done")
	a.waitReady(t)
	a.cmd.Process.Signal(syscall.SIGTERM)
	a.wait(t, 30*time.Second)
	rep := readReport(t, tlog)
	status := -1
	if rep.CommandStatus != nil {
		status = *rep.CommandStatus
	}
	if a.code != ExitPreempted || status != 0 {
		t.Fatalf("exit %d, launcher status %d; want %d and 0 (the launcher must not die of the checkpoint signal); log:\n%s",
			a.code, status, ExitPreempted, a.stderr)
	}
}

// A checkpoint file whose read hangs (a dead NFS server; here a FIFO with
// no writer) must not hold up a deadline or the agent's exit.
func TestHungCheckpointReadDoesNotBlockDeadlines(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	ckdir, tlog, ev := filepath.Join(dir, "ckpt"), filepath.Join(dir, "termination-log"), filepath.Join(dir, "events")
	// A manifest that lists a FIFO: verification blocks in open(2).
	rd := filepath.Join(ckdir, "step-000000000001", "rank-0")
	if err := os.MkdirAll(rd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(rd, "model.pt"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(rd, "gpupack-manifest.json"), []byte(`{"version":1,"step":1,"files":[{"path":"model.pt","size":1,"sha256":"`+
		strings.Repeat("0", 64)+`"}],"savedAt":"2026-01-01T00:00:00Z","rank":0,"worldSize":1}`), 0o644)
	const timeout, grace, margin = 1 * time.Second, 3 * time.Second, 500 * time.Millisecond
	a := startAgent(t, []string{
		"--checkpoint-dir", ckdir, "--checkpoint-timeout", timeout.String(), "--grace", grace.String(), "--kill-margin", margin.String(),
		"--annotations-file", "", "--termination-log", tlog, "--poll", "50ms",
	}, py, trainerPath(t), "--mode", "ignore", "--events", ev)
	a.waitReady(t)
	time.Sleep(200 * time.Millisecond) // the background verifier is stuck by now
	t0 := time.Now()
	a.cmd.Process.Signal(syscall.SIGTERM)
	a.wait(t, 20*time.Second)
	_, at := events(t, ev)
	if d := at["SIGTERM"].Sub(t0); at["SIGTERM"].IsZero() || d < timeout || d > timeout+time.Second {
		t.Errorf("SIGTERM at T0+%v, want within [%v, %v]; log:\n%s", d, timeout, timeout+time.Second, a.stderr)
	}
	if d := a.exitAt.Sub(t0); d > grace {
		t.Errorf("agent exited at T0+%v, after the %v grace period; log:\n%s", d, grace, a.stderr)
	}
	if a.code != ExitKilled {
		t.Errorf("exit %d, want %d", a.code, ExitKilled)
	}
}
