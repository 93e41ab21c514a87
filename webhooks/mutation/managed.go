package mutation

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// LabelQueueName is Kueue's queue label.
const LabelQueueName = "kueue.x-k8s.io/queue-name"

// Framework is the name Kueue's integrations.frameworks gives an object
// kind: "pod", "deployment", "statefulset" for those core kinds, else
// "<group>/<lowercase kind>" ("batch/job", "kubeflow.org/pytorchjob").
func Framework(apiVersion, kind string) string {
	group := ""
	if i := strings.Index(apiVersion, "/"); i >= 0 {
		group = apiVersion[:i]
	}
	switch {
	case group == "" && kind == "Pod":
		return "pod"
	case group == "apps" && kind == "Deployment":
		return "deployment"
	case group == "apps" && kind == "StatefulSet":
		return "statefulset"
	}
	return group + "/" + strings.ToLower(kind)
}

// Integrates reports whether Kueue, as configured, runs framework.
func (m *Mutator) Integrates(framework string) bool {
	for _, f := range m.cfg.Kueue.Frameworks {
		if f == framework {
			return true
		}
	}
	return false
}

// KueueRegistered are the frameworks Kueue v0.17 has built in, whether or
// not its integrations.frameworks enables them. Kueue's walk up a child's
// controller owners (jobframework.FindAncestorJobManagedByKueue) passes
// through an owner of any of these kinds, enabled or not (isKnownOwner
// looks at every registered integration), and stops only at a kind it does
// not know: a Job of a JobSet that a TrainJob made is managed through the
// TrainJob even where Kueue's JobSet integration is off.
var KueueRegistered = []string{
	"batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob",
	"leaderworkerset.x-k8s.io/leaderworkerset", "kubeflow.org/mpijob",
	"kubeflow.org/pytorchjob", "kubeflow.org/tfjob", "kubeflow.org/xgboostjob",
	"kubeflow.org/paddlejob", "kubeflow.org/jaxjob", "ray.io/rayjob",
	"ray.io/raycluster", "ray.io/rayservice", "sparkoperator.k8s.io/sparkapplication",
	"workload.codeflare.dev/appwrapper", "pod", "deployment", "statefulset",
}

// KueueKnows reports whether framework is one of KueueRegistered.
func KueueKnows(framework string) bool {
	for _, f := range KueueRegistered {
		if f == framework {
			return true
		}
	}
	return false
}

// ManagesItself reports whether Kueue manages an object of framework by
// its own labels, as Kueue decides it: the framework is integrated, and
// the object names a queue or Kueue manages jobs without one. (An object
// whose controlling owner Kueue manages is managed through that owner;
// the admission adapter walks the owners.)
func (m *Mutator) ManagesItself(framework string, labels map[string]string) bool {
	if !m.Integrates(framework) {
		return false
	}
	return labels[LabelQueueName] != "" || m.cfg.Kueue.ManageJobsWithoutQueueName
}

// NamespaceSelectorNeedsLabels reports whether deciding NamespaceSelected
// needs the namespace's labels; when false its name is enough.
func (m *Mutator) NamespaceSelectorNeedsLabels() bool { return m.nsSelectorNeedsLabels }

// NamespaceSelected reports whether Kueue's managedJobsNamespaceSelector
// selects the namespace name with labels nsLabels (nil when only the
// name is known: see NamespaceSelectorNeedsLabels). Kueue manages nothing
// in a namespace it does not select.
func (m *Mutator) NamespaceSelected(name string, nsLabels map[string]string) bool {
	if m.nsSelector == nil {
		return true
	}
	set := labels.Set{corev1.LabelMetadataName: name}
	for k, v := range nsLabels {
		set[k] = v
	}
	set[corev1.LabelMetadataName] = name
	return m.nsSelector.Matches(set)
}

// selectorReadsMoreThanTheName: s has a term on a label other than
// kubernetes.io/metadata.name, which the apiserver keeps equal to the
// namespace's name.
func selectorReadsMoreThanTheName(s *metav1.LabelSelector) bool {
	if s == nil {
		return false
	}
	for k := range s.MatchLabels {
		if k != corev1.LabelMetadataName {
			return true
		}
	}
	for _, r := range s.MatchExpressions {
		if r.Key != corev1.LabelMetadataName {
			return true
		}
	}
	return false
}

