package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// With torch.distributed initialised, each rank hashes only its own shard
// when the gang asks which step is consistent (latest_consistent, resume,
// prune), instead of every rank hashing the whole gang's checkpoint
// (world size × checkpoint size per restart); one rank's damaged shard or a
// rank from another run still refuses the step on every rank. Real torchrun,
// 2 ranks, gloo (checkpoint/python/testdata/gang_verify.py counts the bytes
// of checkpoint files each rank opens for reading).
func TestTorchrunEachRankHashesOnlyItsOwnShard(t *testing.T) {
	py := torchPython(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port="+strconv.Itoa(freePort(t)),
		"--tee=1", "--redirects=1", "--monitor_interval=0.5",
		mustAbs(t, "../python/testdata/gang_verify.py"), "--dir", filepath.Join(dir, "ckpt"), "--out", out)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("torchrun: %v\n%s", err, b)
	}
	type phase struct {
		Step  json.RawMessage  `json:"step"`
		Bytes map[string]int64 `json:"bytes"`
	}
	wantStep := map[string]string{"clean-latest": "3", "clean-resume": "3", "corrupt-latest": "2", "corrupt-resume": "2", "mixed-latest": "1", "prune": "[]"}
	for rank := 0; rank < 2; rank++ {
		raw, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank-%d.json", rank)))
		if err != nil {
			t.Fatal(err)
		}
		var res map[string]json.RawMessage
		if err := json.Unmarshal(raw, &res); err != nil {
			t.Fatal(err)
		}
		own := int64(rank+1) << 20 // rank r's shard of every step
		for name, want := range wantStep {
			var p phase
			if err := json.Unmarshal(res[name], &p); err != nil {
				t.Fatalf("rank %d %s: %v (%s)", rank, name, err, res[name])
			}
			if got := string(p.Step); got != want {
				t.Errorf("rank %d %s: step %s, want %s", rank, name, got, want)
			}
			if len(p.Bytes) == 0 {
				t.Errorf("rank %d %s: hashed nothing; its own shard must verify", rank, name)
			}
			var total int64
			for d, n := range p.Bytes {
				total += n
				if !strings.HasSuffix(d, fmt.Sprintf("/rank-%d", rank)) || n != own {
					t.Errorf("rank %d %s: read %d bytes of %s; want only its own shard (%d bytes per step)", rank, name, n, d, own)
				}
			}
			t.Logf("rank %d %s: step %s, hashed %d bytes in %d rank directories", rank, name, p.Step, total, len(p.Bytes))
		}
	}
}
