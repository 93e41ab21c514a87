package topology

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	volcanotopology "volcano.sh/apis/pkg/apis/topology/v1alpha1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// FieldOwner names this controller's writes.
const FieldOwner = "gpupack-topology"

// Options configure topology generation.
type Options struct {
	// Parameters names the GangFitParameters whose topologyLevels define the
	// hierarchy. Empty: the first, by name, that has topologyLevels.
	Parameters string
	// TopologyName names the Kueue Topology (default "gpupack").
	TopologyName string
	// NoHyperNodes leaves Volcano HyperNodes alone even where the CRD is
	// served (a manager without RBAC for them, or Volcano's own discovery
	// in charge); the Kueue Topology is still kept.
	NoHyperNodes bool
	// SkipNameValidation lets tests start the controller again in one process.
	SkipNameValidation bool
}

// Setup registers the topology reconciler. Kinds the cluster does not serve
// (no Volcano installed, say) are skipped with a log line, so the manager
// runs on clusters with Kueue alone.
func Setup(mgr ctrl.Manager, opts Options) error {
	if opts.TopologyName == "" {
		opts.TopologyName = DefaultTopologyName
	}
	log := mgr.GetLogger().WithName("topology")
	r := &reconciler{client: mgr.GetClient(), opts: opts}
	r.hyperNodes = !opts.NoHyperNodes && served(mgr, volcanotopology.SchemeGroupVersion.WithKind("HyperNode").GroupKind(), volcanotopology.SchemeGroupVersion.Version)
	r.kueueTopology = served(mgr, kueue.GroupVersion.WithKind("Topology").GroupKind(), kueue.GroupVersion.Version)
	if !r.hyperNodes && !opts.NoHyperNodes {
		log.Info("Volcano HyperNode CRD not served; HyperNodes will not be generated")
	}
	if !r.kueueTopology {
		log.Info("Kueue Topology CRD not served; the Kueue Topology will not be generated")
	}
	if !r.hyperNodes && !r.kueueTopology {
		return nil
	}
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "cluster"}}}
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("gpupack-topology").
		WithOptions(controller.Options{SkipNameValidation: &opts.SkipNameValidation}).
		// Nodes change status every few seconds; only a new, gone or
		// relabelled node can change the tree.
		Watches(&corev1.Node{}, one, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
			},
		})).
		Watches(&v1alpha1.GangFitParameters{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	managed := builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[LabelManagedBy] == ManagedByValue
	}))
	if r.hyperNodes {
		b = b.Watches(&volcanotopology.HyperNode{}, one, managed)
	}
	if r.kueueTopology {
		b = b.Watches(&kueue.Topology{}, one, managed)
	}
	return b.Complete(r)
}

// served asks the API server (through the manager's REST mapper) whether
// it serves a kind.
func served(mgr ctrl.Manager, gk schema.GroupKind, version string) bool {
	_, err := mgr.GetRESTMapper().RESTMapping(gk, version)
	return err == nil
}

type reconciler struct {
	client        client.Client
	opts          Options
	hyperNodes    bool
	kueueTopology bool
}

