package security

// Issue 14 finding 6, every job kind: a tenant's own job given another
// job's gpupack.io/plan in a pod template by an update would have its
// controller make pods that wait for that job's GPU slot. Policy
// gpupack-job-plan (manifests/base/policy/job-plan.yaml) lets only Kueue's
// controller add or change the plan in the templates of the kinds Kueue
// writes podSetUpdates into, the controller of a JobSet, MPIJob or
// TrainJob copy it into the Jobs or JobSet it controls, and nobody into a
// Deployment's, StatefulSet's, LeaderWorkerSet's or TrainingRuntime's; a
// planned object's owner references are frozen (the garbage collector may
// remove them).

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	mpi "github.com/kubeflow/mpi-operator/pkg/apis/kubeflow/v2beta1"
	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	ray "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// kueueManager is Kueue's manager of a TrainJob's runtime patch.
const kueueManager = "kueue.x-k8s.io/manager"

// cpuTemplate is a CPU-only pod template with an annotation, so that a
// JSON patch can add a key to its annotations.
func cpuTemplate() corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "alice"}, Annotations: map[string]string{"team": "a"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
}

// planKind is one job kind under attack: its object (suspended, CPU-only,
// every template annotated), the JSON pointers of its pod templates, and
// whether Kueue writes podSetUpdates into them.
type planKind struct {
	name  string
	gvk   schema.GroupVersionKind
	obj   func(ns, name string) any
	paths func(obj any) []string
	kueue bool
	// extra are further ways to add a plan (JSON patch operations).
	extra func(plan string) []map[string]any
}

// kindPaths are the template pointers gpupack's webhooks use for the kind
// (mutation.KindTemplates): the policy must cover each.
func kindPaths(obj any) []string {
	_, ts, err := mutation.KindTemplates(obj)
	if err != nil {
		panic(err)
	}
	var out []string
	for _, t := range ts {
		out = append(out, t.Path)
	}
	return out
}

func trainerRJ(ann map[string]string) []trainer.ReplicatedJobPatch {
	return []trainer.ReplicatedJobPatch{{Name: "node", Template: &trainer.JobTemplatePatch{Spec: &trainer.JobSpecPatch{
		Template: &trainer.PodTemplatePatch{Metadata: &metav1.ObjectMeta{Annotations: ann}}}}}}
}

func runtimePatch(manager string, ann map[string]string) trainer.RuntimePatch {
	return trainer.RuntimePatch{Manager: manager, TrainingRuntimeSpec: &trainer.TrainingRuntimeSpecPatch{
		Template: &trainer.JobSetTemplatePatch{Spec: &trainer.JobSetSpecPatch{ReplicatedJobs: trainerRJ(ann)}}}}
}

func rayCluster() *ray.RayClusterSpec {
	return &ray.RayClusterSpec{HeadGroupSpec: ray.HeadGroupSpec{RayStartParams: map[string]string{}, Template: cpuTemplate()},
		WorkerGroupSpecs: []ray.WorkerGroupSpec{{GroupName: "workers", Replicas: ptr.To[int32](1), MinReplicas: ptr.To[int32](1), MaxReplicas: ptr.To[int32](1), RayStartParams: map[string]string{}, Template: cpuTemplate()}}}
}

