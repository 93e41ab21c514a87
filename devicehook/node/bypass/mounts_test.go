package bypass

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A container's table as runc leaves it (trimmed): rootfs overlay, /proc,
// the kubelet's binds, then gpupack-node's from Allocate.
const containerTable = `1201 1130 0:312 / / rw,relatime master:420 - overlay overlay rw,lowerdir=/l1:/l2,upperdir=/u,workdir=/w
1202 1201 0:315 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1210 1201 8:1 /var/lib/kubelet/pods/P/etc-hosts /etc/hosts rw,relatime - ext4 /dev/sda1 rw
1211 1201 8:1 /var/lib/gpupack/hook /usr/local/gpupack rw,relatime - ext4 /dev/sda1 rw
1212 1201 8:1 /var/lib/gpupack/hook/ld.so.preload /etc/ld.so.preload ro,relatime - ext4 /dev/sda1 rw
1213 1201 8:1 /var/lib/gpupack/limits/U/main/limits /etc/gpupack/limits ro,relatime - ext4 /dev/sda1 rw
`

func wantsFor() []Want {
	return []Want{
		{Path: "/usr/local/gpupack/libgpupack-hook.so", Point: "/usr/local/gpupack", Dev: "8:1", Roots: []string{"/var/lib/gpupack/hook"}},
		{Path: "/etc/ld.so.preload", Point: "/etc/ld.so.preload", Dev: "8:1", Roots: []string{"/var/lib/gpupack/hook/ld.so.preload"}},
		{Path: "/etc/gpupack/limits", Point: "/etc/gpupack/limits", Dev: "8:1", Roots: []string{"/var/lib/gpupack/limits/U/main/limits", "/var/lib/gpupack/limits/U/side/limits"}},
	}
}

