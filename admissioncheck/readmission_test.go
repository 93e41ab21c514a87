package admissioncheck

import (
	"context"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

var (
	firstAdmission  = time.Date(2026, 1, 1, 23, 50, 0, 0, time.UTC)
	secondAdmission = time.Date(2026, 1, 1, 23, 59, 0, 0, time.UTC)
)

// readyWorkload is "wl" admitted at firstAdmission with the check Ready on
// plan "wl" (one pod, one whole GPU).
func readyWorkload() *kueue.Workload {
	wl := admittedWorkload("wl", "wl-uid", 1, 1).obj()
	wl.Status.Conditions[0].LastTransitionTime = metav1.NewTime(firstAdmission)
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadAdmitted, Status: metav1.ConditionTrue, Reason: "Admitted"})
	wl.Status.AdmissionChecks[0] = kueue.AdmissionCheckState{Name: testCheck, State: kueue.CheckStateReady, Message: "all 1 pods fit on 1 GPUs",
		LastTransitionTime: metav1.NewTime(firstAdmission.Add(time.Second)),
		PodSetUpdates:      []kueue.PodSetUpdate{{Name: kueue.DefaultPodSetName, Annotations: map[string]string{v1alpha1.AnnotationPlan: "wl"}}}}
	return wl
}

func planOf(wl *kueue.Workload, admission time.Time, uuids ...string) *v1alpha1.GPUPlan {
	p := planFor(wl, uuids...)
	p.Annotations = map[string]string{v1alpha1.AnnotationAdmission: admission.UTC().Format(time.RFC3339)}
	return p
}

// The steps of an eviction written by another controller (the preemption
// coordinator sets only the Evicted condition: Kueue's own eviction would
// also reset the checks) and the re-admission that follows, as Kueue
// performs them.
func evictOutside(wl *kueue.Workload) {
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue, Reason: kueue.WorkloadEvictedDueToNodeFailures})
}

func releaseQuota(wl *kueue.Workload) {
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionFalse, Reason: "Pending",
		LastTransitionTime: metav1.NewTime(secondAdmission.Add(-time.Minute))})
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadAdmitted, Status: metav1.ConditionFalse, Reason: "NoReservation"})
	wl.Status.Admission = nil
}

// readmit: Kueue reserves quota again; it admits at once when every check
// is still Ready (as it did on the Ready left by an outside eviction).
func readmit(wl *kueue.Workload) {
	pods := int32(1)
	// Set the time explicitly: SetStatusCondition keeps it only on a status change.
	wl.Status.Conditions = append(wl.Status.Conditions[:0:0], wl.Status.Conditions...)
	apimeta.RemoveStatusCondition(&wl.Status.Conditions, kueue.WorkloadQuotaReserved)
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionTrue, Reason: "QuotaReserved",
		LastTransitionTime: metav1.NewTime(secondAdmission)})
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadEvicted, Status: metav1.ConditionFalse, Reason: "QuotaReserved"})
	wl.Status.Admission = &kueue.Admission{ClusterQueue: "cq", PodSetAssignments: []kueue.PodSetAssignment{{Name: kueue.DefaultPodSetName, Count: &pods}}}
	if st := wl.Status.AdmissionChecks[0]; st.State == kueue.CheckStateReady {
		apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadAdmitted, Status: metav1.ConditionTrue, Reason: "Admitted"})
	}
}

func (e *env) mutate(wl *kueue.Workload, f func(*kueue.Workload)) *kueue.Workload {
	e.t.Helper()
	cur := &kueue.Workload{}
	if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(wl), cur); err != nil {
		e.t.Fatal(err)
	}
	f(cur)
	if err := e.c.Status().Update(context.Background(), cur); err != nil {
		e.t.Fatal(err)
	}
	return cur
}

