package install

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
)

// replica is one gpupack-manager process started from the Deployment.
type replica struct {
	name    string
	args    []string
	ports   map[string]int
	logPath string
	exited  chan error
}

// why reports why the replica cannot go on: it exited, or it logged a
// "forbidden" error (a permission the manifests lack; informers list
// lazily, so these show up as the manager does real work). "" if neither.
func (r *replica) why() string {
	select {
	case err := <-r.exited:
		r.exited <- err
		return fmt.Sprintf("%s exited: %v", r.name, err)
	default:
	}
	b, _ := os.ReadFile(r.logPath)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "forbidden") {
			return r.name + " lacks a permission: " + line
		}
	}
	return ""
}

// startReplica starts the built gpupack-manager as the kubelet would start
// the Deployment's container: its args with $(VAR) expanded from the
// container env, its Secret and ConfigMap volumes materialised in temp dirs
// (the Secret kept in sync, as the kubelet does, so the cert rotator's
// certificate reaches the webhook server), authenticated as the
// Deployment's ServiceAccount through impersonation so that only the
// manifests' RBAC applies. Listen ports move to free loopback ports.
func startReplica(t *testing.T, env *framework.Env, bin string, dep *unstructured.Unstructured, name string) *replica {
	t.Helper()
	var spec corev1.PodSpec
	podSpec, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	into(t, &unstructured.Unstructured{Object: podSpec}, &spec)
	ctr := spec.Containers[0]
	ns := dep.GetNamespace()

	vars := map[string]string{}
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			vars[e.Name] = ns
		case e.ValueFrom == nil:
			vars[e.Name] = e.Value
		}
	}
	mounts := mountVolumes(t, env, ns, spec.Volumes, ctr.VolumeMounts)
	r := &replica{name: name, ports: map[string]int{}, logPath: filepath.Join(env.Dir, name+".log"), exited: make(chan error, 1)}
	for _, p := range []string{"metrics-bind-address", "health-probe-bind-address", "webhook-port"} {
		port, err := framework.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		r.ports[p] = port
	}
	for _, a := range ctr.Args {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		flag, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch flag {
		case "metrics-bind-address", "health-probe-bind-address":
			a = fmt.Sprintf("--%s=127.0.0.1:%d", flag, r.ports[flag])
		case "webhook-port":
			a = fmt.Sprintf("--%s=%d", flag, r.ports[flag])
		default:
			for mountPath, dir := range mounts {
				if val == mountPath || strings.HasPrefix(val, mountPath+"/") {
					a = "--" + flag + "=" + dir + strings.TrimPrefix(val, mountPath)
				}
			}
		}
		r.args = append(r.args, a)
	}
	if strings.Contains(strings.Join(r.args, " "), "$(") {
		t.Fatalf("unexpanded variable in %v", r.args)
	}

	logf, err := os.Create(r.logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, r.args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+impersonatingKubeconfig(t, env, ns, spec.ServiceAccountName))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-r.exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-r.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(r.logPath)
			t.Logf("---- %s log (%s) ----\n%s", r.name, r.logPath, tail(string(b), 60))
		}
	})
	t.Logf("%s: gpupack-manager %s", name, strings.Join(r.args, " "))
	return r
}