func (r *reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	levels, source, err := r.levels(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var requeue time.Duration
	if r.hyperNodes {
		if err := r.syncHyperNodes(ctx, levels); err != nil {
			return reconcile.Result{}, err
		}
	}
	if r.kueueTopology {
		again, err := r.syncKueueTopology(ctx, levels)
		if err != nil {
			return reconcile.Result{}, err
		}
		if again {
			requeue = time.Second
		}
	}
	log.V(2).Info("topology in sync", "parameters", source, "levels", levels)
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// levels reads the hierarchy's levels from the chosen GangFitParameters.
func (r *reconciler) levels(ctx context.Context) ([]string, string, error) {
	if r.opts.Parameters != "" {
		var p v1alpha1.GangFitParameters
		if err := r.client.Get(ctx, client.ObjectKey{Name: r.opts.Parameters}, &p); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, "", nil
			}
			return nil, "", err
		}
		return p.Spec.TopologyLevels, p.Name, nil
	}
	var list v1alpha1.GangFitParametersList
	if err := r.client.List(ctx, &list); err != nil {
		return nil, "", err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	for _, p := range list.Items {
		if len(p.Spec.TopologyLevels) > 0 {
			return p.Spec.TopologyLevels, p.Name, nil
		}
	}
	return nil, "", nil
}

func (r *reconciler) syncHyperNodes(ctx context.Context, levels []string) error {
	log := ctrl.LoggerFrom(ctx)
	var nodes corev1.NodeList
	if err := r.client.List(ctx, &nodes); err != nil {
		return err
	}
	in := make([]Node, len(nodes.Items))
	for i, n := range nodes.Items {
		in[i] = Node{Name: n.Name, Labels: n.Labels}
	}
	h := Discover(levels, in)
	if len(h.Skipped) > 0 {
		log.V(1).Info("nodes left out of the HyperNode tree", "skipped", h.Skipped)
	}
	for _, c := range h.Conflicts {
		log.Info("node labels do not form a tree", "conflict", c)
	}
	var existing volcanotopology.HyperNodeList
	if err := r.client.List(ctx, &existing); err != nil {
		return err
	}
	changes, conflicts := Diff(HyperNodes(h), existing.Items)
	for _, c := range conflicts {
		log.Info("HyperNode name taken", "conflict", c)
	}
	for i := range changes.Create {
		if err := r.client.Create(ctx, &changes.Create[i], client.FieldOwner(FieldOwner)); err != nil {
			return fmt.Errorf("creating HyperNode %s: %w", changes.Create[i].Name, err)
		}
	}
	for i := range changes.Update {
		if err := r.client.Update(ctx, &changes.Update[i], client.FieldOwner(FieldOwner)); err != nil {
			return fmt.Errorf("updating HyperNode %s: %w", changes.Update[i].Name, err)
		}
	}
	for i := range changes.Delete {
		if err := r.client.Delete(ctx, &changes.Delete[i], client.Preconditions{UID: &changes.Delete[i].UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting HyperNode %s: %w", changes.Delete[i].Name, err)
		}
	}
	if !changes.Empty() {
		log.Info("HyperNodes updated", "created", len(changes.Create), "updated", len(changes.Update), "deleted", len(changes.Delete))
	}
	return nil
}

// syncKueueTopology creates, keeps or replaces the Kueue Topology; again is
// true while a replaced one is still being deleted.
func (r *reconciler) syncKueueTopology(ctx context.Context, levels []string) (again bool, err error) {
	log := ctrl.LoggerFrom(ctx)
	var cur kueue.Topology
	err = r.client.Get(ctx, client.ObjectKey{Name: r.opts.TopologyName}, &cur)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	if exists && cur.Labels[LabelManagedBy] != ManagedByValue {
		log.Info("Kueue Topology exists and is not managed by gpupack; leaving it", "name", cur.Name)
		return false, nil
	}
	if len(levels) == 0 {
		if exists && cur.DeletionTimestamp == nil {
			return false, client.IgnoreNotFound(r.client.Delete(ctx, &cur))
		}
		return false, nil
	}
	want, err := KueueTopology(r.opts.TopologyName, levels)
	if err != nil {
		log.Info("cannot generate the Kueue Topology", "error", err.Error())
		return false, nil
	}
	switch {
	case !exists:
		if err := r.client.Create(ctx, want, client.FieldOwner(FieldOwner)); err != nil {
			return false, fmt.Errorf("creating Kueue Topology %s: %w", want.Name, err)
		}
		log.Info("Kueue Topology created", "name", want.Name, "levels", levels)
	case cur.DeletionTimestamp != nil:
		// Being replaced (Kueue may hold it while flavors use it).
		return true, nil
	case !SameTopology(&cur, want):
		// Levels are immutable: replace.
		log.Info("Kueue Topology levels changed; replacing it", "name", cur.Name, "levels", levels)
		if err := r.client.Delete(ctx, &cur, client.Preconditions{UID: &cur.UID}); client.IgnoreNotFound(err) != nil {
			return false, err
		}
		return true, nil
	}
	return false, nil
}
