// Package inventory translates API objects into the fit engine's types:
// nodes into GPUs (gpupack's own inventory annotation, HAMi's register
// annotation, or a flavor profile), pods and GPU plans into usage, and
// Kueue pod sets into a gang. Pure functions; no client calls.
package inventory

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/flavors"
)

// ErrNoInventory: the node carries no GPU inventory at all (typically a CPU
// node). Callers building a cluster model skip such nodes.
var ErrNoInventory = errors.New("no GPU inventory")

// Source names where a node's GPUs came from.
const (
	SourceGPUPack = "gpupack"
	SourceHAMi    = "hami"
	SourceFlavor  = "flavor"
)

// NodeFromObject reads one node: its labels, taints, readiness and GPUs. GPUs
// come from, in order: the gpupack.io/gpus annotation; HAMi's
// hami.io/node-nvidia-register (JSON or legacy form); a flavor profile
// (flavorModel, else the node's nvidia.com/gpu.product label) with the count
// from nvidia.com/gpu.count or the nvidia.com/gpu capacity, under synthetic
// UUIDs "<node>/gpu-<i>". Allocatable memory per GPU is buf's. The error wraps
// ErrNoInventory when none of these is present.
func NodeFromObject(n *corev1.Node, buf flavors.Buffer, flavorModel string) (fit.Node, error) {
	out, _, err := NodeWithSource(n, buf, flavorModel)
	return out, err
}

// NodeWithSource is NodeFromObject that also says where the GPUs came from.
func NodeWithSource(n *corev1.Node, buf flavors.Buffer, flavorModel string) (fit.Node, string, error) {
	out := fit.Node{
		Name:          n.Name,
		Labels:        n.Labels,
		Taints:        n.Spec.Taints,
		Ready:         nodeReady(n),
		Unschedulable: n.Spec.Unschedulable,
		Resources:     NodeResources(n),
	}
	if s, ok := n.Annotations[v1alpha1.AnnotationGPUs]; ok {
		gpus, err := v1alpha1.ParseGPUs(s)
		if err != nil {
			return out, SourceGPUPack, fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, g := range gpus {
			out.GPUs = append(out.GPUs, fit.GPU{UUID: g.UUID, Model: g.Model, Index: g.Index, PhysicalMiB: g.MemoryMiB,
				AllocatableMiB: buf.Allocatable(g.MemoryMiB), Healthy: g.Healthy()})
		}
		return out, SourceGPUPack, nil
	}
	if s, ok := n.Annotations[v1alpha1.AnnotationHAMiNodeRegister]; ok {
		devs, err := ParseHAMiRegister(s)
		if err != nil {
			return out, SourceHAMi, fmt.Errorf("node %s: %w", n.Name, err)
		}
		for i, d := range devs {
			idx := i
			if d.Index != nil {
				idx = *d.Index
			}
			out.GPUs = append(out.GPUs, fit.GPU{UUID: d.ID, Model: d.Type, Index: idx, PhysicalMiB: d.DevMem,
				AllocatableMiB: buf.Allocatable(d.DevMem), Healthy: d.Health, MaxShare: max(0, d.Count)})
		}
		return out, SourceHAMi, nil
	}
	model := flavorModel
	if model == "" {
		model = n.Labels[flavors.LabelGPUProduct]
	}
	count, hasCount, err := gpuCount(n)
	if err != nil {
		return out, SourceFlavor, err
	}
	if model == "" {
		if hasCount && count > 0 {
			return out, SourceFlavor, fmt.Errorf("node %s has %d GPUs but no inventory: no %s or %s annotation, no %s label and no flavor model to size them: %w",
				n.Name, count, v1alpha1.AnnotationGPUs, v1alpha1.AnnotationHAMiNodeRegister, flavors.LabelGPUProduct, ErrNoInventory)
		}
		return out, SourceFlavor, fmt.Errorf("node %s: no %s or %s annotation and no GPU model label %s: %w",
			n.Name, v1alpha1.AnnotationGPUs, v1alpha1.AnnotationHAMiNodeRegister, flavors.LabelGPUProduct, ErrNoInventory)
	}
	p, ok := flavors.Lookup(model)
	if !ok {
		return out, SourceFlavor, fmt.Errorf("node %s: GPU model %q has no flavor profile (known: %s)", n.Name, model, knownModels())
	}
	if !hasCount {
		return out, SourceFlavor, fmt.Errorf("node %s: GPU model %q known but no GPU count: set label %s or capacity %s", n.Name, model, flavors.LabelGPUCount, v1alpha1.ResourceNvidiaGPU)
	}
	for i := 0; i < count; i++ {
		out.GPUs = append(out.GPUs, fit.GPU{UUID: fmt.Sprintf("%s/gpu-%d", n.Name, i), Model: p.Model, Index: i,
			PhysicalMiB: p.MemoryMiB, AllocatableMiB: buf.Allocatable(p.MemoryMiB), Healthy: true})
	}
	return out, SourceFlavor, nil
}

func knownModels() string {
	ps := flavors.Profiles()
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Model
	}
	return strings.Join(names, ", ")
}

