package bypass

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// The hook's shared accounting region, as devicehook/src/region.c lays it
// out (little endian, the file named by CUDA_DEVICE_MEMORY_SHARED_CACHE):
//
//	header, 64 bytes: magic u64 ("gppkh001"), hw u32 (slots [0,hw) may be used)
//	slots[1024], 192 bytes each: owner u64, start_time u64, used[16] u64, pad
//	then the container's SM state (region.c I10), not read here:
//	budget[16], 64 bytes each; tail[1024], 192 bytes each
//
// A container's usage of device d is the sum of used[d] over slots [0,hw)
// (region.c, invariant I3). Only reading is done here; a layout with another
// magic is refused rather than misread.
const (
	regionMagic    = 0x6770706b68303031
	regionHeader   = 64
	regionSlotSize = 192
	regionMaxSlots = 1024
	regionMaxDev   = 16
	slotUsedOffset = 16
	// After the slots (region.c I10): the SM budget per device, and per
	// slot what its owner may have run that NVML has not reported.
	regionBudgetSize = 64
	regionTailSize   = 192
)

// HookUsage reports what the hook accounted per device ordinal, in bytes.
// It is an interface so the drift report does not depend on the file format
// beyond region.go.
type HookUsage interface {
	Used(path string) ([]uint64, error)
}

// RegionFile reads the accounting files written by devicehook.
type RegionFile struct{}

// RegionSize is the size of the region file the hook creates (header, every
// slot, the SM budgets and the slots' SM tails); nothing bigger is ever
// read. The device plugin sizes the accounting tmpfs from it: a region the
// tmpfs cannot hold fails closed in the hook (posix_fallocate: ENOSPC).
const RegionSize = regionHeader + regionMaxSlots*regionSlotSize + regionMaxDev*regionBudgetSize + regionMaxSlots*regionTailSize

// ErrHostileFile marks an accounting file the hook cannot have written: not
// a regular file (FIFO, device, socket, symlink), or larger than a region.
// The container owns its accounting folder, so this is a finding about the
// tenant, not an agent failure.
var ErrHostileFile = errors.New("accounting file is not a region the hook writes")

// Used returns bytes charged per device ordinal (index = CUDA ordinal inside
// the container). The file is tenant-writable, so it is read bounded: opened
// without following a symlink and without blocking (a FIFO would otherwise
// wedge the watcher for ever), checked to be a regular file of at most
// RegionSize bytes with fstat on the open descriptor (no race with a
// rename), and read with one pread into a fixed buffer (a sparse 4 TiB file
// costs nothing).
func (RegionFile) Used(path string) ([]uint64, error) {
	b, err := ReadRegionFile(path)
	if err != nil {
		return nil, err
	}
	return ParseRegion(b)
}

// ReadRegionFile reads an accounting file bounded (see Used).
func ReadRegionFile(path string) ([]byte, error) {
	// O_PATH first: opening a device node a tenant made (mknod in its
	// accounting folder) for reading can itself act (a watchdog reboots
	// the node); an O_PATH descriptor opens nothing. Only a regular file
	// is then reopened for reading, through the same descriptor, so the
	// name cannot be swapped in between.
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFLNK:
		return nil, fmt.Errorf("%s: a symlink: %w", path, ErrHostileFile)
	default:
		return nil, fmt.Errorf("%s: mode %#o, not a regular file: %w", path, st.Mode&unix.S_IFMT, ErrHostileFile)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if st.Size > RegionSize {
		return nil, fmt.Errorf("%s: %d bytes, a region is %d: %w", path, st.Size, RegionSize, ErrHostileFile)
	}
	b := make([]byte, st.Size)
	n := 0
	for n < len(b) {
		m, err := unix.Pread(fd, b[n:], int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break // truncated meanwhile
		}
		n += m
	}
	return b[:n], nil
}

// ParseRegion decodes a region file.
func ParseRegion(b []byte) ([]uint64, error) {
	if len(b) < regionHeader {
		return nil, fmt.Errorf("accounting region: %d bytes, shorter than its header", len(b))
	}
	le := binary.LittleEndian
	if m := le.Uint64(b[0:8]); m != regionMagic {
		if m == 0 {
			return make([]uint64, regionMaxDev), nil // all-zero is a valid empty region
		}
		return nil, fmt.Errorf("accounting region: magic %#x, want %#x (layout changed?)", m, uint64(regionMagic))
	}
	hw := int(le.Uint32(b[8:12]))
	if hw > regionMaxSlots {
		return nil, fmt.Errorf("accounting region: hw %d > %d slots", hw, regionMaxSlots)
	}
	if need := regionHeader + hw*regionSlotSize; len(b) < need {
		return nil, fmt.Errorf("accounting region: %d bytes, need %d for %d slots", len(b), need, hw)
	}
	used := make([]uint64, regionMaxDev)
	for s := 0; s < hw; s++ {
		off := regionHeader + s*regionSlotSize
		if le.Uint64(b[off:off+8]) == 0 {
			continue // free slot (its used[] is zero anyway)
		}
		for d := 0; d < regionMaxDev; d++ {
			o := off + slotUsedOffset + 8*d
			v := le.Uint64(b[o : o+8])
			if used[d]+v < used[d] {
				used[d] = ^uint64(0) // a hostile region saturates, never wraps
				continue
			}
			used[d] += v
		}
	}
	return used, nil
}

// EncodeRegion writes a region in the same layout (tests and the demo use it
// to stand in for a running hook). usedBySlot[s][d] is slot s's bytes on d;
// slot s is owned by pid 1000+s.
func EncodeRegion(usedBySlot [][]uint64) []byte {
	b := make([]byte, RegionSize)
	le := binary.LittleEndian
	le.PutUint64(b[0:8], regionMagic)
	le.PutUint32(b[8:12], uint32(len(usedBySlot)))
	for s, used := range usedBySlot {
		off := regionHeader + s*regionSlotSize
		le.PutUint64(b[off:off+8], uint64(1000+s))
		for d, u := range used {
			o := off + slotUsedOffset + 8*d
			le.PutUint64(b[o:o+8], u)
		}
	}
	return b
}