// The re-admission bug behind the skipped drain test
// (test/integration/preemption TestDrainEvictsTheWholeWorkloadThroughKueue):
// the coordinator evicts the whole Workload by setting Evicted, which leaves
// the gang-fit check Ready; the check released the plan, Kueue re-admitted
// the Workload at once on the stale Ready (podSetUpdates naming the
// released plan), the check then found the plan gone and set Retry, and
// Kueue evicted the re-admitted Workload again, deleting its new pods.
// Whatever the reconciler sees of the sequence (every step, or only the
// end: events coalesce), the new admission must end Ready on a plan of its
// own, and never Retry.
func TestOutsideEvictionAndReadmission(t *testing.T) {
	type step struct {
		name      string
		f         func(*kueue.Workload)
		reconcile bool
	}
	all := []step{{"evicted", evictOutside, true}, {"quota released", releaseQuota, true}, {"re-admitted", readmit, true}}
	cases := []struct {
		name  string
		seen  []bool // which steps the reconciler saw
		nodes int
		// again: the first decision waits (the earlier plan's slot stays
		// held a while, as its pods may be terminating), leaving the
		// Ready and the gated pods alone; the requeue plans it.
		again bool
	}{
		{"every step seen", []bool{true, true, true}, 2, false},
		{"eviction seen, quota release and re-admission coalesced", []bool{true, false, true}, 2, false},
		{"only the re-admission seen", []bool{false, false, true}, 2, false},
		{"only the re-admission seen, one GPU", []bool{false, false, true}, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wl := readyWorkload()
			e := newEnv(t, gpuNode("n1", tc.nodes, nil), wl, planOf(wl, firstAdmission, "n1-g0"))
			var states []string
			for i, s := range all {
				wl = e.mutate(wl, s.f)
				if !tc.seen[i] {
					continue
				}
				e.reconcile(wl)
				st := e.check(wl)
				states = append(states, s.name+": "+string(st.State))
				if st.State == kueue.CheckStateRetry || st.State == kueue.CheckStateRejected {
					t.Fatalf("after %s: check %s (%q); states %v", s.name, st.State, st.Message, states)
				}
			}
			if tc.again {
				if e.plan("wl") != nil {
					t.Fatalf("planned onto the earlier admission's slot at once")
				}
				e.reconcile(wl) // a restarted model: no ghost left
			}
			st := e.check(wl)
			if st.State != kueue.CheckStateReady {
				t.Fatalf("check %s (%q), want Ready; states %v", st.State, st.Message, states)
			}
			p := e.plan("wl")
			if p == nil {
				t.Fatalf("no plan for the new admission; states %v", states)
			}
			if got, want := p.Annotations[v1alpha1.AnnotationAdmission], secondAdmission.Format(time.RFC3339); got != want {
				t.Errorf("plan is of admission %q, want the new one %q", got, want)
			}
			if len(st.PodSetUpdates) != 1 || st.PodSetUpdates[0].Annotations[v1alpha1.AnnotationPlan] != "wl" {
				t.Errorf("podSetUpdates %+v, want the plan wl", st.PodSetUpdates)
			}
		})
	}
}

// An outside eviction (only the Evicted condition, or the quota released
// with the check left Ready) resets the Ready check to Pending, with no
// podSetUpdates, as Kueue's own eviction does; the plan is released.
func TestOutsideEvictionResetsReadyCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(*kueue.Workload)
	}{
		{"Evicted set by another controller", evictOutside},
		{"quota released with the check Ready", func(wl *kueue.Workload) { evictOutside(wl); releaseQuota(wl) }},
		{"deactivated", func(wl *kueue.Workload) { wl.Spec.Active = ptrTo(false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl := readyWorkload()
			tc.f(wl)
			e := newEnv(t, gpuNode("n1", 1, nil), wl, planOf(wl, firstAdmission, "n1-g0"))
			e.reconcile(wl)
			st := e.check(wl)
			if st.State != kueue.CheckStatePending || len(st.PodSetUpdates) != 0 || !strings.Contains(st.Message, "Reset to Pending") {
				t.Errorf("check %s %+v (%q), want Pending without podSetUpdates", st.State, st.PodSetUpdates, st.Message)
			}
			if e.plan("wl") != nil {
				t.Error("plan still stored")
			}
		})
	}
}

