package bypass

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/devicehook/node/metrics"
)

const uid1 = "0f9c0a52-5d0e-4a43-9d35-1c4e1f7a9b21"

func TestPodFromCgroup(t *testing.T) {
	cases := []struct {
		name, content string
		want          types.UID
		ok            bool
	}{
		{"v1 cgroupfs", "12:memory:/kubepods/burstable/pod" + uid1 + "/8a7f3c\n11:cpu:/kubepods/burstable/pod" + uid1 + "/8a7f3c", uid1, true},
		{"v1 besteffort", "4:devices:/kubepods/besteffort/pod" + uid1 + "/abc", uid1, true},
		{"v1 guaranteed", "4:devices:/kubepods/pod" + uid1 + "/abc", uid1, true},
		{"v2 systemd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid1, "-", "_") + ".slice/cri-containerd-0123.scope", uid1, true},
		{"v2 systemd guaranteed", "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid1, "-", "_") + ".slice/cri-containerd-0123.scope", uid1, true},
		{"host process", "0::/system.slice/nvidia-persistenced.service", "", false},
		{"kubepods but no pod", "0::/kubepods.slice/kubepods-burstable.slice", "", false},
		{"bad uid", "0::/kubepods/podNOT-A-UID/x", "", false},
		{"empty", "", "", false},
	}
	for _, tc := range cases {
		got, ok := PodFromCgroup(tc.content)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: PodFromCgroup = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzPodFromCgroup(f *testing.F) {
	f.Add("0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid1, "-", "_") + ".slice/x")
	f.Add("12:memory:/kubepods/burstable/pod" + uid1 + "/8a7f3c")
	f.Add("0::/kubepods/pod")
	f.Fuzz(func(t *testing.T, s string) {
		uid, ok := PodFromCgroup(s)
		if !ok {
			return
		}
		if u, ok2 := normaliseUID(string(uid)); !ok2 || u != uid || !strings.Contains(s, "kubepods") {
			t.Fatalf("PodFromCgroup(%q) = %q is not a normalised UID from a kubepods path", s, uid)
		}
	})
}

func TestRegionRoundTrip(t *testing.T) {
	b := EncodeRegion([][]uint64{{1 << 20, 0, 5 << 20}, {2 << 20}, {}})
	got, err := ParseRegion(b)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]uint64, regionMaxDev)
	want[0], want[2] = 3<<20, 5<<20
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	// A freed slot (owner 0) is not counted even if bytes linger.
	b[regionHeader+regionSlotSize] = 0
	b[regionHeader+regionSlotSize+1] = 0
	got, _ = ParseRegion(b)
	if got[0] != 1<<20 {
		t.Errorf("freed slot counted: dev0 = %d", got[0])
	}
}

func TestParseRegionRejects(t *testing.T) {
	good := EncodeRegion([][]uint64{{1}})
	bad := append([]byte(nil), good...)
	bad[0] ^= 0xff
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"short", good[:10], "shorter than its header"},
		{"other layout", bad, "layout changed"},
		{"truncated slots", good[:regionHeader+10], "need"},
	}
	for _, tc := range cases {
		if _, err := ParseRegion(tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	if u, err := ParseRegion(make([]byte, 4096)); err != nil || len(u) != regionMaxDev {
		t.Errorf("all-zero region: %v, %v (it is valid and empty)", u, err)
	}
}

func FuzzParseRegion(f *testing.F) {
	f.Add(EncodeRegion([][]uint64{{1, 2}, {3}}))
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseRegion(b)
		if err == nil && len(u) != regionMaxDev {
			t.Fatalf("%d devices", len(u))
		}
	})
}

func TestDecide(t *testing.T) {
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	b := types.NamespacedName{Namespace: "ns", Name: "b"}
	pods := map[types.UID]Pod{
		"ua": {Key: a, UID: "ua", Limits: map[string]int64{"G1": 10000}},
		"ub": {Key: b, UID: "ub"}, // no plan
	}
	cases := []struct {
		name  string
		procs []Proc
		held  map[string]bool
		want  []Finding
	}{
		{"within limit", []Proc{{PID: 1, GPU: "G1", UsedMiB: 10000, Pod: "ua"}}, nil, nil},
		{"within limit plus the container's slack", []Proc{{PID: 1, GPU: "G1", UsedMiB: 10100, Pod: "ua"}, {PID: 2, GPU: "G1", UsedMiB: 150, Pod: "ua"}}, nil, nil},
		{"the slack is per container, not per process", []Proc{{PID: 1, GPU: "G1", UsedMiB: 10200, Pod: "ua"}, {PID: 2, GPU: "G1", UsedMiB: 300, Pod: "ua"}}, nil,
			[]Finding{{Kind: metrics.KindOverLimit, Pod: "ua", Key: a, GPU: "G1", UsedMiB: 10500, LimitMiB: 10000, PIDs: []uint32{1, 2}}}},
		{"over limit summed over processes", []Proc{{PID: 2, GPU: "G1", UsedMiB: 6000, Pod: "ua"}, {PID: 1, GPU: "G1", UsedMiB: 5000, Pod: "ua"}}, nil,
			[]Finding{{Kind: metrics.KindOverLimit, Pod: "ua", Key: a, GPU: "G1", UsedMiB: 11000, LimitMiB: 10000, PIDs: []uint32{1, 2}}}},
		{"planned pod on a GPU not its own", []Proc{{PID: 1, GPU: "G2", UsedMiB: 10, Pod: "ua"}}, nil,
			[]Finding{{Kind: metrics.KindUnassigned, Pod: "ua", Key: a, GPU: "G2", UsedMiB: 10, PIDs: []uint32{1}}}},
		{"unplanned pod on a free GPU is fine", []Proc{{PID: 1, GPU: "G3", UsedMiB: 70000, Pod: "ub"}}, map[string]bool{"G1": true}, nil},
		{"unplanned pod on a planned GPU", []Proc{{PID: 1, GPU: "G1", UsedMiB: 5, Pod: "ub"}}, map[string]bool{"G1": true},
			[]Finding{{Kind: metrics.KindUnassigned, Pod: "ub", Key: b, GPU: "G1", UsedMiB: 5, PIDs: []uint32{1}}}},
		{"host process", []Proc{{PID: 9, GPU: "G1", UsedMiB: 500}}, nil,
			[]Finding{{Kind: metrics.KindUnknown, GPU: "G1", UsedMiB: 500, PIDs: []uint32{9}}}},
		{"pod not on this node", []Proc{{PID: 9, GPU: "G1", UsedMiB: 500, Pod: "zz"}}, nil,
			[]Finding{{Kind: metrics.KindUnknown, Pod: "zz", GPU: "G1", UsedMiB: 500, PIDs: []uint32{9}}}},
	}
	// 64 processes of 512 MiB each on top of a 10000 MiB plan: 32 GiB hidden
	// under a per-process allowance, a finding under a per-container slack.
	var many []Proc
	for i := range 64 {
		many = append(many, Proc{PID: uint32(100 + i), GPU: "G1", UsedMiB: 512, Pod: "ua"})
	}
	many[0].UsedMiB += 10000
	_, got := Decide(Input{Procs: many, Pods: pods, SlackMiB: 512})
	if len(got) != 1 || got[0].Kind != metrics.KindOverLimit || got[0].UsedMiB != 10000+64*512 {
		t.Errorf("64 processes: findings %+v, want one over_limit", got)
	}
	for _, tc := range cases {
		_, got := Decide(Input{Procs: tc.procs, Pods: pods, Held: tc.held, SlackMiB: 256})
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
		for _, f := range got {
			if f.Message() == "" {
				t.Errorf("%s: empty message", tc.name)
			}
		}
	}
}

// BenchmarkDecide: one bypass decision for 8 GPUs × 16 processes.
func BenchmarkDecide(b *testing.B) {
	pods := map[types.UID]Pod{}
	var procs []Proc
	for i := range 128 {
		uid := types.UID("pod-" + string(rune('a'+i%32)))
		gpu := "G" + string(rune('0'+i%8))
		if _, ok := pods[uid]; !ok {
			pods[uid] = Pod{UID: uid, Key: types.NamespacedName{Namespace: "ns", Name: string(uid)}, Limits: map[string]int64{}}
		}
		pods[uid].Limits[gpu] = 10000
		procs = append(procs, Proc{PID: uint32(i), GPU: gpu, UsedMiB: 4000, Pod: uid})
	}
	b.ReportAllocs()
	for b.Loop() {
		Decide(Input{Procs: procs, Pods: pods, SlackMiB: 512})
	}
}

// BenchmarkParseRegion: reading one container's accounting file (the full
// 1024-slot region, 8 slots in use).
func BenchmarkParseRegion(b *testing.B) {
	slots := make([][]uint64, 8)
	for i := range slots {
		slots[i] = []uint64{1 << 30, 2 << 30}
	}
	buf := EncodeRegion(slots)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseRegion(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRegionFileBounded: the accounting file belongs to the tenant. Nothing
// it puts there may block, exhaust or crash the agent.
func TestRegionFileBounded(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, EncodeRegion([][]uint64{{5 << 20}}), 0o644); err != nil {
		t.Fatal(err)
	}
	if u, err := (RegionFile{}).Used(good); err != nil || u[0] != 5<<20 {
		t.Fatalf("good region: %v, %v", u, err)
	}

	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	sparse := filepath.Join(dir, "sparse")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(4 << 40); err != nil { // 4 TiB, no blocks
		t.Skipf("filesystem refuses a 4 TiB sparse file: %v", err)
	}
	f.Close()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	oneOver := filepath.Join(dir, "one-over")
	if err := os.WriteFile(oneOver, make([]byte, RegionSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, sparse, link, oneOver, dir, "/dev/zero"} {
		done := make(chan error, 1)
		go func() { _, err := (RegionFile{}).Used(path); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrHostileFile) {
				t.Errorf("%s: err = %v, want ErrHostileFile", filepath.Base(path), err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: reader blocked", filepath.Base(path))
		}
	}
	if _, err := (RegionFile{}).Used(filepath.Join(dir, "absent")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent: err = %v, want ErrNotExist", err)
	}
}

// FuzzRegionFile: any file content reads without panic, bounded, and agrees
// with ParseRegion.
func FuzzRegionFile(f *testing.F) {
	f.Add(EncodeRegion([][]uint64{{1, 2}, {3}}))
	f.Add(make([]byte, 64))
	f.Add(make([]byte, RegionSize+1))
	huge := EncodeRegion([][]uint64{{^uint64(0)}, {^uint64(0)}})
	f.Add(huge)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "vgpu.cache")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		u, err := (RegionFile{}).Used(path)
		if len(b) > RegionSize {
			if !errors.Is(err, ErrHostileFile) {
				t.Fatalf("%d bytes read: %v", len(b), err)
			}
			return
		}
		want, werr := ParseRegion(b)
		if (err == nil) != (werr == nil) || cmp.Diff(want, u) != "" {
			t.Fatalf("file %v %v, bytes %v %v", u, err, want, werr)
		}
	})
}

// BenchmarkRegionFile: the bounded read of one container's accounting file
// from disk (open O_NOFOLLOW|O_NONBLOCK, fstat, pread, parse).
func BenchmarkRegionFile(b *testing.B) {
	slots := make([][]uint64, 8)
	for i := range slots {
		slots[i] = []uint64{1 << 30, 2 << 30}
	}
	path := filepath.Join(b.TempDir(), "vgpu.cache")
	if err := os.WriteFile(path, EncodeRegion(slots), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(RegionSize)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (RegionFile{}).Used(path); err != nil {
			b.Fatal(err)
		}
	}
}

// Reading a tenant's accounting file must not open what is not a regular
// file: opening can act (a device node the tenant made with mknod — a
// watchdog reboots the node). A FIFO shows it: a writer blocked opening it
// is released the moment anyone opens it for reading.
func TestRegionFileNeverOpensANonRegularFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "vgpu.cache")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	opened := make(chan struct{})
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // blocks until a reader opens
		if err == nil {
			close(opened)
			f.Close()
		}
	}()
	time.Sleep(50 * time.Millisecond)
	if _, err := ReadRegionFile(fifo); !errors.Is(err, ErrHostileFile) {
		t.Fatalf("FIFO: err = %v, want ErrHostileFile", err)
	}
	select {
	case <-opened:
		t.Fatal("ReadRegionFile opened the FIFO for reading (a device node would have been opened too)")
	case <-time.After(300 * time.Millisecond):
	}
	// Release the writer.
	if f, err := os.OpenFile(fifo, os.O_RDONLY|unix.O_NONBLOCK, 0); err == nil {
		<-opened
		f.Close()
	}
}
