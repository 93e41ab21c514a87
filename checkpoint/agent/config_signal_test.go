package agent

import (
	"io"
	"strings"
	"testing"
)

// SIGTERM or SIGINT as the checkpoint signal reaches torchrun and the
// DataLoader workers too (every process with a handler): torchrun stops its
// workers, the workers die, and no checkpoint is written (review). Refused
// at start, with a clear error.
func TestCheckpointSignalRefusesTermAndInt(t *testing.T) {
	for _, sig := range []string{"SIGTERM", "TERM", "15", "SIGINT", "2"} {
		_, err := ParseArgs([]string{"--checkpoint-signal", sig, "--", "true"}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("--checkpoint-signal %s: err %v, want it refused", sig, err)
		}
	}
	for _, sig := range []string{"SIGUSR1", "SIGUSR2"} {
		if _, err := ParseArgs([]string{"--checkpoint-signal", sig, "--", "true"}, io.Discard); err != nil {
			t.Errorf("--checkpoint-signal %s: %v", sig, err)
		}
	}
}
