package webhooks

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/test/framework"
	"github.com/gpupack/gpupack/webhooks"
)

// TestPodCreateThroughput creates GPU pods through the real apiserver with
// and without gpupack's webhooks in the same run (interleaved batches into a
// namespace the webhooks serve and one they exclude) and reports the ratio.
// Opt in with GPUPACK_BENCH=1 (it measures; it does not assert speed).
func TestPodCreateThroughput(t *testing.T) {
	if os.Getenv("GPUPACK_BENCH") == "" {
		t.Skip("set GPUPACK_BENCH=1 to run the pod-create throughput measurement")
	}
	const total, batches, workers = 2000, 4, 16
	env := framework.Start(t, framework.Options{NoKueue: true})
	with := env.Namespace(t, "with")
	without := env.Namespace(t, "without")
	noop := env.Namespace(t, "noop")
	opts := env.WebhookServer()
	env.StartManager(t, func(mgr ctrl.Manager) error {
		// An allow-all pair, to separate the apiserver's cost of calling any
		// webhook from gpupack's own.
		allow := &webhook.Admission{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })}
		mgr.GetWebhookServer().Register("/noop", allow)
		return webhooks.Setup(mgr, webhooks.Config{})
	}, opts)
	so := webhooks.DefaultServeOptions()
	so.ExcludedNamespaces = []string{without, noop}
	mwc, vwc := webhooks.WebhookConfigurations(so)
	// The no-op configurations: same rules and conditions, only for noop.
	nm, nv := webhooks.WebhookConfigurations(so)
	nm.Name, nv.Name = "noop-m", "noop-v"
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": noop}}
	path := "/noop"
	for i := range nm.Webhooks {
		nm.Webhooks[i].Name, nm.Webhooks[i].NamespaceSelector, nm.Webhooks[i].ClientConfig.Service.Path = "noop-"+nm.Webhooks[i].Name, sel, &path
	}
	for i := range nv.Webhooks {
		nv.Webhooks[i].Name, nv.Webhooks[i].NamespaceSelector, nv.Webhooks[i].ClientConfig.Service.Path = "noop-"+nv.Webhooks[i].Name, sel, &path
	}
	env.InstallWebhooks(t, opts, mwc, vwc, nm, nv)

	oneGPU := limits(v1alpha1.ResourceNvidiaGPU, "1")
	create := func(ns string, from, n int) time.Duration {
		var next atomic.Int64
		next.Store(int64(from))
		end := int64(from + n)
		var wg sync.WaitGroup
		var firstErr atomic.Value
		t0 := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= end {
						return
					}
					p := gpuPod(ns, fmt.Sprintf("p-%d", i), map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, corev1.Container{Resources: oneGPU})
					if err := env.Client.Create(env.Ctx, p); err != nil {
						firstErr.CompareAndSwap(nil, err)
					}
				}
			}()
		}
		wg.Wait()
		if err := firstErr.Load(); err != nil {
			t.Fatalf("create in %s: %v", ns, err)
		}
		return time.Since(t0)
	}
	// Warm up both paths (connections, webhook TLS, informers).
	create(with, 1_000_000, 50)
	create(without, 1_000_000, 50)
	create(noop, 1_000_000, 50)
	var dWith, dWithout, dNoop time.Duration
	per := total / batches
	for b := 0; b < batches; b++ {
		dWithout += create(without, b*per, per)
		dWith += create(with, b*per, per)
		dNoop += create(noop, b*per, per)
	}
	rate := func(d time.Duration) float64 { return float64(total) / d.Seconds() }
	p50, p99 := webhookLatency(t, env, "mpod.gpupack.io")
	n50, n99 := webhookLatency(t, env, "noop-mpod.gpupack.io")
	t.Logf("pods: %d each, %d workers; without webhooks %.0f pods/s; with gpupack %.0f pods/s (ratio %.3f); with an allow-all webhook pair %.0f pods/s (ratio %.3f); gpupack vs allow-all %.3f; apiserver-observed mutating call p50 ≤ %s, p99 ≤ %s (allow-all: p50 ≤ %s, p99 ≤ %s)",
		total, workers, rate(dWithout), rate(dWith), rate(dWith)/rate(dWithout), rate(dNoop), rate(dNoop)/rate(dWithout), rate(dWith)/rate(dNoop), p50, p99, n50, n99)
}

// webhookLatency reads the apiserver's admission webhook histogram for the
// pod webhooks and returns the bucket bounds holding p50 and p99.
func webhookLatency(t *testing.T, env *framework.Env, name string) (string, string) {
	raw, err := env.Clientset.RESTClient().Get().AbsPath("/metrics").DoRaw(env.Ctx)
	if err != nil {
		t.Logf("apiserver metrics: %v", err)
		return "?", "?"
	}
	type bucket struct {
		le    string
		count float64
	}
	var bs []bucket
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "apiserver_admission_webhook_admission_duration_seconds_bucket{") || !strings.Contains(l, `name="`+name+`"`) {
			continue
		}
		i := strings.Index(l, `le="`)
		le := l[i+4 : i+4+strings.IndexByte(l[i+4:], '"')]
		var c float64
		fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &c)
		// Sum over operation/rejected label combinations per bound.
		found := false
		for k := range bs {
			if bs[k].le == le {
				bs[k].count += c
				found = true
			}
		}
		if !found {
			bs = append(bs, bucket{le, c})
		}
	}
	if len(bs) == 0 {
		return "?", "?"
	}
	totalCount := bs[len(bs)-1].count
	q := func(f float64) string {
		for _, b := range bs {
			if b.count >= f*totalCount {
				return b.le + "s"
			}
		}
		return "+Inf"
	}
	return q(0.5), q(0.99)
}
