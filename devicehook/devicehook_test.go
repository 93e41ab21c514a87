package devicehook

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	api "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// Paths of the build products, absolute so tests may change directories.
var (
	buildDir string
	hookLib  string
	asanHook string
	fakeDir  string
	hooktest string
)

func TestMain(m *testing.M) {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Build once per test binary: the library, its sanitizer build, the fake
	// driver and the test programs.
	cmd := exec.Command("make", "-s", "-C", wd)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "make -C %s: %v\n", wd, err)
		os.Exit(1)
	}
	buildDir = filepath.Join(wd, "build")
	hookLib = filepath.Join(buildDir, api.HookLibraryName)
	asanHook = filepath.Join(buildDir, "asan", api.HookLibraryName)
	fakeDir = filepath.Join(buildDir, "fake")
	hooktest = filepath.Join(buildDir, "hooktest")
	os.Exit(m.Run())
}

// env is a process environment for a test program: the host's, minus
// anything that would steer the hook or the fake, plus vars.
type env map[string]string

func (e env) list() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "GPUPACK_") || strings.HasPrefix(k, "FAKECUDA_") ||
			strings.HasPrefix(k, "HOOKTEST_") || k == api.EnvLDPreload || k == api.EnvLogLevel || k == "LD_LIBRARY_PATH" {
			continue
		}
		out = append(out, kv)
	}
	if _, ok := e["LD_LIBRARY_PATH"]; !ok {
		out = append(out, "LD_LIBRARY_PATH="+fakeDir)
	}
	for k, v := range e {
		out = append(out, k+"="+v)
	}
	return out
}

// hooked returns e plus LD_PRELOAD of the hook.
func (e env) hooked() env {
	out := env{api.EnvLDPreload: hookLib}
	for k, v := range e {
		out[k] = v
	}
	return out
}

func command(e env, args ...string) *exec.Cmd {
	cmd := exec.Command(hooktest, args...)
	cmd.Env = e.list()
	return cmd
}

// run runs the test driver and parses its key=value output.
func run(t testing.TB, e env, args ...string) map[string]string {
	t.Helper()
	cmd := command(e, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hooktest %v: %v\nstdout: %s\nstderr: %s", args, err, out, stderr.String())
	}
	return parseKV(string(out))
}

func parseKV(s string) map[string]string {
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if k, v, ok := strings.Cut(f, "="); ok {
				kv[k] = v
			}
		}
	}
	return kv
}

func num(t testing.TB, kv map[string]string, key string) int64 {
	t.Helper()
	v, ok := kv[key]
	if !ok {
		t.Fatalf("no %q in %v", key, kv)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", key, v, err)
	}
	return n
}

func float(t testing.TB, kv map[string]string, key string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(kv[key], 64)
	if err != nil {
		t.Fatalf("%s=%q: %v (all: %v)", key, kv[key], err, kv)
	}
	return f
}

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)
