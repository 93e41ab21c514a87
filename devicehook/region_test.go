package devicehook

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Layout of the shared cache file (src/region.c; part of the format).
const (
	regionMagic  = 0x6770706b68303031
	slotsOffset  = 64
	slotSize     = 192
	reclaimBit   = uint64(1) << 62
	regionMaxDev = 16
	// After the slots: the SM budgets (64 bytes per device) and each
	// slot's SM tail (192 bytes; src/region.c I10).
	regionSize = slotsOffset + slotSize*1024 + 64*regionMaxDev + 192*1024
	// The layout before them (the slots alone): still ours, for memory.
	regionV1Size = slotsOffset + slotSize*1024
)

type slot struct {
	owner, start uint64
	used0        uint64
}

// writeRegion writes a cache file as a process that died at some instant
// would have left it.
func writeRegion(t *testing.T, path string, slots []slot) {
	t.Helper()
	writeRegionSized(t, path, regionSize, slots)
}

func writeRegionSized(t *testing.T, path string, size int, slots []slot) {
	t.Helper()
	buf := make([]byte, size)
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

// A file with another layout is left alone, and the process fails closed:
// per-process accounting would hand out the whole limit once more.
func TestRegionWithForeignLayoutFailsClosed(t *testing.T) {
	for name, foreign := range map[string][]byte{
		"short file":                  []byte("HAMi-core shared region, not ours"),
		"our size, other magic":       append([]byte("HAMiHAMi"), make([]byte, regionSize-8)...),
		"our older size, other magic": append([]byte("HAMiHAMi"), make([]byte, regionV1Size-8)...),
		"neither of our sizes":        append([]byte("gppkh001"), make([]byte, regionSize-8-64)...),
	} {
		t.Run(name, func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "cache")
			if err := os.WriteFile(cache, foreign, 0o644); err != nil {
				t.Fatal(err)
			}
			e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}.hooked()
			out, err := command(e, "direct", "grab", fmt.Sprint(4*mib)).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if kv := parseKV(string(out)); kv["n"] != "0" || !strings.Contains(string(out), "another layout") ||
				strings.Count(string(out), " ERROR] ") != 1 {
				t.Errorf("output %q: want 0 chunks and one error naming the foreign layout", out)
			}
			if b, _ := os.ReadFile(cache); string(b) != string(foreign) {
				t.Errorf("the foreign file was modified")
			}
		})
	}
}

// A file of the layout before the container's SM state (the slots alone:
// made by the previous library, still running in the container's other
// processes after an upgrade of gpupack-node, or where only that much
// fits) is still the container's memory accounting, with the SM budget
// per process and one INFO line; before, any size but the current one
// failed closed, so an upgrade under running pods would have refused
// every allocation of their next processes.
func TestRegionOfTheOlderLayoutStillCountsMemory(t *testing.T) {
	const limit, chunk, held = 64 * mib, 4 * mib, 32 * mib
	cache := filepath.Join(t.TempDir(), "cache")
	writeRegionSized(t, cache, regionV1Size, []slot{{owner: uint64(os.Getpid()), start: startTime(t), used0: uint64(held)}})
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m", "LIBCUDA_LOG_LEVEL": "3",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}.hooked()
	out, err := command(e, "direct", "grab", fmt.Sprint(chunk)).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := num(t, parseKV(string(out)), "n"); got != (limit-held)/chunk {
		t.Errorf("next to 32 MiB held in an older-layout file: got %d chunks, want %d\n%s", got, (limit-held)/chunk, out)
	}
	if !strings.Contains(string(out), "SM budgets stay per process") {
		t.Errorf("no line saying the SM budget is per process with this file:\n%s", out)
	}
	if st, err := os.Stat(cache); err != nil || st.Size() != regionV1Size {
		t.Errorf("the older-layout file was resized: %v %v", st, err)
	}
}

// Requests of 2^64 - (what is held) from two threads while a third
// allocates: a wrapping add-then-check lets the third pass the limit.
func TestHugeRequestsCannotWrapTheLimit(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m"}
			if shared {
				e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = filepath.Join(t.TempDir(), "cache")
			}
			kv := run(t, e.hooked(), "direct", "wrap", fmt.Sprint(4*mib), "300")
			if got := num(t, kv, "max_used"); got > 64*mib {
				t.Errorf("the driver held %d MiB under a 64 MiB limit", got/mib)
			}
			if got := num(t, kv, "held"); got != 64*mib {
				t.Errorf("the allocating thread holds %d MiB, want exactly the 64 MiB limit", got/mib)
			}
		})
	}
}

