package admissioncheck

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/admissioncheck/usage"
	"github.com/gpupack/gpupack/flavors"
)

// ledger is the cluster as the check sees it for one decision, rebuilt from
// the API every time (nothing lives only in memory): nodes' inventories,
// pods holding GPUs (terminating ones included until gone) and the GPUPlans
// of workloads admitted but not yet (fully) placed.
type ledger struct {
	nodes []fit.Node
	// all counts every holder; settled leaves out terminating pods, to tell
	// "fits once they are gone" (Pending) from "does not fit" (Retry).
	all, settled    *fit.Model
	terminatingPods int
	warnings        []string
	// unread: GPU nodes whose inventory is missing or unreadable (agent
	// not yet up, version skew, a model without a profile).
	unread []string
}

// incompleteInventory says, in a clause, why the inventory read cannot
// prove a gang never fits ("" when it can).
func (l *ledger) incompleteInventory() string {
	switch {
	case len(l.nodes) == 0 && len(l.unread) == 0:
		return "no node has published a GPU inventory yet"
	case len(l.unread) > 0:
		return fmt.Sprintf("%d GPU node(s) are not read (%s)", len(l.unread), warningsLine(l.unread))
	}
	return ""
}

// planReader reads GPUPlans bypassing the informer cache, so a plan created
// by the previous decision is always seen by the next one.
func buildLedger(ctx context.Context, c client.Client, planReader client.Reader, buf flavors.Buffer, skipPlan client.ObjectKey) (*ledger, error) {
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return nil, err
	}
	l := &ledger{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !hasGPUInventory(n) {
			if q, ok := n.Status.Capacity[v1alpha1.ResourceNvidiaGPU]; ok && !q.IsZero() {
				l.unread = append(l.unread, fmt.Sprintf("node %s has %s %s but no inventory yet", n.Name, q.String(), v1alpha1.ResourceNvidiaGPU))
			}
			continue
		}
		fn, err := inventory.NodeFromObject(n, buf, "")
		if err != nil {
			w := fmt.Sprintf("node %s ignored: %v", n.Name, err)
			l.warnings = append(l.warnings, w)
			l.unread = append(l.unread, w)
			continue
		}
		l.nodes = append(l.nodes, fn)
	}
	l.all = fit.NewModel(l.nodes)
	l.settled = fit.NewModel(l.nodes)

	var plans v1alpha1.GPUPlanList
	if err := planReader.List(ctx, &plans); err != nil {
		return nil, err
	}
	others := plans.Items[:0]
	for i := range plans.Items {
		if client.ObjectKeyFromObject(&plans.Items[i]) != skipPlan {
			others = append(others, plans.Items[i])
		}
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil {
		return nil, err
	}
	// One rule (package usage): every live pod's own devices, and each plan
	// slot not taken by a counted pod bound to it by UID.
	holders, warnings := usage.Ledger(pods.Items, others)
	l.warnings = append(l.warnings, warnings...)
	active := map[string]bool{}
	for _, h := range holders {
		if h.Plan != "" {
			active[h.Plan] = true
		}
		if h.Terminating {
			l.terminatingPods++
		}
		for _, u := range h.GPUs {
			l.use(u, h.Terminating)
		}
	}
	plansActive.Set(float64(len(active)))
	return l, nil
}

func (l *ledger) use(u fit.Usage, terminating bool) {
	if err := l.all.Use(u); err != nil {
		l.warnings = append(l.warnings, err.Error())
		return
	}
	if !terminating {
		_ = l.settled.Use(u)
	}
}

// hasGPUInventory: nodes with no GPU source at all are simply not GPU nodes.
func hasGPUInventory(n *corev1.Node) bool {
	if _, ok := n.Annotations[v1alpha1.AnnotationGPUs]; ok {
		return true
	}
	if _, ok := n.Annotations[v1alpha1.AnnotationHAMiNodeRegister]; ok {
		return true
	}
	_, ok := n.Labels[flavors.LabelGPUProduct]
	return ok
}

// recordCapacity exports allocatable/used MiB per model.
func recordCapacity(l *ledger) {
	alloc, used := map[string]float64{}, map[string]float64{}
	for _, n := range l.nodes {
		for _, g := range n.GPUs {
			alloc[g.Model] += float64(g.AllocatableMiB)
			if free, _, _, ok := l.all.GPUState(g.UUID); ok {
				used[g.Model] += float64(g.AllocatableMiB - free)
			}
		}
	}
	for m, v := range alloc {
		allocatableMiB.WithLabelValues(m).Set(v)
		usedMiB.WithLabelValues(m).Set(used[m])
	}
}
