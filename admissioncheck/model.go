package admissioncheck

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/gpucache"
)

// feedCache registers informer event handlers that keep the long-lived GPU
// model current. It returns when the handlers are registered; synced
// reports when each informer has delivered its initial list.
func feedCache(ctx context.Context, mgr ctrl.Manager, c *gpucache.Cache) (gpucache.Synced, error) {
	var regs []toolscache.ResourceEventHandlerRegistration
	add := func(obj client.Object, h toolscache.ResourceEventHandlerFuncs) error {
		inf, err := mgr.GetCache().GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return err
		}
		regs = append(regs, reg)
		return nil
	}
	unwrap := func(obj any) any {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			return t.Obj
		}
		return obj
	}
	if err := add(&corev1.Node{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.UpsertNode(o.(*corev1.Node)) },
		UpdateFunc: func(_, o any) { c.UpsertNode(o.(*corev1.Node)) },
		DeleteFunc: func(o any) {
			if n, ok := unwrap(o).(*corev1.Node); ok {
				c.DeleteNode(n.Name)
			}
		},
	}); err != nil {
		return nil, err
	}
	if err := add(&corev1.Pod{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.UpsertPod(o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { c.UpsertPod(o.(*corev1.Pod)) },
		DeleteFunc: func(o any) {
			if p, ok := unwrap(o).(*corev1.Pod); ok {
				c.DeletePod(p.UID)
			}
		},
	}); err != nil {
		return nil, err
	}
	if err := add(&v1alpha1.GPUPlan{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.UpsertPlan(o.(*v1alpha1.GPUPlan)) },
		UpdateFunc: func(_, o any) { c.UpsertPlan(o.(*v1alpha1.GPUPlan)) },
		DeleteFunc: func(o any) {
			if p, ok := unwrap(o).(*v1alpha1.GPUPlan); ok {
				c.DeletePlan(client.ObjectKeyFromObject(p), p.UID, p.Spec.WorkloadUID)
			}
		},
	}); err != nil {
		return nil, err
	}
	return func() bool {
		for _, r := range regs {
			if !r.HasSynced() {
				return false
			}
		}
		return true
	}, nil
}

// waiters are the Workloads whose check is Pending on terminating pods:
// re-triggered when the model says capacity was freed, instead of polling.
type waiters struct {
	mu  sync.Mutex
	set map[types.NamespacedName]bool
	ch  chan event.TypedGenericEvent[*kueue.Workload]
}

func newWaiters() *waiters {
	return &waiters{set: map[types.NamespacedName]bool{}, ch: make(chan event.TypedGenericEvent[*kueue.Workload], 1024)}
}

// wake enqueues every waiting Workload (non-blocking: a full channel means
// they are already on their way; the periodic recheck is the backstop).
func (w *waiters) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.set {
		wl := &kueue.Workload{}
		wl.Namespace, wl.Name = k.Namespace, k.Name
		select {
		case w.ch <- event.TypedGenericEvent[*kueue.Workload]{Object: wl}:
		default:
			return
		}
	}
}

// wakeKeys enqueues the given Workloads (plans are named after their
// Workload, in its namespace). Blocking would stall the informer; a full
// channel drops the rest, and the Workload's next reconcile (every
// reconcile of a Ready check looks for lost nodes) is the backstop.
func (w *waiters) wakeKeys(keys []types.NamespacedName) {
	for _, k := range keys {
		wl := &kueue.Workload{}
		wl.Namespace, wl.Name = k.Namespace, k.Name
		select {
		case w.ch <- event.TypedGenericEvent[*kueue.Workload]{Object: wl}:
		default:
			return
		}
	}
}

func (r *workloadReconciler) wait(wl *kueue.Workload, waiting bool) {
	if r.waiters == nil {
		return
	}
	r.waiters.mu.Lock()
	defer r.waiters.mu.Unlock()
	k := types.NamespacedName{Namespace: wl.Namespace, Name: wl.Name}
	if waiting {
		r.waiters.set[k] = true
	} else {
		delete(r.waiters.set, k)
	}
}

func (r *workloadReconciler) forgetWaiting(k types.NamespacedName) {
	if r.waiters == nil {
		return
	}
	r.waiters.mu.Lock()
	delete(r.waiters.set, k)
	r.waiters.mu.Unlock()
}

// capacityEvery bounds how often the capacity gauges walk every GPU.
const capacityEvery = 5 * time.Second

// recordCapacity exports allocatable/used MiB per model and the
// fragmentation gauges, at most every capacityEvery.
func (r *workloadReconciler) recordCapacity(s *gpucache.Snapshot, levels []string) {
	now := time.Now()
	if now.Sub(r.lastCapacity) < capacityEvery {
		return
	}
	r.lastCapacity = now
	alloc, used := map[string]float64{}, map[string]float64{}
	for _, n := range s.Nodes {
		for _, g := range n.GPUs {
			alloc[g.Model] += float64(g.AllocatableMiB)
			if free, _, _, ok := s.Model.GPUState(g.UUID); ok {
				used[g.Model] += float64(g.AllocatableMiB - free)
			}
		}
	}
	for m, v := range alloc {
		allocatableMiB.WithLabelValues(m).Set(v)
		usedMiB.WithLabelValues(m).Set(used[m])
	}
	plansActive.Set(float64(s.Plans))
	// Fragmentation per domain of the first (widest) topology level.
	level := ""
	if len(levels) > 0 {
		level = levels[0]
	}
	freeWhole.Reset()
	freeMiB.Reset()
	largestPods.Reset()
	fragmentation.Reset()
	for _, d := range s.Fragmentation(level) {
		freeWhole.WithLabelValues(level, d.Domain, d.Model).Set(float64(d.WholeFree))
		freeMiB.WithLabelValues(level, d.Domain, d.Model).Set(float64(d.FreeMiB))
		largestPods.WithLabelValues(level, d.Domain, d.Model, "whole").Set(float64(d.WholeFree))
		for i, size := range gpucache.FractionalSizesMiB {
			largestPods.WithLabelValues(level, d.Domain, d.Model, fmt.Sprintf("%dGi", size/1024)).Set(float64(d.PodsAt[i]))
		}
		fragmentation.WithLabelValues(level, d.Domain, d.Model).Set(d.Fragmentation)
	}
}
