package devicehook

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupack/gpupack/test/testenv"
)

// The trusted limits file, /etc/gpupack/limits: its parser against an
// independent Go reading of the contract (docs/devicehook.md), and the
// real library in a private mount namespace with the file bind-mounted
// read-only and a hostile environment.

const limitsPath = "/etc/gpupack/limits"

var (
	fileParserOnce sync.Once
	theFileParser  *parser
	fileParserErr  error
)

func limitsParser() (*parser, error) {
	fileParserOnce.Do(func() {
		cmd := exec.Command(filepath.Join(buildDir, "envparse-asan"), "file")
		cmd.Env = append(env{}.list(), "ASAN_OPTIONS=detect_leaks=0:halt_on_error=1", "UBSAN_OPTIONS=halt_on_error=1")
		var in io.WriteCloser
		var out io.ReadCloser
		if in, fileParserErr = cmd.StdinPipe(); fileParserErr != nil {
			return
		}
		if out, fileParserErr = cmd.StdoutPipe(); fileParserErr != nil {
			return
		}
		fileParserErr = cmd.Start()
		theFileParser = &parser{in: in, out: bufio.NewReader(out)}
	})
	return theFileParser, fileParserErr
}

// parseFile returns the C parser's result line for one file's text.
func (p *parser) parseFile(text string) (string, error) {
	var hdr [4]byte
	binary.LittleEndian.PutUint32(hdr[:], uint32(len(text)))
	if _, err := p.in.Write(append(hdr[:], text...)); err != nil {
		return "", err
	}
	for {
		line, err := p.out.ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("parser died (sanitizer report?): %v: %q", err, line)
		}
		if strings.HasPrefix(line, "mem=") {
			return strings.TrimSpace(line), nil
		}
	}
}

const closedLine = "mem=0,0 sm=0,0 reserve=0 period=100 log=1 disabled=0 file=1 closed=1 cache=-"

// refDevKey: -1 another key, -2 the generic key, -3 a bad device index, else i.
func refDevKey(k, prefix string) int {
	if !strings.HasPrefix(k, prefix) {
		return -1
	}
	rest := k[len(prefix):]
	if rest == "" {
		return -2
	}
	if rest[0] != '_' {
		return -1
	}
	rest = rest[1:]
	if rest == "" || strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }) >= 0 ||
		(rest[0] == '0' && len(rest) > 1) || len(rest) > 2 {
		return -3
	}
	i, _ := strconv.Atoi(rest)
	if i >= 16 {
		return -3
	}
	return i
}

// refLimitsFile is the contract: the line the parser must print for text.
func refLimitsFile(text string) string {
	if len(text) > 64*1024 || strings.ContainsRune(text, 0) {
		return closedLine
	}
	const blanks = " \t\r\v\f"
	memGeneric, smGeneric := none, 0
	memDev, smDev := map[int]uint64{}, map[int]int{}
	seen := map[string]bool{}
	reserve, logLevel, cache := uint64(0), 1, "-"
	uuids := map[int]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.Trim(line, blanks)
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return closedLine
		}
		k, v = strings.TrimRight(k, blanks), strings.TrimLeft(v, blanks)
		if k == "" {
			return closedLine
		}
		mi, si := refDevKey(k, "CUDA_DEVICE_MEMORY_LIMIT"), refDevKey(k, "CUDA_DEVICE_SM_LIMIT")
		ui := refDevKey(k, "GPUPACK_DEVICE_UUID")
		known := mi != -1 || si != -1 || ui != -1 || k == "CUDA_DEVICE_MEMORY_SHARED_CACHE" || k == "GPUPACK_CONTEXT_RESERVE" ||
			k == "LIBCUDA_LOG_LEVEL"
		if !known || len(k) >= 128 {
			continue // unknown keys are ignored
		}
		if len(v) >= 1024 || seen[k] {
			return closedLine
		}
		seen[k] = true
		switch {
		case mi != -1:
			b, ok := refSize(v)
			if mi == -3 || !ok {
				return closedLine
			}
			if b == 0 {
				b = none
			}
			if mi == -2 {
				memGeneric = b
			} else {
				memDev[mi] = b
			}
		case si != -1:
			p, ok := refPercent(v)
			if si == -3 || !ok {
				return closedLine
			}
			if si == -2 {
				smGeneric = p
			} else {
				smDev[si] = p
			}
		case ui != -1:
			u, ok := refUUID(v)
			if ui < 0 || !ok {
				return closedLine
			}
			for _, other := range uuids {
				if other == u {
					return closedLine // one GPU for two indices
				}
			}
			uuids[ui] = u
		case k == "CUDA_DEVICE_MEMORY_SHARED_CACHE":
			if !strings.HasPrefix(v, "/") {
				return closedLine
			}
			cache = v
		case k == "GPUPACK_CONTEXT_RESERVE":
			if reserve, ok = refSize(v); !ok {
				return closedLine
			}
		case k == "LIBCUDA_LOG_LEVEL":
			if logLevel, ok = refPercent(v); !ok || logLevel > 4 {
				return closedLine
			}
		}
	}
	mem := []uint64{memGeneric, memGeneric}
	sm := []int{smGeneric, smGeneric}
	for i := range 2 {
		if b, ok := memDev[i]; ok {
			mem[i] = b
		}
		if p, ok := smDev[i]; ok {
			sm[i] = p
		}
		if sm[i] >= 100 {
			sm[i] = 0
		}
	}
	lim := func(b uint64) string {
		if b == none {
			return "none"
		}
		return strconv.FormatUint(b, 10)
	}
	line := fmt.Sprintf("mem=%s,%s sm=%d,%d reserve=%d period=100 log=%d disabled=0 file=1 closed=0 cache=%s",
		lim(mem[0]), lim(mem[1]), sm[0], sm[1], reserve, logLevel, cache)
	if len(uuids) > 0 {
		var parts []string
		for i := range 16 {
			if u, ok := uuids[i]; ok {
				parts = append(parts, fmt.Sprintf("%d:%s", i, u))
			}
		}
		line += " uuids=" + strings.Join(parts, ",")
	}
	return line
}

