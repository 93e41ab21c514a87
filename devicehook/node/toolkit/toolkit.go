// Package toolkit checks the NVIDIA container toolkit settings gpupack's
// device assignment relies on. gpupack-node hands a container its GPUs as
// CDI devices; that is a boundary only when the runtime does not also let a
// container pick GPUs itself through NVIDIA_VISIBLE_DEVICES (which any
// container, or its image's ENV, can set):
//
//	accept-nvidia-visible-devices-envvar-when-unprivileged = false   (the toolkit's default is true)
//	accept-nvidia-visible-devices-as-volume-mounts = false            (the default; some distributions set true)
//	[nvidia-container-runtime] mode = "cdi", or a CDI spec for nvidia.com/gpu
//	  in /etc/cdi or /var/run/cdi (the CRI injects the devices the plugin names)
//	[nvidia-container-runtime.modes.cdi] annotation-prefixes = []   (the default is ["cdi.k8s.io/"])
//
// Check is a pure function of the file contents; the agent reports the
// result as a node condition, an Event and a metric.
package toolkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Settings named in findings and the metric's "setting" label.
const (
	SettingConfig = "config"                                                 // the file is missing or unreadable
	SettingEnvvar = "accept-nvidia-visible-devices-envvar-when-unprivileged" // must be false
	SettingCDI    = "cdi"                                                    // CDI must be on
	// SettingVolumeMounts lets a container pick GPUs by mounting anything
	// at /var/run/nvidia-container-devices/<uuid|all> (an emptyDir will do):
	// it must not be true (the toolkit's default is false).
	SettingVolumeMounts = "accept-nvidia-visible-devices-as-volume-mounts"
	// SettingAnnotationPrefixes names the pod/container annotation prefixes
	// the runtime (in CDI mode) reads CDI device requests from. gpupack-node
	// assigns devices through the CRI's CDIDevices field only; with the
	// default ["cdi.k8s.io/"] a runtime that sees pod annotations would give
	// a pod gpupack never saw (no GPU resource) nvidia.com/gpu=all for an
	// annotation. It must be an empty array.
	SettingAnnotationPrefixes = "nvidia-container-runtime.modes.cdi.annotation-prefixes"
)

// Settings are every setting Check judges, in the order of its findings:
// the agent exports one gpupack_node_toolkit_unsafe series per entry.
var Settings = []string{SettingConfig, SettingEnvvar, SettingVolumeMounts, SettingCDI, SettingAnnotationPrefixes}

// MaxConfigBytes bounds the config read (it is a few KiB).
const MaxConfigBytes = 1 << 20

// Finding is one unsafe setting.
type Finding struct {
	Setting string
	Message string
}

// Result of a check.
type Result struct {
	Path     string
	Findings []Finding
}

// Safe reports whether nothing was found.
func (r Result) Safe() bool { return len(r.Findings) == 0 }

// Message joins the findings for a condition or an Event.
func (r Result) Message() string {
	if r.Safe() {
		return fmt.Sprintf("%s: NVIDIA_VISIBLE_DEVICES is ignored for unprivileged containers and CDI is on", r.Path)
	}
	var parts []string
	for _, f := range r.Findings {
		parts = append(parts, f.Message)
	}
	return r.Path + ": " + strings.Join(parts, "; ")
}

// CDISpecDirs are where CDI specs are looked up (the CDI defaults).
var CDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// CheckFile reads path (and specDirs for CDI specs) and checks them.
func CheckFile(path string, specDirs []string) Result {
	b, err := readBounded(path)
	if err != nil {
		return Result{Path: path, Findings: []Finding{{SettingConfig, fmt.Sprintf("cannot read the toolkit config (%v); its defaults accept NVIDIA_VISIBLE_DEVICES from any container", err)}}}
	}
	return Check(path, b, HasGPUSpec(specDirs))
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > MaxConfigBytes {
		return nil, fmt.Errorf("not a regular file of at most %d bytes", MaxConfigBytes)
	}
	b := make([]byte, fi.Size())
	n, err := f.Read(b)
	if err != nil && n == 0 && fi.Size() > 0 {
		return nil, err
	}
	return b[:n], nil
}

// HasGPUSpec reports whether a CDI spec for kind nvidia.com/gpu exists.
func HasGPUSpec(dirs []string) bool {
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			ext := filepath.Ext(e.Name())
			if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
				continue
			}
			b, err := readBounded(filepath.Join(d, e.Name()))
			if err == nil && strings.Contains(string(b), "nvidia.com/gpu") {
				return true
			}
		}
	}
	return false
}