// A shared cache that cannot be used fails closed with one log line:
// not readable-writable, not a regular file (a FIFO must not block).
func TestUnusableSharedCacheFailsClosed(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := exec.Command("mkfifo", fifo).Run(); err != nil {
		t.Fatal(err)
	}
	for name, cache := range map[string]string{"fifo": fifo, "directory": dir,
		"missing directory": filepath.Join(dir, "no", "cache")} {
		t.Run(name, func(t *testing.T) {
			e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}.hooked()
			out, err := command(e, "direct", "grab", fmt.Sprint(4*mib)).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if kv := parseKV(string(out)); kv["n"] != "0" || strings.Count(string(out), " ERROR] ") != 1 ||
				!strings.Contains(string(out), "every GPU memory allocation is refused") {
				t.Errorf("output %q: want 0 chunks and one error line", out)
			}
		})
	}
}

// Processes of two uids in one container share one limit: the file is
// created usable by both whatever the creator's umask.
func TestSharedCacheAcrossUIDs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a second uid")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache}.hooked()
	// Root, umask 022, holds 32 MiB and creates the file.
	holder := exec.Command("sh", "-c", `umask 022; exec "$@"`, "sh", hooktest, "direct", "hold", fmt.Sprint(8*mib))
	holder.Env = e.list()
	stdin, _ := holder.StdinPipe()
	stdout, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); holder.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	held := num(t, parseKV(line), "held") * 8 * mib
	// ... then uid 65534 gets exactly the rest.
	other := command(e, "direct", "grab", fmt.Sprint(4*mib))
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := other.CombinedOutput()
	if err != nil {
		t.Fatalf("uid 65534: %v: %s", err, out)
	}
	if got := num(t, parseKV(string(out)), "n") * 4 * mib; held+got != 64*mib {
		t.Errorf("root holds %d MiB, uid 65534 got %d MiB: want %d MiB together\n%s", held/mib, got/mib, 64, out)
	}
}

// On a full filesystem the shared cache cannot be backed: the process
// refuses allocations with one log line instead of dying of SIGBUS.
func TestSharedCacheOnFullFilesystem(t *testing.T) {
	testenvUnshare(t)
	dir := t.TempDir()
	script := fmt.Sprintf(`set -e
mount -t tmpfs -o size=64k tmpfs %[1]s
dd if=/dev/zero of=%[1]s/filler bs=4k count=64 2>/dev/null || true
exec "$@"`, dir)
	cmd := exec.Command("unshare", "-m", "-r", "sh", "-c", script, "sh", hooktest, "direct", "grab", fmt.Sprint(4*mib))
	cmd.Env = env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": filepath.Join(dir, "cache")}.hooked().list()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the process died on a full filesystem (%v): %s", err, out)
	}
	if kv := parseKV(string(out)); kv["n"] != "0" || !strings.Contains(string(out), "every GPU memory allocation is refused") {
		t.Errorf("output %q: want 0 chunks and one error line", out)
	}
}

// An accounting tmpfs sized for the older layout (the device plugin sized
// it from bypass.RegionSize before the SM state was added; pods admitted
// then keep it): the file is made in the older layout rather than failing
// closed, and memory is accounted as ever.
func TestSharedCacheInATmpfsSizedForTheOlderLayout(t *testing.T) {
	testenvUnshare(t)
	dir := t.TempDir()
	// deviceplugin.AccountingTmpfsBytes of the older size: pages, plus one.
	size := (regionV1Size+4095)/4096*4096 + 4096
	script := fmt.Sprintf(`set -e
mount -t tmpfs -o size=%[2]d tmpfs %[1]s
"$@"
stat -c size=%%s %[1]s/cache`, dir, size)
	cmd := exec.Command("unshare", "-m", "-r", "sh", "-c", script, "sh", hooktest, "direct", "grab", fmt.Sprint(4*mib))
	cmd.Env = env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": filepath.Join(dir, "cache")}.hooked().list()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	kv := parseKV(string(out))
	if kv["n"] != "16" || kv["size"] != fmt.Sprint(regionV1Size) {
		t.Errorf("output %q: want 16 chunks of 4 MiB and a file of the older layout (%d bytes)", out, regionV1Size)
	}
}