// refUUID reads GPUPACK_DEVICE_UUID_<i>'s value: "GPU-" or "MIG-", then
// 8-4-4-4-12 hex digits; the 16 bytes in lower-case hex.
func refUUID(v string) (string, bool) {
	rest, ok := strings.CutPrefix(v, "GPU-")
	if !ok {
		if rest, ok = strings.CutPrefix(v, "MIG-"); !ok {
			return "", false
		}
	}
	groups := strings.Split(rest, "-")
	if len(groups) != 5 {
		return "", false
	}
	var hex strings.Builder
	for i, n := range []int{8, 4, 4, 4, 12} {
		if len(groups[i]) != n || strings.IndexFunc(groups[i], func(r rune) bool {
			return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F')
		}) >= 0 {
			return "", false
		}
		hex.WriteString(strings.ToLower(groups[i]))
	}
	return hex.String(), true
}

func checkLimitsFile(t *testing.T, text string) {
	t.Helper()
	p, err := limitsParser()
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.parseFile(text)
	if err != nil {
		t.Fatal(err)
	}
	if want := refLimitsFile(text); got != want {
		t.Errorf("limits file %q:\n got  %s\n want %s", text, got, want)
	}
}

var limitsFileCases = []struct{ name, text string }{
	{"empty", ""},
	{"typical", "# written by gpupack-node\nCUDA_DEVICE_MEMORY_LIMIT_0=20480m\nCUDA_DEVICE_SM_LIMIT_0=30\n" +
		"CUDA_DEVICE_MEMORY_SHARED_CACHE=/var/run/gpupack/cache/c1\nGPUPACK_CONTEXT_RESERVE=512m\n"},
	{"blanks trimmed, CRLF, no final newline", "  CUDA_DEVICE_MEMORY_LIMIT = 4g \r\n\t\n  # x=y\r\nLIBCUDA_LOG_LEVEL=0"},
	{"per device beats generic in any order", "CUDA_DEVICE_MEMORY_LIMIT_1=1g\nCUDA_DEVICE_MEMORY_LIMIT=2g\nCUDA_DEVICE_SM_LIMIT=100\n"},
	{"zero means unlimited", "CUDA_DEVICE_MEMORY_LIMIT=0\n"},
	{"unknown keys ignored", "GPUPACK_FUTURE=1\nCUDA_DEVICE_MEMORY_LIMITS=x\nCUDA_DEVICE_MEMORY_LIMIT=64m\n"},
	{"unknown keys may repeat", "X=1\nX=2\nCUDA_DEVICE_MEMORY_LIMIT=64m\n"},
	{"line without =", "CUDA_DEVICE_MEMORY_LIMIT=64m\nCUDA_DISABLE_CONTROL\n"},
	{"empty key", "=64m\n"},
	{"bad size", "CUDA_DEVICE_MEMORY_LIMIT=64 MiB\n"},
	{"empty value", "CUDA_DEVICE_MEMORY_LIMIT=\n"},
	{"negative", "CUDA_DEVICE_MEMORY_LIMIT=-1\n"},
	{"overflow", "CUDA_DEVICE_MEMORY_LIMIT=18446744073709551615k\n"},
	{"sm over 100", "CUDA_DEVICE_SM_LIMIT=101\n"},
	{"device index too big", "CUDA_DEVICE_MEMORY_LIMIT_16=1g\n"},
	{"device index not canonical", "CUDA_DEVICE_SM_LIMIT_01=30\n"},
	{"duplicate", "CUDA_DEVICE_MEMORY_LIMIT=64m\nCUDA_DEVICE_MEMORY_LIMIT=64g\n"},
	{"duplicate per device", "CUDA_DEVICE_MEMORY_LIMIT_0=64m\nCUDA_DEVICE_MEMORY_LIMIT_0 = 64m\n"},
	{"relative cache path", "CUDA_DEVICE_MEMORY_SHARED_CACHE=cache\n"},
	{"bad log level", "LIBCUDA_LOG_LEVEL=5\n"},
	{"NUL byte", "CUDA_DEVICE_MEMORY_LIMIT=64m\x00\n"},
	{"disable control is not a file key", "CUDA_DISABLE_CONTROL=1\nCUDA_DEVICE_MEMORY_LIMIT=64m\n"},
	{"too big", "CUDA_DEVICE_MEMORY_LIMIT=64m\n" + strings.Repeat("#", 64*1024)},
	{"exactly 64 KiB", "CUDA_DEVICE_MEMORY_LIMIT=64m\n" + strings.Repeat("#", 64*1024-29)},
	{"device UUIDs", "CUDA_DEVICE_MEMORY_LIMIT_0=1g\nGPUPACK_DEVICE_UUID_0=GPU-fa4e0000-0000-4000-8000-000000000000\n" +
		"GPUPACK_DEVICE_UUID_1 = MIG-FA4E0000-0000-4000-8000-0000000000Ab\n"},
	{"device UUID for a high index", "GPUPACK_DEVICE_UUID_15=GPU-fa4e0000-0000-4000-8000-00000000000f\n"},
	{"device UUID without an index", "GPUPACK_DEVICE_UUID=GPU-fa4e0000-0000-4000-8000-000000000000\n"},
	{"device UUID index too big", "GPUPACK_DEVICE_UUID_16=GPU-fa4e0000-0000-4000-8000-000000000000\n"},
	{"device UUID twice", "GPUPACK_DEVICE_UUID_0=GPU-fa4e0000-0000-4000-8000-000000000000\n" +
		"GPUPACK_DEVICE_UUID_0=GPU-fa4e0000-0000-4000-8000-000000000001\n"},
	{"one GPU for two indices", "GPUPACK_DEVICE_UUID_0=GPU-fa4e0000-0000-4000-8000-000000000000\n" +
		"GPUPACK_DEVICE_UUID_1=MIG-fa4e0000-0000-4000-8000-000000000000\n"},
	{"device UUID too short", "GPUPACK_DEVICE_UUID_0=GPU-fa4e0000-0000-4000-8000-00000000000\n"},
	{"device UUID too long", "GPUPACK_DEVICE_UUID_0=GPU-fa4e0000-0000-4000-8000-0000000000000\n"},
	{"device UUID not hex", "GPUPACK_DEVICE_UUID_0=GPU-fa4e0000-0000-4000-8000-00000000000g\n"},
	{"device UUID no prefix", "GPUPACK_DEVICE_UUID_0=fa4e0000-0000-4000-8000-000000000000\n"},
	{"device UUID old MIG form", "GPUPACK_DEVICE_UUID_0=MIG-GPU-fa4e0000-0000-4000-8000-000000000000/1/0\n"},
	{"device UUID dashes moved", "GPUPACK_DEVICE_UUID_0=GPU-fa4e000-00000-4000-8000-000000000000\n"},
}