// Check checks the contents of config.toml; cdiSpec says whether a CDI
// spec for nvidia.com/gpu was found.
func Check(path string, content []byte, cdiSpec bool) Result {
	r := Result{Path: path}
	cfg, err := Parse(content)
	if err != nil {
		r.Findings = append(r.Findings, Finding{SettingConfig, fmt.Sprintf("cannot parse the toolkit config (%v)", err)})
		return r
	}
	switch v, ok := cfg[SettingEnvvar]; {
	case !ok:
		r.Findings = append(r.Findings, Finding{SettingEnvvar, SettingEnvvar + " is not set (the toolkit's default is true): any container can ask for every GPU with NVIDIA_VISIBLE_DEVICES=all"})
	case v != "false":
		r.Findings = append(r.Findings, Finding{SettingEnvvar, SettingEnvvar + " = " + v + ": any container can ask for every GPU with NVIDIA_VISIBLE_DEVICES=all"})
	}
	if v := cfg[SettingVolumeMounts]; v != "" && v != "false" {
		r.Findings = append(r.Findings, Finding{SettingVolumeMounts, SettingVolumeMounts + " = " + v + ": any container can ask for every GPU by mounting a volume at /var/run/nvidia-container-devices/all"})
	}
	if mode := cfg["nvidia-container-runtime.mode"]; mode != `"cdi"` && !cdiSpec {
		if mode == "" {
			mode = "unset"
		}
		r.Findings = append(r.Findings, Finding{SettingCDI, fmt.Sprintf("CDI is off (nvidia-container-runtime.mode %s and no CDI spec for nvidia.com/gpu in %s): the CDI devices gpupack-node assigns are not injected", mode, strings.Join(CDISpecDirs, ", "))})
	}
	switch v, ok := cfg[SettingAnnotationPrefixes]; {
	case !ok:
		r.Findings = append(r.Findings, Finding{SettingAnnotationPrefixes, SettingAnnotationPrefixes + ` is not set (the toolkit's default is ["cdi.k8s.io/"]): a pod annotation may ask the runtime for nvidia.com/gpu=all; set it to []`})
	case !emptyArray(v):
		r.Findings = append(r.Findings, Finding{SettingAnnotationPrefixes, SettingAnnotationPrefixes + " = " + v + ": a pod annotation with such a prefix may ask the runtime for CDI devices gpupack never assigned; set it to []"})
	}
	return r
}

// emptyArray reports whether a value as Parse keeps it is the TOML empty
// array ("[]", spaces allowed inside).
func emptyArray(v string) bool {
	return strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") && strings.TrimSpace(v[1:len(v)-1]) == ""
}

// Parse reads the subset of TOML the toolkit's config.toml uses: [table]
// headers, key = value lines (values kept as written: true, false, "str",
// numbers, and single-line arrays), '#' comments. Keys are returned dotted
// with their table ("nvidia-container-runtime.mode"). Anything else is an
// error rather than a guess.
func Parse(b []byte) (map[string]string, error) {
	out := map[string]string{}
	table := ""
	for n, raw := range strings.Split(string(b), "\n") {
		line := strings.TrimSpace(stripComment(raw))
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "[") {
			if !strings.HasSuffix(line, "]") || strings.HasPrefix(line, "[[") {
				return nil, fmt.Errorf("line %d: unsupported table header %q", n+1, line)
			}
			table = strings.TrimSpace(line[1 : len(line)-1])
			if table == "" {
				return nil, fmt.Errorf("line %d: empty table name", n+1)
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("line %d: %q is not key = value", n+1, line)
		}
		if uq, err := strconv.Unquote(k); err == nil && strings.HasPrefix(k, `"`) {
			k = uq
		}
		if strings.HasPrefix(v, `"`) {
			if _, err := strconv.Unquote(v); err != nil {
				return nil, fmt.Errorf("line %d: bad string %s", n+1, v)
			}
		}
		if table != "" {
			k = table + "." + k
		}
		out[k] = v
	}
	return out, nil
}

// stripComment drops a '#' comment that is not inside a string.
func stripComment(s string) string {
	in := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if in {
				i++
			}
		case '"':
			in = !in
		case '#':
			if !in {
				return s[:i]
			}
		}
	}
	return s
}
