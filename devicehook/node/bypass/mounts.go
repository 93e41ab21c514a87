package bypass

// Mount check (issue 14, second review finding 2). The webhook compares the
// destinations of a pod's mounts with gpupack's paths as strings; an image
// symlink (/x/y -> /etc) lets a tenant's ConfigMap subPath at
// /x/y/ld.so.preload, or terminationMessagePath /x/y/gpupack/limits, pass
// that check and land — runc resolves destinations inside the rootfs, and
// containerd mounts deeper destinations later — on top of /etc/ld.so.preload
// or /etc/gpupack/limits. What a container really sees is only known on the
// node: /proc/<pid>/mountinfo of its process. The functions here are pure:
// parse mountinfo (tenant-influenced text: mount points with spaces,
// escapes, long lines), find the mount visible at a path, and decide whether
// it is gpupack's own bind.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/deviceplugin"
)

// MountinfoMaxBytes bounds what is read of one mountinfo file. A container
// has tens of mounts; a pod spec cannot give it the thousands this needs.
const MountinfoMaxBytes = 4 << 20

// mountinfoMaxLine bounds one line: two paths of PATH_MAX, each up to four
// times longer escaped, plus options.
const mountinfoMaxLine = 64 << 10

// Mount is one line of /proc/<pid>/mountinfo (proc(5)), paths unescaped.
type Mount struct {
	ID, Parent int
	Dev        string // major:minor of the filesystem
	Root       string // the path inside the filesystem that is the mount's root
	Point      string // mount point, relative to the process's root
	FSType     string
}

// ErrMountinfoTooBig is returned for mountinfo over MountinfoMaxBytes.
var ErrMountinfoTooBig = errors.New("mountinfo too big")

// ParseMountinfo parses mountinfo text. Any malformed line is an error: the
// kernel writes this file, and a view that cannot be read cannot be
// verified.
func ParseMountinfo(b []byte) ([]Mount, error) {
	if len(b) > MountinfoMaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrMountinfoTooBig, len(b), MountinfoMaxBytes)
	}
	var out []Mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), mountinfoMaxLine)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" {
			continue
		}
		m, err := parseMountLine(line)
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo line %d: %w", n+1, err)
	}
	return out, nil
}

// parseMountLine reads
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// (ID, parent, dev, root, mount point, options, optional fields ending at
// "-", fstype, source, super options).
func parseMountLine(line string) (Mount, error) {
	f := strings.Split(line, " ")
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || len(f) < sep+3 {
		return Mount{}, errors.New("no ' - fstype source' after the optional fields")
	}
	var m Mount
	var err error
	if m.ID, err = strconv.Atoi(f[0]); err != nil || m.ID < 0 {
		return Mount{}, fmt.Errorf("mount ID %q", f[0])
	}
	if m.Parent, err = strconv.Atoi(f[1]); err != nil || m.Parent < 0 {
		return Mount{}, fmt.Errorf("parent ID %q", f[1])
	}
	maj, min, ok := strings.Cut(f[2], ":")
	if _, e1 := strconv.ParseUint(maj, 10, 32); !ok || e1 != nil {
		return Mount{}, fmt.Errorf("device %q", f[2])
	}
	if _, e2 := strconv.ParseUint(min, 10, 32); e2 != nil {
		return Mount{}, fmt.Errorf("device %q", f[2])
	}
	m.Dev = f[2]
	if m.Root, err = unescapeMount(f[3]); err != nil {
		return Mount{}, fmt.Errorf("root: %w", err)
	}
	if m.Point, err = unescapeMount(f[4]); err != nil {
		return Mount{}, fmt.Errorf("mount point: %w", err)
	}
	if !strings.HasPrefix(m.Point, "/") {
		return Mount{}, fmt.Errorf("mount point %q is not absolute", m.Point)
	}
	if m.FSType, err = unescapeMount(f[sep+1]); err != nil {
		return Mount{}, fmt.Errorf("fstype: %w", err)
	}
	return m, nil
}

