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

// A JobSet's replicated Job with replicas R runs R Jobs whose pods share
// completion indices 0..P-1; Kueue's pod set counts R × P. Every pod,
// arriving in any order, gets the slot of its (Job index, completion
// index): distinct pods never wait on each other's slots, and a pod of the
// driver never lands in the workers' set.
func TestAssignJobSetReplicas(t *testing.T) {
	const replicas, parallelism = 3, 2
	plan := []v1alpha1.PodAssignment{slot("driver", 0, "n1")}
	for i := int32(0); i < replicas*parallelism; i++ {
		plan = append(plan, slot("workers", i, fmt.Sprintf("n%d", i)))
	}
	type pod struct{ job, ci int32 }
	var pods []pod
	for j := int32(0); j < replicas; j++ {
		for c := int32(0); c < parallelism; c++ {
			pods = append(pods, pod{j, c})
		}
	}
	r := rand.New(rand.NewSource(2))
	for round := 0; round < 50; round++ {
		r.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
		var bindings []v1alpha1.SlotBinding
		taken := map[int32]string{}
		for _, p := range pods {
			name := fmt.Sprintf("js-workers-%d-%d", p.job, p.ci)
			pi := PodInfoFromLabels(name, types.UID(name), map[string]string{
				"jobset.sigs.k8s.io/replicatedjob-name":     "workers",
				"jobset.sigs.k8s.io/job-index":              fmt.Sprint(p.job),
				"jobset.sigs.k8s.io/replicatedjob-replicas": fmt.Sprint(replicas),
				"batch.kubernetes.io/job-completion-index":  fmt.Sprint(p.ci),
			}, nil)
			a, nb, err := Assign(plan, bindings, pi, func(v1alpha1.SlotBinding) bool { return true })
			if err != nil {
				t.Fatalf("round %d: %s: %v", round, name, err)
			}
			if a.PodSet != "workers" || a.Index != p.job*parallelism+p.ci {
				t.Fatalf("round %d: %s got %s[%d], want workers[%d]", round, name, a.PodSet, a.Index, p.job*parallelism+p.ci)
			}
			if other, dup := taken[a.Index]; dup {
				t.Fatalf("round %d: %s and %s share workers[%d]", round, other, name, a.Index)
			}
			taken[a.Index] = name
			bindings = nb
		}
	}
	// Pods of the driver Job take the driver's set, by name.
	pi := PodInfoFromLabels("js-driver-0-0", "d", map[string]string{
		"jobset.sigs.k8s.io/replicatedjob-name": "driver", "jobset.sigs.k8s.io/job-index": "0",
		"jobset.sigs.k8s.io/replicatedjob-replicas": "1", "batch.kubernetes.io/job-completion-index": "0"}, nil)
	if a, _, err := Assign(plan, nil, pi, func(v1alpha1.SlotBinding) bool { return true }); err != nil || a.PodSet != "driver" {
		t.Errorf("driver pod: %s[%d], %v", a.PodSet, a.Index, err)
	}
}

// slotIndex never falls back to the bare completion index of a JobSet pod:
// a plan the replicas do not divide, or labels missing, give the first free
// slot instead of one another Job's pod holds.
func TestSlotIndexJobSetFallbacks(t *testing.T) {
	plan := []v1alpha1.PodAssignment{slot("w", 0, "n"), slot("w", 1, "n"), slot("w", 2, "n")}
	sets := map[string]bool{"w": true}
	cases := []struct {
		name string
		pod  PodInfo
		want *int32
	}{
		{"not a JobSet pod", PodInfo{Index: idx(2)}, idx(2)},
		{"replicas do not divide the plan", PodInfo{Index: idx(0), Group: idx(1), Groups: 2}, nil},
		{"no replicas label", PodInfo{Index: idx(0), Group: idx(1)}, nil},
		{"job index beyond replicas", PodInfo{Index: idx(0), Group: idx(3), Groups: 3}, nil},
		{"completion index beyond parallelism", PodInfo{Index: idx(1), Group: idx(0), Groups: 3}, nil},
		{"one pod per Job", PodInfo{Index: idx(0), Group: idx(2), Groups: 3}, idx(2)},
	}
	for _, tc := range cases {
		got := slotIndex(plan, sets, tc.pod)
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("%s: slotIndex = %v, want %v", tc.name, ptrStr(got), ptrStr(tc.want))
		}
	}
}

