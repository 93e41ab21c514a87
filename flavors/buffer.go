// Package flavors holds the one memory-safety formula every part of gpupack
// uses (the check, the webhook's validation, the node agent's capacity, the
// hook's limits), GPU device profiles, and ClusterQueue quota helpers.
package flavors

// Defaults of the per-GPU memory safety buffer (DESIGN.md).
const (
	DefaultDriverOverheadMiB int64 = 1500
	DefaultBufferPercent     int32 = 10
	// HardCapPercent: no configuration may raise allocatable above this share
	// of physical memory (the seed's 90 % safety line).
	HardCapPercent int64 = 90
)

// Buffer is the per-GPU reserve. Zero values mean "use the default"; use
// pointers in APIs and resolve them with NewBuffer.
type Buffer struct {
	DriverOverheadMiB int64
	BufferPercent     int32
}

// DefaultBuffer is 1500 MiB + 10 %.
func DefaultBuffer() Buffer {
	return Buffer{DriverOverheadMiB: DefaultDriverOverheadMiB, BufferPercent: DefaultBufferPercent}
}

// NewBuffer resolves optional settings against the defaults. Negative values
// are treated as defaults (the CRD forbids them; this keeps callers safe).
func NewBuffer(overheadMiB *int64, percent *int32) Buffer {
	b := DefaultBuffer()
	if overheadMiB != nil && *overheadMiB >= 0 {
		b.DriverOverheadMiB = *overheadMiB
	}
	if percent != nil && *percent >= 0 && *percent <= 100 {
		b.BufferPercent = *percent
	}
	return b
}

// Allocatable returns the MiB of one GPU that may be handed to pods:
// physical − driverOverhead − ceil(bufferPercent% × physical), never above
// floor(90 % × physical) and never below zero.
func (b Buffer) Allocatable(physicalMiB int64) int64 {
	if physicalMiB <= 0 {
		return 0
	}
	pct := int64(b.BufferPercent)
	buffer := (pct*physicalMiB + 99) / 100 // ceil
	a := physicalMiB - b.DriverOverheadMiB - buffer
	if capMiB := HardCapPercent * physicalMiB / 100; a > capMiB {
		a = capMiB
	}
	if a < 0 {
		return 0
	}
	return a
}

// Allocatable with the default buffer.
func Allocatable(physicalMiB int64) int64 { return DefaultBuffer().Allocatable(physicalMiB) }
