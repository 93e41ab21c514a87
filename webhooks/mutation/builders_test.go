package mutation

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "k8s.io/api/batch/v1"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// podW builds pods so a test reads like the situation it sets up.
type podW struct{ corev1.Pod }

func makePod(name string) *podW {
	return &podW{corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}}
}

func (w *podW) ann(k, v string) *podW {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[k] = v
	return w
}

func (w *podW) ctr(c corev1.Container) *podW {
	w.Spec.Containers = append(w.Spec.Containers, c)
	return w
}

func (w *podW) nodeSelector(k, v string) *podW {
	if w.Spec.NodeSelector == nil {
		w.Spec.NodeSelector = map[string]string{}
	}
	w.Spec.NodeSelector[k] = v
	return w
}

func (w *podW) obj() *corev1.Pod { return &w.Pod }

type ctrW struct{ corev1.Container }

func makeCtr(name string) *ctrW {
	return &ctrW{corev1.Container{Name: name, Image: "trainer", Command: []string{"python", "train.py"}}}
}

func (w *ctrW) limit(k, v string) *ctrW {
	if w.Resources.Limits == nil {
		w.Resources.Limits = corev1.ResourceList{}
	}
	w.Resources.Limits[corev1.ResourceName(k)] = resource.MustParse(v)
	return w
}

func (w *ctrW) gpus(n string) *ctrW { return w.limit(v1alpha1.ResourceNvidiaGPU, n) }

func (w *ctrW) env(k, v string) *ctrW {
	w.Env = append(w.Env, corev1.EnvVar{Name: k, Value: v})
	return w
}

func (w *ctrW) noCommand() *ctrW { w.Command = nil; return w }

func (w *ctrW) privileged() *ctrW {
	t := true
	w.SecurityContext = &corev1.SecurityContext{Privileged: &t}
	return w
}

func (w *ctrW) obj() corev1.Container { return w.Container }

func template(ann map[string]string, cs ...corev1.Container) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: ann}, Spec: corev1.PodSpec{Containers: cs}}
}

func makePyTorchJob(ann map[string]string, replicas map[string]corev1.PodTemplateSpec) *kftraining.PyTorchJob {
	j := &kftraining.PyTorchJob{ObjectMeta: metav1.ObjectMeta{Name: "pt", Namespace: "ns", Annotations: ann}}
	j.Spec.PyTorchReplicaSpecs = map[kftraining.ReplicaType]*kftraining.ReplicaSpec{}
	for rt, t := range replicas {
		n := int32(2)
		j.Spec.PyTorchReplicaSpecs[kftraining.ReplicaType(rt)] = &kftraining.ReplicaSpec{Replicas: &n, Template: t}
	}
	return j
}

func makeJob(ann map[string]string, t corev1.PodTemplateSpec) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns", Annotations: ann}, Spec: batchv1.JobSpec{Template: t}}
}

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}