func TestLimitsFileContract(t *testing.T) {
	for _, c := range limitsFileCases {
		t.Run(c.name, func(t *testing.T) { checkLimitsFile(t, c.text) })
	}
	// The reference itself, on the cases whose answer is plain.
	for text, closed := range map[string]bool{"CUDA_DEVICE_MEMORY_LIMIT=64m\n": false, "x\n": true,
		"CUDA_DEVICE_MEMORY_LIMIT=1\nCUDA_DEVICE_MEMORY_LIMIT=1\n": true} {
		if got := refLimitsFile(text) == closedLine; got != closed {
			t.Errorf("reference on %q: closed=%v, want %v", text, got, closed)
		}
	}
}

func FuzzLimitsFile(f *testing.F) {
	for _, c := range limitsFileCases {
		if len(c.text) < 4096 {
			f.Add(c.text)
		}
	}
	f.Fuzz(func(t *testing.T, text string) { checkLimitsFile(t, text) })
}

// loadLimits runs the whole rule (gp_config_load) on a file at path;
// extra "node" loads it as gpupack-node's own copy of the library.
func loadLimits(t *testing.T, path string, e env, extra ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(buildDir, "envparse"), append([]string{"load", path}, extra...)...)
	cmd.Env = e.list()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("envparse load %s: %v: %s", path, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], strings.Join(lines[:len(lines)-1], "\n")
}

