// Package ladder is the preemption coordinator's escalation state machine,
// as pure functions: given the durable state of one victim workload and what
// is observed now (its pods, their reported checkpoint steps, the time), it
// returns the next state and the actions to take. Reconcilers translate API
// objects into these types and the actions back into API calls.
//
//	(none) --evicted--> Checkpointing --all ranks saved | timeout--> Terminating
//	Terminating --grace + slack passed, pods left--> Killing
//	Terminating | Killing --no pod left--> Done
//
// Checkpointing is skipped for workloads that did not opt in.
package ladder

import (
	"time"
)

// Phase of a preemption.
type Phase string

// Phases, in order.
const (
	PhaseNone          Phase = ""
	PhaseCheckpointing Phase = "Checkpointing"
	PhaseTerminating   Phase = "Terminating"
	PhaseKilling       Phase = "Killing"
	PhaseDone          Phase = "Done"
)

// Transition is one phase change.
type Transition struct {
	Phase Phase     `json:"phase"`
	At    time.Time `json:"at"`
}

// State is the durable record of one preemption (JSON in the Workload
// annotation gpupack.io/preemption): enough for a restarted manager to
// resume exactly where it was.
type State struct {
	Phase Phase `json:"phase"`
	// Reason says what evicted the workload (Evicted, Preempted,
	// DisruptionTarget, Eviction…).
	Reason string `json:"reason,omitempty"`
	// Transitions, oldest first; the first is the eviction.
	Transitions []Transition `json:"transitions,omitempty"`
	// CheckpointDeadline ends Checkpointing; KillDeadline ends Terminating.
	CheckpointDeadline *time.Time `json:"checkpointDeadline,omitempty"`
	KillDeadline       *time.Time `json:"killDeadline,omitempty"`
	// GraceDeadline is when the victim's pods must be gone by the cluster
	// policy: the eviction + the policy's grace (checkpoint timeout +
	// margin; for an opted-in victim the checkpoint deadline + margin).
	// Graceful deletes never ask for a grace ending later, whatever the
	// pods' own terminationGracePeriodSeconds. Absent in records of older
	// managers (then the pods' own grace counts, as before).
	GraceDeadline *time.Time `json:"graceDeadline,omitempty"`
	// Ranks are the opted-in pods present at the eviction, by pod UID,
	// with the verified steps each reported (newest first, capped). They
	// outlive the pods, so the consistent step can be computed after they
	// are gone.
	Ranks map[string][]int64 `json:"ranks,omitempty"`
	// Outcomes per rank (pod UID): Saved, TimedOut or Killed (set on
	// leaving a phase).
	Outcomes map[string]string `json:"outcomes,omitempty"`
	// LastConsistentStep is the newest step every rank completed, once known.
	LastConsistentStep *int64 `json:"lastConsistentStep,omitempty"`
	// WorkloadEvicted: this preemption asked Kueue to evict the Workload
	// (a pod-level trigger). Stored before the request is made, so it is
	// made once: a reconcile working from a stale view of the old trigger
	// must not evict the workload's next admission.
	WorkloadEvicted bool `json:"workloadEvicted,omitempty"`
}

// Since returns when phase p was entered, if it was.
func (s State) Since(p Phase) (time.Time, bool) {
	for i := len(s.Transitions) - 1; i >= 0; i-- {
		if s.Transitions[i].Phase == p {
			return s.Transitions[i].At, true
		}
	}
	return time.Time{}, false
}

// Pod is what the coordinator observes of one pod of the victim.
type Pod struct {
	Name string
	// UID identifies the pod: a pod recreated under the same name by the
	// job controller is another pod, never a rank of this preemption.
	// Empty only in tests, where Name stands in.
	UID string
	// OptedIn: the pod runs gpupack-ckpt (gpupack.io/checkpoint: "true").
	OptedIn bool
	// Terminating: the pod has a deletionTimestamp.
	Terminating bool
	// Finished: the pod is Succeeded or Failed (it holds no GPU).
	Finished bool
	// CheckpointRequested: gpupack.io/checkpoint-request is set.
	CheckpointRequested bool
	// Steps are the verified checkpoint steps this pod reported for this
	// request (annotation gpupack.io/checkpoint-step and the agent's
	// termination message), newest first. Reported is true once the agent
	// answered the request with a new checkpoint.
	Steps    []int64
	Reported bool
	// Grace is the pod's termination grace period.
	Grace time.Duration
	// DeletedAt and DeletionGrace describe a terminating pod's deletion:
	// when it was asked (deletionTimestamp − deletionGracePeriodSeconds)
	// and the grace it was given. A later delete may only shorten that
	// grace, and the API server counts the shorter one from DeletedAt.
	DeletedAt     time.Time
	DeletionGrace time.Duration
	// Created is the pod's creation time (zero: unknown, taken as before
	// the eviction). A pod created after the eviction began is the job
	// controller's replacement: the preemption neither waits for it nor
	// deletes it.
	Created time.Time
}