var planKinds = []planKind{
	{name: "Job", gvk: batchv1.SchemeGroupVersion.WithKind("Job"), kueue: true,
		obj: func(ns, name string) any {
			return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: cpuTemplate()}}
		},
		paths: func(any) []string { return []string{"/spec/template"} }},
	{name: "PyTorchJob", gvk: kftraining.SchemeGroupVersion.WithKind("PyTorchJob"), kueue: true,
		obj: func(ns, name string) any {
			return &kftraining.PyTorchJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: kftraining.PyTorchJobSpec{
				RunPolicy: kftraining.RunPolicy{Suspend: ptr.To(true)},
				PyTorchReplicaSpecs: map[kftraining.ReplicaType]*kftraining.ReplicaSpec{
					kftraining.PyTorchJobReplicaTypeMaster: {Replicas: ptr.To[int32](1), Template: cpuTemplate()},
					kftraining.PyTorchJobReplicaTypeWorker: {Replicas: ptr.To[int32](1), Template: cpuTemplate()}}}}
		},
		paths: func(any) []string {
			return []string{"/spec/pytorchReplicaSpecs/Master/template", "/spec/pytorchReplicaSpecs/Worker/template"}
		}},
	{name: "MPIJob", gvk: mpi.SchemeGroupVersion.WithKind("MPIJob"), kueue: true, paths: kindPaths,
		obj: func(ns, name string) any {
			return &mpi.MPIJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: mpi.MPIJobSpec{
				RunPolicy: mpi.RunPolicy{Suspend: ptr.To(true)},
				MPIReplicaSpecs: map[mpi.MPIReplicaType]*mpi.ReplicaSpec{
					mpi.MPIReplicaTypeLauncher: {Replicas: ptr.To[int32](1), Template: cpuTemplate()},
					mpi.MPIReplicaTypeWorker:   {Replicas: ptr.To[int32](1), Template: cpuTemplate()}}}}
		}},
	{name: "JobSet", gvk: jobset.GroupVersion.WithKind("JobSet"), kueue: true, paths: kindPaths,
		obj: func(ns, name string) any {
			rj := func(n string) jobset.ReplicatedJob {
				return jobset.ReplicatedJob{Name: n, Replicas: 1, Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: cpuTemplate()}}}
			}
			return &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: jobset.JobSetSpec{Suspend: ptr.To(true),
				ReplicatedJobs: []jobset.ReplicatedJob{rj("driver"), rj("workers")}}}
		}},
	{name: "RayCluster", gvk: ray.GroupVersion.WithKind("RayCluster"), kueue: true, paths: kindPaths,
		obj: func(ns, name string) any {
			c := &ray.RayCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: *rayCluster()}
			c.Spec.Suspend = ptr.To(true)
			return c
		}},
	{name: "RayJob", gvk: ray.GroupVersion.WithKind("RayJob"), kueue: true, paths: kindPaths,
		obj: func(ns, name string) any {
			sub := cpuTemplate()
			return &ray.RayJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: ray.RayJobSpec{Suspend: true, Entrypoint: "python train.py",
				RayClusterSpec: rayCluster(), SubmitterPodTemplate: &sub}}
		}},
	// A TrainJob has no templates of its own: Kueue writes its podSetUpdates
	// into a runtime patch of its own (Kueue v0.17's trainjob integration,
	// RunWithPodSetsInfo), which the Trainer applies to the JobSet's pod
	// templates. Any runtime patch reaches them.
	{name: "TrainJob", gvk: trainer.GroupVersion.WithKind("TrainJob"), kueue: true,
		obj: func(ns, name string) any {
			return &trainer.TrainJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: trainer.TrainJobSpec{
				RuntimeRef: trainer.RuntimeRef{Name: "torch-distributed"}, Suspend: ptr.To(true),
				RuntimePatches: []trainer.RuntimePatch{runtimePatch("alice.example.com/tuning", map[string]string{"team": "a"})}}}
		},
		paths: func(any) []string {
			return []string{"/spec/runtimePatches/0/trainingRuntimeSpec/template/spec/replicatedJobs/0/template/spec/template"}
		},
		extra: func(plan string) []map[string]any {
			return []map[string]any{{"op": "add", "path": "/spec/runtimePatches/-", "value": runtimePatch(kueueManager, map[string]string{v1alpha1.AnnotationPlan: plan})}}
		}},
	{name: "Deployment", gvk: appsv1.SchemeGroupVersion.WithKind("Deployment"), paths: kindPaths,
		obj: func(ns, name string) any {
			t := cpuTemplate()
			t.Spec.RestartPolicy = corev1.RestartPolicyAlways
			return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0),
				Selector: &metav1.LabelSelector{MatchLabels: t.Labels}, Template: t}}
		}},
	{name: "StatefulSet", gvk: appsv1.SchemeGroupVersion.WithKind("StatefulSet"), paths: kindPaths,
		obj: func(ns, name string) any {
			t := cpuTemplate()
			t.Spec.RestartPolicy = corev1.RestartPolicyAlways
			return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](0),
				Selector: &metav1.LabelSelector{MatchLabels: t.Labels}, Template: t}}
		}},
	{name: "LeaderWorkerSet", gvk: lws.GroupVersion.WithKind("LeaderWorkerSet"), paths: kindPaths,
		obj: func(ns, name string) any {
			leader, worker := cpuTemplate(), cpuTemplate()
			leader.Spec.RestartPolicy, worker.Spec.RestartPolicy = corev1.RestartPolicyAlways, corev1.RestartPolicyAlways
			return &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: lws.LeaderWorkerSetSpec{Replicas: ptr.To[int32](0),
				StartupPolicy: lws.LeaderCreatedStartupPolicy, RolloutStrategy: lws.RolloutStrategy{Type: lws.RollingUpdateStrategyType},
				LeaderWorkerTemplate: lws.LeaderWorkerTemplate{Size: ptr.To[int32](2), LeaderTemplate: &leader, WorkerTemplate: worker}}}
		}},
	{name: "TrainingRuntime", gvk: trainer.GroupVersion.WithKind("TrainingRuntime"), paths: kindPaths,
		obj: func(ns, name string) any {
			return &trainer.TrainingRuntime{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: trainer.TrainingRuntimeSpec{
				Template: trainer.JobSetTemplateSpec{Spec: jobset.JobSetSpec{ReplicatedJobs: []jobset.ReplicatedJob{{Name: "node", Replicas: 1,
					Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: cpuTemplate()}}}}}}}}
		}},
}