// What exists at the path decides: a file (its limits alone, the
// environment ignored), nothing (the environment), anything else that
// cannot be read as a small regular file (refuse everything, one line).
func TestLimitsFileLoading(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o444); err != nil {
			t.Fatal(err)
		}
		return p
	}
	symlink := func(target, name string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := exec.Command("mkfifo", fifo).Run(); err != nil {
		t.Fatal(err)
	}
	hostile := env{"CUDA_DISABLE_CONTROL": "1", "CUDA_DEVICE_MEMORY_LIMIT": "0", "CUDA_DEVICE_MEMORY_LIMIT_0": "64g",
		"CUDA_DEVICE_SM_LIMIT": "0", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/mine", "GPUPACK_CONTEXT_RESERVE": "0",
		"GPUPACK_SM_PERIOD_MS": "10000"}
	cases := []struct {
		name, path, want string
		loud             bool
	}{
		{"file wins over a hostile environment", write("ok", "CUDA_DEVICE_MEMORY_LIMIT=64m\nCUDA_DEVICE_SM_LIMIT=30\n"),
			"mem=67108864,67108864 sm=30,30 reserve=0 period=100 log=1 disabled=0 file=1 closed=0 cache=-", false},
		{"absent: the environment", filepath.Join(dir, "absent"),
			"mem=68719476736,none sm=0,0 reserve=0 period=10000 log=1 disabled=1 file=0 closed=0 cache=/tmp/mine", false},
		{"a path through a file: absent", filepath.Join(write("notdir", ""), "limits"),
			"mem=68719476736,none sm=0,0 reserve=0 period=10000 log=1 disabled=1 file=0 closed=0 cache=/tmp/mine", false},
		{"unparsable", write("bad", "CUDA_DEVICE_MEMORY_LIMIT=64m\nCUDA_DEVICE_MEMORY_LIMIT=64g\n"), closedLine, true},
		{"empty file: no limits, env still ignored", write("empty", ""),
			"mem=none,none sm=0,0 reserve=0 period=100 log=1 disabled=0 file=1 closed=0 cache=-", false},
		{"a directory", dir, closedLine, true},
		{"a FIFO (must not block)", fifo, closedLine, true},
		{"over 64 KiB", write("big", strings.Repeat("# padding\n", 7000)), closedLine, true},
		// Issue 15 H5(a): a symlink at the path or above it is not the
		// node's file (the tenant's image can plant either).
		{"a symlink to a good file", symlink(write("target", "CUDA_DEVICE_MEMORY_LIMIT=64g\n"), "link"), closedLine, true},
		{"a dangling symlink", symlink(filepath.Join(dir, "nowhere"), "dangling"), closedLine, true},
		{"a file through a symlinked folder", filepath.Join(symlink(dir, "linkdir"), "ok"), closedLine, true},
	}
	// On gpupack-node's own copy of the library a missing file is a
	// hidden one (issue 14 finding 4): refuse, never the environment.
	fileLine := "mem=67108864,67108864 sm=30,30 reserve=0 period=100 log=1 disabled=0 file=1 closed=0 cache=-"
	nodeCases := []struct {
		name, path, want string
		loud             bool
	}{
		{"node: absent fails closed", filepath.Join(dir, "absent"), closedLine, true},
		{"node: a path through a file fails closed", filepath.Join(write("notdir2", ""), "limits"), closedLine, true},
		{"node: the file's limits", write("ok2", "CUDA_DEVICE_MEMORY_LIMIT=64m\nCUDA_DEVICE_SM_LIMIT=30\n"), fileLine, false},
		{"node: unparsable fails closed", write("bad2", "x\n"), closedLine, true},
	}
	for _, c := range nodeCases {
		t.Run(c.name, func(t *testing.T) {
			got, logs := loadLimits(t, c.path, hostile, "node")
			if got != c.want {
				t.Errorf("got  %s\nwant %s\nlogs: %s", got, c.want, logs)
			}
			if n := strings.Count(logs, " ERROR] "); c.loud && (n != 1 || !strings.Contains(logs, "every GPU memory allocation is refused")) {
				t.Errorf("want exactly one ERROR line saying allocations are refused, got:\n%s", logs)
			} else if !c.loud && n != 0 {
				t.Errorf("want no ERROR line, got:\n%s", logs)
			}
		})
	}
	// The library requires a read-only mount ("ro"); the test's temp
	// folder is writable, as a file the container wrote would be.
	t.Run("ro: a file on a writable mount fails closed", func(t *testing.T) {
		got, logs := loadLimits(t, write("ok3", "CUDA_DEVICE_MEMORY_LIMIT=64m\n"), hostile, "ro")
		if got != closedLine || !strings.Contains(logs, "is not on a read-only mount") {
			t.Errorf("got  %s\nwant %s\nlogs: %s", got, closedLine, logs)
		}
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, logs := loadLimits(t, c.path, hostile)
			if got != c.want {
				t.Errorf("got  %s\nwant %s\nlogs: %s", got, c.want, logs)
			}
			if n := strings.Count(logs, " ERROR] "); c.loud && (n != 1 || !strings.Contains(logs, "every GPU memory allocation is refused")) {
				t.Errorf("want exactly one ERROR line saying allocations are refused, got:\n%s", logs)
			} else if !c.loud && n != 0 {
				t.Errorf("want no ERROR line, got:\n%s", logs)
			}
		})
	}
}

