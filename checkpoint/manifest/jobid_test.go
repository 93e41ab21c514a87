package manifest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The ranks of one step must name rank 0's jobId, as they must its runId:
// a verifier without a JobID of its own (Python without GPUPACK_JOB_UID, a
// bare Verifier) never names a step mixing two jobs' shards, or one job's
// and an unnamed writer's (issue 16 review L1).
func TestRanksOfOneStepAgreeOnJobID(t *testing.T) {
	py := python3(t)
	for name, jobs := range map[string][2]string{"two jobs": {"job-j", "job-k"}, "job and none": {"job-j", ""}, "none and job": {"", "job-k"}} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for r := 0; r < 2; r++ {
				save := func(step int64, job string) {
					if _, err := SaveRankWith(dir, step, RankInfo{Rank: r, WorldSize: 2, RunID: "run-1", JobID: job}, map[string]WriteFunc{"m": Bytes([]byte("x"))}); err != nil {
						t.Fatal(err)
					}
				}
				save(1, jobs[0]) // step 1: one job, consistent
				save(2, jobs[r])
			}
			if got := latestConsistent(t, dir); got != 1 {
				t.Errorf("Go LatestConsistent = %d, want 1 (step 2 mixes jobIds %q)", got, jobs)
			}
			cmd := exec.Command(py, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gpupack_ckpt as c; print(c.latest_consistent(sys.argv[2]))", pythonDir(t), dir)
			cmd.Env = append(os.Environ(), "GPUPACK_JOB_UID=")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != "1" {
				t.Errorf("python latest_consistent = %s, want 1 (step 2 mixes jobIds %q)", got, jobs)
			}
		})
	}
}
