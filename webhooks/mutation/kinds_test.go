package mutation

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	lws "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/flavors"
)

type rjob struct {
	name string
	ann  map[string]string // the replicated Job template's own annotations
	t    corev1.PodTemplateSpec
}

func makeJobSet(ann map[string]string, rjs ...rjob) *jobset.JobSet {
	j := &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Name: "js", Namespace: "ns", Annotations: ann}}
	for _, r := range rjs {
		j.Spec.ReplicatedJobs = append(j.Spec.ReplicatedJobs, jobset.ReplicatedJob{Name: r.name, Replicas: 1,
			Template: batchv1.JobTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: r.ann}, Spec: batchv1.JobSpec{Template: r.t}}})
	}
	return j
}

func makeLWS(ann map[string]string, leader *corev1.PodTemplateSpec, worker corev1.PodTemplateSpec) *lws.LeaderWorkerSet {
	l := &lws.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: "lws", Namespace: "ns", Annotations: ann}}
	l.Spec.LeaderWorkerTemplate.LeaderTemplate = leader
	l.Spec.LeaderWorkerTemplate.WorkerTemplate = worker
	return l
}

func makeDeployment(ann map[string]string, t corev1.PodTemplateSpec) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "inf", Namespace: "ns", Annotations: ann}, Spec: appsv1.DeploymentSpec{Template: t}}
}

func makeStatefulSet(ann map[string]string, t corev1.PodTemplateSpec) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "inf", Namespace: "ns", Annotations: ann}, Spec: appsv1.StatefulSetSpec{Template: t}}
}

func onH100(t corev1.PodTemplateSpec) corev1.PodTemplateSpec {
	t.Spec.NodeSelector = map[string]string{flavors.LabelGPUProduct: h100}
	return t
}

// mutateKind runs the kind's own entry point (not Templates directly), so
// the test covers which templates each kind hands over.
func mutateKind(m *Mutator, obj any) ([]string, error) {
	switch o := obj.(type) {
	case *jobset.JobSet:
		return m.JobSet(o)
	case *lws.LeaderWorkerSet:
		return m.LeaderWorkerSet(o)
	case *appsv1.Deployment:
		return m.Deployment(o)
	case *appsv1.StatefulSet:
		return m.StatefulSet(o)
	}
	if w, err, ok := mutateOperatorKind(m, obj); ok {
		return w, err
	}
	panic("unknown kind")
}

func templatesByWhere(t *testing.T, obj any) map[string]*corev1.PodTemplateSpec {
	t.Helper()
	_, ts, err := KindTemplates(obj)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.PodTemplateSpec{}
	for _, x := range ts {
		out[x.Where] = x.T
	}
	return out
}