// CreatesForOwners reports whether user (with groups) is one the
// unmanaged-GPU policy trusts to create objects for their controlling
// owner: unmanagedGPUs.ownerControllers, or a cluster admin.
func (m *Mutator) CreatesForOwners(user string, groups []string) bool {
	for _, g := range groups {
		if g == "system:masters" {
			return true
		}
	}
	for _, u := range m.cfg.UnmanagedGPUs.OwnerControllers {
		if u == user {
			return true
		}
	}
	return false
}

// CheckPlanCreator is who may create an object carrying gpupack.io/plan —
// a pod, or a job whose pod template carries it (what names it, for the
// message; hasController: the object has a controlling owner). The plan
// names the GPUPlan whose slot a pod takes, and Kueue writes it (through
// the check's podSetUpdates) into a job's template when it starts the
// job, or into a pod of its pod integration by an update; so at creation
// only the controllers the unmanaged-GPU policy trusts to create objects
// for their owner (CreatesForOwners: unmanagedGPUs.ownerControllers),
// creating one for its controlling owner, and cluster admins
// (system:masters) may write it. Anyone else could point a pod at another
// job's plan and take its slot (issue 14, finding 6; the ungater checks
// the pod belongs to the plan's Workload as well).
func (m *Mutator) CheckPlanCreator(what string, hasController bool, user string, groups []string) error {
	for _, g := range groups {
		if g == "system:masters" {
			return nil
		}
	}
	if hasController && m.CreatesForOwners(user, groups) {
		return nil
	}
	why := fmt.Sprintf("it is created by %q, not by a controller gpupack trusts to create objects for their owner (unmanagedGPUs.ownerControllers)", user)
	if !hasController && m.CreatesForOwners(user, groups) {
		why = "it has no controlling owner to create it for"
	}
	return fmt.Errorf("%s carries the annotation %s, which names the GPUPlan whose GPU slot a pod takes; only a job's controller creating the object for its controlling owner (unmanagedGPUs.ownerControllers), or a cluster admin, may create it with one, and %s. Leave it out: Kueue writes it when the gang-fit check admits the job", what, v1alpha1.AnnotationPlan, why)
}

// CheckPlanManaged refuses a pod created with gpupack.io/plan that Kueue
// will not manage (u: why not), whatever the unmanaged-GPU policy or the
// namespace's opt-out say: Kueue's job integrations write the plan into
// the templates of the jobs Kueue manages, and its pod integration adds it
// to a pod by an update, never at creation. A planned pod under no
// Kueue-managed owner was made from a template nobody checked (a tenant's
// ReplicaSet, which the trusted ReplicaSet controller turns into pods;
// issue 14 finding 6, round 2), and would wait for another job's slot.
// Cluster admins (system:masters) may create one, as CheckPlanCreator lets
// them.
func (m *Mutator) CheckPlanManaged(what string, u Unmanaged, groups []string) error {
	for _, g := range groups {
		if g == "system:masters" {
			return nil
		}
	}
	return fmt.Errorf("%s carries the annotation %s, which names the GPUPlan whose GPU slot a pod takes, but Kueue will not manage it (%s); only pods of the jobs Kueue manages are created with a plan (Kueue writes it into their templates). Leave it out", what, v1alpha1.AnnotationPlan, u.Why)
}

// Unmanaged is what the admission adapter found out about a GPU object
// that Kueue will not manage.
type Unmanaged struct {
	// Why Kueue will not manage it (for the message).
	Why string
	// NamespaceAllows: its namespace carries
	// NamespaceLabelUnmanagedGPUs=allow.
	NamespaceAllows bool
	// PosesAsChild: its controller is a Kueue-managed owner whose
	// controller copies the owner's templates into its children (a
	// JobSet, an MPIJob, a TrainJob), and nobody gpupack trusts to create
	// objects for their owner created it. Neither the policy Allow nor a
	// namespace's opt-out lets it in: that controller takes it for its
	// owner's child and copies the owner's gpupack.io/plan into it — its
	// pods would take another job's GPU slots (review 9, F1).
	PosesAsChild bool
	// Adopted: it is judged because an update by a controller gpupack
	// trusts gave it a controller reference it did not have: that
	// controller taking over an existing object of its child's name (the
	// Trainer's and LWS's forced server-side apply), judged as made by
	// nobody gpupack trusts (review 10, F1). Only the message changes:
	// whoever reads the controller's event learns what is in the way.
	Adopted bool
}