func TestParseMountinfo(t *testing.T) {
	got, err := ParseMountinfo([]byte("36 35 98:0 /mnt\\0401 /mnt\\134two rw,noatime master:1 shared:7 - ext3 /dev/root rw,errors=continue\n" +
		"40 36 0:5 / /no\\011opt rw - tmpfs tmpfs rw\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{ID: 36, Parent: 35, Dev: "98:0", Root: "/mnt 1", Point: `/mnt\two`, FSType: "ext3"},
		{ID: 40, Parent: 36, Dev: "0:5", Root: "/", Point: "/no\topt", FSType: "tmpfs"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("parse (-want +got):\n%s", d)
	}
	for name, bad := range map[string]string{
		"no separator":      "36 35 98:0 / / rw master:1 ext3 /dev/root rw\n",
		"separator early":   "36 35 98:0 / - ext3 /dev/root rw\n",
		"bad id":            "x 35 98:0 / / rw - ext3 /dev/root rw\n",
		"bad dev":           "36 35 98 / / rw - ext3 /dev/root rw\n",
		"relative point":    "36 35 98:0 / etc rw - ext3 /dev/root rw\n",
		"truncated escape":  "36 35 98:0 / /a\\04 rw - ext3 /dev/root rw\n",
		"non-octal escape":  "36 35 98:0 / /a\\09x rw - ext3 /dev/root rw\n",
		"empty point field": "36 35 98:0 /  rw - ext3 /dev/root rw\n",
		"line too long":     "36 35 98:0 / /" + strings.Repeat("a", mountinfoMaxLine) + " rw - ext3 /dev/root rw\n",
	} {
		if _, err := ParseMountinfo([]byte(bad)); err == nil {
			t.Errorf("%s: parsed %q", name, bad)
		}
	}
	if _, err := ParseMountinfo(make([]byte, MountinfoMaxBytes+1)); !errors.Is(err, ErrMountinfoTooBig) {
		t.Errorf("oversized table: %v, want ErrMountinfoTooBig", err)
	}
}

func TestVisible(t *testing.T) {
	ms, err := ParseMountinfo([]byte(`1 0 8:1 / / rw - ext4 a rw
2 1 8:1 /x /etc/gpupack/limits ro - ext4 a rw
3 1 0:9 / /etc rw - tmpfs b rw
4 3 0:10 / /etc/a rw - tmpfs c rw
5 3 0:11 / /etc/a rw - tmpfs d rw
6 4 0:12 / /etc/a rw - tmpfs e rw
`))
	if err != nil {
		t.Fatal(err)
	}
	for p, id := range map[string]int{
		"/":                   1,
		"/usr/bin":            1,
		"/etc/gpupack/limits": 3, // /etc mounted later over the file's parent: hidden
		"/etc/passwd":         3,
		"/etc/a/b":            5, // 4 and 5: one point, one parent (the kernel tucks such mounts; contrived): the later line wins
		"/etcetera":           1,
	} {
		m, ok := Visible(ms, p)
		if !ok || m.ID != id {
			t.Errorf("Visible(%s) = %d %v, want %d", p, m.ID, ok, id)
		}
	}
	if _, ok := Visible(nil, "/"); ok {
		t.Error("Visible of an empty table")
	}
}

// TestCheckMounts: the attacks of the review (a ConfigMap subPath through an
// image symlink to /etc, mounted deeper hence later) and their look-alikes.
func TestCheckMounts(t *testing.T) {
	base, err := ParseMountinfo([]byte(containerTable))
	if err != nil {
		t.Fatal(err)
	}
	with := func(lines string) []Mount {
		ms, err := ParseMountinfo([]byte(containerTable + lines))
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	cases := []struct {
		name  string
		table []Mount
		bad   []string // paths flagged
	}{
		{"gpupack's own binds", base, nil},
		{"forged limits over ours (subPath /x/y/gpupack/limits, /x/y -> /etc)", with("1300 1213 0:400 /..data/limits /etc/gpupack/limits ro - tmpfs tmpfs rw\n"), []string{"/etc/gpupack/limits"}},
		{"forged ld.so.preload (terminationMessagePath /x/y/ld.so.preload)", with("1301 1212 8:1 /var/lib/kubelet/pods/P/containers/main/abc /etc/ld.so.preload rw - ext4 /dev/sda1 rw\n"), []string{"/etc/ld.so.preload"}},
		{"a folder over /etc/gpupack mounted after ours: hides it", with("1302 1201 0:400 / /etc/gpupack ro - tmpfs tmpfs rw\n"), []string{"/etc/gpupack/limits"}},
		{"a folder at /etc/gpupack mounted first (shallower), ours on it", shallowFirst(t), nil},
		{"a folder over /etc after ours: hides all", append(append([]Mount(nil), base[:3]...), with("1303 1201 0:400 / /etc ro - tmpfs tmpfs rw\n")[3:]...), []string{"/etc/ld.so.preload", "/etc/gpupack/limits"}},
		{"over the hook folder", with("1304 1211 0:400 / /usr/local/gpupack ro - tmpfs tmpfs rw\n"), []string{"/usr/local/gpupack/libgpupack-hook.so"}},
		{"a file over the library itself", with("1305 1211 0:400 /evil.so /usr/local/gpupack/libgpupack-hook.so ro - tmpfs tmpfs rw\n"), []string{"/usr/local/gpupack/libgpupack-hook.so"}},
		{"another container's limits file of the same pod", with("1306 1213 8:1 /var/lib/gpupack/limits/U/side/limits /etc/gpupack/limits ro - ext4 /dev/sda1 rw\n"), nil},
		{"another pod's limits file", with("1307 1213 8:1 /var/lib/gpupack/limits/V/main/limits /etc/gpupack/limits ro - ext4 /dev/sda1 rw\n"), []string{"/etc/gpupack/limits"}},
		{"same root string on another filesystem", with("1308 1213 0:77 /var/lib/gpupack/limits/U/main/limits /etc/gpupack/limits ro - ext4 /dev/sdb1 rw\n"), []string{"/etc/gpupack/limits"}},
		{"ours deleted and a tenant file", with("1309 1213 8:1 /var/lib/gpupack/limits/U/main/limits.x//deleted /etc/gpupack/limits ro - ext4 /dev/sda1 rw\n"), []string{"/etc/gpupack/limits"}},
		{"no gpupack mounts at all", base[:3], []string{"/usr/local/gpupack/libgpupack-hook.so", "/etc/ld.so.preload", "/etc/gpupack/limits"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, v := range CheckMounts(tc.table, wantsFor()) {
				got = append(got, v.Path)
				if v.String() == "" {
					t.Error("empty violation text")
				}
			}
			if d := cmp.Diff(tc.bad, got); d != "" {
				t.Errorf("violations (-want +got):\n%s", d)
			}
		})
	}
	// A replaced (renamed-over) limits file shows "//deleted": still ours.
	ms := with("")
	ms[len(ms)-1].Root += "//deleted"
	if v := CheckMounts(ms, wantsFor()); len(v) != 0 {
		t.Errorf("a limits file gpupack-node replaced since: %v", v)
	}
}

// shallowFirst is containerTable with a tenant folder at /etc/gpupack that
// containerd mounted before gpupack's (deeper) limits file: ours is on it.
func shallowFirst(t *testing.T) []Mount {
	table := strings.Replace(containerTable, "1213 1201 ", "1209 1201 0:400 / /etc/gpupack ro - tmpfs tmpfs rw\n1213 1209 ", 1)
	ms, err := ParseMountinfo([]byte(table))
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func TestHostSide(t *testing.T) {
	self, err := ParseMountinfo([]byte(`100 90 0:50 / / rw - overlay overlay rw
101 100 8:1 /var/lib/gpupack /var/lib/gpupack rw - ext4 /dev/sda1 rw
102 100 8:2 /data/hook /opt/hook rw - ext4 /dev/sda2 rw
`))
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][2]string{
		"/var/lib/gpupack/limits/U": {"8:1", "/var/lib/gpupack/limits/U"},
		"/opt/hook":                 {"8:2", "/data/hook"},
		"/opt/hook/ld.so.preload":   {"8:2", "/data/hook/ld.so.preload"},
		"/usr":                      {"0:50", "/usr"},
	} {
		dev, root, ok := HostSide(self, p)
		if !ok || dev != want[0] || root != want[1] {
			t.Errorf("HostSide(%s) = %s %s %v, want %v", p, dev, root, ok, want)
		}
	}
}

// FuzzParseMountinfo: mount points are the tenant's (escaped by the kernel);
// the parser never panics, and what it accepts has absolute mount points and
// well-formed devices; Visible terminates on any parsed table.
func FuzzParseMountinfo(f *testing.F) {
	f.Add([]byte(containerTable))
	f.Add([]byte("36 35 98:0 /mnt\\0401 /mnt\\134two rw,noatime master:1 shared:7 - ext3 /dev/root rw\n"))
	f.Add([]byte("1 1 0:1 / / rw - rootfs rootfs rw\n2 1 0:2 / /a rw - t t rw\n3 2 0:3 / /a rw - t t rw\n"))
	f.Add([]byte("1 0 0:1 / / rw - x x x\n2 3 0:1 / /a rw - x x x\n3 2 0:1 / /a/b rw - x x x\n"))
	f.Add([]byte("36 35 98:0 / /\\0 rw - ext3 /dev/root rw\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := ParseMountinfo(b)
		if err != nil {
			return
		}
		for _, m := range ms {
			if !strings.HasPrefix(m.Point, "/") || !strings.Contains(m.Dev, ":") {
				t.Fatalf("accepted %+v", m)
			}
		}
		Visible(ms, "/etc/gpupack/limits")
		CheckMounts(ms, wantsFor())
	})
}