// podGroups: Kueue's pod integration on, as where LWS and StatefulSets run
// under Kueue (their pods are pod groups); without it the pod webhook
// refuses a fractional pod of theirs, so their templates get no marker.
var podGroups = Config{Kueue: KueueConfig{Frameworks: append(slices.Clone(DefaultKueueFrameworks), "pod", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset")}}

func TestJobKindConversion(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	type want struct {
		limits corev1.ResourceList // of the first container
		ann    map[string]string   // the template's, without the marker
	}
	cases := []struct {
		name string
		cfg  Config
		obj  any
		want map[string]want // by template
	}{
		{
			name: "JobSet: job-level default, HAMi name on one template, CPU-only driver untouched",
			obj: makeJobSet(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30"},
				rjob{name: "driver", t: template(nil, makeCtr("d").limit("cpu", "1").obj())},
				rjob{name: "workers", t: template(map[string]string{v1alpha1.AnnotationHAMiGPUMem: "10240"}, makeCtr("w").gpus("2").obj())}),
			want: map[string]want{
				"replicatedJobs[driver].template":  {limits: rl("cpu", "1")},
				"replicatedJobs[workers].template": {limits: rl(vgpu, "2", gmem, "20480", gcor, "60"), ann: map[string]string{v1alpha1.AnnotationHAMiGPUMem: "10240", v1alpha1.AnnotationGPUCores: "30"}},
			},
		},
		{
			name: "JobSet: a replicated Job template's annotations override the JobSet's, group by group",
			obj: makeJobSet(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30"},
				rjob{name: "a", ann: map[string]string{v1alpha1.AnnotationHAMiGPUMem: "4096"}, t: template(nil, makeCtr("w").gpus("1").obj())},
				rjob{name: "b", t: template(nil, makeCtr("w").gpus("1").obj())}),
			want: map[string]want{
				"replicatedJobs[a].template": {limits: rl(vgpu, "1", gmem, "4096", gcor, "30"), ann: map[string]string{v1alpha1.AnnotationHAMiGPUMem: "4096", v1alpha1.AnnotationGPUCores: "30"}},
				"replicatedJobs[b].template": {limits: rl(vgpu, "1", gmem, "20480", gcor, "30"), ann: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30"}},
			},
		},
		{
			name: "LeaderWorkerSet: leader and worker templates",
			cfg:  podGroups,
			obj: makeLWS(mem, func() *corev1.PodTemplateSpec {
				t := template(map[string]string{v1alpha1.AnnotationGPUMemory: "8Gi"}, makeCtr("leader").gpus("1").obj())
				return &t
			}(), template(nil, makeCtr("worker").gpus("4").obj())),
			want: map[string]want{
				"leaderWorkerTemplate.leaderTemplate": {limits: rl(vgpu, "1", gmem, "8192"), ann: map[string]string{v1alpha1.AnnotationGPUMemory: "8Gi"}},
				"leaderWorkerTemplate.workerTemplate": {limits: rl(vgpu, "4", gmem, "81920"), ann: mem},
			},
		},
		{
			name: "LeaderWorkerSet without a leader template",
			cfg:  podGroups,
			obj:  makeLWS(mem, nil, template(nil, makeCtr("worker").gpus("1").obj())),
			want: map[string]want{"leaderWorkerTemplate.workerTemplate": {limits: rl(vgpu, "1", gmem, "20480"), ann: mem}},
		},
		{
			name: "Deployment: HAMi's percentage becomes MiB on a known model",
			obj:  makeDeployment(map[string]string{v1alpha1.AnnotationHAMiGPUMemPercentage: "25"}, onH100(template(nil, makeCtr("srv").gpus("1").obj()))),
			want: map[string]want{"pod template": {limits: rl(vgpu, "1", gmem, "17976"), ann: map[string]string{v1alpha1.AnnotationHAMiGPUMemPercentage: "25"}}},
		},
		{
			name: "Deployment: HAMi resources in the container convert as they do on a Job",
			obj:  makeDeployment(nil, onH100(template(nil, makeCtr("srv").gpus("1").limit(v1alpha1.AnnotationHAMiGPUMem, "3000").limit(v1alpha1.AnnotationHAMiGPUCores, "30").obj()))),
			want: map[string]want{"pod template": {limits: rl(vgpu, "1", gmem, "3000", gcor, "30")}},
		},
		{
			name: "StatefulSet",
			cfg:  podGroups,
			obj:  makeStatefulSet(mem, template(nil, makeCtr("srv").gpus("1").obj())),
			want: map[string]want{"pod template": {limits: rl(vgpu, "1", gmem, "20480"), ann: mem}},
		},
		{
			name: "JobSet in hami mode: HAMi's resources",
			cfg:  Config{Resources: ResourcesHAMi},
			obj:  makeJobSet(mem, rjob{name: "workers", t: template(nil, makeCtr("w").gpus("2").obj())}),
			want: map[string]want{"replicatedJobs[workers].template": {limits: rl(gpu, "2", v1alpha1.AnnotationHAMiGPUMem, "20480"), ann: mem}},
		},
		{
			name: "whole GPUs stay exclusive",
			obj:  makeDeployment(nil, template(nil, makeCtr("srv").gpus("8").obj())),
			want: map[string]want{"pod template": {limits: rl(gpu, "8")}},
		},
		{
			name: "RayCluster: CPU head untouched, worker groups by name, HAMi resources on one",
			obj: makeRayCluster(nil, template(nil, makeCtr("ray-head").limit("cpu", "2").obj()),
				rayGroup{"small", template(nil, makeCtr("ray-worker").gpus("1").limit(v1alpha1.AnnotationHAMiGPUMem, "3000").obj())},
				rayGroup{"big", template(map[string]string{v1alpha1.AnnotationGPUMemory: "40Gi"}, makeCtr("ray-worker").gpus("2").obj())}),
			want: map[string]want{
				"headGroupSpec.template":           {limits: rl("cpu", "2")},
				"workerGroupSpecs[small].template": {limits: rl(vgpu, "1", gmem, "3000")},
				"workerGroupSpecs[big].template":   {limits: rl(vgpu, "2", gmem, "81920"), ann: map[string]string{v1alpha1.AnnotationGPUMemory: "40Gi"}},
			},
		},
		{
			name: "RayJob: its cluster's head and workers, and the submitter",
			obj: makeRayJob(mem, &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{makeCtr("submit").limit("cpu", "1").obj()}}},
				template(nil, makeCtr("ray-head").gpus("1").obj()), rayGroup{"gpu", template(nil, makeCtr("ray-worker").gpus("4").obj())}),
			want: map[string]want{
				"rayClusterSpec.headGroupSpec.template":         {limits: rl(vgpu, "1", gmem, "20480"), ann: mem},
				"rayClusterSpec.workerGroupSpecs[gpu].template": {limits: rl(vgpu, "4", gmem, "81920"), ann: mem},
				"submitterPodTemplate":                          {limits: rl("cpu", "1")},
			},
		},
		{
			name: "RayJob on an existing cluster (clusterSelector): nothing to convert but the submitter",
			obj: func() any {
				j := makeRayJob(nil, &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{makeCtr("submit").limit("cpu", "1").obj()}}}, corev1.PodTemplateSpec{})
				j.Spec.RayClusterSpec = nil
				return j
			}(),
			want: map[string]want{"submitterPodTemplate": {limits: rl("cpu", "1")}},
		},
		{
			name: "MPIJob: launcher and workers",
			obj: makeMPIJob(map[string]string{v1alpha1.AnnotationGPUMemory: "10Gi", v1alpha1.AnnotationGPUCores: "50"},
				&corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{makeCtr("launcher").limit("cpu", "1").obj()}}},
				template(nil, makeCtr("worker").gpus("2").obj())),
			want: map[string]want{
				"mpiReplicaSpecs[Launcher].template": {limits: rl("cpu", "1")},
				"mpiReplicaSpecs[Worker].template":   {limits: rl(vgpu, "2", gmem, "20480", gcor, "100"), ann: map[string]string{v1alpha1.AnnotationGPUMemory: "10Gi", v1alpha1.AnnotationGPUCores: "50"}},
			},
		},
		{
			name: "TrainingRuntime: the runtime's, then the JobSet template's, then the replicated Job's annotations",
			obj: makeTrainingRuntime(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30"}, map[string]string{v1alpha1.AnnotationGPUCores: "50"},
				rjob{name: "dataset-initializer", t: template(nil, makeCtr("dataset-initializer").limit("cpu", "1").obj())},
				rjob{name: "node", t: template(nil, makeCtr("node").gpus("1").obj())},
				rjob{name: "eval", ann: map[string]string{v1alpha1.AnnotationHAMiGPUMem: "4096"}, t: template(nil, makeCtr("node").gpus("1").obj())}),
			want: map[string]want{
				"template.spec.replicatedJobs[dataset-initializer].template": {limits: rl("cpu", "1")},
				"template.spec.replicatedJobs[node].template":                {limits: rl(vgpu, "1", gmem, "20480", gcor, "50"), ann: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "50"}},
				"template.spec.replicatedJobs[eval].template":                {limits: rl(vgpu, "1", gmem, "4096", gcor, "50"), ann: map[string]string{v1alpha1.AnnotationHAMiGPUMem: "4096", v1alpha1.AnnotationGPUCores: "50"}},
			},
		},
		{
			name: "ClusterTrainingRuntime in hami mode",
			cfg:  Config{Resources: ResourcesHAMi},
			obj:  makeClusterTrainingRuntime(mem, rjob{name: "node", t: template(nil, makeCtr("node").gpus("2").obj())}),
			want: map[string]want{"template.spec.replicatedJobs[node].template": {limits: rl(gpu, "2", v1alpha1.AnnotationHAMiGPUMem, "20480"), ann: mem}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.cfg)
			if _, err := mutateKind(m, tc.obj); err != nil {
				t.Fatal(err)
			}
			got := templatesByWhere(t, tc.obj)
			if len(got) != len(tc.want) {
				t.Fatalf("templates %v, want %d", got, len(tc.want))
			}
			for where, w := range tc.want {
				tm := got[where]
				if tm == nil {
					t.Fatalf("no template %s", where)
				}
				if d := cmp.Diff(w.limits, tm.Spec.Containers[0].Resources.Limits); d != "" {
					t.Errorf("%s limits (-want +got):\n%s", where, d)
				}
				ann := map[string]string{}
				for k, v := range tm.Annotations {
					ann[k] = v
				}
				if _, gpuTemplate := ann[v1alpha1.AnnotationInjected]; !gpuTemplate && len(w.ann) > 0 {
					t.Errorf("%s: no injection marker", where)
				}
				delete(ann, v1alpha1.AnnotationInjected)
				if len(ann) == 0 {
					ann = nil
				}
				if d := cmp.Diff(w.ann, ann); d != "" {
					t.Errorf("%s annotations (-want +got):\n%s", where, d)
				}
			}
			// A second pass changes nothing: the mutating webhook is
			// reinvoked, and the validating one re-runs it.
			again := deepCopyKind(tc.obj)
			if _, err := mutateKind(m, again); err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(again, tc.obj) {
				t.Errorf("second pass changed the object: %s", cmp.Diff(tc.obj, again))
			}
			if err := validateKind(m, tc.obj); err != nil {
				t.Errorf("converted object does not validate: %v", err)
			}
		})
	}
}

