// Package testenv holds what unit tests need from the machine they run on.
// It has no dependencies, so any package's tests can use it.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// Command returns the path of a command a test needs. Where it is missing
// the test is skipped on a developer's machine but fails in CI (CI set, as
// .ci/run's callers do): .ci/run installs every such command, so a missing
// one there means coverage silently lost, not a machine without it.
func Command(t testing.TB, name, why string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not installed in CI (%s); .ci/run should install it", name, why)
	}
	t.Skipf("%s not installed (%s)", name, why)
	return ""
}
