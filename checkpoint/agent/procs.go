package agent

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER (linux/prctl.h).
const prSetChildSubreaper = 36

// becomeSubreaper makes orphaned descendants (torchrun's workers when
// torchrun dies, a daemon a wrapper script left behind) children of the
// agent instead of the host's init, so the agent can signal, wait for and
// reap them. As PID 1 of a pid namespace the agent is their reaper anyway.
func becomeSubreaper() error {
	_, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	if e != 0 {
		return e
	}
	return nil
}

// procInfo is what the agent reads of a process in /proc.
type procInfo struct {
	pid, ppid, pgrp int
	zombie          bool
}

// listProcs reads every process of /proc (of this pid namespace).
func listProcs(procDir string) ([]procInfo, error) {
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return nil, err
	}
	out := make([]procInfo, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		b, err := os.ReadFile(procDir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		if p, ok := parseStat(pid, b); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// parseStat reads state and ppid from /proc/<pid>/stat; the command name
// in parentheses may itself hold spaces and parentheses.
func parseStat(pid int, b []byte) (procInfo, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return procInfo{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return procInfo{}, false
	}
	return procInfo{pid: pid, ppid: ppid, pgrp: pgrp, zombie: f[0] == "Z" || f[0] == "X"}, true
}

// descendants are the live processes below root (root excluded). As PID 1
// every process of the namespace counts, including ones entered from
// outside (kubectl exec), whose parent is not visible.
func descendants(procDir string, root int, pid1 bool) ([]procInfo, error) {
	ps, err := listProcs(procDir)
	if err != nil {
		return nil, err
	}
	var out []procInfo
	if pid1 {
		for _, p := range ps {
			if p.pid != root && !p.zombie {
				out = append(out, p)
			}
		}
		return out, nil
	}
	children := map[int][]procInfo{}
	for _, p := range ps {
		children[p.ppid] = append(children[p.ppid], p)
	}
	queue := []int{root}
	seen := map[int]bool{root: true}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for _, c := range children[n] {
			if seen[c.pid] {
				continue
			}
			seen[c.pid] = true
			queue = append(queue, c.pid)
			if !c.zombie {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// catches reports whether the process has a handler installed for sig
// (SigCgt of /proc/<pid>/status). A process that leaves the checkpoint
// signal at its default would be terminated by SIGUSR1: torchrun's
// launcher, a bash wrapper, a spawned DataLoader worker.
func catches(procDir string, pid int, sig syscall.Signal) (bool, error) {
	f, err := os.Open(procDir + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "SigCgt:")
		if !ok {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return false, err
		}
		return mask&(1<<(uint(sig)-1)) != 0, nil
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, errors.New("no SigCgt line")
}