// unstructuredOf converts a typed object of gvk for the API.
func unstructuredOf(t *testing.T, obj any, gvk schema.GroupVersionKind) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	unstructured.RemoveNestedField(u.Object, "status")
	return u
}

func jsonPatch(t *testing.T, ops ...map[string]any) client.Patch {
	t.Helper()
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	return client.RawPatch(types.JSONPatchType, raw)
}

// planOp sets (add: adds or replaces) or removes the plan of the template at path.
func planOp(op, path, plan string) map[string]any {
	o := map[string]any{"op": op, "path": path + "/metadata/annotations/gpupack.io~1plan"}
	if op != "remove" {
		o["value"] = plan
	}
	return o
}

func planOps(op string, paths []string, plan string) []map[string]any {
	var ops []map[string]any
	for _, p := range paths {
		ops = append(ops, planOp(op, p, plan))
	}
	return ops
}

// asKueue is Kueue's controller manager under its own RBAC (a ClusterRole
// on the job kinds, as Kueue's install grants).
func asKueue(t *testing.T, c *cluster) client.Client {
	t.Helper()
	grant(t, c, framework.UserKueue, "kueue-jobs", append([]string{"batch", "apps"}, jobKindGroups...))
	return c.as(t, framework.UserKueue, []string{"system:serviceaccounts", "system:serviceaccounts:kueue-system", "system:authenticated"}, nil)
}

// grant binds user to a ClusterRole that may read and write every
// resource of groups.
func grant(t *testing.T, c *cluster, user, name string, groups []string) {
	t.Helper()
	c.env.MustCreate(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: groups, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch", "update", "patch"}}}})
	c.env.MustCreate(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}})
}

func gcClient(t *testing.T, c *cluster) client.Client {
	return c.as(t, "system:serviceaccount:kube-system:generic-garbage-collector", []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}, nil)
}

