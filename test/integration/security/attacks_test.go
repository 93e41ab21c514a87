package security

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/checkpoint/agent"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks/mutation"
	"github.com/gpupack/gpupack/webhooks/placement"
)

func mergePatch(obj map[string]any) client.Patch {
	raw, _ := json.Marshal(obj)
	return client.RawPatch(types.MergePatchType, raw)
}

func annPatch(k string, v any) client.Patch {
	return mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]any{k: v}}})
}

func hasGate(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == v1alpha1.SchedulingGatePlacement {
			return true
		}
	}
	return false
}

// TestTenantAttacks: issue 14's API-side attacks, each by a tenant with
// `edit` in its namespace.
func TestTenantAttacks(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	always := corev1.ContainerRestartPolicyAlways
	yes := true
	queued := map[string]string{mutation.LabelQueueName: "gpu"}

	// Item 6: a baseline namespace takes fractional GPU pods, and the pods
	// the Job controller and the training operator make from GPU templates.
	t.Run("pod security baseline admits GPU pods", func(t *testing.T) {
		p := gpuPod(c.baseline, "frac")
		if err := c.alice.Create(ctx, p); err != nil {
			t.Fatalf("fractional GPU pod in a baseline namespace: %v", err)
		}
		for _, v := range p.Spec.Volumes {
			if v.HostPath != nil {
				t.Errorf("stored pod has hostPath volume %q", v.Name)
			}
		}
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: c.baseline, Labels: queued, Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "trainer", Image: "trainer:test", Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, "1")}}},
			}}},
		}
		if err := c.alice.Create(ctx, job); err != nil {
			t.Fatal(err)
		}
		pt := &kftraining.PyTorchJob{
			ObjectMeta: metav1.ObjectMeta{Name: "ft", Namespace: c.baseline, Labels: queued, Annotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
			Spec: kftraining.PyTorchJobSpec{RunPolicy: kftraining.RunPolicy{Suspend: ptr.To(true)}, PyTorchReplicaSpecs: map[kftraining.ReplicaType]*kftraining.ReplicaSpec{
				kftraining.PyTorchJobReplicaTypeWorker: {Replicas: ptr.To[int32](1), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "pytorch", Image: "trainer:test", Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, "1")}}},
				}}},
			}},
		}
		env.MustCreate(t, pt)
		for _, tc := range []struct {
			user  string
			owner metav1.OwnerReference
			tmpl  corev1.PodTemplateSpec
		}{
			{framework.UserKubeControllerManager, *metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job")), job.Spec.Template},
			{framework.UserTrainingOperator, *metav1.NewControllerRef(pt, kftraining.SchemeGroupVersion.WithKind(kftraining.PyTorchJobKind)),
				pt.Spec.PyTorchReplicaSpecs[kftraining.PyTorchJobReplicaTypeWorker].Template},
		} {
			ctl, err := client.New(env.UserConfig(t, tc.user, "system:masters"), client.Options{Scheme: env.Scheme})
			if err != nil {
				t.Fatal(err)
			}
			p := &corev1.Pod{ObjectMeta: *tc.tmpl.ObjectMeta.DeepCopy(), Spec: *tc.tmpl.Spec.DeepCopy()}
			p.GenerateName, p.Namespace, p.OwnerReferences = tc.owner.Name+"-", c.baseline, []metav1.OwnerReference{tc.owner}
			// As Kueue starts the job: its podSetUpdates name the plan.
			p.Annotations[v1alpha1.AnnotationPlan] = "plan-" + tc.owner.Name
			if err := ctl.Create(ctx, p); err != nil {
				t.Errorf("%s's pod from %s's template in a baseline namespace: %v", tc.user, tc.owner.Kind, err)
			}
		}
	})

	// Items 4 and 1: init containers, restartable sidecars and ephemeral
	// containers are held to the same rules; gpupack-named volumes never
	// reach a stored pod, and no container mounts over gpupack's paths.
	t.Run("every container is covered", func(t *testing.T) {
		for _, ns := range []string{c.open, c.baseline} {
			p := gpuPod(ns, "sidecar-steal")
			p.Spec.Volumes = []corev1.Volume{
				{Name: "gpupack-cache", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/gpupack"}}},
				{Name: "gpupack-hook", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			}
			p.Spec.InitContainers = []corev1.Container{
				{Name: "init", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "gpupack-hook", MountPath: "/hook"}}},
				{Name: "side", Image: "busybox", RestartPolicy: &always, VolumeMounts: []corev1.VolumeMount{{Name: "gpupack-cache", MountPath: "/steal"}}},
			}
			if err := c.alice.Create(ctx, p); err != nil {
				t.Fatalf("%s: %v", ns, err)
			}
			for _, v := range p.Spec.Volumes {
				t.Errorf("%s: stored pod kept volume %q", ns, v.Name)
			}
		}

		side := gpuPod(c.open, "gpu-sidecar")
		side.Spec.InitContainers = []corev1.Container{{Name: "side", Image: "x", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Limits: rl(v1alpha1.ResourceNvidiaGPU, "1")}}}
		// The GPU is only in the sidecar, and no request annotation: the
		// match conditions must see it there.
		side.Spec.Containers[0].Resources.Limits, side.Annotations = nil, nil
		denied(t, "GPU in a restartable sidecar", c.alice.Create(ctx, side), `sidecar container (restartPolicy: Always) "side" asks for GPUs`)

		for _, path := range []string{"/usr/local/gpupack", "/usr/local/gpupack/libgpupack-hook.so", "/etc/ld.so.preload", "/etc/gpupack", "/etc/gpupack/limits", "/var/run/gpupack", "/run/gpupack"} {
			for _, in := range []string{"trainer", "side"} {
				p := gpuPod(c.open, "mount-over")
				p.Spec.Volumes = []corev1.Volume{{Name: "mine", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
				vm := []corev1.VolumeMount{{Name: "mine", MountPath: path}}
				if in == "trainer" {
					p.Spec.Containers[0].VolumeMounts = vm
				} else {
					p.Spec.InitContainers = []corev1.Container{{Name: "side", Image: "busybox", RestartPolicy: &always, VolumeMounts: vm}}
				}
				denied(t, "mount at "+path+" in "+in, c.alice.Create(ctx, p), `"`+in+`" mounts volume "mine" at `+path)
			}
		}

		// kubectl debug on a GPU pod.
		target := gpuPod(c.open, "debug-me")
		target.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		if err := c.alice.Create(ctx, target); err != nil {
			t.Fatal(err)
		}
		debug := func(ec corev1.EphemeralContainerCommon) error {
			cur, err := c.aliceCS.CoreV1().Pods(c.open).Get(ctx, target.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ec.Image = "busybox"
			cur.Spec.EphemeralContainers = append(cur.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: ec})
			_, err = c.aliceCS.CoreV1().Pods(c.open).UpdateEphemeralContainers(ctx, target.Name, cur, metav1.UpdateOptions{})
			return err
		}
		denied(t, "privileged ephemeral container", debug(corev1.EphemeralContainerCommon{Name: "dbg1", SecurityContext: &corev1.SecurityContext{Privileged: &yes}}), `ephemeral container "dbg1" is privileged`)
		denied(t, "ephemeral container with SYS_PTRACE (kubectl debug --profile=general)", debug(corev1.EphemeralContainerCommon{Name: "dbg2",
			SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_PTRACE"}}}}), "adds capability SYS_PTRACE")
		denied(t, "ephemeral container over the limits file", debug(corev1.EphemeralContainerCommon{Name: "dbg3",
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/etc/gpupack"}}}), "at /etc/gpupack")
		denied(t, "ephemeral container with owned env", debug(corev1.EphemeralContainerCommon{Name: "dbg4",
			Env: []corev1.EnvVar{{Name: v1alpha1.EnvDisableControl, Value: "1"}}}), "sets CUDA_DISABLE_CONTROL")
		if err := debug(corev1.EphemeralContainerCommon{Name: "dbg-ok"}); err != nil {
			t.Errorf("a plain debug container: %v", err)
		}
	})

	// Item 6: privilege, in the namespace without Pod Security, where
	// gpupack is the only defence.
	t.Run("GPU pods get no privilege", func(t *testing.T) {
		unmasked := corev1.UnmaskedProcMount
		for _, tc := range []struct {
			name string
			set  func(*corev1.Pod)
			want string
		}{
			{"privileged sidecar", func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "side", Image: "x", RestartPolicy: &always, SecurityContext: &corev1.SecurityContext{Privileged: &yes}}}
			}, `sidecar container "side" is privileged`},
			{"CAP_SYS_ADMIN", func(p *corev1.Pod) {
				p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"CAP_SYS_ADMIN"}}}
			}, "adds capability CAP_SYS_ADMIN"},
			{"CAP_SYS_ADMIN in a CPU container", func(p *corev1.Pod) {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "helper", Image: "x", SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}})
			}, `container "helper" adds capability SYS_ADMIN`},
			{"hostPID", func(p *corev1.Pod) { p.Spec.HostPID = true }, "sets hostPID"},
			{"hostIPC", func(p *corev1.Pod) { p.Spec.HostIPC = true }, "sets hostIPC"},
			{"procMount Unmasked", func(p *corev1.Pod) {
				p.Spec.HostUsers = ptr.To(false) // the apiserver allows Unmasked only in a user namespace
				p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{ProcMount: &unmasked}
			}, "procMount: Unmasked"},
		} {
			p := gpuPod(c.open, "priv")
			tc.set(p)
			denied(t, tc.name, c.alice.Create(ctx, p), tc.want)
		}
	})

	// Item 3: owned env. env is stripped; envFrom cannot be seen by a
	// webhook and is admitted — harmless because the hook takes its limits
	// from /etc/gpupack/limits and ignores the environment when that file
	// exists (the node side's tests show it).
	t.Run("owned env", func(t *testing.T) {
		env.MustCreate(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "unlimited", Namespace: c.open}, Data: map[string]string{v1alpha1.EnvDisableControl: "1"}})
		p := gpuPod(c.open, "env")
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: v1alpha1.EnvDisableControl, Value: "1"}, {Name: v1alpha1.EnvMemoryLimit, Value: "0"}, {Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "80g"}}
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "unlimited"}}}}
		if err := c.alice.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		// What stays is gpupack's own: with envFrom, an explicit
		// GPUPACK_JOB_ID — the pod's Job's id (the pod is created by the
		// Job controller for alice's Job: throughJob), or empty when no job
		// is known — shadows whatever the ConfigMap says (issue 16 review
		// L2). Nothing the tenant wrote survives.
		jobID := mutation.JobID(c.open, batchv1.SchemeGroupVersion.WithKind("Job").GroupKind(), metav1.GetControllerOf(p).Name)
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name != agent.EnvJobID || (e.Value != "" && e.Value != jobID) || e.ValueFrom != nil {
				t.Errorf("owned env survived: %v", p.Spec.Containers[0].Env)
				break
			}
		}
	})

	// Findings 1 and 2 of the outside review, at admission: a fractional
	// pod that can never get a plan is denied (no plan, no slot), and so
	// is a GPU pod or job Kueue will not manage, unless an administrator
	// labelled its namespace gpupack.io/unmanaged-gpus=allow.
	t.Run("no plan no slot, no GPUs outside Kueue", func(t *testing.T) {
		unplanned := gpuPod(c.open, "unplanned")
		delete(unplanned.Annotations, v1alpha1.AnnotationPlan)
		denied(t, "a fractional pod that can never get a plan", c.alice.Create(ctx, unplanned.DeepCopy()), "has no gpupack.io/plan and will not get one")
		vgpu := unplanned.DeepCopy()
		vgpu.Name = "unplanned-vgpu"
		delete(vgpu.Annotations, v1alpha1.AnnotationGPUMemory)
		vgpu.Spec.Containers[0].Resources.Limits = rl(v1alpha1.ResourceVGPU, "1", v1alpha1.ResourceGPUMemory, "4096")
		denied(t, "gpupack.io/vgpu written by hand, no plan", c.alice.Create(ctx, vgpu), "has no gpupack.io/plan and will not get one")
		queuedPod := unplanned.DeepCopy()
		queuedPod.Labels = queued
		denied(t, "a queue label without Kueue's pod integration", c.alice.Create(ctx, queuedPod), "has no gpupack.io/plan and will not get one")

		greedy := wholeGPUPod(c.open, "greedy", "8")
		denied(t, "8 whole GPUs and no queue name", c.alice.Create(ctx, greedy.DeepCopy()), "pod greedy asks for GPUs but Kueue will not manage it")
		plainJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: c.open},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: *greedy.Spec.DeepCopy()}}}
		plainJob.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
		denied(t, "a GPU Job with no queue name", c.alice.Create(ctx, plainJob.DeepCopy()), "Job plain asks for GPUs but Kueue will not manage it")
		// An owner reference is the tenant's to write: naming a queued Job
		// of its own does not count unless it is that Job (UID).
		real := plainJob.DeepCopy()
		real.Name, real.Labels, real.Spec.Suspend = "queued", queued, ptr.To(true)
		if err := c.alice.Create(ctx, real); err != nil {
			t.Fatalf("a queued GPU Job: %v", err)
		}
		adopted := wholeGPUPod(c.open, "adopted", "8")
		adopted.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "queued", UID: "00000000-0000-0000-0000-00000000beef", Controller: &yes}}
		denied(t, "a forged owner reference to a queued Job", c.alice.Create(ctx, adopted), "which is not that object")

		// The opt-out is the administrator's: edit cannot label a namespace.
		lab := env.Namespace(t, "lab")
		env.MustCreate(t, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "alice-edit", Namespace: lab},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
			Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"}},
		})
		optOut := mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{mutation.NamespaceLabelUnmanagedGPUs: "allow"}}})
		if err := c.alice.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.open}}, optOut); err == nil {
			t.Error("a tenant labelled its own namespace out of the policy")
		}
		if err := env.Client.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lab}}, optOut); err != nil {
			t.Fatal(err)
		}
		inLab := wholeGPUPod(lab, "greedy", "8")
		if err := c.alice.Create(ctx, inLab); err != nil {
			t.Errorf("8 whole GPUs in a namespace that opted out: %v", err)
		}
		inLab = unplanned.DeepCopy()
		inLab.Namespace = lab
		denied(t, "an unplanned fractional pod in a namespace that opted out", c.alice.Create(ctx, inLab), "has no gpupack.io/plan")
	})

	// Item 2: the placement is gpupack's.
	t.Run("placement", func(t *testing.T) {
		mgr := c.manager(t)
		forged := gpuPod(c.open, "forged")
		forged.Annotations[v1alpha1.AnnotationDevices] = "GPU-00000000-0000-0000-0000-000000000001:70000"
		if err := c.alice.Create(ctx, forged); err != nil {
			t.Fatal(err)
		}
		if v, ok := forged.Annotations[v1alpha1.AnnotationDevices]; ok {
			t.Errorf("tenant gpupack.io/devices at creation kept: %q", v)
		}
		cpu := cpuPod(c.open, "forged-cpu")
		cpu.Annotations = map[string]string{v1alpha1.AnnotationDevices: "GPU-00000000-0000-0000-0000-000000000001:70000"}
		denied(t, "gpupack.io/devices on a CPU pod (the ledger would count it)", c.alice.Create(ctx, cpu), "only gpupack's placement may add, change or remove the annotation gpupack.io/devices")

		// annotate --overwrite, on a fresh pod and on one the ungater pinned.
		planned := gpuPod(c.open, "planned")
		planned.Annotations[v1alpha1.AnnotationPlan] = "plan-1"
		if err := c.alice.Create(ctx, planned); err != nil {
			t.Fatal(err)
		}
		if !hasGate(planned) {
			t.Fatal("the webhook did not gate the planned pod")
		}
		dev := "GPU-00000000-0000-0000-0000-000000000001:70000"
		denied(t, "kubectl annotate gpupack.io/devices", c.alice.Patch(ctx, planned.DeepCopy(), annPatch(v1alpha1.AnnotationDevices, dev)), "gpupack.io/devices")
		denied(t, "removing one's own placement gate", c.alice.Patch(ctx, planned.DeepCopy(), mergePatch(map[string]any{"spec": map[string]any{"schedulingGates": nil}})),
			"only gpupack's placement may remove the scheduling gate gpupack.io/placement")
		denied(t, "pointing a pod at another plan", c.alice.Patch(ctx, planned.DeepCopy(), annPatch(v1alpha1.AnnotationPlan, "someone-elses")), "gpupack.io/plan cannot be added to or changed")
		noPlan := cpuPod(c.open, "no-plan")
		if err := c.alice.Create(ctx, noPlan); err != nil {
			t.Fatal(err)
		}
		denied(t, "adding a plan to an existing pod", c.alice.Patch(ctx, noPlan.DeepCopy(), annPatch(v1alpha1.AnnotationPlan, "plan-1")), "gpupack.io/plan cannot be added")

		// The ungater pins it (node affinity, devices, gate lifted).
		cur := &corev1.Pod{}
		if err := mgr.Get(ctx, client.ObjectKeyFromObject(planned), cur); err != nil {
			t.Fatal(err)
		}
		placement.Pin(cur, "node-a", "GPU-00000000-0000-0000-0000-000000000002:4096")
		if err := mgr.Update(ctx, cur); err != nil {
			t.Fatalf("the manager pinning a pod: %v", err)
		}
		denied(t, "kubectl annotate --overwrite gpupack.io/devices on a pinned pod", c.alice.Patch(ctx, cur.DeepCopy(), annPatch(v1alpha1.AnnotationDevices, dev)), "gpupack.io/devices")
		denied(t, "removing gpupack.io/devices", c.alice.Patch(ctx, cur.DeepCopy(), annPatch(v1alpha1.AnnotationDevices, nil)), "gpupack.io/devices")
		denied(t, "claiming an unplanned allocation (gpupack.io/allocated-by)", c.alice.Patch(ctx, cur.DeepCopy(), annPatch("gpupack.io/allocated-by", "gpupack-node/node-a")), "gpupack.io/allocated-by")
		// A far-future checkpoint request (or deadline) would make the
		// eviction webhook hold a drain of the node for ever.
		future := "2099-01-01T00:00:00Z"
		denied(t, "a far-future gpupack.io/checkpoint-request", c.alice.Patch(ctx, cur.DeepCopy(), annPatch(v1alpha1.AnnotationCheckpointRequest, future)), "gpupack.io/checkpoint-request")
		denied(t, "a gpupack.io/checkpoint-deadline", c.alice.Patch(ctx, cur.DeepCopy(), annPatch("gpupack.io/checkpoint-deadline", future)), "gpupack.io/checkpoint-deadline")
		early := gpuPod(c.open, "early-request")
		early.Annotations[v1alpha1.AnnotationCheckpointRequest] = future
		denied(t, "a pod created with a gpupack.io/checkpoint-request", c.alice.Create(ctx, early), "gpupack.io/checkpoint-request")
		// Her planned pod's labels are frozen (a relabel out of its
		// job's selector would release it from the job: review 11 F2);
		// her other edits still work.
		denied(t, "tenant relabelling its planned pod", c.alice.Patch(ctx, cur.DeepCopy(), mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{"team": "a"}}})),
			"the labels of a pod that carries gpupack.io/plan cannot be added, changed or removed")
		if err := c.alice.Patch(ctx, cur.DeepCopy(), annPatch("team", "a")); err != nil {
			t.Errorf("tenant annotating its pod: %v", err)
		}
	})
}

