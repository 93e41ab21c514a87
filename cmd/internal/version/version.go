// Package version holds the build version stamped by the Makefile.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set with -ldflags "-X github.com/gpupack/gpupack/cmd/internal/version.Version=…".
var Version = "dev"

// String is "gpupack <version> (<go version>, <vcs revision>)".
func String() string {
	rev := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("gpupack %s (%s, %s)", Version, runtime.Version(), rev)
}
