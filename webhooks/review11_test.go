package webhooks

import (
	"context"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/ptr"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// Review 11 (hostile review of gcRemovesOwners and the CronJob Job rule).
// Each test asserts the promise and fails with "BROKEN: ..." while the hole
// is open.

// decideFor is decide for a resource other than pods: the policy's answer
// ("" admitted) and whether a validation errored (fails closed).
func decideFor(ctx context.Context, v validating.Validator, gvr schema.GroupVersionResource, attr *admission.VersionedAttributes) (string, bool) {
	r := v.Validate(ctx, gvr, attr, nil, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attr.GetNamespace()}}, celconfig.RuntimeCELCostBudget, nil)
	for _, d := range r.Decisions {
		if d.Evaluation == validating.EvalError {
			return d.Message, true
		}
		if d.Action == validating.ActionDeny {
			return d.Message, false
		}
	}
	return "", false
}

// jobAttr is a Job create (old nil) or update as admission sees it.
func jobAttr(old, j *batchv1.Job, username string) *admission.VersionedAttributes {
	kind := batchv1.SchemeGroupVersion.WithKind("Job")
	op, opts := admission.Create, kruntime.Object(&metav1.CreateOptions{})
	var oldObj kruntime.Object
	if old != nil {
		op, opts, oldObj = admission.Update, &metav1.UpdateOptions{}, old
	}
	attr := admission.NewAttributesRecord(j, oldObj, kind, j.Namespace, j.Name, batchv1.SchemeGroupVersion.WithResource("jobs"), "",
		op, opts, false, &user.DefaultInfo{Name: username})
	va := &admission.VersionedAttributes{Attributes: attr, VersionedKind: kind}
	va.VersionedObject.Set(j)
	if old != nil {
		va.VersionedOldObject.Set(old)
	}
	return va
}

// TestReview11GCUnblockIsJudgedAsACreation (Low, availability; a
// regression of 0be7288 on the Job and PyTorchJob paths). The garbage
// collector does not only remove owner references: in a foreground
// deletion, when an item's owner waits for its dependents and one of the
// item's own dependents is itself deleting its dependents (its cycle
// guard, k8s.io/kubernetes pkg/controller/garbagecollector
// attemptToDeleteItem, "to prevent potential cycle"), it first patches
// the item's references to blockOwnerDeletion=false
// (unblockOwnerReferencesStrategicMergePatch), then deletes it. Policies
// gpupack-job-plan and gpupack-placement admit that ("or unblock their
// deletion": they compare apiVersion, kind, name, uid, controller only);
// gcRemovesOwners compares whole references (equality.Semantic.DeepEqual),
// so the unblock is judged as a creation by the collector — under its
// service account (--use-service-account-credentials, kubeadm's default)
// not one of unmanagedGPUs.ownerControllers, so a JobSet's Job is refused
// as PosesAsChild whatever the policy says, a Job's PyTorchJob and a
// TrainJob's JobSet under Deny. The collector's attemptToDeleteItem returns
// the error before its delete and retries for good: the foreground
// deletion of the owner never completes (its Jobs keep running). Before
// 0be7288 the Job and PyTorchJob paths let the collector's account make
// any owner change, so the unblock passed there.
//
// Attack steps (alice, edit): her admitted GPU JobSet js runs Job js-w-0
// with pod P. She creates a ConfigMap with an owner reference to P
// (blockOwnerDeletion: true) and a finalizer of her own, deletes P with
// propagation Foreground (P now carries foregroundDeletion for as long as
// her finalizer stays), then deletes js with propagation Foreground
// (`kubectl delete jobset js --cascade=foreground`).
func TestReview11GCUnblockIsJudgedAsACreation(t *testing.T) {
	ctx := context.Background()
	h, children := gcFixture(t)
	job := func(block bool) *batchv1.Job { j, _, _ := children(block, "js-plan"); return j }
	pt := func(block bool) *kftraining.PyTorchJob { _, p, _ := children(block, "js-plan"); return p }
	js := func(block bool) *jobset.JobSet { _, _, s := children(block, "js-plan"); return s }

	// The policy admits the unblock (the premise: only the webhook differs).
	vap, _ := readPolicy(t, "job-plan.yaml")
	if msg, evalErr := decideFor(ctx, compiledPolicy(&vap), batchv1.SchemeGroupVersion.WithResource("jobs"), jobAttr(job(true), job(false), garbageCollector)); msg != "" || evalErr {
		t.Fatalf("premise: gpupack-job-plan refuses the collector's unblock of a planned Job: %q (error %v)", msg, evalErr)
	}

	for _, u := range []authenticationv1.UserInfo{{Username: garbageCollector}, {Username: "system:kube-controller-manager"}} {
		for _, k := range []struct {
			kind     string
			path     string
			old, obj any
		}{
			{"Job under a JobSet", PathMutateJob, job(true), job(false)},
			{"PyTorchJob under a Job", PathMutatePyTorchJob, pt(true), pt(false)},
			{"JobSet under a TrainJob", PathMutateJobSet, js(true), js(false)},
		} {
			t.Run(u.Username+"/"+k.kind, func(t *testing.T) {
				req := request(t, admissionv1.Update, k.obj, k.old)
				req.UserInfo = u
				if resp := h[k.path].Handle(ctx, req); !resp.Allowed {
					t.Errorf("BROKEN: the garbage collector's unblock of an owner reference (blockOwnerDeletion true→false, a foreground deletion's cycle guard) is refused, so the owner's foreground deletion never completes: %v", resp.Result.Message)
				}
			})
		}
	}
}