// gpuCount reads nvidia.com/gpu.count, else the nvidia.com/gpu capacity.
func gpuCount(n *corev1.Node) (int, bool, error) {
	if s, ok := n.Labels[flavors.LabelGPUCount]; ok {
		c, err := strconv.Atoi(s)
		if err != nil || c < 0 || c > 1024 {
			return 0, false, fmt.Errorf("node %s: label %s=%q is not a GPU count", n.Name, flavors.LabelGPUCount, s)
		}
		return c, true, nil
	}
	if q, ok := n.Status.Capacity[v1alpha1.ResourceNvidiaGPU]; ok {
		c, exact := q.AsInt64()
		if !exact || c < 0 || c > 1024 {
			return 0, false, fmt.Errorf("node %s: capacity %s=%s is not a GPU count", n.Name, v1alpha1.ResourceNvidiaGPU, q.String())
		}
		return int(c), true, nil
	}
	return 0, false, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// HAMiDevice is one GPU of HAMi's hami.io/node-nvidia-register annotation.
// DevMem is the memory HAMi registered, in MiB (physical unless HAMi's
// deviceMemoryScaling is set, which gpupack does not undo).
type HAMiDevice struct {
	ID      string `json:"id"`
	Index   *int   `json:"index,omitempty"`
	Count   int32  `json:"count"`
	DevMem  int64  `json:"devmem"`
	DevCore int32  `json:"devcore"`
	Type    string `json:"type"`
	Numa    int    `json:"numa"`
	Mode    string `json:"mode,omitempty"`
	Health  bool   `json:"health"`
}

// ParseHAMiRegister parses hami.io/node-nvidia-register in either form HAMi
// has written: a JSON array of devices (current HAMi), or the legacy
// "uuid,count,devmem,devcore,type,numa,health[,index,mode]:" list.
func ParseHAMiRegister(s string) ([]HAMiDevice, error) {
	t := strings.TrimSpace(s)
	var devs []HAMiDevice
	if strings.HasPrefix(t, "[") {
		if err := json.Unmarshal([]byte(t), &devs); err != nil {
			return nil, fmt.Errorf("%s: not a JSON array of devices: %w", v1alpha1.AnnotationHAMiNodeRegister, err)
		}
	} else {
		var err error
		if devs, err = parseHAMiLegacy(t); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for i, d := range devs {
		switch {
		case d.ID == "":
			return nil, fmt.Errorf("%s: device %d has no id", v1alpha1.AnnotationHAMiNodeRegister, i)
		case seen[d.ID]:
			return nil, fmt.Errorf("%s: device %q listed twice", v1alpha1.AnnotationHAMiNodeRegister, d.ID)
		case d.DevMem <= 0 || d.DevMem > 1<<30:
			return nil, fmt.Errorf("%s: device %q has devmem %d MiB, want 1–%d", v1alpha1.AnnotationHAMiNodeRegister, d.ID, d.DevMem, 1<<30)
		case d.Index != nil && (*d.Index < 0 || *d.Index > 1<<16):
			return nil, fmt.Errorf("%s: device %q has index %d", v1alpha1.AnnotationHAMiNodeRegister, d.ID, *d.Index)
		}
		seen[d.ID] = true
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("%s: no devices", v1alpha1.AnnotationHAMiNodeRegister)
	}
	return devs, nil
}

func parseHAMiLegacy(s string) ([]HAMiDevice, error) {
	var devs []HAMiDevice
	for _, part := range strings.Split(s, ":") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, ",")
		if len(f) != 7 && len(f) != 9 {
			return nil, fmt.Errorf("%s: %q has %d fields, want uuid,count,devmem,devcore,type,numa,health[,index,mode]", v1alpha1.AnnotationHAMiNodeRegister, part, len(f))
		}
		count, err1 := strconv.ParseInt(f[1], 10, 32)
		mem, err2 := strconv.ParseInt(f[2], 10, 64)
		core, err3 := strconv.ParseInt(f[3], 10, 32)
		numa, err4 := strconv.Atoi(f[5])
		health, err5 := strconv.ParseBool(f[6])
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return nil, fmt.Errorf("%s: %q: %v", v1alpha1.AnnotationHAMiNodeRegister, part, err)
		}
		d := HAMiDevice{ID: f[0], Count: int32(count), DevMem: mem, DevCore: int32(core), Type: f[4], Numa: numa, Health: health}
		if len(f) == 9 {
			idx, err := strconv.Atoi(f[7])
			if err != nil {
				return nil, fmt.Errorf("%s: %q: index: %v", v1alpha1.AnnotationHAMiNodeRegister, part, err)
			}
			d.Index, d.Mode = &idx, f[8]
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// FormatHAMiLegacy renders devices in the legacy form (tests, fixtures).
func FormatHAMiLegacy(devs []HAMiDevice) string {
	var b strings.Builder
	for _, d := range devs {
		fmt.Fprintf(&b, "%s,%d,%d,%d,%s,%d,%t", d.ID, d.Count, d.DevMem, d.DevCore, d.Type, d.Numa, d.Health)
		if d.Index != nil {
			fmt.Fprintf(&b, ",%d,%s", *d.Index, d.Mode)
		}
		b.WriteByte(':')
	}
	return b.String()
}
