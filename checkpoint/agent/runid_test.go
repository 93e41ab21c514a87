package agent

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupack/gpupack/checkpoint/manifest"
)

// The agent's report names no step whose ranks come from two runs, though
// each rank of it verifies (rankSteps still shows them, for diagnosis).
func TestReportSkipsAStepMixingTwoRuns(t *testing.T) {
	dir := t.TempDir()
	save := func(step int64, rank int, run string) {
		if _, err := manifest.SaveRankRun(dir, step, rank, 2, run, map[string]manifest.WriteFunc{"m": manifest.Bytes([]byte(run))}); err != nil {
			t.Fatal(err)
		}
	}
	save(1, 0, "a")
	save(1, 1, "a")
	save(2, 0, "b") // the restart (run b) re-saved rank 0 of step 2 and died
	save(2, 1, "a")
	scans, err := (&manifest.Verifier{}).Scan(context.Background(), dir, scanSteps)
	if err != nil {
		t.Fatal(err)
	}
	consistent, world, ranks := summarize(scans)
	if diff := cmp.Diff([]int64{1}, consistent); diff != "" || world != 2 {
		t.Errorf("verifiedSteps (-want +got):\n%s world %d", diff, world)
	}
	if diff := cmp.Diff(map[string][]int64{"0": {2, 1}, "1": {2, 1}}, ranks); diff != "" {
		t.Errorf("rankSteps (-want +got):\n%s", diff)
	}
}

// Another job sharing the checkpoint directory saved step 777 after the
// request (review /tmp/revG): with both job ids known, the agent's
// verifier does not count it, so it cannot report "Saved" with it.
func TestVerifierIgnoresAnotherJobsStep(t *testing.T) {
	dir := t.TempDir()
	for r := 0; r < 2; r++ {
		if _, err := manifest.SaveRankWith(dir, 777, manifest.RankInfo{Rank: r, WorldSize: 2, RunID: "x", JobID: "other"},
			map[string]manifest.WriteFunc{"m": manifest.Bytes([]byte("y"))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		job  string
		want bool
	}{{"mine", false}, {"other", true}, {"", true}} {
		st, err := (&manifest.Verifier{JobID: c.job}).StepState(context.Background(), dir, 777)
		if err != nil || st.Consistent() != c.want {
			t.Errorf("verifier of job %q: step 777 consistent %v (%v, %q), want %v", c.job, st.Consistent(), err, st.Problems, c.want)
		}
	}
}