// TestPlanAddedByUpdateRefusedEveryKind (issue 14 finding 6, every job
// kind): on alice's own suspended CPU-only object of each kind — which
// reaches no gpupack webhook that would judge it — her update adding the
// victim's plan to any one of its pod templates (at the JSON pointers
// gpupack's webhooks use for the kind) is refused; Kueue's account may add
// a plan where Kueue writes podSetUpdates, and nowhere else; on a planned
// object, alice may not change the plan, move it to another template or
// change the owner references; the garbage collector may remove them, and
// anyone may remove the plan.
func TestPlanAddedByUpdateRefusedEveryKind(t *testing.T) {
	c := startClusterOpts(t, framework.Options{NoKueue: true, OperatorCRDs: true}, webhooks.AllJobKinds)
	env, ctx, ns := c.env, c.env.Ctx, c.open
	kueueCl, gc := asKueue(t, c), gcClient(t, c)
	for _, k := range planKinds {
		t.Run(k.name, func(t *testing.T) {
			name := strings.ToLower(k.name)
			owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-owner", Namespace: ns}}
			other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-other", Namespace: ns}}
			for _, cm := range []*corev1.ConfigMap{owner, other} {
				if err := c.aliceSelf.Create(ctx, cm); err != nil {
					t.Fatal(err)
				}
			}
			ref := func(cm *corev1.ConfigMap) metav1.OwnerReference {
				return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID}
			}
			typed := k.obj(ns, name)
			paths := k.paths(typed)
			if len(paths) == 0 {
				t.Fatalf("%s has no pod templates", k.name)
			}
			own := unstructuredOf(t, typed, k.gvk)
			own.SetOwnerReferences([]metav1.OwnerReference{ref(owner)})
			if err := c.aliceSelf.Create(ctx, own); err != nil {
				t.Fatalf("alice's %s: %v", k.name, err)
			}

			// The attack: the victim's plan into one template of hers.
			for _, p := range paths {
				denied(t, "alice adding the victim's plan at "+p, c.aliceSelf.Patch(ctx, own, jsonPatch(t, planOp("add", p, "victim"))), "gpupack-job-plan")
			}
			if k.extra != nil {
				denied(t, "alice adding the victim's plan otherwise", c.aliceSelf.Patch(ctx, own, jsonPatch(t, k.extra("victim")...)), "gpupack-job-plan")
			}

			// A planned object: Kueue's podSetUpdates where Kueue writes
			// them; elsewhere only a creation with the plan (a cluster
			// admin's, which the webhooks' creation check lets through:
			// the policy binds admins too).
			planned := own
			err := kueueCl.Patch(ctx, own, jsonPatch(t, planOps("add", paths, "alices")...))
			if k.kueue {
				if err != nil {
					t.Fatalf("Kueue writing the plan into alice's %s: %v", k.name, err)
				}
			} else {
				denied(t, "Kueue writing a plan into a "+k.name+" template", err, "gpupack-job-plan")
				denied(t, "a cluster admin writing a plan into a "+k.name+" template", env.Client.Patch(ctx, own, jsonPatch(t, planOps("add", paths, "alices")...)), "gpupack-job-plan")
				planned = unstructuredOf(t, k.obj(ns, name+"-planned"), k.gvk)
				planned.SetOwnerReferences([]metav1.OwnerReference{ref(owner)})
				for _, p := range paths {
					setAt(t, planned.Object, append(pointerFields(p), "metadata", "annotations", v1alpha1.AnnotationPlan), "alices")
				}
				env.MustCreate(t, planned)
			}
			denied(t, "alice changing the plan", c.aliceSelf.Patch(ctx, planned, jsonPatch(t, planOp("add", paths[0], "victim"))), "gpupack-job-plan")
			planLeft := paths
			if len(paths) > 1 {
				// Removing it from one template is hers; putting it back is
				// adding it there, though another template still has it.
				last := paths[len(paths)-1]
				if err := c.aliceSelf.Patch(ctx, planned, jsonPatch(t, planOp("remove", last, ""))); err != nil {
					t.Errorf("alice removing the plan from %s: %v", last, err)
				}
				planLeft = paths[:len(paths)-1]
				denied(t, "alice copying the plan to "+last, c.aliceSelf.Patch(ctx, planned, jsonPatch(t, planOp("add", last, "alices"))), "gpupack-job-plan")
			}
			err = c.aliceSelf.Patch(ctx, planned, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{ref(owner), ref(other)}}}))
			denied(t, "alice adding an owner to her planned "+k.name, err, "owner references")
			err = c.aliceSelf.Patch(ctx, planned, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{ref(other)}}}))
			denied(t, "alice replacing the owner of her planned "+k.name, err, "owner references")
			if err := gc.Patch(ctx, planned, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{}}})); err != nil {
				t.Errorf("the garbage collector removing the planned %s's owner reference: %v", k.name, err)
			}
			if err := c.aliceSelf.Patch(ctx, planned, jsonPatch(t, planOps("remove", planLeft, "")...)); err != nil {
				t.Errorf("alice removing the plan from her %s: %v", k.name, err)
			}
			// Without a plan the owners are hers to change.
			if err := c.aliceSelf.Patch(ctx, planned, mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{ref(other)}}})); err != nil {
				t.Errorf("alice changing the owners of her %s without a plan: %v", k.name, err)
			}
		})
	}
}

