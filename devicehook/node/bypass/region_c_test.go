package bypass

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpupack/gpupack/test/testenv"
)

// TestParseRegionFromHook checks the reader against the hook's real layout:
// it builds devicehook/src/region.c (with config.c for logging) and a tiny
// writer, lets it charge memory, and parses the file it left.
func TestParseRegionFromHook(t *testing.T) {
	src := filepath.Join("..", "..", "src")
	if _, err := os.Stat(filepath.Join(src, "region.c")); err != nil {
		t.Skipf("devicehook/src/region.c not present: %v", err)
	}
	gcc := testenv.Command(t, "gcc", "builds devicehook's region code to check the reader against")
	dir := t.TempDir()
	bin := filepath.Join(dir, "writer")
	out, err := exec.Command(gcc, "-std=gnu11", "-O1", "-I", src,
		filepath.Join(src, "region.c"), filepath.Join(src, "config.c"), filepath.Join("testdata", "region_writer.c"),
		"-o", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("building the hook's region code failed (did its file set change?): %v\n%s", err, out)
	}
	region := filepath.Join(dir, "main.cache")
	if out, err := exec.Command(bin, region).CombinedOutput(); err != nil {
		t.Fatalf("writer: %v\n%s", err, out)
	}
	used, err := RegionFile{}.Used(region)
	if err != nil {
		t.Fatal(err)
	}
	if used[0] != 5<<20 || used[1] != 0 || used[2] != 7<<20 {
		t.Errorf("used = %v, want dev0 5 MiB, dev2 7 MiB", used[:4])
	}
}