// runManager runs the Deployment's replicas (spec.replicas processes) and
// checks what a healthy install looks like: every replica ready (webhook
// certificates rotated, on disk and their CA injected), exactly one holding
// the leader lease, every replica serving the webhooks with a certificate
// the injected CA verifies, the example AdmissionCheck Active and an
// example job's Workload decided by the gang-fit check — with no
// "forbidden" error in any log.
func runManager(t *testing.T, env *framework.Env, bin string, dep *unstructured.Unstructured) {
	var d appsv1.Deployment
	into(t, dep, &d)
	n := 1
	if d.Spec.Replicas != nil {
		n = int(*d.Spec.Replicas)
	}
	var rs []*replica
	for i := range n {
		rs = append(rs, startReplica(t, env, bin, dep, fmt.Sprintf("gpupack-manager-%d", i)))
	}
	check := func() {
		for _, r := range rs {
			if why := r.why(); why != "" {
				t.Fatal(why)
			}
		}
	}
	for _, r := range rs {
		env.Eventually(t, 120*time.Second, r.name+" /readyz", func() (bool, string) {
			check()
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", r.ports["health-probe-bind-address"]))
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, resp.Status
		})
	}
	env.Eventually(t, 60*time.Second, "one replica to hold the leader lease", func() (bool, string) {
		check()
		var l coordinationv1.Lease
		if err := env.Client.Get(env.Ctx, client.ObjectKey{Namespace: dep.GetNamespace(), Name: "gpupack-manager.gpupack.io"}, &l); err != nil {
			return false, err.Error()
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", "no holder"
	})
	args := rs[0].args
	if v, _ := flagValue(args, "cert-management"); v == "internal" {
		webhooksServeInjectedCA(t, env, rs)
	}
	if v, _ := flagValue(args, "enable-gang-fit"); v == "true" {
		env.Eventually(t, 60*time.Second, "the example AdmissionCheck to be Active", func() (bool, string) {
			check()
			var ac kueue.AdmissionCheck
			if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: "gpupack-gang-fit"}, &ac); err != nil {
				return false, err.Error()
			}
			c := meta.FindStatusCondition(ac.Status.Conditions, kueue.AdmissionCheckActive)
			if c == nil {
				return false, "no Active condition"
			}
			return c.Status == metav1.ConditionTrue, c.Reason + ": " + c.Message
		})
		// Deciding reads nodes, pods and plans and writes Workload status:
		// the informers behind those reads start only now.
		env.Eventually(t, 120*time.Second, "the gang-fit check to decide on an example job's Workload", func() (bool, string) {
			check()
			var wls kueue.WorkloadList
			if err := env.Client.List(env.Ctx, &wls, client.InNamespace("ml-team")); err != nil {
				return false, err.Error()
			}
			for _, wl := range wls.Items {
				for _, st := range wl.Status.AdmissionChecks {
					if st.Name == "gpupack-gang-fit" && st.Message != "" {
						t.Logf("Workload %s: gpupack-gang-fit %s: %s", wl.Name, st.State, st.Message)
						return true, ""
					}
				}
			}
			return false, fmt.Sprintf("%d Workloads in ml-team, none decided", len(wls.Items))
		})
	}
	check()
}

// webhooksServeInjectedCA: the rotator injected a CA into both GPU webhook
// configurations, and every replica's webhook server presents a
// certificate for the Service that this CA verifies.
func webhooksServeInjectedCA(t *testing.T, env *framework.Env, rs []*replica) {
	t.Helper()
	o := webhooks.DefaultServeOptions()
	var m admissionregistrationv1.MutatingWebhookConfiguration
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: o.MutatingName}, &m); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(env.Ctx, client.ObjectKey{Name: o.ValidatingName}, &v); err != nil {
		t.Fatal(err)
	}
	var bundles [][]byte
	for _, w := range m.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	for _, w := range v.Webhooks {
		bundles = append(bundles, w.ClientConfig.CABundle)
	}
	for i, b := range bundles {
		if len(b) == 0 || string(b) != string(bundles[0]) {
			t.Fatalf("webhook %d of %d: caBundle missing or different from the others", i, len(bundles))
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundles[0]) {
		t.Fatalf("caBundle holds no PEM certificate")
	}
	server := o.ServiceName + "." + o.Namespace + ".svc"
	for _, r := range rs {
		env.Eventually(t, 60*time.Second, r.name+" to serve webhooks with a certificate the injected CA verifies", func() (bool, string) {
			if why := r.why(); why != "" {
				t.Fatal(why)
			}
			d := &net.Dialer{Timeout: 2 * time.Second}
			c, err := tls.DialWithDialer(d, "tcp", fmt.Sprintf("127.0.0.1:%d", r.ports["webhook-port"]), &tls.Config{RootCAs: pool, ServerName: server})
			if err != nil {
				return false, err.Error()
			}
			c.Close()
			return true, ""
		})
	}
}
