//go:build !linux

package fit

import "time"

func threadCPU() time.Duration { return 0 }
