package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
)

// explore leaves the cluster running for a newcomer (make demo KEEP=1):
// the kubeconfig, a dump `gpupack fit --explain` reads, and a few commands,
// until Ctrl-C; the deferred cleanup then stops everything as usual.
func explore(t *demoTB, env *framework.Env) {
	step("The cluster stays up (KEEP=1) until Ctrl-C")
	dump := filepath.Join(t.dir, "dump")
	waiting := waitingWorkload(env)
	if err := writeDump(env, dump, waiting); err != nil {
		say("(no dump for gpupack fit: %v)", err)
	}
	kc := env.Kubeconfig
	say("export KUBECONFIG=%s", kc)
	say("")
	say("kubectl get workloads,gpuplans -A                  # every Workload and the GPU plan the check stored for it")
	say("kubectl get clusterqueues,localqueues -A           # quota, the cohort, what is borrowed")
	if waiting != nil {
		say("kubectl -n %s describe workload %s   # why it waits (conditions, check state)", waiting.Namespace, waiting.Name)
	}
	say("kubectl get pods -A -o wide                        # kwok runs them on the fake GPU nodes")
	say("kubectl get events -A --field-selector reason=Placed    # the ungater pinning pods to planned GPUs")
	say("kubectl get nodes -o jsonpath='{.items[0].metadata.annotations.gpupack\\.io/gpus}'   # a node's GPU inventory")
	if waiting != nil {
		say("go run ./cmd/gpupack fit --explain --nodes %[1]s/nodes.yaml --pods %[1]s/pods.yaml --plans %[1]s/plans.yaml --workload %[1]s/workload.yaml", dump)
		say("    # the check's decision for %s offline, from the dump just written, with free capacity per domain", waiting.Name)
	}
	say("")
	say("component logs: %s", env.Dir)
	say("press Ctrl-C to stop the cluster and clean up")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	signal.Stop(sig)
	fmt.Println("\nstopping the cluster...")
}

// waitingWorkload is a Workload not admitted (the preempted training job,
// queued again), or nil.
func waitingWorkload(env *framework.Env) *kueue.Workload {
	var wls kueue.WorkloadList
	if env.Client.List(env.Ctx, &wls) != nil {
		return nil
	}
	for i := range wls.Items {
		w := &wls.Items[i]
		if apimeta.IsStatusConditionTrue(w.Status.Conditions, kueue.WorkloadAdmitted) || apimeta.IsStatusConditionTrue(w.Status.Conditions, kueue.WorkloadFinished) {
			continue
		}
		if w.Spec.Active == nil || *w.Spec.Active {
			return w
		}
	}
	return nil
}

// writeDump writes what `kubectl get -o yaml` would: nodes, pods, GPUPlans
// and the waiting Workload, each a multi-document YAML file.
func writeDump(env *framework.Env, dir string, wl *kueue.Workload) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var nodes corev1.NodeList
	var pods corev1.PodList
	var plans v1alpha1.GPUPlanList
	for _, l := range []client.ObjectList{&nodes, &pods, &plans} {
		if err := env.Client.List(env.Ctx, l); err != nil {
			return err
		}
	}
	write := func(name string, gvk schema.GroupVersionKind, objs []client.Object) error {
		var b strings.Builder
		for _, o := range objs {
			o.GetObjectKind().SetGroupVersionKind(gvk)
			o.SetManagedFields(nil)
			y, err := yaml.Marshal(o)
			if err != nil {
				return err
			}
			b.WriteString("---\n")
			b.Write(y)
		}
		return os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644)
	}
	var ns, ps, pl []client.Object
	for i := range nodes.Items {
		ns = append(ns, &nodes.Items[i])
	}
	for i := range pods.Items {
		ps = append(ps, &pods.Items[i])
	}
	for i := range plans.Items {
		pl = append(pl, &plans.Items[i])
	}
	if err := write("nodes.yaml", corev1.SchemeGroupVersion.WithKind("Node"), ns); err != nil {
		return err
	}
	if err := write("pods.yaml", corev1.SchemeGroupVersion.WithKind("Pod"), ps); err != nil {
		return err
	}
	if err := write("plans.yaml", v1alpha1.GroupVersion.WithKind("GPUPlan"), pl); err != nil {
		return err
	}
	if wl != nil {
		return write("workload.yaml", kueue.GroupVersion.WithKind("Workload"), []client.Object{wl.DeepCopy()})
	}
	return nil
}
