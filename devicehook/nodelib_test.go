package devicehook

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	api "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/devicehook/node/installer"
)

// Issue 14 finding 4: a symlink in the image plus a volume can hide
// /etc/gpupack/limits. The library gpupack-node installed (its VERSION
// stamp beside it, in the read-only hook folder) then refuses every
// allocation instead of reading the tenant's environment; any other copy
// (HAMi mode, a tenant's own) keeps the environment contract.

// nodeHookDir installs the built library as gpupack-node does and returns
// the installed library's path.
func nodeHookDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "gpupack")
	if _, err := installer.Install(hookLib, dir, "test"); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, api.HookLibraryName)
}

func TestInstalledByNodeMarker(t *testing.T) {
	node := filepath.Dir(nodeHookDir(t))
	plain := t.TempDir()
	covered := t.TempDir()
	if err := os.Mkdir(filepath.Join(covered, installer.VersionFile), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		lib  string
		want string
	}{
		{filepath.Join(node, api.HookLibraryName), "node=1"},
		{filepath.Join(plain, api.HookLibraryName), "node=0"},
		{filepath.Join(covered, api.HookLibraryName), "node=1"}, // a volume over the stamp leaves a mount point
		{filepath.Join(plain, "no", "such", api.HookLibraryName), "node=0"},
		{"", "node=0"},
	}
	for _, c := range cases {
		out, err := exec.Command(filepath.Join(buildDir, "envparse"), "marker", c.lib).CombinedOutput()
		if err != nil {
			t.Fatalf("envparse marker %q: %v: %s", c.lib, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Errorf("marker for %q: got %s, want %s", c.lib, got, c.want)
		}
	}
}

// The real library, loaded from a gpupack-node hook folder, with no
// limits file and a tenant's environment limit: nothing is allocated (not
// even a context: `ctxloop 0` reports the chunks it got, where `grab`
// would stop at the refused context), one log line says why. The same library from another folder keeps the
// environment's limit; with the file, the file's limit holds.
func TestNodeLibraryFailsClosedWithoutLimitsFile(t *testing.T) {
	const chunk = 4 * mib
	nodeLib := nodeHookDir(t)
	tenant := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "32m"}
	withLib := func(lib string) env {
		e := env{api.EnvLDPreload: lib}
		for k, v := range tenant {
			e[k] = v
		}
		return e
	}
	check := func(t *testing.T, kv map[string]string, logs string, want int64, what string) {
		t.Helper()
		if n := num(t, kv, "n"); n*chunk != want {
			t.Errorf("%s: got %d MiB, want %d MiB\n%s", what, n*chunk/mib, want/mib, logs)
		}
	}
	// Without a namespace, where this host has no limits file.
	if _, err := os.Lstat(limitsPath); os.IsNotExist(err) {
		for _, mode := range []string{"direct", "gpa"} {
			cmd := command(withLib(nodeLib), mode, "ctxloop", "0", fmt.Sprint(chunk))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("hooktest: %v: %s", err, stderr.String())
			}
			check(t, parseKV(string(out)), stderr.String(), 0, mode+": node library, no limits file")
			if n := strings.Count(stderr.String(), "every GPU memory allocation is refused"); n != 1 {
				t.Errorf("%s: want one log line saying allocations are refused, got:\n%s", mode, stderr.String())
			}
			kv := run(t, withLib(hookLib), mode, "ctxloop", "0", fmt.Sprint(chunk))
			check(t, kv, "", 32*mib, mode+": another copy of the library, no limits file (env)")
		}
	}
	// In a private mount namespace: the path removed, then the file there.
	kv, logs := inLimitsNamespace(t, nil, withLib(nodeLib), "direct", "ctxloop", "0", fmt.Sprint(chunk))
	check(t, kv, logs, 0, "node library, /etc/gpupack removed")
	if strings.Count(logs, "every GPU memory allocation is refused") != 1 {
		t.Errorf("want one log line saying allocations are refused, got:\n%s", logs)
	}
	kv, logs = inLimitsNamespace(t, nil, withLib(hookLib), "direct", "ctxloop", "0", fmt.Sprint(chunk))
	check(t, kv, logs, 32*mib, "another copy, /etc/gpupack removed (env)")
	file := "CUDA_DEVICE_MEMORY_LIMIT=64m\n"
	kv, logs = inLimitsNamespace(t, &file, withLib(nodeLib), "gpa", "ctxloop", "0", fmt.Sprint(chunk))
	check(t, kv, logs, 64*mib, "node library with its limits file")
}

// A tenant that preloads its own copy of the library (image ENV
// LD_PRELOAD; the node's folder is readable, so the copy is byte for byte
// the node's) from a folder without the stamp, in a container that has
// the node's hook folder mounted at its default path: still a gpupack
// node, so no limits file still refuses everything.
func TestOwnCopyOnANodeFailsClosedWithoutLimitsFile(t *testing.T) {
	const chunk = 4 * mib
	if api.DefaultHookHostPath != "/usr/local/gpupack" {
		t.Fatalf("the hook's GP_NODE_HOOK_DIR is /usr/local/gpupack but DefaultHookHostPath is %s", api.DefaultHookHostPath)
	}
	e := env{api.EnvLDPreload: hookLib, "FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "32m"}
	// The node's folder at its default path, in the namespace only.
	mountNode := fmt.Sprintf(`mount -t tmpfs tmpfs %[1]s
mkdir -p %[2]s
echo "test sha256:0" > %[2]s/%[3]s
`, filepath.Dir(api.DefaultHookHostPath), api.DefaultHookHostPath, installer.VersionFile)
	kv, logs := inLimitsNamespaceSetup(t, nil, mountNode, e, "direct", "ctxloop", "0", fmt.Sprint(chunk))
	if n := num(t, kv, "n"); n != 0 {
		t.Errorf("own copy, node folder mounted, no limits file: got %d MiB, want 0\n%s", n*chunk/mib, logs)
	}
	if strings.Count(logs, "every GPU memory allocation is refused") != 1 {
		t.Errorf("want one log line saying allocations are refused, got:\n%s", logs)
	}
	file := "CUDA_DEVICE_MEMORY_LIMIT=64m\n"
	kv, logs = inLimitsNamespaceSetup(t, &file, mountNode, e, "direct", "ctxloop", "0", fmt.Sprint(chunk))
	if n := num(t, kv, "n"); n*chunk != 64*mib {
		t.Errorf("own copy, node folder mounted, limits file: got %d MiB, want the file's 64\n%s", n*chunk/mib, logs)
	}
}