// pointerFields splits a JSON pointer into its steps.
func pointerFields(p string) []string {
	return strings.Split(strings.TrimPrefix(p, "/"), "/")
}

// setAt sets the field at steps (map keys, list indexes) of obj, whose
// maps on the way exist but for the last.
func setAt(t *testing.T, obj map[string]any, steps []string, v any) {
	t.Helper()
	var node any = obj
	for i, s := range steps {
		last := i == len(steps)-1
		switch n := node.(type) {
		case map[string]any:
			if last {
				n[s] = v
				return
			}
			if n[s] == nil {
				n[s] = map[string]any{}
			}
			node = n[s]
		case []any:
			idx, err := strconv.Atoi(s)
			if err != nil || idx >= len(n) || last {
				t.Fatalf("no %v in the object", steps)
			}
			node = n[idx]
		default:
			t.Fatalf("no %v in the object", steps)
		}
	}
}

// TestPlanCopiedFromOwnerOnlyByItsController: the controllers that copy
// their owner's (Kueue-written) templates into a child when they resume it
// — the JobSet controller into a JobSet's Jobs, the MPI operator into an
// MPIJob's launcher Job, the Trainer into a TrainJob's JobSet (JobSet
// v0.11 resumeJob, MPI operator v0.8 syncLauncherSchedulingDirectives,
// Trainer v2.2 re-applying the JobSet of an unsuspended TrainJob) — may add
// the plan to a child their owner kind controls, and only that: not to a
// child of another kind's, nor to one without a controller; alice never.
// Each is its real account (impersonated: a fresh control plane runs none
// of them; TestJobSetControllerResumesPlannedJobs runs the real JobSet
// controller).
func TestPlanCopiedFromOwnerOnlyByItsController(t *testing.T) {
	c := startClusterOpts(t, framework.Options{NoKueue: true, OperatorCRDs: true}, nil)
	env, ctx, ns := c.env, c.env.Ctx, c.open
	const (
		jobSetCtl  = framework.UserJobSetController
		mpiCtl     = "system:serviceaccount:mpi-operator:mpi-operator"
		trainerCtl = framework.UserTrainerController
	)
	// RBAC lets each write Jobs and JobSets: only the policy tells them apart.
	for i, user := range []string{jobSetCtl, mpiCtl, trainerCtl} {
		grant(t, c, user, fmt.Sprintf("ctl-%d", i), []string{"batch", "jobset.x-k8s.io"})
	}
	ctl := func(user string) client.Client {
		return c.as(t, user, []string{"system:serviceaccounts", "system:authenticated"}, nil)
	}

	// The owners, as the admin (Kueue, in a cluster) would have them.
	jobK, jobSetK, mpiK, trainJobK := planKindNamed("Job"), planKindNamed("JobSet"), planKindNamed("MPIJob"), planKindNamed("TrainJob")
	jsOwner := unstructuredOf(t, jobSetK.obj(ns, "js"), jobSetK.gvk)
	mpiOwner := unstructuredOf(t, mpiK.obj(ns, "mpi"), mpiK.gvk)
	tjOwner := unstructuredOf(t, trainJobK.obj(ns, "tj"), trainJobK.gvk)
	for _, o := range []*unstructured.Unstructured{jsOwner, mpiOwner, tjOwner} {
		env.MustCreate(t, o)
	}
	controllerRef := func(o *unstructured.Unstructured) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Name: o.GetName(), UID: o.GetUID(), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	}
	child := func(kind planKind, name string, owner *unstructured.Unstructured) *unstructured.Unstructured {
		u := unstructuredOf(t, kind.obj(ns, name), kind.gvk)
		if owner != nil {
			u.SetOwnerReferences([]metav1.OwnerReference{controllerRef(owner)})
		}
		env.MustCreate(t, u)
		return u
	}
	ci := 0
	jobPath, jobSetPaths := []string{"/spec/template"}, []string{"/spec/replicatedJobs/0/template/spec/template", "/spec/replicatedJobs/1/template/spec/template"}
	for _, tc := range []struct {
		what    string
		kind    planKind
		owner   *unstructured.Unstructured
		paths   []string
		allowed map[string]bool // by user
	}{
		{"a JobSet's Job", jobK, jsOwner, jobPath, map[string]bool{jobSetCtl: true}},
		{"an MPIJob's launcher Job", jobK, mpiOwner, jobPath, map[string]bool{mpiCtl: true}},
		{"a TrainJob's JobSet", jobSetK, tjOwner, jobSetPaths, map[string]bool{trainerCtl: true}},
		{"a Job without a controller", jobK, nil, jobPath, map[string]bool{}},
		{"a JobSet without a controller", jobSetK, nil, jobSetPaths, map[string]bool{}},
	} {
		ci++
		for i, user := range []string{jobSetCtl, mpiCtl, trainerCtl, "alice"} {
			cl := c.aliceSelf
			if user != "alice" {
				cl = ctl(user)
			}
			o := child(tc.kind, fmt.Sprintf("%s-%d-%d", strings.ToLower(tc.kind.name), ci, i), tc.owner)
			err := cl.Patch(ctx, o, jsonPatch(t, append(planOps("add", tc.paths, "owners-plan"), map[string]any{"op": "replace", "path": "/spec/suspend", "value": false})...))
			switch {
			case tc.allowed[user] && err != nil:
				t.Errorf("%s copying its owner's plan into %s: %v", user, tc.what, err)
			case !tc.allowed[user]:
				denied(t, user+" adding a plan to "+tc.what, err, "gpupack-job-plan")
			}
		}
	}
}

