package devicehook

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// The limiter's host-pid resolution when NVML's process list names
// several new pids around this process's context creation (containers
// starting at once on one GPU): the hook allocates a 16 MiB probe at its
// next throttled launch and takes the one candidate whose usedGpuMemory
// grew by it, trying up to 5 times. The fake makes the candidates appear
// deterministically (FAKECUDA_CTX_TWINS) and makes their memory move with
// ours for the first k probes (FAKECUDA_TWIN_ECHO), so no timing decides.
func TestHostPidProbeTieBreak(t *testing.T) {
	const offset = 100000
	resolvedRE := regexp.MustCompile(`NVML knows this process as pid (\d+) \(([^)]*)\)`)
	cases := []struct {
		name     string
		echo     int
		resolved bool
	}{
		{"three new pids, the first probe tells", 0, true},
		{"the twins' memory moves with the first two probes", 2, true},
		{"every probe ambiguous: stays unknown, never a twin", 100, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := limitedAt(30, 167, offset)
			e["FAKECUDA_CTX_TWINS"] = "2"
			e["FAKECUDA_TWIN_ECHO"] = fmt.Sprint(c.echo)
			e["LIBCUDA_LOG_LEVEL"] = "3"
			cmd := command(e, "gpa", "launch", "kernel", "1.5", "0.5")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("launch: %v\n%s", err, out.String())
			}
			logs := out.String()
			if !strings.Contains(logs, "3 processes created contexts at once") {
				t.Fatalf("the fake's twins did not make the resolution ambiguous:\n%s", logs)
			}
			want := fmt.Sprint(cmd.Process.Pid + offset)
			got := resolvedRE.FindAllStringSubmatch(logs, -1)
			switch {
			case c.resolved && (len(got) != 1 || got[0][1] != want || got[0][2] != "memory probe"):
				t.Errorf("want one resolution to host pid %s by the memory probe, got %q\n%s", want, got, logs)
			case !c.resolved && len(got) != 0:
				t.Errorf("every probe was ambiguous, yet the hook resolved %q (its host pid is %s)\n%s", got, want, logs)
			}
			t.Logf("util=%s", parseKV(logs)["util"])
		})
	}
}