func ptrStr(p *int32) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

func TestPodInfoFromLabelsJobSetAndLWS(t *testing.T) {
	pi := PodInfoFromLabels("p", "u", map[string]string{
		"jobset.sigs.k8s.io/replicatedjob-name": "workers", "jobset.sigs.k8s.io/job-index": "1",
		"jobset.sigs.k8s.io/replicatedjob-replicas": "2", "batch.kubernetes.io/job-completion-index": "1"}, nil)
	if pi.ReplicaType != "workers" || ptrStr(pi.Group) != "1" || pi.Groups != 2 || ptrStr(pi.Index) != "1" {
		t.Errorf("jobset: %+v", pi)
	}
	pi = PodInfoFromLabels("p", "u", map[string]string{"jobset.sigs.k8s.io/replicatedjob-name": "workers"}, nil)
	if pi.Group == nil || *pi.Group != -1 || pi.Groups != 0 {
		t.Errorf("jobset without job index: %+v", pi)
	}
	lwsPod := func(role, worker string) PodInfo {
		return PodInfoFromLabels("p", "u", map[string]string{"leaderworkerset.sigs.k8s.io/worker-index": worker},
			map[string]string{"kueue.x-k8s.io/role-hash": role})
	}
	for _, tc := range []struct{ role, worker, want string }{
		{"main", "0", "0"}, {"main", "3", "3"}, {"leader", "0", "0"}, {"worker", "1", "0"}, {"worker", "3", "2"}, {"worker", "0", "nil"}, {"main", "x", "nil"},
	} {
		pi := lwsPod(tc.role, tc.worker)
		if pi.ReplicaType != tc.role || ptrStr(pi.Index) != tc.want {
			t.Errorf("lws %s/%s: %+v, want index %s", tc.role, tc.worker, pi, tc.want)
		}
	}
	// Without Kueue's role, the worker index names no pod set's slot.
	if pi := PodInfoFromLabels("p", "u", map[string]string{"leaderworkerset.sigs.k8s.io/worker-index": "1"}, nil); pi.Index != nil {
		t.Errorf("lws without role: %+v", pi)
	}
}

// An LWS group with a leader template is two pod sets (Kueue's "leader",
// one pod, and "worker", workers 1..size-1), whose slots differ in memory.
// Pods arrive in any order: a worker that comes first must not take the
// leader's slot (plan order puts it first), nor the leader a worker's.
func TestAssignLWSWorkerBeforeLeader(t *testing.T) {
	plan := []v1alpha1.PodAssignment{slot("leader", 0, "n1"), slot("worker", 0, "n1"), slot("worker", 1, "n2")}
	lwsPod := func(name, role, worker string) PodInfo {
		return PodInfoFromLabels(name, types.UID(name), map[string]string{"leaderworkerset.sigs.k8s.io/worker-index": worker},
			map[string]string{"kueue.x-k8s.io/role-hash": role})
	}
	all := func(v1alpha1.SlotBinding) bool { return true }
	var bindings []v1alpha1.SlotBinding
	for _, tc := range []struct {
		pod  PodInfo
		want string
	}{
		{lwsPod("g-0-2", "worker", "2"), "worker/1"},
		{lwsPod("g-0-1", "worker", "1"), "worker/0"},
		{lwsPod("g-0", "leader", "0"), "leader/0"},
	} {
		a, nb, err := Assign(plan, bindings, tc.pod, all)
		if err != nil {
			t.Fatalf("%s: %v", tc.pod.Name, err)
		}
		if got := fmt.Sprintf("%s/%d", a.PodSet, a.Index); got != tc.want {
			t.Errorf("%s got %s, want %s", tc.pod.Name, got, tc.want)
		}
		bindings = nb
	}
}

