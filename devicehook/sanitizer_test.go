package devicehook

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The ASan/UBSan build of the library runs the same scenarios; any report
// aborts the program (halt_on_error, no recovery), which fails the test.
func TestSanitizerBuild(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	san := func(e env) env { return asanEnv(t, e) }
	base := func() env {
		return env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "64m",
			"CUDA_DEVICE_MEMORY_SHARED_CACHE": cache, "GPUPACK_CONTEXT_RESERVE": "4m"}
	}
	for _, mode := range []string{"direct", "gpa-ptsz"} {
		for _, fam := range families {
			kv := run(t, san(base()), mode, "family", fam, fmt.Sprint(4*mib))
			want := (60 * mib) / unitBytes(fam, 4*mib)
			if fam == "async" || fam == "pool" { // the pool grows in whole granules
				want = (60 * mib) / poolGranule * poolGranule / (4 * mib)
			}
			if num(t, kv, "n") != want {
				t.Errorf("asan %s/%s: n=%s, want %d", mode, fam, kv["n"], want)
			}
		}
	}
	kv := run(t, san(base()), "dlsym", "query", fmt.Sprint(8*mib))
	if kv["total"] != fmt.Sprint(64*mib) {
		t.Errorf("asan query: total=%s", kv["total"])
	}
	e := san(base())
	e["CUDA_DEVICE_SM_LIMIT"] = "50"
	e["GPUPACK_SM_PERIOD_MS"] = "10"
	e["FAKECUDA_STATE"] = filepath.Join(t.TempDir(), "device")
	run(t, e, "gpa", "launch", "ex", "0.5", "0.1")
	if kv := run(t, san(base()), "direct", "rtld-next"); kv["next_is_default"] != "1" || kv["default_is_direct"] != "1" {
		t.Errorf("asan rtld-next: %v", kv)
	}
}

// asanEnv preloads the ASan/UBSan build of the library (after libasan,
// which must come first); any report aborts the program.
func asanEnv(t *testing.T, e env) env {
	t.Helper()
	out, err := exec.Command("gcc", "-print-file-name=libasan.so").Output()
	libasan := strings.TrimSpace(string(out))
	if err != nil || !filepath.IsAbs(libasan) {
		t.Fatalf("gcc cannot locate libasan.so (%v): the sanitizer build cannot be loaded", err)
	}
	e["LD_PRELOAD"] = libasan + " " + asanHook
	e["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=66"
	e["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1:exitcode=67"
	return e
}