// Observation is the world as the reconciler reads it now.
type Observation struct {
	Now time.Time
	// Evicted is true while the workload is evicted or preempted (or a pod
	// of it is being disrupted); Reason says by what.
	Evicted bool
	Reason  string
	// PodLevel: the eviction is seen only on pods (a drain, a
	// DisruptionTarget, a pod deletion, a NotReady node) while Kueue still
	// has the workload admitted. The decision then asks for the Workload's
	// eviction through Kueue, so the job controller stops the job instead
	// of recreating the pods into a fight.
	PodLevel bool
	// CheckpointTimeout is the job's gpupack.io/checkpoint-timeout (zero:
	// Config.DefaultCheckpointTimeout).
	CheckpointTimeout time.Duration
	// Grace is the policy's bound on how long the victim's pods may hold
	// their GPUs after the eviction (policy.Decision.Grace: the effective
	// timeout + margin); it fixes State.GraceDeadline. Zero: no bound but
	// the pods' own grace. Read when the preemption starts.
	Grace time.Duration
	// Pods that still exist.
	Pods []Pod
}

// Config holds the coordinator-wide knobs.
type Config struct {
	DefaultCheckpointTimeout time.Duration
	// DefaultGrace is used for pods without a grace period.
	DefaultGrace time.Duration
	// Slack is added to the grace period before pods are force-deleted
	// (a kubelet that stopped answering never confirms a graceful delete).
	Slack time.Duration
	// MaxStepsPerRank caps State.Ranks entries.
	MaxStepsPerRank int
}

// ActionKind is what to do to one pod.
type ActionKind string

// Actions.
const (
	// RequestCheckpoint: set gpupack.io/checkpoint-request on the pod.
	RequestCheckpoint ActionKind = "RequestCheckpoint"
	// Delete: graceful delete (SIGTERM, the pod's grace period).
	Delete ActionKind = "Delete"
	// ForceDelete: delete with grace period 0 (SIGKILL; the object goes).
	ForceDelete ActionKind = "ForceDelete"
)

// Action on one pod.
type Action struct {
	Kind ActionKind
	Pod  string
	// UID is the pod's UID (a precondition of the write: a recreated pod
	// of the same name is never touched).
	UID string
	// Grace, for Delete, is the grace period to ask for (0: the pod's
	// own). After a checkpoint request the pod's grace is already running
	// in its agent, so the delete asks only for what is left of it, and
	// never past State.GraceDeadline. For a pod already terminating with
	// a longer grace it is the shorter grace counted from that deletion
	// (the API server's rule), ending at the bound.
	Grace time.Duration
}

// Outcome of one rank's checkpoint.
const (
	OutcomeSaved    = "Saved"
	OutcomeTimedOut = "TimedOut"
	OutcomeKilled   = "Killed"
)

// Decision is the result of one Step.
type Decision struct {
	State State
	// Entered lists the phases entered by this step, in order (for Events
	// and metrics).
	Entered []Phase
	Actions []Action
	// RequeueAfter is when the next deadline falls (0: none pending).
	RequeueAfter time.Duration
	// Reset: the workload is no longer evicted and the preemption is over;
	// drop the record. Never in the step that entered Done, so the
	// results of every preemption are written first.
	Reset bool
	// EvictWorkload: a pod-level trigger (drain, DisruptionTarget, pod
	// deletion, node NotReady) while Kueue still has the workload
	// admitted: evict the whole Workload through Kueue.
	EvictWorkload bool
}
