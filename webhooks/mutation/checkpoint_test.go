package mutation

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/policy"
)

// How long GPUs are held is the policy's, not the tenant's: a GPU pod's
// terminationGracePeriodSeconds is capped at its job's priority class's cap
// + margin (the class the webhook resolved, PodContext.Class; the
// ClusterQueue is not known at creation, so the class's longest over every
// queue), an opted-in pod's agent gets that grace and a timeout within the
// cap, and pods without GPUs are left alone. Every pod carries a tenant's
// kueue.x-k8s.io/priority-class "research" label and priorityClassName:
// they never choose the cap (review 16, H3), and an unknown class gets the
// shortest cap of any, not the longest.
func TestGPUPodGraceIsCappedByThePolicy(t *testing.T) {
	m := mustNew(t, Config{Checkpoint: CheckpointConfig{Image: "mgr:v1", Margin: metav1.Duration{Duration: 15 * time.Second},
		MaxTimeout: metav1.Duration{Duration: time.Hour},
		Policy: policy.Policy{Max: 5 * time.Minute, MaxByPriorityClass: map[string]time.Duration{"low": time.Minute, "research": 30 * time.Minute},
			MaxByClusterQueue: map[string]time.Duration{"big": 10 * time.Minute}}}})
	hour := int64(3600)
	low, research, unnamed := PodContext{Class: "low", ClassKnown: true}, PodContext{Class: "research", ClassKnown: true}, PodContext{ClassKnown: true}
	cases := []struct {
		name      string
		optIn     bool
		gpu       bool
		pc        PodContext
		grace     *int64
		wantGrace int64 // 0: unset
		wantFlags string
		wantWarn  bool
	}{
		{name: "opted in, an hour, class low", optIn: true, gpu: true, pc: low, grace: &hour, wantGrace: 75, wantFlags: "--checkpoint-timeout=1m0s --grace=1m15s", wantWarn: true},
		{name: "opted in, class research", optIn: true, gpu: true, pc: research, grace: &hour, wantGrace: 30*60 + 15, wantFlags: "--checkpoint-timeout=30m0s --grace=30m15s", wantWarn: true},
		{name: "opted in, unnamed class: the longest of Max and the queue caps", optIn: true, gpu: true, pc: unnamed, grace: &hour, wantGrace: 10*60 + 15, wantFlags: "--checkpoint-timeout=10m0s --grace=10m15s", wantWarn: true},
		{name: "opted in, class unknown: the shortest cap of any", optIn: true, gpu: true, grace: &hour, wantGrace: 75, wantFlags: "--checkpoint-timeout=1m0s --grace=1m15s", wantWarn: true},
		{name: "opted in, no grace set: timeout + margin", optIn: true, gpu: true, pc: low, wantGrace: 75, wantFlags: "--checkpoint-timeout=1m0s --grace=1m15s"},
		{name: "not opted in, GPU, an hour: capped", gpu: true, pc: low, grace: &hour, wantGrace: 75, wantWarn: true},
		{name: "not opted in, GPU, class unknown: the shortest cap", gpu: true, grace: &hour, wantGrace: 75, wantWarn: true},
		{name: "not opted in, GPU, within the cap: kept", gpu: true, pc: low, grace: ptr(int64(60)), wantGrace: 60},
		{name: "no GPU, not opted in: untouched", pc: low, grace: &hour, wantGrace: 3600},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := makeCtr("t").obj()
			if tc.gpu {
				c = makeCtr("t").gpus("1").obj()
			}
			b := makePod("p").ann(v1alpha1.AnnotationCheckpointTimeout, "50m")
			if tc.optIn {
				b = b.ann(v1alpha1.AnnotationCheckpoint, "true")
			}
			p := b.ctr(c).obj()
			p.Labels = map[string]string{"kueue.x-k8s.io/priority-class": "research"}
			p.Spec.PriorityClassName = "research"
			if tc.grace != nil {
				p.Spec.TerminationGracePeriodSeconds = ptr(*tc.grace)
			}
			warn, err := m.Pod(p, tc.pc)
			if err != nil {
				t.Fatal(err)
			}
			got := int64(0)
			if g := p.Spec.TerminationGracePeriodSeconds; g != nil {
				got = *g
			}
			if got != tc.wantGrace {
				t.Errorf("terminationGracePeriodSeconds %d, want %d", got, tc.wantGrace)
			}
			if cmd := strings.Join(p.Spec.Containers[0].Command, " "); tc.wantFlags != "" && !strings.Contains(cmd, tc.wantFlags) {
				t.Errorf("agent command %q, want %q", cmd, tc.wantFlags)
			}
			if warned := strings.Contains(strings.Join(warn, "\n"), "terminationGracePeriodSeconds"); warned != tc.wantWarn {
				t.Errorf("warnings %q, want a grace warning: %v", warn, tc.wantWarn)
			}
		})
	}
}

// Kueue's class for an object: its priority-class label wins over
// priorityClassName.
func TestPriorityClassOf(t *testing.T) {
	for _, tc := range []struct {
		labels    map[string]string
		pcn, want string
	}{
		{map[string]string{"kueue.x-k8s.io/priority-class": "low"}, "research", "low"},
		{nil, "research", "research"},
		{map[string]string{"kueue.x-k8s.io/priority-class": ""}, "", ""},
	} {
		if got := PriorityClassOf(tc.labels, tc.pcn); got != tc.want {
			t.Errorf("PriorityClassOf(%v, %q) = %q, want %q", tc.labels, tc.pcn, got, tc.want)
		}
	}
}
