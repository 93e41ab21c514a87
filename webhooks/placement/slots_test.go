package placement

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

func slot(ps string, i int32, node string) v1alpha1.PodAssignment {
	return v1alpha1.PodAssignment{PodSet: ps, Index: i, Node: node, GPUs: []v1alpha1.GPUAssignment{{UUID: fmt.Sprintf("GPU-%s-%d", ps, i), MemoryMiB: 1000}}}
}

func idx(i int32) *int32 { return &i }

func TestAssign(t *testing.T) {
	plan := []v1alpha1.PodAssignment{slot("master", 0, "n1"), slot("worker", 0, "n1"), slot("worker", 1, "n2")}
	b := func(ps string, i int32, name string) v1alpha1.SlotBinding {
		return v1alpha1.SlotBinding{PodSet: ps, Index: i, PodName: name, PodUID: types.UID(name + "-uid")}
	}
	pod := func(name, rt string, i *int32) PodInfo {
		return PodInfo{Name: name, UID: types.UID(name + "-uid"), ReplicaType: rt, Index: i}
	}
	alive := func(names ...string) func(v1alpha1.SlotBinding) bool {
		return func(b v1alpha1.SlotBinding) bool {
			for _, n := range names {
				if b.PodName == n {
					return true
				}
			}
			return false
		}
	}
	cases := []struct {
		name     string
		bindings []v1alpha1.SlotBinding
		pod      PodInfo
		live     func(v1alpha1.SlotBinding) bool
		want     string
		wantB    []v1alpha1.SlotBinding
		wantErr  error
	}{
		{name: "worker by index", pod: pod("w1", "worker", idx(1)), live: alive(), want: "worker/1", wantB: []v1alpha1.SlotBinding{b("worker", 1, "w1")}},
		{name: "replica type matches case-insensitively", pod: pod("m", "Master", idx(0)), live: alive(), want: "master/0", wantB: []v1alpha1.SlotBinding{b("master", 0, "m")}},
		{name: "already bound is idempotent", bindings: []v1alpha1.SlotBinding{b("worker", 1, "w1")}, pod: pod("w1", "worker", idx(0)), live: alive("w1"), want: "worker/1", wantB: []v1alpha1.SlotBinding{b("worker", 1, "w1")}},
		{name: "recreated pod gets its slot back", bindings: []v1alpha1.SlotBinding{b("worker", 0, "w0-old"), b("worker", 1, "w1")}, pod: pod("w0-new", "worker", idx(0)), live: alive("w1"),
			want: "worker/0", wantB: []v1alpha1.SlotBinding{b("worker", 0, "w0-new"), b("worker", 1, "w1")}},
		{name: "predecessor still terminating", bindings: []v1alpha1.SlotBinding{b("worker", 0, "w0-old")}, pod: pod("w0-new", "worker", idx(0)), live: alive("w0-old"), wantErr: ErrSlotBusy},
		{name: "no index takes first free", bindings: []v1alpha1.SlotBinding{b("worker", 0, "a")}, pod: pod("x", "worker", nil), live: alive("a"), want: "worker/1",
			wantB: []v1alpha1.SlotBinding{b("worker", 0, "a"), b("worker", 1, "x")}},
		{name: "no replica type, any set", pod: pod("x", "", nil), live: alive(), want: "master/0", wantB: []v1alpha1.SlotBinding{b("master", 0, "x")}},
		{name: "full", bindings: []v1alpha1.SlotBinding{b("worker", 0, "a"), b("worker", 1, "c")}, pod: pod("x", "worker", nil), live: alive("a", "c"), wantErr: ErrNoSlot},
		{name: "unknown replica type with several sets", pod: pod("x", "evaluator", nil), live: alive(), wantErr: ErrNoSlot},
		{name: "index beyond plan falls back to a free slot", pod: pod("w7", "worker", idx(7)), live: alive(), want: "worker/0", wantB: []v1alpha1.SlotBinding{b("worker", 0, "w7")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, nb, err := Assign(plan, tc.bindings, tc.pod, tc.live)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g := fmt.Sprintf("%s/%d", got.PodSet, got.Index); g != tc.want {
				t.Errorf("slot = %s, want %s", g, tc.want)
			}
			if d := cmp.Diff(tc.wantB, nb); d != "" {
				t.Errorf("bindings (-want +got):\n%s", d)
			}
		})
	}
}

