package devicehook

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Layout of the shared cache file (src/region.c; part of the format).
const (
	regionMagic  = 0x6770706b68303031
	slotsOffset  = 64
	slotSize     = 192
	reclaimBit   = uint64(1) << 62
	regionMaxDev = 16
)

type slot struct {
	owner, start uint64
	used0        uint64
}

// writeRegion writes a cache file as a process that died at some instant
// would have left it.
func writeRegion(t *testing.T, path string, slots []slot) {
	t.Helper()
	buf := make([]byte, slotsOffset+slotSize*1024)
	binary.LittleEndian.PutUint64(buf[0:], regionMagic)
	binary.LittleEndian.PutUint32(buf[8:], uint32(len(slots)))
	for i, s := range slots {
		o := slotsOffset + i*slotSize
		binary.LittleEndian.PutUint64(buf[o:], s.owner)
		binary.LittleEndian.PutUint64(buf[o+8:], s.start)
		binary.LittleEndian.PutUint64(buf[o+16:], s.used0)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

func deadPID(t *testing.T) uint64 {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return uint64(cmd.Process.Pid)
}

// startTime is field 22 of /proc/self/stat, as the hook records it.
func startTime(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var v uint64
	fmt.Sscan(f[22-3], &v)
	return v
}

// Slots left behind by dead processes, by a reclaimer that died half-way,
// or by a pid that has since been recycled are reclaimed the moment a live
// process needs the memory; a live process's slot never is.
func TestRegionReclaimsStaleSlots(t *testing.T) {
	const limit, chunk, held = 64 * mib, 4 * mib, 32 * mib
	me := uint64(os.Getpid())
	cases := []struct {
		name string
		slot slot
		want int64 // chunks a new process gets
	}{
		{"dead owner", slot{owner: deadPID(t), start: 1, used0: uint64(held)}, limit / chunk},
		{"reclaimer died mid-way", slot{owner: reclaimBit | deadPID(t), used0: uint64(held)}, limit / chunk},
		{"recycled pid", slot{owner: me, start: startTime(t) + 12345, used0: uint64(held)}, limit / chunk},
		{"live owner", slot{owner: me, start: startTime(t), used0: uint64(held)}, (limit - held) / chunk},
		{"live owner, start not yet written", slot{owner: me, start: 0, used0: uint64(held)}, (limit - held) / chunk},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "cache")
			writeRegion(t, cache, []slot{c.slot})
			e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}.hooked()
			if got := num(t, run(t, e, "direct", "grab", fmt.Sprint(chunk)), "n"); got != c.want {
				t.Errorf("a new process got %d chunks, want %d", got, c.want)
			}
		})
	}
}

// A file with another layout is left alone; accounting falls back to the
// process, loudly, and limits still hold.
func TestRegionWithForeignLayoutIsNotTouched(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	foreign := []byte("HAMi-core shared region, not ours")
	if err := os.WriteFile(cache, foreign, 0o644); err != nil {
		t.Fatal(err)
	}
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}.hooked()
	cmd := command(e, "direct", "grab", fmt.Sprint(4*mib))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if kv := parseKV(string(out)); kv["n"] != "16" || !strings.Contains(string(out), "another layout") {
		t.Errorf("output %q: want 16 chunks and an error naming the foreign layout", out)
	}
	if b, _ := os.ReadFile(cache); string(b) != string(foreign) {
		t.Errorf("the foreign file was modified")
	}
}