func deepCopyKind(obj any) any {
	switch o := obj.(type) {
	case *jobset.JobSet:
		return o.DeepCopy()
	case *lws.LeaderWorkerSet:
		return o.DeepCopy()
	case *appsv1.Deployment:
		return o.DeepCopy()
	case *appsv1.StatefulSet:
		return o.DeepCopy()
	}
	if o := deepCopyOperatorKind(obj); o != nil {
		return o
	}
	panic("unknown kind")
}

func validateKind(m *Mutator, obj any) error {
	ann, ts, err := KindTemplates(obj)
	if err != nil {
		return err
	}
	return m.ValidateTemplates(ann, ts)
}

// The same denials as for a PyTorchJob, each naming the template.
func TestJobKindDenials(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}
	cases := []struct {
		name string
		obj  any
		want []string
	}{
		{"JobSet: more memory than one GPU allows",
			makeJobSet(map[string]string{v1alpha1.AnnotationGPUMemory: "79Gi"},
				rjob{name: "driver", t: template(nil, makeCtr("d").limit("cpu", "1").obj())},
				rjob{name: "workers", t: onH100(template(nil, makeCtr("w").gpus("1").obj()))}),
			[]string{"replicatedJobs[workers].template", `container "w" asks for 80896 MiB`}},
		{"JobSet: bad request in a replicated Job template's annotations",
			makeJobSet(nil, rjob{name: "workers", ann: map[string]string{v1alpha1.AnnotationGPUMemory: "lots"}, t: template(nil, makeCtr("w").gpus("1").obj())}),
			[]string{"replicatedJobs[workers].template"}},
		{"LeaderWorkerSet: privileged GPU worker",
			makeLWS(mem, nil, template(nil, makeCtr("worker").gpus("1").privileged().obj())),
			[]string{"leaderWorkerTemplate.workerTemplate", "privileged"}},
		{"LeaderWorkerSet: a template's memory request without a GPU container",
			makeLWS(nil, &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: mem}, Spec: corev1.PodSpec{Containers: []corev1.Container{makeCtr("leader").obj()}}},
				template(nil, makeCtr("worker").gpus("1").obj())),
			[]string{"leaderWorkerTemplate.leaderTemplate", "no container asks for nvidia.com/gpu"}},
		{"Deployment: job-level request, no GPU anywhere",
			makeDeployment(mem, template(nil, makeCtr("srv").limit("cpu", "1").obj())),
			[]string{"job: ", "no container asks for nvidia.com/gpu"}},
		{"Deployment: percentage without a model",
			makeDeployment(map[string]string{v1alpha1.AnnotationHAMiGPUMemPercentage: "25"}, template(nil, makeCtr("srv").gpus("1").obj())),
			[]string{"pod template", "needs a known GPU model"}},
		{"StatefulSet: tenant env under the Deny policy", // the env policy's denial reaches whoever applies it
			makeStatefulSet(mem, template(nil, makeCtr("srv").gpus("1").env(v1alpha1.EnvLDPreload, "/evil.so").obj())),
			[]string{"pod template", "LD_PRELOAD"}},
		{"RayCluster: more memory than one GPU allows, in a worker group",
			makeRayCluster(map[string]string{v1alpha1.AnnotationGPUMemory: "79Gi"}, template(nil, makeCtr("ray-head").limit("cpu", "1").obj()),
				rayGroup{"gpu", onH100(template(nil, makeCtr("ray-worker").gpus("1").obj()))}),
			[]string{"workerGroupSpecs[gpu].template", `container "ray-worker" asks for 80896 MiB`}},
		{"RayJob: privileged GPU head",
			makeRayJob(mem, nil, template(nil, makeCtr("ray-head").gpus("1").privileged().obj())),
			[]string{"rayClusterSpec.headGroupSpec.template", "privileged"}},
		{"RayJob: job-level request, no GPU anywhere",
			makeRayJob(mem, nil, template(nil, makeCtr("ray-head").limit("cpu", "1").obj())),
			[]string{"job: ", "no container asks for nvidia.com/gpu"}},
		{"MPIJob: GPU in an init container",
			makeMPIJob(nil, nil, func() corev1.PodTemplateSpec {
				t := template(nil, makeCtr("worker").gpus("1").obj())
				t.Spec.InitContainers = []corev1.Container{makeCtr("init").gpus("1").obj()}
				return t
			}()),
			[]string{"mpiReplicaSpecs[Worker].template", "init"}},
		{"MPIJob: tenant memory limit env under the Deny policy",
			makeMPIJob(mem, nil, template(nil, makeCtr("worker").gpus("1").env(v1alpha1.EnvMemoryLimit+"_0", "80g").obj())),
			[]string{"mpiReplicaSpecs[Worker].template", v1alpha1.EnvMemoryLimit}},
		{"TrainingRuntime: cores without memory on the trainer",
			makeTrainingRuntime(map[string]string{v1alpha1.AnnotationGPUCores: "30"}, nil, rjob{name: "node", t: template(nil, makeCtr("node").gpus("1").obj())}),
			[]string{"template.spec.replicatedJobs[node].template", "without gpupack.io/gpu-memory"}},
		{"ClusterTrainingRuntime: conflicting HAMi resources",
			makeClusterTrainingRuntime(nil, rjob{name: "node", t: template(nil, makeCtr("node").gpus("1").limit(v1alpha1.AnnotationHAMiGPUMem, "3000").limit(v1alpha1.AnnotationHAMiGPUMemPercentage, "30").obj())}),
			[]string{"template.spec.replicatedJobs[node].template", "conflict"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{}
			if strings.Contains(tc.name, "Deny") {
				cfg.EnvPolicy = EnvPolicyDeny
			}
			m := mustNew(t, cfg)
			before := deepCopyKind(tc.obj)
			_, err := mutateKind(m, deepCopyKind(tc.obj))
			if err == nil {
				t.Fatal("allowed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if verr := validateKind(m, tc.obj); verr == nil || verr.Error() != err.Error() {
				t.Errorf("validation says %v, mutation %v", verr, err)
			}
			if !equality.Semantic.DeepEqual(before, tc.obj) {
				t.Error("validation changed the object")
			}
		})
	}
}