// inLimitsNamespace runs the test driver in a private mount namespace in
// which text is a read-only file at /etc/gpupack/limits (nil: no such
// path), with the given environment. It returns the driver's output.
func inLimitsNamespace(t *testing.T, text *string, e env, args ...string) (map[string]string, string) {
	t.Helper()
	return inLimitsNamespaceSetup(t, text, "", e, args...)
}

// inLimitsNamespaceSetup is inLimitsNamespace with a shell snippet run
// first inside the namespace (as its root).
func inLimitsNamespaceSetup(t *testing.T, text *string, setup string, e env, args ...string) (map[string]string, string) {
	t.Helper()
	testenvUnshare(t)
	dir := t.TempDir()
	for _, d := range []string{"u", "w"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mountFile := ""
	if text != nil {
		src := filepath.Join(dir, "limits")
		if err := os.WriteFile(src, []byte(*text), 0o444); err != nil {
			t.Fatal(err)
		}
		mountFile = fmt.Sprintf(`mkdir -p /etc/gpupack
touch /etc/gpupack/limits
mount --bind %[1]s /etc/gpupack/limits
mount -o remount,bind,ro /etc/gpupack/limits
if echo x >> /etc/gpupack/limits 2>/dev/null; then echo "limits file is writable" >&2; exit 97; fi
`, src)
	}
	script := fmt.Sprintf(`set -e
mount -t overlay overlay -o lowerdir=/etc,upperdir=%[1]s/u,workdir=%[1]s/w /etc
rm -rf /etc/gpupack
%[2]s
%[4]s
exec %[3]s "$@"`, dir, mountFile, hooktest, setup)
	cmd := exec.Command("unshare", append([]string{"-m", "-r", "sh", "-c", script, "sh"}, args...)...)
	cmd.Env = e.list()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 97 {
			t.Fatalf("the bind mount is not read-only: %s", stderr.String())
		}
		t.Skipf("mount namespace setup not permitted here (%v: %s)", err, stderr.String())
	}
	return parseKV(string(out)), stderr.String()
}

func testenvUnshare(t *testing.T) {
	t.Helper()
	// Skips on a developer's machine without it, fails under CI.
	testenv.Command(t, "unshare", "the trusted limits file is tested only in a private mount namespace")
	if err := exec.Command("unshare", "-m", "-r", "true").Run(); err != nil {
		t.Skipf("no unprivileged mount namespaces here (%v)", err)
	}
}

