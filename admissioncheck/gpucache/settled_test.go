package gpucache

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/flavors"
)

// Outside review: a victim plan released (evicted), its pod terminating. A
// preemptor that fits once it is gone must be Pending (SettledFits), not Retry
// (which hands back the quota Kueue just freed for it).
func TestReleasedPlanGhostsAreSettling(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(nil)
	c.SetClock(func() time.Time { return now })
	c.UpsertNode(node("n1", 1))
	pod := wholePod("victim", "n1-g0")
	c.UpsertPod(pod)
	c.UpsertPlan(onePlan("v", "v-uid", "n1-g0", "victim"))
	c.DeletePlan(types.NamespacedName{Namespace: "ns", Name: "v"}, "obj-v", "v-uid") // evicted: plan released
	ts := metav1.NewTime(now)
	pod = pod.DeepCopy()
	pod.DeletionTimestamp = &ts
	c.UpsertPod(pod) // terminating
	g := fit.Gang{PodSets: []fit.PodSet{{Name: "main", Count: 1, GPUsPerPod: 1}}}
	var v Verdict
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v = s.Decide(g, nil, fit.Options{}) })
	t.Logf("pod terminating, ghost live: fits=%v settled=%v never=%v", v.Result.Fits, v.SettledFits, v.Never)
	if !v.SettledFits {
		t.Errorf("preemptor would get Retry (quota released) while only the victim's terminating pod and the ghost hold the GPU")
	}
	now = now.Add(3 * time.Second)
	c.DeletePod("victim") // victim pod gone after 3s
	c.Read(flavors.DefaultBuffer(), func(s *Snapshot) { v = s.Decide(g, nil, fit.Options{}) })
	t.Logf("pod gone, ghost live: fits=%v settled=%v never=%v", v.Result.Fits, v.SettledFits, v.Never)
	if !v.Result.Fits && !v.SettledFits {
		t.Errorf("preemptor would get Retry for the 12s the ghost still lives")
	}
}
