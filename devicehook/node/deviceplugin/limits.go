package deviceplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// The trusted limits file (DESIGN.md "Trust boundary"): per container, a
// root-owned file, mode 0444, in a root-owned directory no container
// mounts, bind-mounted read-only at /etc/gpupack/limits. One KEY=VALUE per
// line, '#' comment lines, at most 64 KiB. devicehook reads it and then
// ignores the same keys (and CUDA_DISABLE_CONTROL) in the environment.
const (
	LimitsMountPath = "/etc/gpupack/limits"
	LimitsFileName  = "limits"
	LimitsMaxBytes  = 64 << 10
	// DefaultLimitsDir is the host root of the per-container limits files.
	DefaultLimitsDir = "/var/lib/gpupack/limits"
)

// ContextReserve is the per-model GPUPACK_CONTEXT_RESERVE table: the memory
// one CUDA context costs, charged by the hook against the limit. Keys are
// substrings of the NVML model name; "*" is the default.
type ContextReserve map[string]string

// DefaultContextReserve: H100/H200 contexts take about 500 MiB with the
// CUDA 12 runtime loaded (lazy loading on); other models get the same
// figure until measured. Override with --context-reserve.
func DefaultContextReserve() ContextReserve {
	return ContextReserve{"H100": "512m", "H200": "512m", "*": "512m"}
}

var sizeRe = regexp.MustCompile(`^[0-9]{1,15}[kmgKMG]?$`)

// ParseContextReserve reads "H100=512m,H200=512m,*=512m".
func ParseContextReserve(s string) (ContextReserve, error) {
	out := ContextReserve{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || !sizeRe.MatchString(v) || strings.ContainsAny(k, "\n\r#=") {
			return nil, fmt.Errorf("context reserve %q: want <model substring or *>=<bytes with k/m/g suffix>", kv)
		}
		out[k] = strings.ToLower(v)
	}
	return out, nil
}

// String renders the table sorted (flag default, docs).
func (c ContextReserve) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + c[k]
	}
	return strings.Join(parts, ",")
}

// For returns the reserve of a model: the longest key that is a substring
// of it, else "*", else "".
func (c ContextReserve) For(model string) string {
	best, v := "", c["*"]
	for k, val := range c {
		if k != "*" && strings.Contains(model, k) && len(k) > len(best) {
			best, v = k, val
		}
	}
	return v
}

// LimitsKeyDeviceUUID is the limits-file key (file only, never an
// environment variable) naming the GPU that limits index i applies to:
// GPUPACK_DEVICE_UUID_<i>=GPU-…. With it the hook maps each CUDA device to
// an index by the UUID the driver reports (cuDeviceGetUuid), so the
// tenant's CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER cannot make two
// processes charge one GPU under two indices (issue 14 finding 7). A CUDA
// device whose UUID is in no such line gets no GPU memory.
const LimitsKeyDeviceUUID = "GPUPACK_DEVICE_UUID"

