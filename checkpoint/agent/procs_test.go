package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
)

// fakeProc writes /proc/<pid>/stat and status the way Linux does, with the
// awkward parts: command names with spaces and parentheses, zombies.
func fakeProc(t *testing.T, dir string, pid, ppid, pgrp int, comm, state string, sigCgt string) {
	t.Helper()
	d := filepath.Join(dir, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	stat := strconv.Itoa(pid) + " (" + comm + ") " + state + " " + strconv.Itoa(ppid) + " " + strconv.Itoa(pgrp) + " 1 0 -1 4194560 0 0\n"
	os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o644)
	os.WriteFile(filepath.Join(d, "status"), []byte("Name:\t"+comm+"\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nSigCgt:\t"+sigCgt+"\n"), 0o644)
}

func TestDescendantsAndHandlers(t *testing.T) {
	dir := t.TempDir()
	usr1 := "0000000000000200" // bit 9 = signal 10 (SIGUSR1)
	fakeProc(t, dir, 100, 1, 100, "gpupack-ckpt", "S", "0")
	fakeProc(t, dir, 101, 100, 101, "torchrun) S 1 (x", "S", "0000000000004002") // SIGTERM, SIGINT only
	fakeProc(t, dir, 102, 101, 102, "python3", "S", usr1)                        // setsid'd worker
	fakeProc(t, dir, 103, 102, 102, "pt_data_worker", "S", "0")
	fakeProc(t, dir, 104, 101, 101, "dead", "Z", usr1)
	fakeProc(t, dir, 200, 1, 200, "unrelated", "S", usr1)
	os.MkdirAll(filepath.Join(dir, "self"), 0o755)
	os.MkdirAll(filepath.Join(dir, "300"), 0o755) // vanished while listed

	pids := func(ps []procInfo) []int {
		var out []int
		for _, p := range ps {
			out = append(out, p.pid)
		}
		slices.Sort(out)
		return out
	}
	got, err := descendants(dir, 100, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{101, 102, 103}; !slices.Equal(pids(got), want) {
		t.Errorf("descendants of 100 = %v, want %v (zombies and strangers left out)", pids(got), want)
	}
	all, _ := descendants(dir, 100, true)
	if want := []int{101, 102, 103, 200}; !slices.Equal(pids(all), want) {
		t.Errorf("as PID 1: %v, want every live process but itself %v", pids(all), want)
	}
	for pid, want := range map[int]bool{101: false, 102: true, 103: false} {
		ok, err := catches(dir, pid, syscall.SIGUSR1)
		if err != nil || ok != want {
			t.Errorf("catches(%d, SIGUSR1) = %v, %v; want %v", pid, ok, err, want)
		}
	}
	if ok, _ := catches(dir, 101, syscall.SIGTERM); !ok {
		t.Error("torchrun catches SIGTERM")
	}
	if _, err := catches(dir, 300, syscall.SIGUSR1); err == nil {
		t.Error("catches on a vanished process: no error")
	}
}

func FuzzParseStat(f *testing.F) {
	for _, s := range []string{"1 (sh) S 0 1 1 0", "7 (a) b (c) Z 3 7", "9 (x", ")", "5 () R -1 -1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, ok := parseStat(42, []byte(s))
		if ok && p.pid != 42 {
			t.Fatalf("parseStat(%q) = %+v", s, p)
		}
	})
}