// An object the mutating webhook did not reach is refused, naming the template.
func TestJobKindValidateUnconverted(t *testing.T) {
	m := mustNew(t, Config{})
	for _, obj := range []any{
		makeJobSet(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, rjob{name: "workers", t: template(nil, makeCtr("w").gpus("1").obj())}),
		makeLWS(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, nil, template(nil, makeCtr("w").gpus("1").obj())),
		makeDeployment(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, template(nil, makeCtr("w").gpus("1").obj())),
		makeStatefulSet(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, template(nil, makeCtr("w").gpus("1").obj())),
		makeRayCluster(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, template(nil, makeCtr("w").gpus("1").obj())),
		makeRayJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, nil, template(nil, makeCtr("w").gpus("1").obj())),
		makeMPIJob(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{makeCtr("w").gpus("1").obj()}}}, template(nil, makeCtr("w").gpus("1").obj())),
		makeTrainingRuntime(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, nil, rjob{name: "node", t: template(nil, makeCtr("w").gpus("1").obj())}),
		makeClusterTrainingRuntime(map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, rjob{name: "node", t: template(nil, makeCtr("w").gpus("1").obj())}),
	} {
		_, ts, _ := KindTemplates(obj)
		err := validateKind(m, obj)
		if err == nil || !strings.Contains(err.Error(), ts[0].Where+`: container "w": GPU resources are not converted`) {
			t.Errorf("%T: %v", obj, err)
		}
	}
}

