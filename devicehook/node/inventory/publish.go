package inventory

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

// Transition is a GPU whose health differs from the published inventory.
type Transition struct {
	UUID     string
	Index    int
	From, To string // health; From is "" for a GPU not published before
	Reason   string
}

// Result says what one publish pass did.
type Result struct {
	State             State
	MetadataPatched   bool // annotation and/or label
	StatusPatched     bool // capacity/allocatable
	Transitions       []Transition
	PreviousMalformed error // the node's old annotation could not be parsed (it is replaced)
}

// Publisher writes the inventory of one node.
type Publisher struct {
	Client      kubernetes.Interface
	NodeName    string
	Buffer      flavors.Buffer
	SlotsPerGPU int
}

// Publish reads the Node, merges now with what the Node already carries and
// patches only what differs. Level-triggered: run it on a timer and on Node
// updates, and it repairs capacity the kubelet zeroed.
func (p *Publisher) Publish(ctx context.Context, now []GPU) (Result, error) {
	node, err := p.Client.CoreV1().Nodes().Get(ctx, p.NodeName, metav1.GetOptions{})
	if err != nil {
		return Result{}, fmt.Errorf("get node %s: %w", p.NodeName, err)
	}
	var res Result
	var previous []v1alpha1.GPUInfo
	if s, ok := node.Annotations[v1alpha1.AnnotationGPUs]; ok {
		previous, res.PreviousMalformed = v1alpha1.ParseGPUs(s)
	}
	res.State = Desired(now, previous, p.NodeName, p.Buffer, p.SlotsPerGPU)
	res.Transitions = Transitions(previous, res.State.GPUs, now)

	metaPatch, statusPatch := Diff(node, res.State)
	if metaPatch != nil {
		if _, err := p.Client.CoreV1().Nodes().Patch(ctx, p.NodeName, types.MergePatchType, metaPatch, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
			return res, fmt.Errorf("patch node %s inventory: %w", p.NodeName, err)
		}
		res.MetadataPatched = true
	}
	if statusPatch != nil {
		if _, err := p.Client.CoreV1().Nodes().Patch(ctx, p.NodeName, types.MergePatchType, statusPatch, metav1.PatchOptions{FieldManager: FieldManager}, "status"); err != nil {
			return res, fmt.Errorf("patch node %s capacity: %w", p.NodeName, err)
		}
		res.StatusPatched = true
	}
	return res, nil
}

// FieldManager names gpupack-node in managedFields.
const FieldManager = "gpupack-node"

// Diff returns merge patches for the metadata and the status of node, or nil
// where the node already matches the state.
func Diff(node *corev1.Node, st State) (meta, status []byte) {
	ann := v1alpha1.FormatGPUs(st.GPUs)
	if node.Annotations[v1alpha1.AnnotationGPUs] != ann || node.Labels[v1alpha1.LabelNVLinkDomain] != st.Domain {
		meta, _ = json.Marshal(map[string]any{"metadata": map[string]any{
			"annotations": map[string]string{v1alpha1.AnnotationGPUs: ann},
			"labels":      map[string]string{v1alpha1.LabelNVLinkDomain: st.Domain},
		}})
	}
	want := corev1.ResourceList{}
	differs := false
	for name, v := range st.Capacity {
		q := *resource.NewQuantity(v, resource.DecimalSI)
		want[corev1.ResourceName(name)] = q
		for _, have := range []corev1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
			if h, ok := have[corev1.ResourceName(name)]; !ok || h.Cmp(q) != 0 {
				differs = true
			}
		}
	}
	if differs {
		status, _ = json.Marshal(map[string]any{"status": map[string]any{"capacity": want, "allocatable": want}})
	}
	return meta, status
}

// Transitions lists GPUs whose health in next differs from previous. GPUs new
// to the inventory are reported only when they arrive unhealthy. The reason
// comes from what NVML said now, or "not found by NVML" for a vanished GPU.
func Transitions(previous, next []v1alpha1.GPUInfo, now []GPU) []Transition {
	prev := make(map[string]string, len(previous))
	for _, g := range previous {
		h := g.Health
		if h == "" {
			h = v1alpha1.GPUHealthy
		}
		prev[g.UUID] = h
	}
	reason := make(map[string]string, len(now))
	for _, g := range now {
		reason[g.UUID] = g.Reason
	}
	var out []Transition
	for _, g := range next {
		from, known := prev[g.UUID]
		if known && from == g.Health || !known && g.Health == v1alpha1.GPUHealthy {
			continue
		}
		r, seen := reason[g.UUID]
		if !seen {
			r = "not found by NVML"
		}
		out = append(out, Transition{UUID: g.UUID, Index: g.Index, From: from, To: g.Health, Reason: r})
	}
	return out
}