// TestAssignProperties plays random pod arrivals, deletions and recreations
// against a plan and checks after every step: no two live pods share a slot,
// a pod with an index in range sits in its own index, and asking again gives
// the same answer.
func TestAssignProperties(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for round := 0; round < 300; round++ {
		n := int32(1 + r.Intn(6))
		var plan []v1alpha1.PodAssignment
		for i := int32(0); i < n; i++ {
			plan = append(plan, slot("worker", i, "n"))
		}
		var bindings []v1alpha1.SlotBinding
		livePods := map[string]PodInfo{}
		slotOf := map[string]string{}
		gen := 0
		for step := 0; step < 40; step++ {
			if len(livePods) > 0 && r.Intn(3) == 0 { // delete a random pod
				for name := range livePods {
					delete(livePods, name)
					delete(slotOf, name)
					break
				}
				continue
			}
			gen++
			pi := PodInfo{Name: fmt.Sprintf("p%d", gen), UID: types.UID(fmt.Sprintf("u%d", gen)), ReplicaType: "worker"}
			if r.Intn(2) == 0 {
				pi.Index = idx(int32(r.Intn(int(n) + 1)))
			}
			live := func(b v1alpha1.SlotBinding) bool { _, ok := livePods[b.PodName]; return ok }
			a, nb, err := Assign(plan, bindings, pi, live)
			if err != nil {
				if !errors.Is(err, ErrNoSlot) && !errors.Is(err, ErrSlotBusy) {
					t.Fatal(err)
				}
				continue
			}
			if pi.Index != nil && *pi.Index < n && a.Index != *pi.Index {
				t.Fatalf("round %d: pod with index %d got slot %d", round, *pi.Index, a.Index)
			}
			bindings = nb
			livePods[pi.Name] = pi
			key := fmt.Sprint(a.Index)
			for other, s := range slotOf {
				if s == key {
					t.Fatalf("round %d: %s and %s share slot %s", round, other, pi.Name, key)
				}
			}
			slotOf[pi.Name] = key
			again, nb2, err := Assign(plan, bindings, pi, live)
			if err != nil || again.Index != a.Index || !cmp.Equal(nb2, bindings) {
				t.Fatalf("round %d: not idempotent: %v %v", round, again, err)
			}
		}
	}
}

func TestPodInfoFromLabels(t *testing.T) {
	pi := PodInfoFromLabels("p", "u", map[string]string{"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "3"}, nil)
	if pi.ReplicaType != "worker" || pi.Index == nil || *pi.Index != 3 {
		t.Errorf("pytorch: %+v", pi)
	}
	pi = PodInfoFromLabels("p", "u", nil, map[string]string{"batch.kubernetes.io/job-completion-index": "2"})
	if pi.Index == nil || *pi.Index != 2 {
		t.Errorf("job annotation: %+v", pi)
	}
	pi = PodInfoFromLabels("p", "u", map[string]string{"training.kubeflow.org/replica-index": "x"}, nil)
	if pi.Index != nil {
		t.Errorf("bad index parsed: %+v", pi)
	}
}

func TestDevices(t *testing.T) {
	a := v1alpha1.PodAssignment{GPUs: []v1alpha1.GPUAssignment{{UUID: "GPU-a", MemoryMiB: 20480}, {UUID: "GPU-b", MemoryMiB: 71903, Exclusive: true}}}
	if got := Devices(a); got != "GPU-a:20480,GPU-b:71903" {
		t.Errorf("Devices = %q", got)
	}
}