// TestReview11TenantRelabelReleasesPodFromItsJob (Medium, promise (a)):
// a tenant takes her own running GPU pod out of its Job by a label change
// and keeps it after the Job — and its Workload, so its quota — is gone.
// The Job controller claims pods by its selector
// (batch.kubernetes.io/controller-uid=<job uid>) and releases a pod it
// controls that no longer matches: it removes its controller reference
// (controller.PodControllerRefManager.ClaimPods → ReleasePod). Nothing in
// gpupack looks at a pod's labels on update (ValidatePodUpdate: the
// request annotations; gpupack-placement: only kueue.x-k8s.io/pod-group-name),
// gpupack-placement lets system:kube-controller-manager — the Job
// controller too, without --use-service-account-credentials — remove a
// planned pod's owner references (its variable gc), and an unplanned
// (whole-GPU, ClusterQueue without the check) pod's references are not
// guarded at all (the tenant may remove them herself).
//
// Attack steps (alice, edit): her Job a (1 GPU, queue q) is admitted, pod
// a-x runs. `kubectl label pod a-x batch.kubernetes.io/controller-uid=x
// controller-uid=x --overwrite`; the Job controller releases a-x (and
// makes a replacement, which waits: the released pod still holds the plan's
// slot, ungater livePods lists pods by plan). `kubectl delete job a`
// (background): the collector deletes the Job's Workload and the
// replacement, not a-x, which has no owner; Kueue frees the quota, the
// gang-fit usage rule keeps a-x's GPU held (so it is not re-planned).
// Submit Job b: admitted on another GPU. Repeat: n GPUs held on a 1-GPU
// quota, outside every Workload (and outside the preemption coordinator's
// reach, which walks Workload owners). Not run end to end (needs the Job
// controller); this test checks the two admission steps gpupack owns.
func TestReview11TenantRelabelReleasesPodFromItsJob(t *testing.T) {
	ctx := context.Background()
	policies := podPolicies(t)
	jobRef := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "a", UID: "u-a", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	running := wholeGPUPod("ns", "1")
	running.Name, running.UID = "a-x", "u-a-x"
	running.OwnerReferences = jobRef
	running.Labels = map[string]string{"batch.kubernetes.io/controller-uid": "u-a", "controller-uid": "u-a", "batch.kubernetes.io/job-name": "a", "job-name": "a"}
	running.Annotations = map[string]string{v1alpha1.AnnotationPlan: "a-plan", v1alpha1.AnnotationDevices: "node-1:GPU-1"}
	running.Spec.NodeName = "node-1"

	relabelled := running.DeepCopy()
	relabelled.Labels["batch.kubernetes.io/controller-uid"], relabelled.Labels["controller-uid"] = "x", "x"
	released := relabelled.DeepCopy()
	released.OwnerReferences = nil

	m, err := mutation.New(mutation.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hv := Handlers(m, nil)[PathValidatePod]
	req := request(t, admissionv1.Update, relabelled, running)
	req.UserInfo = authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}}
	webhookAdmits := hv.Handle(ctx, req).Allowed
	policyAdmits := true
	for name, v := range policies {
		if msg, evalErr := decide(ctx, v, podUpdate(running, relabelled, "alice")); msg != "" || evalErr {
			t.Logf("%s refuses alice's relabel: %s", name, msg)
			policyAdmits = false
		}
	}
	kcmReleases := true
	for name, v := range policies {
		if msg, evalErr := decide(ctx, v, podUpdate(relabelled, released, "system:kube-controller-manager")); msg != "" || evalErr {
			t.Logf("%s refuses the Job controller's release (as kube-controller-manager): %s", name, msg)
			kcmReleases = false
		}
	}
	if webhookAdmits && policyAdmits && kcmReleases {
		t.Errorf("BROKEN: alice relabels her running planned GPU pod out of its Job's selector (admitted by the pod webhook and every pod policy), and the Job controller running as system:kube-controller-manager may release it (gpupack-placement's gc): the pod outlives its Job and Workload, holding its GPU outside quota")
	}
}