// deviceUUIDRe is the form the hook parses (devicehook/src/config.c,
// gp_parse_uuid): NVML's GPU and (new-style) MIG UUIDs.
var deviceUUIDRe = regexp.MustCompile(`^(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// ValidDeviceUUID reports whether the hook can read uuid as a device UUID.
func ValidDeviceUUID(uuid string) bool { return deviceUUIDRe.MatchString(uuid) }

// LimitsGPU is one GPU of the container: limits index = position.
type LimitsGPU struct {
	UUID      string // the GPU (GPUPACK_DEVICE_UUID_<i>); "" = unknown
	MemoryMiB int64  // 0 = no memory limit (a whole GPU)
	Cores     int32  // SM percent; 0 or 100 = no SM limit
}

// RenderLimits writes the file's content. Values come only from the plan
// and the node's configuration, never from the pod spec. Each GPU's UUID
// is written when every GPU has one the hook can read (and no two are the
// same); otherwise none is, and index i means CUDA device i, as before
// the UUID keys existed (a UUID missing for one index would refuse that
// GPU's memory).
func RenderLimits(gpus []LimitsGPU, reserve string) []byte {
	var b strings.Builder
	b.WriteString("# written by gpupack-node from the pod's GPUPlan binding; read-only\n")
	withUUIDs := len(gpus) > 0
	seen := map[string]bool{}
	for _, g := range gpus {
		key := strings.ToLower(g.UUID[min(4, len(g.UUID)):])
		if !ValidDeviceUUID(g.UUID) || seen[key] {
			withUUIDs = false
		}
		seen[key] = true
	}
	for i, g := range gpus {
		if withUUIDs {
			fmt.Fprintf(&b, "%s_%d=%s\n", LimitsKeyDeviceUUID, i, g.UUID)
		}
		if g.MemoryMiB > 0 {
			fmt.Fprintf(&b, "%s_%d=%dm\n", v1alpha1.EnvMemoryLimit, i, g.MemoryMiB)
		}
		if g.Cores > 0 && g.Cores < 100 {
			fmt.Fprintf(&b, "%s_%d=%d\n", v1alpha1.EnvSMLimit, i, g.Cores)
		}
	}
	fmt.Fprintf(&b, "%s=%s\n", v1alpha1.EnvSharedCache, filepath.Join(CacheMountPath, CacheFileName))
	if reserve != "" {
		fmt.Fprintf(&b, "%s=%s\n", v1alpha1.EnvContextReserve, reserve)
	}
	return []byte(b.String())
}

// ParseLimits reads a limits file back (tests, the demo, and a check that
// what was written is what the hook will read). It accepts exactly the
// contract: KEY=VALUE lines, '#' comments, blank lines, known keys, each
// once, at most LimitsMaxBytes.
func ParseLimits(b []byte) (map[string]string, error) {
	if len(b) > LimitsMaxBytes {
		return nil, fmt.Errorf("limits file: %d bytes, more than %d", len(b), LimitsMaxBytes)
	}
	out := map[string]string{}
	for n, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !knownLimitKey(k) || v == "" || strings.ContainsAny(v, "\r\x00") {
			return nil, fmt.Errorf("limits file line %d: %q is not KEY=VALUE with a known key", n+1, line)
		}
		if strings.HasPrefix(k, LimitsKeyDeviceUUID+"_") && !ValidDeviceUUID(v) {
			return nil, fmt.Errorf("limits file line %d: %s=%q is not a GPU UUID the hook reads", n+1, k, v)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("limits file line %d: %s given twice", n+1, k)
		}
		out[k] = v
	}
	return out, nil
}

func knownLimitKey(k string) bool {
	switch k {
	case v1alpha1.EnvSharedCache, v1alpha1.EnvContextReserve:
		return true
	}
	for _, p := range []string{v1alpha1.EnvMemoryLimit + "_", v1alpha1.EnvSMLimit + "_", LimitsKeyDeviceUUID + "_"} {
		if i, ok := strings.CutPrefix(k, p); ok {
			n, err := strconv.Atoi(i)
			return err == nil && n >= 0 && n < 64 && strconv.Itoa(n) == i
		}
	}
	return false
}

// LimitsFile is the host path of one container's limits file.
func LimitsFile(root string, uid types.UID, container string) string {
	return filepath.Join(root, string(uid), container, LimitsFileName)
}

// safeName rejects path components an API object could smuggle in.
func safeName(s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("unsafe path component %q", s)
	}
	return nil
}

// WriteLimits writes the limits file of one container under root, replacing
// it atomically: root, <root>/<uid> and <root>/<uid>/<container> are
// directories (never symlinks) of mode 0755, the file 0444. Nothing in root
// is mounted writable into any container, so only this process (root)
// writes there.
func WriteLimits(root string, uid types.UID, container string, content []byte) (string, error) {
	if len(content) > LimitsMaxBytes {
		return "", fmt.Errorf("limits file for %s/%s: %d bytes, more than %d", uid, container, len(content), LimitsMaxBytes)
	}
	if err := safeName(string(uid)); err != nil {
		return "", err
	}
	if err := safeName(container); err != nil {
		return "", err
	}
	dir := root
	for _, part := range []string{"", string(uid), container} {
		dir = filepath.Join(dir, part)
		if err := ensureDir(dir); err != nil {
			return "", err
		}
	}
	path := filepath.Join(dir, LimitsFileName)
	tmp, err := os.CreateTemp(dir, ".limits-*")
	if err != nil {
		return "", fmt.Errorf("limits file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(content); err != nil {
		tmp.Close()
		return "", fmt.Errorf("limits file: %w", err)
	}
	if err := tmp.Chmod(0o444); err != nil {
		tmp.Close()
		return "", fmt.Errorf("limits file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("limits file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("limits file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("limits file: %w", err)
	}
	return path, nil
}

// ensureDir makes dir a real directory of mode 0755 (a symlink or a file in
// its place is an error, not something to follow).
func ensureDir(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("limits dir: %w", err)
		}
		fi, err = os.Lstat(dir)
	}
	if err != nil {
		return fmt.Errorf("limits dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("limits dir %s is not a directory (%s)", dir, fi.Mode().Type())
	}
	if fi.Mode().Perm() != 0o755 {
		if err := os.Chmod(dir, 0o755); err != nil {
			return fmt.Errorf("limits dir: %w", err)
		}
	}
	return nil
}
