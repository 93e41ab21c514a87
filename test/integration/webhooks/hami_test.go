package webhooks

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
	"github.com/gpupack/gpupack/webhooks/mutation"
)

// noGpupackResources reports the gpupack.io/* resources of a list.
func noGpupackResources(rl corev1.ResourceList) []string {
	var out []string
	for name := range rl {
		if strings.HasPrefix(string(name), "gpupack.io/") {
			out = append(out, string(name))
		}
	}
	return out
}

// Next to HAMi (resources: hami) the webhooks write HAMi's resources, Kueue
// counts them from the Workload, and a ClusterQueue with quota on
// nvidia.com/gpu and nvidia.com/gpumem admits exactly as many jobs as fit.
func TestHAMiMode(t *testing.T) {
	env := framework.Start(t, framework.Options{})
	startWebhooks(t, env, webhooks.Config{Resources: mutation.ResourcesHAMi})
	ns := env.Namespace(t, "hami")
	ctx := env.Ctx

	t.Run("pytorchjob workload counts nvidia.com/gpumem", func(t *testing.T) {
		env.MustCreate(t, framework.MakeResourceFlavor("hami-gpu"))
		// nvidia.com/gpumem is per GPU per container (HAMi's convention);
		// here one GPU per worker, so 2 × 20480 per job: room for exactly two.
		env.MustCreate(t, framework.MakeClusterQueue("hami-cq").Flavor("hami-gpu",
			framework.Quota{Resource: corev1.ResourceCPU, Nominal: "1000"}, framework.Quota{Resource: corev1.ResourceMemory, Nominal: "10Ti"},
			framework.Quota{Resource: v1alpha1.ResourceNvidiaGPU, Nominal: "100"}, framework.Quota{Resource: v1alpha1.AnnotationHAMiGPUMem, Nominal: "81920"},
		).Obj())
		env.MustCreate(t, framework.MakeLocalQueue("lq", ns, "hami-cq"))
		for i := 0; i < 3; i++ {
			env.MustCreate(t, framework.MakePyTorchJob(fmt.Sprintf("pt-%d", i), ns, "lq", 2, 1).WorkersOnly().Annotation(v1alpha1.AnnotationGPUMemory, "20Gi").Obj())
		}
		// The stored job is in HAMi form.
		var pt kftraining.PyTorchJob
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pt-0"}, &pt); err != nil {
			t.Fatal(err)
		}
		c := pt.Spec.PyTorchReplicaSpecs[kftraining.PyTorchJobReplicaTypeWorker].Template.Spec.Containers[0]
		for what, rl := range map[string]corev1.ResourceList{"limits": c.Resources.Limits, "requests": c.Resources.Requests} {
			if q := rl[v1alpha1.AnnotationHAMiGPUMem]; q.Value() != 20480 {
				t.Errorf("stored PyTorchJob %s: nvidia.com/gpumem = %s, want 20480", what, q.String())
			}
			if q := rl[v1alpha1.ResourceNvidiaGPU]; q.Value() != 1 {
				t.Errorf("stored PyTorchJob %s: nvidia.com/gpu = %s, want 1", what, q.String())
			}
			if g := noGpupackResources(rl); len(g) > 0 {
				t.Errorf("stored PyTorchJob %s has %v", what, g)
			}
		}

		wl := env.WaitForWorkloadOf(t, ns, "pt-0", "PyTorchJob", nil)
		if len(wl.Spec.PodSets) != 1 {
			t.Fatalf("pod sets = %d", len(wl.Spec.PodSets))
		}
		ps := wl.Spec.PodSets[0]
		req := ps.Template.Spec.Containers[0].Resources.Requests
		if q := req[v1alpha1.AnnotationHAMiGPUMem]; q.Value() != 20480 || ps.Count != 2 {
			t.Errorf("pod set %s: count %d, nvidia.com/gpumem %s, want 2 × 20480", ps.Name, ps.Count, q.String())
		}
		if q := req[v1alpha1.ResourceNvidiaGPU]; q.Value() != 1 {
			t.Errorf("nvidia.com/gpu = %s, want 1", q.String())
		}
		if g := noGpupackResources(req); len(g) > 0 {
			t.Errorf("Workload pod set requests %v", g)
		}
		expectQuotaFor(t, env, ns, 3, 2)
	})

	t.Run("pod: HAMi resources, no gpupack hook, tenant env stripped", func(t *testing.T) {
		cs, w := warningClient(t, env)
		c := corev1.Container{Resources: limits(v1alpha1.ResourceNvidiaGPU, "2"), Env: []corev1.EnvVar{
			{Name: "LD_PRELOAD", Value: "/home/me/unlimited.so"}, {Name: "CUDA_DEVICE_MEMORY_LIMIT_0", Value: "80g"},
			{Name: "CUDA_DISABLE_CONTROL", Value: "true"}, {Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}, {Name: "KEEP", Value: "me"},
		}}
		in := gpuPod(ns, "tenant", map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCores: "30"}, c)
		got, err := cs.CoreV1().Pods(ns).Create(ctx, in, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gc := got.Spec.Containers[0]
		for what, rl := range map[string]corev1.ResourceList{"limits": gc.Resources.Limits, "requests": gc.Resources.Requests} {
			want := map[corev1.ResourceName]int64{v1alpha1.ResourceNvidiaGPU: 2, v1alpha1.AnnotationHAMiGPUMem: 20480, v1alpha1.AnnotationHAMiGPUCores: 30}
			for name, v := range want {
				if q := rl[name]; q.Value() != v {
					t.Errorf("%s: %s = %s, want %d (per GPU)", what, name, q.String(), v)
				}
			}
			if g := noGpupackResources(rl); len(g) > 0 {
				t.Errorf("%s has %v", what, g)
			}
		}
		if d := fmt.Sprint(gc.Env); d != fmt.Sprint([]corev1.EnvVar{{Name: "KEEP", Value: "me"}}) {
			t.Errorf("stored env = %v, want only KEEP", gc.Env)
		}
		if len(gc.VolumeMounts) != 0 || len(got.Spec.Volumes) != 0 {
			t.Errorf("hook injected: mounts %v, volumes %v", gc.VolumeMounts, got.Spec.Volumes)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		all := strings.Join(w.msg, "\n")
		for _, k := range []string{"LD_PRELOAD", "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DISABLE_CONTROL", "NVIDIA_VISIBLE_DEVICES"} {
			if !strings.Contains(all, "removed "+k+";") {
				t.Errorf("no kubectl warning for %s: %q", k, w.msg)
			}
		}
	})
}