// unescapeMount undoes the kernel's octal escapes (\040 space, \011 tab,
// \012 newline, \134 backslash). An empty field or a backslash not followed
// by three octal digits is an error (the kernel escapes every backslash).
func unescapeMount(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty field")
	}
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", fmt.Errorf("truncated escape in %q", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape %q", s[i:i+4])
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), nil
}

// covers reports whether mount point p is path q or a folder above it.
func covers(p, q string) bool {
	return p == "/" || p == q || strings.HasPrefix(q, p+"/")
}

// Visible returns the mount a lookup of the absolute, clean path p resolves
// into (symlinks are the mount table's business: the kernel records the
// resolved mount point). It walks the mount tree from the root: among the
// children of the current mount whose mount points cover p, the one nearest
// the root wins — a child mounted deeper under the same parent was mounted
// first and is hidden by it (a later mount there would have had the nearer
// one as its parent); on a tie (one mount point, one parent: propagation)
// the later line wins. False when the table has no root mount.
func Visible(ms []Mount, p string) (Mount, bool) {
	ids := make(map[int]bool, len(ms))
	for _, m := range ms {
		ids[m.ID] = true
	}
	cur := -1
	for i, m := range ms {
		if m.Point == "/" && (!ids[m.Parent] || m.Parent == m.ID) {
			cur = i
		}
	}
	if cur < 0 {
		return Mount{}, false
	}
	seen := map[int]bool{ms[cur].ID: true}
	for {
		next := -1
		for i, m := range ms {
			if m.Parent != ms[cur].ID || seen[m.ID] || !covers(m.Point, p) {
				continue
			}
			if next < 0 || len(m.Point) <= len(ms[next].Point) {
				next = i
			}
		}
		if next < 0 {
			return ms[cur], true
		}
		cur = next
		seen[ms[cur].ID] = true
	}
}

// Want is what must be visible at one path of a container: a mount at
// exactly Point (a file bind for /etc/ld.so.preload and the limits file;
// the hook folder for the library) whose filesystem is Dev and whose root is
// one of Roots. Roots are what gpupack-node bound there (its own view of
// the host path, see HostSide); a root whose file gpupack-node has since
// replaced (WriteLimits renames) reads "<root>//deleted".
type Want struct {
	Path  string
	Point string
	Dev   string
	Roots []string
}

// Violation is one path of a container where something else is visible.
type Violation struct {
	Path string
	Got  Mount
	Ok   bool   // false: no mount at all resolves the path
	Err  string // the table could not be judged (unparsable, too big)
}

func (v Violation) String() string {
	if v.Err != "" {
		return v.Err
	}
	if !v.Ok {
		return fmt.Sprintf("%s: no root mount in the container's mountinfo", v.Path)
	}
	return fmt.Sprintf("%s is served by mount %d at %q (filesystem %s %s, root %q), not gpupack-node's", v.Path, v.Got.ID, v.Got.Point, v.Got.Dev, v.Got.FSType, v.Got.Root)
}

// CheckMounts decides, for each want, whether the mount visible at its path
// in the container's table is gpupack-node's own.
func CheckMounts(container []Mount, wants []Want) []Violation {
	var out []Violation
	for _, w := range wants {
		m, ok := Visible(container, w.Path)
		if ok && m.Point == w.Point && m.Dev == w.Dev && rootIn(m.Root, w.Roots) {
			continue
		}
		out = append(out, Violation{Path: w.Path, Got: m, Ok: ok})
	}
	return out
}

func rootIn(root string, roots []string) bool {
	r := strings.TrimSuffix(root, "//deleted")
	for _, want := range roots {
		if r == want {
			return true
		}
	}
	return false
}

// HostSide returns the filesystem and in-filesystem path of hostPath (clean,
// absolute, symlinks already resolved) as the mount table self (gpupack-
// node's own mountinfo) shows it: what a bind of hostPath shows as Dev and
// Root in the container's table.
func HostSide(self []Mount, hostPath string) (dev, root string, ok bool) {
	m, ok := Visible(self, hostPath)
	if !ok {
		return "", "", false
	}
	rel := strings.TrimPrefix(hostPath, m.Point)
	if m.Point == "/" {
		rel = hostPath
	}
	return m.Dev, path.Join(m.Root, rel), true
}

