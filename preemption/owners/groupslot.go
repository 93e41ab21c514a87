package owners

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

// Member is one Pod owner of a pod group's Workload as GroupSlot sees it.
type Member struct {
	Name string
	UID  types.UID
	// Stamp is the pod's gpupack.io/created-by (the user who created it,
	// written by the pod webhook, frozen by policy gpupack-placement);
	// Stamped says it carries one.
	Stamp   string
	Stamped bool
	// Skip: the pod takes no part — it no longer exists (or another pod
	// has its name now), or it asks for no GPUs (it takes no slot, and a
	// CPU-only pod skips the pod webhook, so it has no stamp).
	Skip bool
}

func (m Member) describe() string {
	if !m.Stamped {
		return fmt.Sprintf("%s (no creator stamp)", m.Name)
	}
	return fmt.Sprintf("%s (created by %q)", m.Name, m.Stamp)
}

// GroupSlot says why a pod of Workload wl may not take a slot of wl's plan
// on account of its pod group ("" when it may). It is the one rule for
// "may this pod-group member take this Workload's slot" (the ungater asks
// it after Belongs); its arguments:
//
//   - lineage: the pod's links, its own reference first (Finder.Lineage,
//     then Finder.GroupLinks);
//   - self: the pod, as a Member;
//   - members: wl's other Pod owners (the pod itself may be among them).
//
// Kueue makes every pod labelled with a plain pod group's name an owner of
// the group's Workload (EnsureWorkloadOwnedByAllMembers), whoever created
// it: a tenant's own pod, with the victim group's label, total count and
// role hash, is an owner like the victim's own (review 14 F3). So when the
// pod belongs to wl only through its own Pod reference — no link above it
// is a non-Pod owner of wl (a member pod forged as its controller does not
// count) (a Job, JobSet, StatefulSet, the LeaderWorkerSet of an
// LWS group: those pods a trusted controller made, and the pod webhook
// checked who created such a pod under them) — and wl has two or more Pod
// owners, the pod may take a slot only if it carries a creator stamp and
// every other member that still exists and asks for GPUs carries the same.
// A disagreement keeps every member gated (each one sees the others'
// stamps): no pod runs on a slot of a group two users made. Kueue's
// replacement pods keep working when the same user creates them.
func GroupSlot(wl *kueue.Workload, lineage []metav1.OwnerReference, self Member, members []Member) string {
	if len(lineage) > 1 {
		for _, o := range wl.OwnerReferences {
			if isPodRef(o) {
				continue // another member named as the pod's controller is no ancestor
			}
			for _, l := range lineage[1:] {
				if SameObject(o, l) {
					return "" // through an ancestor: not a plain pod group's member
				}
			}
		}
	}
	pods := 0
	for _, o := range wl.OwnerReferences {
		if isPodRef(o) {
			pods++
		}
	}
	if pods < 2 {
		return ""
	}
	var differ []string
	for _, m := range members {
		if m.Skip || m.UID == self.UID {
			continue
		}
		if !m.Stamped || !self.Stamped || m.Stamp != self.Stamp {
			differ = append(differ, m.describe())
		}
	}
	switch {
	case !self.Stamped:
		return fmt.Sprintf("it is a member of pod group %s only as an owner of its Workload, and carries no %s stamp (the pod webhook writes one on every pod-group pod it admits), so it cannot be told to be the group's creator's; it may not take the group's slot", wl.Name, AnnotationCreatedBy)
	case len(differ) > 0:
		return fmt.Sprintf("pod group %s has members created by different users: this pod %s, %s; a pod-group slot is taken only by pods of one creator, so none of them is placed until the other user's pods are gone", wl.Name, self.describe(), strings.Join(differ, ", "))
	}
	return ""
}

// AnnotationCreatedBy is v1alpha1.AnnotationCreatedBy (this package
// imports no gpupack API).
const AnnotationCreatedBy = "gpupack.io/created-by"

func isPodRef(o metav1.OwnerReference) bool {
	return schema.FromAPIVersionAndKind(o.APIVersion, o.Kind) == GVKPod
}

// GroupLinks are the links of an LWS group's pod up to its LeaderWorkerSet,
// as the LWS and StatefulSet controllers make them and Kueue's LWS
// integration relates them (its Workload, one per replica group, is owned
// by the LWS and by each member pod; Lineage stops at the StatefulSet, a
// kind no Workload-owner chain passes through):
//
//	leader Pod → leader StatefulSet → LeaderWorkerSet
//	worker Pod → worker StatefulSet → leader Pod → leader StatefulSet → LeaderWorkerSet
//
// Every link but the last is read and UID-checked; the last (the LWS) is
// the reference the StatefulSet below names, matched as the same object
// by SameObject. Anything else (no StatefulSet controller, a read that
// fails, another pair) gives none: the pod is then judged as a plain
// group member, by its stamp. The pod webhook refuses a GPU pod under a
// Kueue-managed owner that a trusted controller did not create, so a
// tenant's pod does not get here by forging the chain.
func (f Finder) GroupLinks(ctx context.Context, obj client.Object) []metav1.OwnerReference {
	sts := schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}
	var out []metav1.OwnerReference
	cur := metav1.Object(obj)
	for i := 0; i < 4; i++ {
		ref := metav1.GetControllerOf(cur)
		if ref == nil {
			return nil
		}
		gvk := schema.FromAPIVersionAndKind(ref.APIVersion, ref.Kind)
		lws := gvk.Group == "leaderworkerset.x-k8s.io" && gvk.Kind == "LeaderWorkerSet"
		switch {
		case (i == 1 || i == 3) && lws:
			return append(out, *ref)
		case (i == 0 || i == 2) && gvk == sts, i == 1 && gvk == GVKPod:
		default:
			return nil
		}
		// The leader Pod is read typed (the cache's pod informer), a
		// StatefulSet as metadata.
		var next client.Object = &corev1.Pod{}
		if gvk == sts {
			meta := &metav1.PartialObjectMetadata{}
			meta.SetGroupVersionKind(gvk)
			next = meta
		}
		lctx, cancel := context.WithTimeout(ctx, LookupTimeout)
		err := f.Reader.Get(lctx, types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}, next)
		cancel()
		if err != nil || next.GetUID() != ref.UID {
			return nil
		}
		out = append(out, *ref)
		cur = next
	}
	return nil
}

// HasLWSOwner: wl is an LWS replica group's (Kueue's LWS integration),
// the only kind of Workload GroupLinks can find an owner of.
func HasLWSOwner(wl *kueue.Workload) bool {
	for _, o := range wl.OwnerReferences {
		gvk := schema.FromAPIVersionAndKind(o.APIVersion, o.Kind)
		if gvk.Group == "leaderworkerset.x-k8s.io" && gvk.Kind == "LeaderWorkerSet" {
			return true
		}
	}
	return false
}
