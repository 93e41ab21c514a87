package deviceplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// A container's accounting folder is mounted read-write into it, so it is
// the tenant's: on the host disk nothing would bound it (the kubelet's
// ephemeral-storage accounting does not count device-plugin mounts), and a
// container could fill /var/lib until DiskPressure evicts its neighbours.
// With Config.AccountingRegionBytes set, gpupack-node mounts a tmpfs of its
// own on each container's folder before Allocate answers: a little more
// than one region (the hook's only file), a handful of inodes, nosuid,
// nodev, noexec. The host path reaches the runtime only through mount
// propagation (the DaemonSet's Bidirectional hostPath).

// AccountingInodes bounds the files (and folders) of one accounting tmpfs;
// its root counts as one. The hook creates one file.
const AccountingInodes = 16

// AccountingTmpfsBytes is the size of the tmpfs for a region of
// regionBytes: the region rounded up to pages, plus one page.
func AccountingTmpfsBytes(regionBytes int64) int64 {
	page := int64(os.Getpagesize())
	return (regionBytes+page-1)/page*page + page
}

const accountingFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

// BoundAccountingDir makes dir (created if missing) a bounded tmpfs of
// AccountingTmpfsBytes(regionBytes). A tmpfs already mounted there (an agent
// restart, a second Allocate for the container) is kept; any other mount
// there is an error.
func BoundAccountingDir(dir string, regionBytes int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	switch mounted, fsType, err := mountPoint(dir); {
	case err != nil:
		return err
	case mounted && fsType == "tmpfs":
		return nil
	case mounted:
		return fmt.Errorf("%s is already a mount point of filesystem type %s, not gpupack's tmpfs", dir, fsType)
	}
	// mode=0777: the container may run as any user; the tmpfs is its own.
	opts := "size=" + strconv.FormatInt(AccountingTmpfsBytes(regionBytes), 10) + ",nr_inodes=" + strconv.Itoa(AccountingInodes) + ",mode=0777"
	if err := unix.Mount("gpupack-accounting", dir, "tmpfs", accountingFlags, opts); err != nil {
		return fmt.Errorf("mount tmpfs (%s) on %s: %w", opts, dir, err)
	}
	return nil
}

// mountPoint reports whether dir is a mount point in this thread's mount
// namespace and the filesystem type of the topmost mount there. It reads
// mountinfo: a bind mount of the same filesystem has its parent's st_dev.
func mountPoint(dir string) (bool, string, error) {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false, "", fmt.Errorf("%s is not a directory", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false, "", err
	}
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return false, "", err
	}
	mounted, fsType := false, ""
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options [optional...] - type source super
		f := strings.Fields(line)
		if len(f) < 5 || unescapeMountinfo(f[4]) != real {
			continue
		}
		mounted, fsType = true, ""
		for i := 5; i < len(f)-1; i++ {
			if f[i] == "-" {
				fsType = f[i+1]
				break
			}
		}
	}
	return mounted, fsType, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// RemovePodAccounting removes <root>/<uid> of a pod that is gone: first
// each container folder's tmpfs is unmounted (detached: a process of the
// pod may still be exiting), then the folders. A container folder that is a
// mount point after that is left in place, never recursed into.
func RemovePodAccounting(root string, uid types.UID) error {
	if err := safeName(string(uid)); err != nil {
		return err
	}
	podDir := filepath.Join(root, string(uid))
	ents, err := os.ReadDir(podDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range ents {
		dir := filepath.Join(podDir, e.Name())
		if !e.IsDir() {
			continue
		}
		for {
			mounted, _, err := mountPoint(dir)
			if err != nil || !mounted {
				break
			}
			if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
				break
			}
		}
		if mounted, _, err := mountPoint(dir); err == nil && mounted {
			errs = append(errs, fmt.Errorf("%s is still a mount point; left in place", dir))
			return errors.Join(errs...)
		}
	}
	if err := os.RemoveAll(podDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