// remedy is what the denial of u tells its reader to do: fallback, or,
// for an adoption, to clear the way for the controller's own object.
func (u Unmanaged) remedy(fallback string) string {
	if u.Adopted {
		return "an update gave this existing object a controller reference it did not have: its controller adopting an object of its child's name that someone else created, which never takes its owner's GPUs or quota. Delete or rename the existing object, so that the controller creates its own"
	}
	return fallback
}

// CheckUnmanaged is the unmanaged-GPU policy for a GPU object (what: "pod",
// "Job", …) that Kueue will not manage: nil under Allow or in a namespace
// that opted out, else a denial that says what to do. An object that poses
// as a managed job's child (Unmanaged.PosesAsChild) is denied whatever the
// policy and the namespace say.
func (m *Mutator) CheckUnmanaged(what string, u Unmanaged) error {
	if u.PosesAsChild {
		return fmt.Errorf("%s asks for GPUs under an owner it cannot claim (%s); the unmanaged-GPU policy's Allow and the namespace label %s=allow do not cover it, since its owner's controller would adopt it and hand it that job's GPUs; %s", what, u.Why, NamespaceLabelUnmanagedGPUs, u.remedy("create it without that owner reference"))
	}
	if m.cfg.UnmanagedGPUs.Policy == UnmanagedAllow || u.NamespaceAllows {
		return nil
	}
	return fmt.Errorf("%s asks for GPUs but Kueue will not manage it (%s), so it would hold GPUs outside every quota; %s", what, u.Why,
		u.remedy(fmt.Sprintf("submit it through Kueue (label %s: <local queue>), or have an administrator label the namespace %s=allow", LabelQueueName, NamespaceLabelUnmanagedGPUs)))
}

// placementGate brings a fractional GPU pod behind the gpupack.io/placement
// gate (finding 1): gpupack-node serves a fractional slot only to a pod
// bound to a GPUPlan slot, and only the ungater lifts the gate, once it
// has bound the pod. A pod that can never get a plan is denied here, at
// creation, with the reason, rather than left to fail at the kubelet.
func (m *Mutator) placementGate(p *corev1.Pod, anyFractional bool) error {
	_, planned := p.Annotations[v1alpha1.AnnotationPlan]
	switch {
	case planned:
	case !anyFractional || m.cfg.hami():
		return nil
	case m.ManagesItself("pod", p.Labels):
		// Kueue's pod integration manages it: it may get a plan when
		// Kueue admits it; until then the gate holds it.
	case m.Integrates("pod") && podOfKueuePodGroup(p):
		// A pod a StatefulSet or ReplicaSet makes (LWS groups,
		// Deployments) may meet gpupack's webhook before Kueue's pod
		// webhook has labelled it: it waits at the gate, which only a
		// plan lifts (gpupack-node serves no slot without one).
	default:
		return fmt.Errorf("pod: a fractional GPU (%s or %s) is served only to pods that gpupack's gang-fit admission check placed, and this pod has no %s and will not get one (Kueue does not manage it: no %s label, or Kueue's pod integration is off); create it from a Job or PyTorchJob labelled %s whose ClusterQueue uses the gpupack.io/gang-fit check", v1alpha1.AnnotationGPUMemory, v1alpha1.ResourceVGPU, v1alpha1.AnnotationPlan, LabelQueueName, LabelQueueName)
	}
	addGate(&p.Spec, v1alpha1.SchedulingGatePlacement)
	return nil
}

// podOfKueuePodGroup reports whether Kueue's pod integration may still
// take p in: it carries Kueue's own gate or pod-group label, or a
// StatefulSet or ReplicaSet controls it (Kueue's pod webhook labels such
// pods from their owners, possibly after gpupack's webhook has run).
func podOfKueuePodGroup(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == "kueue.x-k8s.io/admission" {
			return true
		}
	}
	if p.Labels["kueue.x-k8s.io/pod-group-name"] != "" {
		return true
	}
	owner := metav1.GetControllerOf(p)
	return owner != nil && owner.APIVersion == "apps/v1" && (owner.Kind == "StatefulSet" || owner.Kind == "ReplicaSet")
}