// The real library, /etc/gpupack/limits mounted read-only, a tenant that
// tries every environment trick: the file's limit holds exactly.
func TestTrustedLimitsFileBeatsHostileEnvironment(t *testing.T) {
	const chunk = 4 * mib
	file := "# gpupack-node\nCUDA_DEVICE_MEMORY_LIMIT=64m\n"
	hostile := []env{
		{"CUDA_DISABLE_CONTROL": "1"},
		{"CUDA_DEVICE_MEMORY_LIMIT": "0"},
		{"CUDA_DEVICE_MEMORY_LIMIT": "8g", "CUDA_DEVICE_MEMORY_LIMIT_0": "64g"},
		{"CUDA_DISABLE_CONTROL": "true", "CUDA_DEVICE_MEMORY_LIMIT": "0", "CUDA_DEVICE_MEMORY_LIMIT_0": "0",
			"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/dev/null"},
	}
	for i, h := range hostile {
		for _, mode := range []string{"direct", "gpa"} {
			t.Run(fmt.Sprintf("%d/%s", i, mode), func(t *testing.T) {
				e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib)}.hooked()
				for k, v := range h {
					e[k] = v
				}
				kv, logs := inLimitsNamespace(t, &file, e, mode, "grab", fmt.Sprint(chunk))
				if n := num(t, kv, "n"); n*chunk != 64*mib {
					t.Errorf("env %v: got %d MiB under the file's 64 MiB limit\n%s", h, n*chunk/mib, logs)
				}
			})
		}
	}
}

// A limits file that exists but is unparsable refuses every allocation
// and every context (a context holds device memory, 300 MiB on an H100,
// and is what a kernel launch needs: before, 200 contexts went through),
// whatever the environment says; an absent one leaves the env contract.
func TestTrustedLimitsFileFailsClosed(t *testing.T) {
	const chunk = 4 * mib
	bad := "CUDA_DEVICE_MEMORY_LIMIT=64m\nCUDA_DEVICE_MEMORY_LIMIT=64m\n"
	// A context whose memory NVML shows (300 MiB), and one it does not
	// (measured 0: no charge can refuse it, only closed mode itself).
	for _, ctxMem := range []int64{300 * mib, 0} {
		e := env{"FAKECUDA_MEM": fmt.Sprint(80 * gib), "CUDA_DISABLE_CONTROL": "1",
			"FAKECUDA_CTX_MEM": fmt.Sprint(ctxMem), "FAKECUDA_PID_OFFSET": "70000"}.hooked()
		kv, _ := inLimitsNamespace(t, &bad, e, "direct", "ctxloop", "200", fmt.Sprint(chunk))
		want := map[string]string{"primary_rc": "2", "created": "0", "create_rc": "2", "n": "0"}
		if d := cmp.Diff(want, kv); d != "" {
			t.Errorf("contexts of %d MiB: an unparsable limits file let contexts or memory through (-want +got):\n%s",
				ctxMem/mib, d)
		}
	}
	e := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DISABLE_CONTROL": "1"}.hooked()
	for _, mode := range []string{"direct", "gpa"} {
		kv, logs := inLimitsNamespace(t, &bad, e, mode, "ctxloop", "0", fmt.Sprint(chunk))
		if n := num(t, kv, "n"); n != 0 {
			t.Errorf("%s: an unparsable limits file let %d MiB through, want every allocation refused", mode, n*chunk/mib)
		}
		if strings.Count(logs, "every GPU memory allocation is refused") != 1 {
			t.Errorf("%s: want one clear log line, got:\n%s", mode, logs)
		}
	}
	// Issue 15 H5(a): the file on a writable bind mount (one the
	// container could have made or can rewrite) fails closed too.
	writable := "CUDA_DEVICE_MEMORY_LIMIT=64m\n"
	kv, logs := inLimitsNamespaceSetup(t, &writable, "mount -o remount,bind,rw /etc/gpupack/limits", e,
		"direct", "ctxloop", "0", fmt.Sprint(chunk))
	if d := cmp.Diff("0", kv["n"]); d != "" || !strings.Contains(logs, "is not on a read-only mount") {
		t.Errorf("a limits file on a writable mount was trusted (-want +got chunks):\n%s\nlogs: %s", d, logs)
	}
	// Absent: the environment, as on a node gpupack does not manage.
	envOnly := env{"FAKECUDA_MEM": fmt.Sprint(1 * gib), "CUDA_DEVICE_MEMORY_LIMIT": "32m"}.hooked()
	kv, _ = inLimitsNamespace(t, nil, envOnly, "direct", "grab", fmt.Sprint(chunk))
	if d := cmp.Diff("8", kv["n"]); d != "" {
		t.Errorf("without the file the env limit of 32 MiB should hold (-want +got chunks):\n%s", d)
	}
}