// TestReview11JobPlanCreateRule: gpupack-job-plan now matches every Job
// creation (for the CronJob rule); oldObject is null there, and an
// evaluation error would fail closed for every Job. Checked: no creation
// errors, only a CronJob's Job with a plan is refused (the controllers
// that create planned Jobs — JobSet, MPI operator, KubeRay, the Trainer's
// JobSet controller — name other owners). Passes: no hole found here.
func TestReview11JobPlanCreateRule(t *testing.T) {
	ctx := context.Background()
	vap, _ := readPolicy(t, "job-plan.yaml")
	v := compiledPolicy(&vap)
	owned := func(apiVersion, kind string, controller bool, plan bool) *batchv1.Job {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns"}, Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: wholeGPUPod("ns", "1").Spec}}}
		if kind != "" {
			j.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "o", UID: "u-o", Controller: ptr.To(controller)}}
		}
		if plan {
			j.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationPlan: "p"}
		}
		return j
	}
	for _, tc := range []struct {
		name string
		job  *batchv1.Job
		deny bool
	}{
		{"a tenant's plain Job", owned("", "", false, false), false},
		{"a JobSet's planned Job", owned("jobset.x-k8s.io/v1alpha2", "JobSet", true, true), false},
		{"an MPIJob's planned launcher", owned("kubeflow.org/v2beta1", "MPIJob", true, true), false},
		{"a RayJob's submitter", owned("ray.io/v1", "RayJob", true, true), false},
		{"a CronJob's Job without a plan", owned("batch/v1", "CronJob", true, false), false},
		{"a CronJob's Job with a plan", owned("batch/v1", "CronJob", true, true), true},
		{"a Job naming a CronJob as a plain owner, with a plan", owned("batch/v1", "CronJob", false, true), false},
	} {
		msg, evalErr := decideFor(ctx, v, batchv1.SchemeGroupVersion.WithResource("jobs"), jobAttr(nil, tc.job, "system:kube-controller-manager"))
		if evalErr {
			t.Errorf("%s: the policy errors on a Job creation (fails closed for every Job): %s", tc.name, msg)
		} else if (msg != "") != tc.deny {
			t.Errorf("%s: denied %q, want deny=%v", tc.name, msg, tc.deny)
		}
	}
}