func planKindNamed(name string) planKind {
	for _, k := range planKinds {
		if k.name == name {
			return k
		}
	}
	panic("no plan kind " + name)
}

// cpuTrainingRuntime is a torch TrainingRuntime of one CPU node.
func cpuTrainingRuntime(ns string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(`apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainingRuntime
metadata:
  name: torch-cpu
  namespace: `+ns+`
  labels:
    trainer.kubeflow.org/framework: torch
spec:
  mlPolicy:
    numNodes: 1
    torch: {}
  template:
    spec:
      replicatedJobs:
      - name: node
        replicas: 1
        template:
          metadata:
            labels:
              trainer.kubeflow.org/trainjob-ancestor-step: trainer
          spec:
            template:
              spec:
                restartPolicy: Never
                containers:
                - name: node
                  image: docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
                  command: ["python", "train.py"]
`), &u.Object); err != nil {
		panic(err)
	}
	return u
}

// TestControllersCopyTheOwnersPlanIntoTheirChildren runs the real Trainer
// and JobSet controllers under the shipped policies through what Kueue's
// trainjob integration does when it admits a TrainJob: it writes its
// runtime patch (the plan in the node template) into the suspended
// TrainJob, then unsuspends it. The Trainer re-applies the TrainJob's
// JobSet (made suspended, before the plan) with the plan in its template,
// and the JobSet controller copies it into the JobSet's suspended Job when
// it resumes it: both are updates that add the plan, by the controller of
// the child's owner (variable propagates of gpupack-job-plan); refused,
// the job would never start. alice may not give the suspended Job a plan.
func TestControllersCopyTheOwnersPlanIntoTheirChildren(t *testing.T) {
	c := startClusterOpts(t, framework.Options{NoKueue: true, OperatorCRDs: true, JobSetController: true, TrainerController: true}, nil)
	env, ctx, ns := c.env, c.env.Ctx, c.open
	kueueCl := asKueue(t, c)
	env.MustCreate(t, cpuTrainingRuntime(ns))
	tj := unstructuredOf(t, &trainer.TrainJob{ObjectMeta: metav1.ObjectMeta{Name: "tj", Namespace: ns},
		Spec: trainer.TrainJobSpec{RuntimeRef: trainer.RuntimeRef{Name: "torch-cpu", Kind: ptr.To("TrainingRuntime")}, Suspend: ptr.To(true)}}, trainer.GroupVersion.WithKind("TrainJob"))
	env.MustCreate(t, tj)

	jobOf := func() (*batchv1.Job, string) {
		var jobs batchv1.JobList
		if err := env.Client.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{"jobset.sigs.k8s.io/jobset-name": "tj"}); err != nil {
			return nil, err.Error()
		}
		if len(jobs.Items) != 1 {
			return nil, fmt.Sprintf("%d Jobs", len(jobs.Items))
		}
		j := &jobs.Items[0]
		return j, fmt.Sprintf("Job %s suspended %v, template annotations %v", j.Name, ptr.Deref(j.Spec.Suspend, false), j.Spec.Template.Annotations)
	}
	env.Eventually(t, 90*time.Second, "the TrainJob's suspended JobSet and Job", func() (bool, string) {
		j, why := jobOf()
		return j != nil && ptr.Deref(j.Spec.Suspend, false), why
	})

	// alice giving the suspended Job the victim's plan herself.
	j, _ := jobOf()
	denied(t, "alice adding the victim's plan to the TrainJob's suspended Job", c.aliceSelf.Patch(ctx, j, jsonPatch(t, map[string]any{"op": "add", "path": "/spec/template/metadata/annotations",
		"value": map[string]string{v1alpha1.AnnotationPlan: "victim"}})), "gpupack-job-plan")

	// Kueue's RunWithPodSetsInfo: its runtime patch while suspended, then
	// the unsuspend.
	if err := kueueCl.Patch(ctx, tj, jsonPatch(t, map[string]any{"op": "add", "path": "/spec/runtimePatches", "value": []trainer.RuntimePatch{
		runtimePatch(kueueManager, map[string]string{v1alpha1.AnnotationPlan: "tj-plan"})}})); err != nil {
		t.Fatalf("Kueue writing its runtime patch: %v", err)
	}
	if err := kueueCl.Patch(ctx, tj, mergePatch(map[string]any{"spec": map[string]any{"suspend": false}})); err != nil {
		t.Fatalf("Kueue unsuspending the TrainJob: %v", err)
	}
	env.Eventually(t, 90*time.Second, "the JobSet's Job resumed with the plan", func() (bool, string) {
		js, jsWhy := &jobset.JobSet{}, ""
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tj"}, js); err == nil && len(js.Spec.ReplicatedJobs) > 0 {
			jsWhy = fmt.Sprintf("JobSet suspended %v, template annotations %v; ", ptr.Deref(js.Spec.Suspend, false), js.Spec.ReplicatedJobs[0].Template.Spec.Template.Annotations)
		}
		j, why := jobOf()
		return j != nil && !ptr.Deref(j.Spec.Suspend, false) && j.Spec.Template.Annotations[v1alpha1.AnnotationPlan] == "tj-plan", jsWhy + why
	})
}