// The fast path's promise holds for every kind's templates: a pod made from
// a marked template is a fixed point of Pod.
func TestJobKindMarkedTemplatePodsAreFixedPoints(t *testing.T) {
	mem := map[string]string{v1alpha1.AnnotationGPUMemory: "10Gi", v1alpha1.AnnotationGPUCores: "40"}
	for _, cfg := range []Config{podGroups, {Resources: ResourcesHAMi}} {
		m := mustNew(t, cfg)
		for _, obj := range []any{
			makeJobSet(mem, rjob{name: "workers", t: onH100(template(nil, makeCtr("w").gpus("2").env(v1alpha1.EnvLDPreload, "/evil.so").obj(), makeCtr("log").limit("cpu", "1").obj()))}),
			makeLWS(mem, func() *corev1.PodTemplateSpec { t := onH100(template(nil, makeCtr("l").gpus("1").obj())); return &t }(), onH100(template(nil, makeCtr("w").gpus("1").obj()))),
			makeDeployment(mem, onH100(template(map[string]string{v1alpha1.AnnotationPlan: "wl-plan"}, makeCtr("srv").gpus("1").obj()))),
			makeStatefulSet(nil, template(nil, makeCtr("srv").gpus("8").obj())),
			makeRayCluster(mem, onH100(template(nil, makeCtr("ray-head").gpus("1").obj())), rayGroup{"gpu", onH100(template(nil, makeCtr("ray-worker").gpus("2").env(v1alpha1.EnvSMLimit, "100").obj()))}),
			makeRayJob(mem, nil, onH100(template(nil, makeCtr("ray-head").gpus("1").obj()))),
			makeMPIJob(mem, nil, onH100(template(nil, makeCtr("worker").gpus("1").obj()))),
			makeTrainingRuntime(mem, nil, rjob{name: "node", t: onH100(template(nil, makeCtr("node").gpus("1").obj()))}),
			makeClusterTrainingRuntime(mem, rjob{name: "node", t: onH100(template(nil, makeCtr("node").gpus("1").obj()))}),
		} {
			if _, err := mutateKind(m, obj); err != nil {
				t.Fatalf("%T: %v", obj, err)
			}
			for where, tm := range templatesByWhere(t, obj) {
				if got := tm.Annotations[v1alpha1.AnnotationInjected]; got != m.Fingerprint() {
					t.Errorf("%s %T %s: marker %q, want %q", cfg.Resources, obj, where, got, m.Fingerprint())
				}
				p := podFrom(tm)
				admit := m.Pod
				if _, ok := obj.(*lws.LeaderWorkerSet); ok {
					// A StatefulSet's pod, as the pod webhook admits it.
					p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "l", Controller: new(true)}}
					admit = m.AdmitPod
				}
				before := p.DeepCopy()
				warn, err := admit(p, PodContext{})
				if err != nil || len(warn) > 0 || !equality.Semantic.DeepEqual(before.Spec, p.Spec) {
					t.Errorf("%s %T %s: pod is not a fixed point: err %v warn %v\n%s", cfg.Resources, obj, where, err, warn, cmp.Diff(before.Spec, p.Spec))
				}
			}
		}
	}
}