// MountCheck is the adapter: what gpupack-node's Allocate bound into each
// GPU container, read from its own mount table, compared with the table of
// each GPU process it sees.
type MountCheck struct {
	// ProcRoot holds <pid>/mountinfo of host processes (/proc: hostPID).
	ProcRoot string
	// SelfMountinfo is gpupack-node's own table (""
	// /proc/thread-self/mountinfo: the reading thread's, not the thread
	// group leader's, should any thread ever leave the namespace),
	// in which --limits-dir and --hook-dir are the host's paths (hostPath
	// volumes at the same path, which Allocate already relies on).
	SelfMountinfo string
	LimitsDir     string // "" checks no limits file
	HookDir       string // "" checks no hook library
	Preload       bool   // /etc/ld.so.preload is HookDir/ld.so.preload
}

// wants lists what a container of pod uid (one of containers) must see. A
// path whose host side gpupack-node cannot resolve (the pod's limits folder
// removed, no hook installed) is left out, and logged.
func (c *MountCheck) wants(self []Mount, uid string, containers []string) []Want {
	var out []Want
	side := func(hostPath string) (string, string, bool) {
		real, err := filepath.EvalSymlinks(hostPath)
		if err != nil {
			klog.V(2).InfoS("mount check: host side unknown", "path", hostPath, "err", err)
			return "", "", false
		}
		dev, root, ok := HostSide(self, real)
		if !ok {
			klog.V(2).InfoS("mount check: no mount in gpupack-node's own mountinfo", "path", real)
		}
		return dev, root, ok
	}
	if c.HookDir != "" {
		if dev, root, ok := side(c.HookDir); ok {
			out = append(out, Want{Path: path.Join(c.HookDir, v1alpha1.HookLibraryName), Point: path.Clean(c.HookDir), Dev: dev, Roots: []string{root}})
		}
		if c.Preload {
			if dev, root, ok := side(filepath.Join(c.HookDir, "ld.so.preload")); ok {
				out = append(out, Want{Path: "/etc/ld.so.preload", Point: "/etc/ld.so.preload", Dev: dev, Roots: []string{root}})
			}
		}
	}
	if c.LimitsDir != "" {
		if dev, root, ok := side(filepath.Join(c.LimitsDir, uid)); ok {
			w := Want{Path: deviceplugin.LimitsMountPath, Point: deviceplugin.LimitsMountPath, Dev: dev}
			for _, name := range containers {
				w.Roots = append(w.Roots, path.Join(root, name, deviceplugin.LimitsFileName))
			}
			out = append(out, w)
		}
	}
	return out
}

// readBounded reads at most MountinfoMaxBytes+1 of a file.
func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MountinfoMaxBytes+1))
}

// Self reads gpupack-node's own mount table (once per pass).
func (c *MountCheck) Self() ([]Mount, error) {
	selfPath := c.SelfMountinfo
	if selfPath == "" {
		selfPath = "/proc/thread-self/mountinfo"
	}
	b, err := readBounded(selfPath)
	if err != nil {
		return nil, err
	}
	self, err := ParseMountinfo(b)
	if err != nil {
		return nil, fmt.Errorf("gpupack-node's own %s: %w", selfPath, err)
	}
	return self, nil
}

// Check returns the violations of process pid of pod uid, whose containers
// are named containers; self is Self(). (nil, err) when the process cannot
// be read (it exited) or none of gpupack-node's side is known; a table that
// cannot be parsed (or is too big) is a violation: fail closed.
func (c *MountCheck) Check(self []Mount, pid uint32, uid string, containers []string) ([]Violation, error) {
	wants := c.wants(self, uid, containers)
	if len(wants) == 0 {
		return nil, errors.New("nothing gpupack-node bound is known on its side")
	}
	b, err := readBounded(filepath.Join(c.ProcRoot, strconv.FormatUint(uint64(pid), 10), "mountinfo"))
	if err != nil {
		return nil, err
	}
	ms, err := ParseMountinfo(b)
	if err != nil {
		return []Violation{{Err: "mount table cannot be verified: " + err.Error()}}, nil
	}
	return CheckMounts(ms, wants), nil
}
