package preemption

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/preemption/ladder"
)

func bigState(ranks int) ladder.State {
	st := ladder.State{Phase: ladder.PhaseTerminating, Reason: ReasonKueuePreempted,
		Transitions:        []ladder.Transition{{Phase: ladder.PhaseCheckpointing, At: t0}, {Phase: ladder.PhaseTerminating, At: t0.Add(time.Minute)}},
		CheckpointDeadline: ptr.To(t0.Add(5 * time.Minute)), KillDeadline: ptr.To(t0.Add(6 * time.Minute)),
		Ranks: map[string][]int64{}, Outcomes: map[string]string{}, LastConsistentStep: ptr.To(int64(123000))}
	for i := range ranks {
		uid := fmt.Sprintf("%08x-1234-4567-89ab-%012x", i, i) // a UID's length
		st.Ranks[uid] = []int64{124000, 123000, 122000, 121000, 120000, 119000, 118000, 117000}
		st.Outcomes[uid] = ladder.OutcomeSaved
	}
	return st
}

// A 4,096-rank record is written and read back whole, the Workload
// annotation stays small, and the ConfigMap fits its 1 MiB with room; the
// old in-annotation record of the same gang is over the 256 KiB limit.
func TestRankRecord4096(t *testing.T) {
	st := bigState(4096)
	wl := workload(preempted())
	wl.UID = "wl-uid"
	h := newHarness(t, job(), wl)
	r := &Reconciler{client: h.c}
	if err := r.saveState(context.Background(), wl, &st); err != nil {
		t.Fatal(err)
	}
	var got kueue.Workload
	if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: wl.Name}, &got); err != nil {
		t.Fatal(err)
	}
	ann := got.Annotations[v1alpha1.AnnotationPreemptionPhase]
	if len(ann) > 2048 {
		t.Errorf("workload annotation %d bytes for 4,096 ranks, want it independent of the gang size", len(ann))
	}
	back, err := PreemptionRecord(context.Background(), h.c, &got)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(st, back); diff != "" {
		t.Fatalf("record read back (-want +got):\n%s", diff)
	}
	var cm corev1.ConfigMap
	if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: RankRecordName(wl.Name)}, &cm); err != nil {
		t.Fatal(err)
	}
	size := 0
	for k, v := range cm.Data {
		size += len(k) + len(v)
	}
	old, _ := json.Marshal(st)
	t.Logf("4,096 ranks: annotation %d B, ConfigMap data %d B; the old inline record %d B", len(ann), size, len(old))
	if size > 512<<10 {
		t.Errorf("ConfigMap data %d B for 4,096 ranks: too close to the 1 MiB limit", size)
	}
	if len(old) < 256<<10 {
		t.Logf("note: the inline record would have fit (%d B)", len(old))
	}
	// Reset removes both parts.
	if err := r.saveState(context.Background(), &got, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: RankRecordName(wl.Name)}, &cm); err == nil {
		t.Error("per-rank ConfigMap kept after reset")
	}
}

// A ConfigMap of that name that the Workload does not own is neither read
// nor overwritten.
func TestRankRecordRefusesForeignConfigMap(t *testing.T) {
	wl := workload(preempted())
	wl.UID = "wl-uid"
	foreign := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: RankRecordName(wl.Name)}, Data: map[string]string{"x": "Saved;1"}}
	h := newHarness(t, job(), wl, foreign)
	st := bigState(2)
	if err := (rankStore{reader: h.c, client: h.c}).save(context.Background(), wl, &st); err == nil {
		t.Error("overwrote a ConfigMap the workload does not own")
	}
	var got ladder.State
	if err := (rankStore{reader: h.c, client: h.c}).load(context.Background(), wl, &got); err == nil || got.Ranks != nil {
		t.Errorf("read a foreign ConfigMap: %v %+v", err, got)
	}
}

func TestDecodeRanksRejectsGarbage(t *testing.T) {
	for _, v := range []string{"Saved", "Sleeping;1", "Saved;1,x", "Saved;-1", "Saved;1,,2"} {
		var st ladder.State
		if err := decodeRanks(map[string]string{"u": v}, &st); err == nil {
			t.Errorf("decodeRanks(%q) accepted: %+v", v, st)
		}
	}
	var st ladder.State
	if err := decodeRanks(map[string]string{"a": "Saved;3,2", "b": ";", "c": "TimedOut;"}, &st); err != nil {
		t.Fatal(err)
	}
	want := ladder.State{Ranks: map[string][]int64{"a": {3, 2}, "b": {}, "c": {}}, Outcomes: map[string]string{"a": "Saved", "c": "TimedOut"}}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func FuzzDecodeRanks(f *testing.F) {
	for _, s := range []string{"Saved;1200,1000", ";", "Killed;", "TimedOut;7", "Saved", ";1,x", "Saved;-3"} {
		f.Add("uid", s)
	}
	f.Fuzz(func(t *testing.T, key, value string) {
		var st ladder.State
		if err := decodeRanks(map[string]string{key: value}, &st); err != nil {
			return
		}
		// What decodes re-encodes to something that decodes the same.
		var again ladder.State
		if err := decodeRanks(encodeRanks(st), &again); err != nil {
			t.Fatalf("%q: re-encoded record does not decode: %v", value, err)
		}
		if diff := cmp.Diff(st, again); diff != "" {
			t.Fatalf("%q: round trip (-first +second):\n%s", value, diff)
		}
	})
}

// BenchmarkRankRecord4096: encoding and decoding the per-rank record of a
// 4,096-rank gang (what each reconcile that changes it pays on top of the
// API round trip).
func BenchmarkRankRecord4096(b *testing.B) {
	st := bigState(4096)
	for b.Loop() {
		var back ladder.State
		if err := decodeRanks(encodeRanks(st), &back); err != nil {
			b.Fatal(err)
		}
	}
}
