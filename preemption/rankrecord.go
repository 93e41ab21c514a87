package preemption

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/gpupack/gpupack/preemption/ladder"
)

// The per-rank record (each rank's verified steps and outcome) lives in a
// ConfigMap next to the Workload, owned by it, one key per rank:
//
//	data:
//	  <pod UID>: "<outcome>;<step>,<step>,…"   e.g. "Saved;1200,1000" or ";1000"
//
// so the Workload annotation gpupack.io/preemption stays small (phase,
// deadlines, the consistent step) at any gang size: 4,096 ranks take
// ~300 KiB of the ConfigMap's 1 MiB, where the old in-annotation record
// passed the 256 KiB annotation limit around 1,800 ranks. The ConfigMap is
// written before the annotation, read live (the manager caches no
// ConfigMaps) and deleted with the record.
const (
	rankRecordSuffix = "-gpupack-preemption"
	// LabelRankRecordOf marks the ConfigMap with its Workload's name.
	LabelRankRecordOf = "gpupack.io/preemption-of"
)

// RankRecordName is the ConfigMap holding a workload's per-rank record.
func RankRecordName(workload string) string {
	name := workload + rankRecordSuffix
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(workload))
	return workload[:253-len(rankRecordSuffix)-9] + "-" + hex.EncodeToString(sum[:4]) + rankRecordSuffix
}

// encodeRanks is the ConfigMap data for a state's ranks and outcomes.
func encodeRanks(st ladder.State) map[string]string {
	out := make(map[string]string, len(st.Ranks))
	for uid, steps := range st.Ranks {
		var b strings.Builder
		b.WriteString(st.Outcomes[uid])
		b.WriteByte(';')
		for i, s := range steps {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(s, 10))
		}
		out[uid] = b.String()
	}
	for uid, o := range st.Outcomes { // an outcome for a rank without steps
		if _, ok := out[uid]; !ok {
			out[uid] = o + ";"
		}
	}
	return out
}

// decodeRanks fills st.Ranks and st.Outcomes from ConfigMap data. A value
// it cannot read is an error naming the key; nothing is half-applied.
func decodeRanks(data map[string]string, st *ladder.State) error {
	ranks := make(map[string][]int64, len(data))
	outcomes := map[string]string{}
	for _, uid := range slices.Sorted(maps.Keys(data)) {
		v := data[uid]
		outcome, list, ok := strings.Cut(v, ";")
		if !ok {
			return fmt.Errorf("rank %s: %q is not <outcome>;<steps>", uid, v)
		}
		switch outcome {
		case "", ladder.OutcomeSaved, ladder.OutcomeTimedOut, ladder.OutcomeKilled:
		default:
			return fmt.Errorf("rank %s: unknown outcome %q", uid, outcome)
		}
		steps := []int64{}
		if list != "" {
			for _, f := range strings.Split(list, ",") {
				n, err := strconv.ParseInt(f, 10, 64)
				if err != nil || n < 0 {
					return fmt.Errorf("rank %s: step %q is not a non-negative integer", uid, f)
				}
				steps = append(steps, n)
			}
		}
		ranks[uid] = steps
		if outcome != "" {
			outcomes[uid] = outcome
		}
	}
	st.Ranks = ranks
	st.Outcomes = outcomes
	if len(outcomes) == 0 {
		st.Outcomes = nil
	}
	if len(ranks) == 0 {
		st.Ranks = nil
	}
	return nil
}

// rankStore reads and writes the per-rank record.
type rankStore struct {
	reader client.Reader // live: the manager caches no ConfigMaps
	client client.Client
}

func (s rankStore) load(ctx context.Context, wl *kueue.Workload, st *ladder.State) error {
	var cm corev1.ConfigMap
	err := s.reader.Get(ctx, types.NamespacedName{Namespace: wl.Namespace, Name: RankRecordName(wl.Name)}, &cm)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !ownedBy(&cm, wl) {
		return fmt.Errorf("configmap %s is not owned by workload %s (uid %s): not reading it", cm.Name, wl.Name, wl.UID)
	}
	return decodeRanks(cm.Data, st)
}

// save writes the record (nil state or no ranks: deletes it).
func (s rankStore) save(ctx context.Context, wl *kueue.Workload, st *ladder.State) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: wl.Namespace, Name: RankRecordName(wl.Name)}}
	if st == nil || (len(st.Ranks) == 0 && len(st.Outcomes) == 0) {
		var cur corev1.ConfigMap
		if err := s.reader.Get(ctx, client.ObjectKeyFromObject(cm), &cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !ownedBy(&cur, wl) {
			return nil // not ours to delete
		}
		return client.IgnoreNotFound(s.client.Delete(ctx, cm, client.Preconditions{UID: ptr.To(cur.UID)}))
	}
	data := encodeRanks(*st)
	var cur corev1.ConfigMap
	err := s.reader.Get(ctx, client.ObjectKeyFromObject(cm), &cur)
	switch {
	case apierrors.IsNotFound(err):
		cm.Labels = map[string]string{LabelRankRecordOf: labelValue(wl.Name)}
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: kueue.GroupVersion.String(), Kind: "Workload", Name: wl.Name, UID: wl.UID,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false)}}
		cm.Data = data
		return s.client.Create(ctx, cm, client.FieldOwner(ControllerName))
	case err != nil:
		return err
	case !ownedBy(&cur, wl):
		return fmt.Errorf("configmap %s exists and is not owned by workload %s: not overwriting it", cur.Name, wl.Name)
	case maps.Equal(cur.Data, data):
		return nil
	}
	cur.Data = data
	return s.client.Update(ctx, &cur, client.FieldOwner(ControllerName)) // optimistic: resourceVersion
}

func ownedBy(cm *corev1.ConfigMap, wl *kueue.Workload) bool {
	for _, o := range cm.OwnerReferences {
		if o.UID == wl.UID && o.Kind == "Workload" {
			return true
		}
	}
	return false
}

func labelValue(s string) string {
	if len(s) <= 63 {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return s[:54] + "-" + hex.EncodeToString(sum[:4])
}

// DecodeRankRecord fills st.Ranks and st.Outcomes from the data of a
// per-rank ConfigMap (for tests and tools that watch it).
func DecodeRankRecord(data map[string]string, st *ladder.State) error {
	return decodeRanks(data, st)
}