// TestServiceAccountScope: item 11 — what the shipped RBAC plus the
// policies let gpupack's own identities do.
func TestServiceAccountScope(t *testing.T) {
	c := startCluster(t)
	env, ctx := c.env, c.env.Ctx
	for _, n := range []string{"node-a", "node-b"} {
		env.MustCreate(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	onNode := func(name, node string) *corev1.Pod {
		p := cpuPod(c.open, name)
		p.Spec.NodeName = node
		env.MustCreate(t, p)
		return p
	}
	a, b := onNode("on-a", "node-a"), onNode("on-b", "node-b")
	nodeA := c.node(t, "node-a")
	inv := mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationGPUs: "[]"}}})

	// The apiserver loads each policy and binding through its own informer:
	// waitForPolicies saw gpupack-placement enforced, the node policies may
	// come a moment later on a loaded machine. Dry-run probes change
	// nothing; the assertions below are unchanged.
	env.Eventually(t, 30*time.Second, "gpupack-node policies enforced", func() (bool, string) {
		if err := nodeA.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, inv, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "gpupack-node may change only its own Node") {
			return false, fmt.Sprintf("patching another Node: %v", err)
		}
		if err := nodeA.Patch(ctx, a.DeepCopy(), annPatch("example.com/x", "y"), client.DryRunAll); err == nil || !strings.Contains(err.Error(), "only the annotations gpupack.io/devices and gpupack.io/allocated-by") {
			return false, fmt.Sprintf("another annotation on a pod of its node: %v", err)
		}
		return true, ""
	})

	t.Run("gpupack-node", func(t *testing.T) {
		if err := nodeA.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, inv); err != nil {
			t.Errorf("patching its own Node: %v", err)
		}
		if err := nodeA.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, mergePatch(map[string]any{"status": map[string]any{"capacity": map[string]string{v1alpha1.ResourceVGPU: "8"}}})); err != nil {
			t.Errorf("patching its own Node's status: %v", err)
		}
		denied(t, "patching another Node", nodeA.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, inv), "gpupack-node may change only its own Node")
		denied(t, "patching another Node's status", nodeA.Status().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, inv), "gpupack-node may change only its own Node")
		denied(t, "a token without a node binding", c.node(t, "").Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, inv), "bound service-account token")

		rec := mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			v1alpha1.AnnotationDevices: "GPU-00000000-0000-0000-0000-000000000003:81559", "gpupack.io/allocated-by": "gpupack-node/node-a"}}})
		if err := nodeA.Patch(ctx, a.DeepCopy(), rec); err != nil {
			t.Errorf("recording an unplanned allocation on a pod of its node: %v", err)
		}
		denied(t, "re-marking a recorded allocation", nodeA.Patch(ctx, a.DeepCopy(), annPatch("gpupack.io/allocated-by", "gpupack-node/node-b")), "gpupack.io/allocated-by")
		denied(t, "changing a recorded allocation", nodeA.Patch(ctx, a.DeepCopy(), annPatch(v1alpha1.AnnotationDevices, "GPU-00000000-0000-0000-0000-000000000004:1")), "gpupack.io/devices")
		denied(t, "recording on another node's pod", nodeA.Patch(ctx, b.DeepCopy(), rec), "denied request")
		denied(t, "relabelling a pod of its node", nodeA.Patch(ctx, a.DeepCopy(), mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{"x": "y"}}})),
			"only the annotations gpupack.io/devices and gpupack.io/allocated-by")
		denied(t, "changing the spec of a pod of its node", nodeA.Patch(ctx, a.DeepCopy(), mergePatch(map[string]any{"spec": map[string]any{"activeDeadlineSeconds": 1}})),
			"only the annotations gpupack.io/devices and gpupack.io/allocated-by")
		denied(t, "writing another annotation on a pod of its node", nodeA.Patch(ctx, a.DeepCopy(), annPatch("example.com/x", "y")),
			"only the annotations gpupack.io/devices and gpupack.io/allocated-by")
		// A token that names no node matches no node's pods — but it would
		// match a pod not bound to any node yet (spec.nodeName ""), such as
		// a gated pod waiting for its placement.
		unbound := cpuPod(c.open, "unbound")
		env.MustCreate(t, unbound)
		// (policy gpupack-placement refuses that record too: either may answer)
		denied(t, "a token without a node binding recording GPUs on an unbound pod", c.node(t, "").Patch(ctx, unbound.DeepCopy(), rec), "denied request")
		denied(t, "a token without a node binding deleting an unbound pod", c.node(t, "").Delete(ctx, unbound.DeepCopy()), "bound service-account token")
		denied(t, "deleting another node's pod", nodeA.Delete(ctx, b.DeepCopy(), client.GracePeriodSeconds(0)), "only pods bound to its own node")
		if err := nodeA.Delete(ctx, a.DeepCopy(), client.GracePeriodSeconds(0)); err != nil {
			t.Errorf("deleting a pod of its node (enforcement): %v", err)
		}
		err := nodeA.SubResource("eviction").Create(ctx, b.DeepCopy(), &policyEviction)
		denied(t, "evicting a pod", err, "forbidden")
	})

	t.Run("gpupack-manager", func(t *testing.T) {
		mgr := c.manager(t)
		p := gpuPod(c.open, "victim")
		p.Annotations[v1alpha1.AnnotationPlan] = "plan-1"
		env.MustCreate(t, p)
		if err := mgr.Patch(ctx, p.DeepCopy(), mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			v1alpha1.AnnotationCheckpointRequest: "2026-12-01T00:00:00Z", "gpupack.io/checkpoint-deadline": "2026-12-01T00:05:00Z"}}})); err != nil {
			t.Errorf("requesting a checkpoint: %v", err)
		}
		cur := &corev1.Pod{}
		if err := mgr.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
			t.Fatal(err)
		}
		img := cur.DeepCopy()
		img.Spec.Containers[0].Image = "evil:latest"
		denied(t, "the manager changing an image", mgr.Update(ctx, img), "nothing else of its spec")
		denied(t, "the manager relabelling a pod", mgr.Patch(ctx, cur.DeepCopy(), mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{"x": "y"}}})), "none of its labels")
		denied(t, "the manager writing another annotation", mgr.Patch(ctx, cur.DeepCopy(), annPatch("example.com/x", "y")), "only the annotations")
		// Another controller's gate (here one a platform webhook added) is
		// not the manager's to lift: it would release pods gpupack does not own.
		held := gpuPod(c.open, "held")
		held.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
		env.MustCreate(t, held)
		if !hasGate(held) {
			t.Fatal("held: no placement gate")
		}
		lifted := held.DeepCopy()
		lifted.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: v1alpha1.SchedulingGatePlacement}}
		denied(t, "the manager lifting another controller's gate", mgr.Update(ctx, lifted), "may remove only its own scheduling gate gpupack.io/placement")
		placement.Pin(cur, "node-a", "GPU-00000000-0000-0000-0000-000000000005:4096")
		if err := mgr.Update(ctx, cur); err != nil {
			t.Errorf("the manager pinning a pod: %v", err)
		}
		// Jobs: RBAC lets the manager patch them (it records the last
		// consistent checkpoint); policy gpupack-manager-job-writes keeps it
		// to that one annotation (outside review 2026-12-02, finding 9).
		job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "recorded", Namespace: c.open},
			Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "c", Image: "trainer"}}}}}}
		env.MustCreate(t, job)
		if err := mgr.Patch(ctx, job.DeepCopy(), annPatch(v1alpha1.AnnotationLastConsistentCheckpoint, "700")); err != nil {
			t.Errorf("the manager recording the consistent step on a Job: %v", err)
		}
		denied(t, "the manager resuming a suspended Job", mgr.Patch(ctx, job.DeepCopy(), mergePatch(map[string]any{"spec": map[string]any{"suspend": false}})), "gpupack-manager-job-writes")
		// (A suspended Job's template takes scheduling directives: where its pods run.)
		denied(t, "the manager steering a suspended Job's pods", mgr.Patch(ctx, job.DeepCopy(), mergePatch(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"nodeSelector": map[string]string{"kubernetes.io/hostname": "node-a"}}}}})), "gpupack-manager-job-writes")
		denied(t, "the manager relabelling a Job", mgr.Patch(ctx, job.DeepCopy(), mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{mutation.LabelQueueName: "other"}}})), "gpupack-manager-job-writes")
		denied(t, "the manager writing another annotation on a Job", mgr.Patch(ctx, job.DeepCopy(), annPatch("example.com/x", "y")), "gpupack-manager-job-writes")
		// (An owner reference to a missing UID would have the garbage
		// collector delete the Job: second review, finding 4.)
		denied(t, "the manager adding an owner reference to a Job", mgr.Patch(ctx, job.DeepCopy(), mergePatch(map[string]any{"metadata": map[string]any{"ownerReferences": []map[string]any{
			{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}}}})), "gpupack-manager-job-writes")
		if err := mgr.Delete(ctx, cur); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("the manager deleting a victim: %v", err)
		}
	})
}

var policyEviction = policyv1.Eviction{}
