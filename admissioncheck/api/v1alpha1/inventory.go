package v1alpha1

import (
	"encoding/json"
	"fmt"
	"strings"
)

// GPUInfo is one element of the node annotation gpupack.io/gpus.
type GPUInfo struct {
	UUID         string `json:"uuid"`
	Index        int    `json:"index"`
	Model        string `json:"model"`
	MemoryMiB    int64  `json:"memoryMiB"` // physical
	SMCount      int    `json:"smCount,omitempty"`
	NVLinkDomain string `json:"nvlinkDomain,omitempty"`
	NUMA         int    `json:"numa"`
	Health       string `json:"health"` // Healthy | Unhealthy
}

// Healthy reports whether the GPU may be planned on. A missing health field is
// read as healthy so hand-written inventories stay short.
func (g GPUInfo) Healthy() bool { return g.Health == "" || g.Health == GPUHealthy }

// ParseGPUs parses the gpupack.io/gpus annotation. It rejects what would make
// a plan wrong: empty or duplicate UUIDs, non-positive memory, unknown health.
func ParseGPUs(s string) ([]GPUInfo, error) {
	var gpus []GPUInfo
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&gpus); err != nil {
		return nil, fmt.Errorf("%s: not a JSON array of GPUs: %w", AnnotationGPUs, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: trailing data after the JSON array", AnnotationGPUs)
	}
	seen := make(map[string]bool, len(gpus))
	for i, g := range gpus {
		switch {
		case g.UUID == "":
			return nil, fmt.Errorf("%s: GPU %d has no uuid", AnnotationGPUs, i)
		case seen[g.UUID]:
			return nil, fmt.Errorf("%s: duplicate GPU uuid %q", AnnotationGPUs, g.UUID)
		case g.MemoryMiB <= 0:
			return nil, fmt.Errorf("%s: GPU %q has memoryMiB %d, want > 0", AnnotationGPUs, g.UUID, g.MemoryMiB)
		case g.Health != "" && g.Health != GPUHealthy && g.Health != GPUUnhealthy:
			return nil, fmt.Errorf("%s: GPU %q has health %q, want %s or %s", AnnotationGPUs, g.UUID, g.Health, GPUHealthy, GPUUnhealthy)
		}
		seen[g.UUID] = true
	}
	return gpus, nil
}

// FormatGPUs renders the gpupack.io/gpus annotation.
func FormatGPUs(gpus []GPUInfo) string {
	b, _ := json.Marshal(gpus) // cannot fail: plain struct
	return string(b)
}

// DeviceAssignment is one GPU of a pod's gpupack.io/devices annotation.
type DeviceAssignment struct {
	UUID      string
	MemoryMiB int64
}

// ParseDevices parses "<uuid>:<MiB>[,…]". Every GPU must appear once.
func ParseDevices(s string) ([]DeviceAssignment, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%s: empty", AnnotationDevices)
	}
	parts := strings.Split(s, ",")
	out := make([]DeviceAssignment, 0, len(parts))
	seen := make(map[string]bool, len(parts))
	for _, p := range parts {
		p = strings.TrimSpace(p)
		i := strings.LastIndexByte(p, ':')
		if i <= 0 || i == len(p)-1 {
			return nil, fmt.Errorf("%s: %q is not <uuid>:<MiB>", AnnotationDevices, p)
		}
		uuid, mem := p[:i], p[i+1:]
		var mib int64
		for _, c := range mem {
			if c < '0' || c > '9' || mib > (1<<40) {
				return nil, fmt.Errorf("%s: %q: MiB %q is not a positive integer", AnnotationDevices, p, mem)
			}
			mib = mib*10 + int64(c-'0')
		}
		if mib <= 0 {
			return nil, fmt.Errorf("%s: %q: MiB must be > 0", AnnotationDevices, p)
		}
		if strings.ContainsAny(uuid, " ,") {
			return nil, fmt.Errorf("%s: %q: bad uuid", AnnotationDevices, p)
		}
		if seen[uuid] {
			return nil, fmt.Errorf("%s: GPU %q listed twice", AnnotationDevices, uuid)
		}
		seen[uuid] = true
		out = append(out, DeviceAssignment{UUID: uuid, MemoryMiB: mib})
	}
	return out, nil
}

// FormatDevices renders the gpupack.io/devices annotation.
func FormatDevices(ds []DeviceAssignment) string {
	var b strings.Builder
	for i, d := range ds {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%d", d.UUID, d.MemoryMiB)
	}
	return b.String()
}