func TestJobSetFrozenTemplatesUpdate(t *testing.T) {
	m := mustNew(t, Config{})
	converted := func(ann map[string]string, suspend bool) *jobset.JobSet {
		j := makeJobSet(ann, rjob{name: "workers", t: template(nil, makeCtr("w").gpus("1").obj())})
		j.Spec.Suspend = &suspend
		if _, err := m.JobSet(j); err != nil {
			t.Fatal(err)
		}
		return j
	}
	update := func(old, cur *jobset.JobSet) error {
		return m.ValidateFrozenTemplatesUpdate(old.Annotations, cur.Annotations, JobSetTemplates(old), JobSetTemplates(cur), old.Spec.Suspend != nil && *old.Spec.Suspend)
	}
	mem := func(v string) map[string]string { return map[string]string{v1alpha1.AnnotationGPUMemory: v} }

	// Edits change annotations only, as kubectl apply would: the templates
	// (converted resources, hook env) stay as created.
	running := converted(mem("20Gi"), false)
	jobLevel := func(j *jobset.JobSet, v string) *jobset.JobSet {
		j = j.DeepCopy()
		j.Annotations = mem(v)
		return j
	}
	if err := update(running, jobLevel(running, "40Gi")); err == nil || !strings.Contains(err.Error(), "cannot change while the job runs") {
		t.Errorf("request edit on a running JobSet: %v", err)
	}
	if err := update(running, jobLevel(running, "20Gi")); err != nil {
		t.Errorf("no edit: %v", err)
	}
	edited := running.DeepCopy()
	edited.Spec.ReplicatedJobs[0].Template.Spec.Template.Annotations[v1alpha1.AnnotationGPUMemory] = "40Gi"
	if err := update(running, edited); err == nil || !strings.Contains(err.Error(), "cannot change while the job runs") {
		t.Errorf("template request edit on a running JobSet: %v", err)
	}
	suspended := converted(mem("20Gi"), true)
	if err := update(suspended, jobLevel(suspended, "40Gi")); err != nil {
		t.Errorf("job-level edit on a suspended JobSet (its templates keep their own copy): %v", err)
	}
	raw := jobLevel(suspended, "40Gi")
	delete(raw.Spec.ReplicatedJobs[0].Template.Spec.Template.Annotations, v1alpha1.AnnotationGPUMemory)
	if err := update(suspended, raw); err == nil || !strings.Contains(err.Error(), "replicatedJobs[workers].template") {
		t.Errorf("request edit on a suspended JobSet must still validate the templates: %v", err)
	}
	// Kueue's podSetUpdates on a running JobSet: the plan, nothing else.
	planned := running.DeepCopy()
	planned.Spec.ReplicatedJobs[0].Template.Spec.Template.Annotations[v1alpha1.AnnotationPlan] = "wl-plan"
	m.SyncTemplates(JobSetTemplates(planned))
	if err := update(running, planned); err != nil {
		t.Errorf("Kueue's plan: %v", err)
	}
	if g := planned.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.SchedulingGates; len(g) != 1 || g[0].Name != v1alpha1.SchedulingGatePlacement {
		t.Errorf("planned template gates %v", g)
	}
	env := running.DeepCopy()
	c := &env.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: v1alpha1.EnvMemoryLimit + "_1", Value: "80g"})
	if err := update(running, env); err == nil || !strings.Contains(err.Error(), "replicatedJobs[workers].template") {
		t.Errorf("owned env added on update: %v", err)
	}
}
