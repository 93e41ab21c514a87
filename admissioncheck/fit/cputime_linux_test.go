package fit

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the CPU time of the calling OS thread: on a shared machine it
// leaves out the time the decision waited for a CPU.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
