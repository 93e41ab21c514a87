package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
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

// The SIGTERM step's choice: ranks, and whatever no live rank hangs from
// or launched.
func TestTermTargetsSpareLaunchersAndWorkersOfLiveRanks(t *testing.T) {
	ps := []procInfo{
		{pid: 5, ppid: 1},   // bash -c "torchrun …; echo done"
		{pid: 10, ppid: 5},  // torchrun
		{pid: 11, ppid: 10}, // rank 0
		{pid: 12, ppid: 11}, // its DataLoader workers
		{pid: 13, ppid: 12}, // a worker's own child
		{pid: 14, ppid: 10}, // rank 1 (setsid'd: another group, same parent)
		{pid: 15, ppid: 14},
		{pid: 20, ppid: 1},  // a sidecar-ish process of the container
		{pid: 30, ppid: 1},  // an orphaned DataLoader worker whose rank died
		{pid: 31, ppid: 99}, // parent not visible (kubectl exec)
	}
	got := termTargets(ps, map[int]bool{11: true, 14: true, 77: true /* gone */})
	if diff := cmp.Diff([]int{11, 14, 20, 30, 31}, got); diff != "" {
		t.Errorf("termTargets (-want +got):\n%s", diff)
	}
	// Rank 0 gone: its workers (now orphans below the agent) and nothing
	// else become targets; torchrun stays spared while rank 1 lives.
	ps2 := append([]procInfo{}, ps[0], ps[1], procInfo{pid: 12, ppid: 1}, procInfo{pid: 13, ppid: 12}, ps[5], ps[6])
	if diff := cmp.Diff([]int{12, 13, 14}, termTargets(ps2, map[int]bool{14: true})); diff != "" {
		t.Errorf("termTargets after rank 0 exited (-want +got):\n%s", diff)
	}
	// After the request's checkpoint verified: torchrun gets the SIGTERM
	// instead of its ranks (it would restart ranks that die of it); a rank
	// directly below the agent (pid 1 here: not in ps) still gets it.
	if diff := cmp.Diff([]int{10, 20, 30, 31}, launchersInstead(ps, map[int]bool{11: true, 14: true}, got)); diff != "" {
		t.Errorf("launchersInstead (-want +got):\n%s", diff)
	}
	solo := []procInfo{{pid: 40, ppid: 1}, {pid: 41, ppid: 40}}
	if diff := cmp.Diff([]int{40}, launchersInstead(solo, map[int]bool{40: true}, termTargets(solo, map[int]bool{40: true}))); diff != "" {
		t.Errorf("launchersInstead of a rank below the agent (-want +got):\n%s", diff)
	}
	// No rank at all (a trainer without the helper): everything.
	if diff := cmp.Diff([]int{5, 10, 11, 12, 13, 14, 15, 20, 30, 31}, termTargets(ps, nil)); diff != "" {
		t.Errorf("termTargets without ranks (-want +got):\n%s", diff)
	}
}
