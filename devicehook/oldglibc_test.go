package devicehook

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupack/gpupack/test/testenv"
)

// Issue 15 item 7: glibc before 2.34 has no dlsym@GLIBC_2.34, only the
// architecture's base version, and the hook that asked for 2.34 alone
// called a NULL dlsym (a segfault on aarch64 with glibc < 2.34). The
// stub oldglibc.so, preloaded before the hook, makes glibc's dlvsym
// answer NULL for dlsym@GLIBC_2.34, so the hook must take its fallback:
// GLIBC_2.2.5 natively on x86_64, GLIBC_2.17 on aarch64 (the hook, fake
// driver and test program cross-built, run under qemu-user). Either way
// the memory limit must hold exactly, through dlsym look-ups.
func TestDlsymFallbackBeforeGlibc234(t *testing.T) {
	check := func(t *testing.T, out []byte, err error) {
		t.Helper()
		s := string(out)
		if err != nil {
			t.Fatalf("hooktest under a glibc without dlsym@GLIBC_2.34: %v\n%s", err, s)
		}
		if strings.Contains(s, "cannot find glibc's dlsym") {
			t.Fatalf("the hook found no dlsym:\n%s", s)
		}
		kv := parseKV(s)
		// 16 chunks of 4 MiB under 64 MiB, then refused (2: OUT_OF_MEMORY)
		// without reaching the driver.
		if kv["n"] != "16" || kv["err"] != "2" || kv["reached"] != "0" {
			t.Errorf("the limit did not hold (want n=16 err=2 reached=0):\n%s", s)
		}
	}
	base := env{"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKECUDA_MEM": "1073741824"}
	t.Run("native", func(t *testing.T) {
		e := env{"LD_PRELOAD": filepath.Join(buildDir, "stub", "oldglibc.so") + " " + hookLib}
		for k, v := range base {
			e[k] = v
		}
		out, err := command(e, "dlsym", "family", "mem", "4194304").CombinedOutput()
		check(t, out, err)
	})
	t.Run("aarch64 under qemu", func(t *testing.T) {
		testenv.Command(t, "aarch64-linux-gnu-gcc", "the aarch64 dlsym fallback is tested with a cross-built hook")
		testenv.Command(t, "qemu-aarch64", "the aarch64 dlsym fallback is tested under qemu-user")
		b := filepath.Join(t.TempDir(), "aarch64")
		mk := exec.Command("make", "-s", "-C", filepath.Dir(buildDir), "CC=aarch64-linux-gnu-gcc", "B="+b, "cross")
		if out, err := mk.CombinedOutput(); err != nil {
			t.Fatalf("cross build: %v\n%s", err, out)
		}
		args := []string{"-L", "/usr/aarch64-linux-gnu",
			"-E", "LD_PRELOAD=" + filepath.Join(b, "stub", "oldglibc.so") + " " + filepath.Join(b, "libgpupack-hook.so"),
			"-E", "LD_LIBRARY_PATH=" + filepath.Join(b, "fake")}
		for k, v := range base {
			args = append(args, "-E", k+"="+v)
		}
		cmd := exec.Command("qemu-aarch64", append(args, filepath.Join(b, "hooktest"), "dlsym", "family", "mem", "4194304")...)
		cmd.Env = env{}.list()
		out, err := cmd.CombinedOutput()
		check(t, out, err)
	})
}