// A finished Workload's check is left as it is.
func TestFinishedWorkloadCheckLeftAlone(t *testing.T) {
	wl := readyWorkload()
	apimeta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadFinished, Status: metav1.ConditionTrue, Reason: "Succeeded"})
	e := newEnv(t, gpuNode("n1", 1, nil), wl, planOf(wl, firstAdmission, "n1-g0"))
	e.reconcile(wl)
	if st := e.check(wl); st.State != kueue.CheckStateReady {
		t.Errorf("check %s (%q), want Ready left alone", st.State, st.Message)
	}
}

// A Ready state of an earlier admission on which Kueue admitted this one:
// planned again in place when the gang fits with the same podSetUpdates,
// else Retry (the pods already carry the updates; Kueue refuses to change
// a Ready check's).
func TestStaleReadyPlannedInPlace(t *testing.T) {
	for _, tc := range []struct {
		name      string
		objs      func(wl *kueue.Workload) []interface{ client.Object }
		level     string
		want      kueue.CheckState
		wantInMsg string
	}{
		{"plan released at the eviction", nil, "", kueue.CheckStateReady, "planned again"},
		{"earlier admission's plan still stored", func(wl *kueue.Workload) []interface{ client.Object } {
			return []interface{ client.Object }{planOf(wl, firstAdmission, "n1-g0")}
		}, "", kueue.CheckStateReady, "planned again"},
		{"does not fit now", func(wl *kueue.Workload) []interface{ client.Object } {
			return []interface{ client.Object }{holderPod("other-0", "other-uid", "n1", "", false, "n1-g0", "n1-g1")}
		}, "", kueue.CheckStateRetry, "does not fit now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl := readyWorkload()
			readmit(wl)
			objs := []client.Object{gpuNode("n1", 2, nil), wl}
			if tc.objs != nil {
				for _, o := range tc.objs(wl) {
					objs = append(objs, o)
				}
			}
			e := newEnv(t, objs...)
			e.reconcile(wl)
			st := e.check(wl)
			if st.State != tc.want || !strings.Contains(st.Message, tc.wantInMsg) {
				t.Fatalf("check %s (%q), want %s with %q", st.State, st.Message, tc.want, tc.wantInMsg)
			}
			p := e.plan("wl")
			if tc.want == kueue.CheckStateReady {
				if p == nil || p.Annotations[v1alpha1.AnnotationAdmission] != secondAdmission.Format(time.RFC3339) {
					t.Errorf("plan %+v, want one of the new admission", p)
				}
				if len(st.PodSetUpdates) != 1 || st.PodSetUpdates[0].Annotations[v1alpha1.AnnotationPlan] != "wl" {
					t.Errorf("podSetUpdates %+v changed", st.PodSetUpdates)
				}
			} else if p != nil {
				t.Errorf("plan left behind: %+v", p.Spec.Assignments)
			}
		})
	}
}

// A Pending check never reuses the plan of an earlier admission of the
// same Workload (same name, same UID): its pods may still be terminating
// on its slots, and it was made for other capacity.
func TestPlanOfEarlierAdmissionNotReused(t *testing.T) {
	wl := admittedWorkload("wl", "wl-uid", 1, 1).obj() // admitted at secondAdmission, check Pending
	e := newEnv(t, gpuNode("n1", 2, nil), wl, planOf(wl, firstAdmission, "n1-g0"),
		holderPod("wl-0-old", "old-pod-uid", "n1", "wl", true, "n1-g0"))
	e.reconcile(wl)
	st := e.check(wl)
	if st.State != kueue.CheckStateReady {
		t.Fatalf("check %s (%q)", st.State, st.Message)
	}
	p := e.plan("wl")
	if p == nil || p.Annotations[v1alpha1.AnnotationAdmission] != secondAdmission.Format(time.RFC3339) {
		t.Fatalf("plan %+v, want one of the new admission", p)
	}
	if g := p.Spec.Assignments[0].GPUs[0].UUID; g != "n1-g1" {
		t.Errorf("planned %s, still held by the earlier admission's terminating pod; want n1-g1", g)
	}
}