// The MPI operator and KubeRay set no replica-type label: their pods are
// told apart by job role (MPIJob) and node type / group (Ray), so a worker
// never takes the launcher's or the head's slot (plan order puts those
// first), and a Ray worker stays in its own group's pod set.
func TestAssignMPIAndRayPodsOwnPodSets(t *testing.T) {
	mpiPod := func(name, role, index string) PodInfo {
		l := map[string]string{"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/job-role": role}
		if index != "" {
			l["training.kubeflow.org/replica-index"] = index
		}
		return PodInfoFromLabels(name, types.UID(name), l, nil)
	}
	rayPod := func(name, nodeType, group string) PodInfo {
		return PodInfoFromLabels(name, types.UID(name), map[string]string{"ray.io/node-type": nodeType, "ray.io/group": group}, nil)
	}
	all := func(v1alpha1.SlotBinding) bool { return true }
	for _, tc := range []struct {
		name string
		plan []v1alpha1.PodAssignment
		pods []PodInfo
		want []string
	}{
		{"mpijob", []v1alpha1.PodAssignment{slot("launcher", 0, "n1"), slot("worker", 0, "n1"), slot("worker", 1, "n2")},
			[]PodInfo{mpiPod("j-worker-0", "worker", "0"), mpiPod("j-worker-1", "worker", "1"), mpiPod("j-launcher", "launcher", "")},
			[]string{"worker/0", "worker/1", "launcher/0"}},
		{"mpijob, workers first without index", []v1alpha1.PodAssignment{slot("launcher", 0, "n1"), slot("worker", 0, "n1")},
			[]PodInfo{mpiPod("j-worker-x", "worker", ""), mpiPod("j-launcher", "launcher", "")},
			[]string{"worker/0", "launcher/0"}},
		{"ray", []v1alpha1.PodAssignment{slot("head", 0, "n1"), slot("gpu", 0, "n1"), slot("gpu", 1, "n2"), slot("small", 0, "n2")},
			[]PodInfo{rayPod("c-gpu-a", "worker", "gpu"), rayPod("c-small-a", "worker", "small"), rayPod("c-gpu-b", "worker", "gpu"), rayPod("c-head", "head", "headgroup")},
			[]string{"gpu/0", "small/0", "gpu/1", "head/0"}},
		{"ray group named in capitals", []v1alpha1.PodAssignment{slot("head", 0, "n1"), slot("gpu-workers", 0, "n1")},
			[]PodInfo{rayPod("c-w", "worker", "GPU-Workers"), rayPod("c-head", "head", "headgroup")},
			[]string{"gpu-workers/0", "head/0"}},
	} {
		var bindings []v1alpha1.SlotBinding
		for i, p := range tc.pods {
			a, nb, err := Assign(tc.plan, bindings, p, all)
			if err != nil {
				t.Fatalf("%s: %s: %v", tc.name, p.Name, err)
			}
			if got := fmt.Sprintf("%s/%d", a.PodSet, a.Index); got != tc.want[i] {
				t.Errorf("%s: %s got %s, want %s", tc.name, p.Name, got, tc.want[i])
			}
			bindings = nb
		}
	}
	// A pod that only claims an MPI role without the operator's name label
	// is not read as one (the training operator sets job-role "master" on
	// PyTorchJob pods too; those carry replica-type).
	if pi := PodInfoFromLabels("p", "u", map[string]string{"training.kubeflow.org/job-role": "launcher"}, nil); pi.ReplicaType != "" {
		t.Errorf("role without operator label: %+v", pi)
	}
}
