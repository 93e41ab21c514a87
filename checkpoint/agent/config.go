package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Exit codes of gpupack-ckpt. Without a request it exits with the
// command's own status (128+N when it died of signal N), like a shell.
const (
	// ExitPreempted: a checkpoint was requested and a new gang-consistent
	// checkpoint verified; the command and everything it started are gone.
	// Non-zero so a preempted job is never Succeeded; >= 128 so Kubeflow's
	// restartPolicy ExitCode retries it; above 128+64 so it is no signal's
	// status. A batch Job's podFailurePolicy can match it (action Ignore)
	// so a preemption does not count against backoffLimit.
	ExitPreempted = 200
	// ExitPreemptedNoCheckpoint: a checkpoint was requested, none verified
	// in time, and the command exited 0 anyway. (A non-zero status of the
	// command is passed through.)
	ExitPreemptedNoCheckpoint = 201
	// ExitKilled: the trainer did not exit after the checkpoint signal and
	// SIGTERM, and the agent SIGKILLed it before the grace period ended.
	ExitKilled = 124
	// ExitAgentError: bad flags, or the agent could not start the trainer.
	ExitAgentError = 125
	// ExitNotExecutable: the command exists but cannot be executed.
	ExitNotExecutable = 126
	// ExitNotFound: the command was not found.
	ExitNotFound = 127
)

// Defaults. The webhook passes explicit values derived from the job's
// gpupack.io/checkpoint-* annotations and the pod's grace period.
const (
	DefaultCheckpointSignal  = syscall.SIGUSR1
	DefaultCheckpointTimeout = 20 * time.Second
	DefaultGrace             = 30 * time.Second // Kubernetes' default terminationGracePeriodSeconds
	DefaultKillMargin        = 2 * time.Second
	DefaultPolicyKillMargin  = 5 * time.Second
	DefaultExitWait          = 5 * time.Second
	DefaultMaxClockSkew      = 2 * time.Second
	DefaultPoll              = 250 * time.Millisecond
	DefaultUploadTimeout     = 10 * time.Minute
	DefaultAnnotationsFile   = "/etc/gpupack/podinfo/annotations"
	DefaultTerminationLog    = "/dev/termination-log"
	// EnvPodName and EnvPodNamespace are set from the downward API
	// (metadata.name, metadata.namespace) so the agent can annotate its pod.
	EnvPodName      = "POD_NAME"
	EnvPodNamespace = "POD_NAMESPACE"
)

// Config is one run of the agent.
type Config struct {
	// Command and its arguments (after "--").
	Command []string
	// CheckpointSignal is sent to the trainer's process group on a request.
	CheckpointSignal syscall.Signal
	// CheckpointTimeout bounds the wait for a new verified checkpoint.
	CheckpointTimeout time.Duration
	// CheckpointDir is where the trainer saves (manifest format). Empty:
	// the agent cannot see checkpoints and only escalates on time.
	CheckpointDir string
	// LocalCheckpointDir (tiered checkpoints): the fast node-local
	// directory the trainer saves to first. A step counts as saved once
	// this pod's ranks of it verify there; the agent uploads every
	// verified local rank checkpoint to CheckpointDir in the background,
	// at a request within the grace period, and at start (before the
	// command) whatever an earlier run on this node left un-uploaded. Only
	// uploaded steps are reported: a restart reads CheckpointDir.
	LocalCheckpointDir string
	// UploadTimeout bounds the upload at start and, without a request, at
	// the command's exit (with a request the kill deadline bounds it).
	UploadTimeout time.Duration
	// Grace is the pod's termination grace period, counted from the request.
	Grace time.Duration
	// KillMargin: the agent SIGKILLs the trainer this long before Grace
	// ends, so it can still write its report before the kubelet kills it.
	KillMargin time.Duration
	// PolicyKillMargin: with a cluster-policy deadline
	// (gpupack.io/checkpoint-deadline) the SIGKILL comes at the earlier of
	// T0 + Grace − KillMargin and that deadline + PolicyKillMargin, so a
	// trainer that ignores SIGTERM cannot hold the node past the policy.
	PolicyKillMargin time.Duration
	// MaxClockSkew: how far past a cluster-policy deadline, read on this
	// node's clock, the agent may wait. The coordinator's deadline and
	// request time come from its own clock, so the wait is their
	// difference counted from when this agent saw the request, and no
	// longer than the deadline + MaxClockSkew by the node's clock
	// (ClockSkewBound).
	MaxClockSkew time.Duration
	// ExitWait: after a checkpoint is verified, how long the trainer may
	// take to exit on its own before it gets SIGTERM.
	ExitWait time.Duration
	// AnnotationsFile is the downward-API file of the pod's annotations;
	// gpupack.io/checkpoint-request appearing there is a request. Empty or
	// absent: only SIGTERM requests.
	AnnotationsFile string
	// TerminationLog receives the report (JSON) when the agent exits.
	TerminationLog string
	// Poll is how often files are looked at.
	Poll time.Duration
	// Reporter publishes the verified step (pod annotation); may be nil.
	Reporter StepReporter
	// Log receives one line per decision.
	Log io.Writer
	// ProcDir is where processes are listed; empty: /proc.
	ProcDir string
	// Init: the agent is the container's init (gpupack-ckpt sets it): it
	// becomes a child subreaper unless it is PID 1, reaps every child,
	// signals every process below it and exits only when all are gone.
	// Without it (Run called inside a bigger program, as tests do) it
	// waits for and signals only the command and its descendants.
	Init bool
}

// ParseArgs reads "gpupack-ckpt [flags] -- CMD ARGS…".
func ParseArgs(args []string, stderr io.Writer) (Config, error) {
	cfg := Config{Log: stderr, Init: true}
	fs := flag.NewFlagSet("gpupack-ckpt", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: gpupack-ckpt [flags] -- CMD [ARGS...]\n\n"+
			"Runs CMD as the container's init. On SIGTERM or when the pod annotation\n"+
			"gpupack.io/checkpoint-request appears, sends the checkpoint signal to every\n"+
			"process that handles it, waits for a new checkpoint every rank's manifest\n"+
			"verifies, then SIGTERM, then SIGKILL to all before the grace period ends,\n"+
			"and exits when all are gone. Exit status: CMD's without a request, else\n"+
			"%d preempted after a checkpoint, %d preempted without one (CMD exited 0),\n"+
			"%d killed after timeout; %d agent error, %d not executable, %d not found.\n\nflags:\n",
			ExitPreempted, ExitPreemptedNoCheckpoint, ExitKilled, ExitAgentError, ExitNotExecutable, ExitNotFound)
		fs.PrintDefaults()
	}
	sig := fs.String("checkpoint-signal", SignalName(DefaultCheckpointSignal), "signal asking the trainer to checkpoint (name or number)")
	fs.DurationVar(&cfg.CheckpointTimeout, "checkpoint-timeout", DefaultCheckpointTimeout, "how long to wait for a new verified checkpoint (a request's own deadline can only shorten it)")
	fs.StringVar(&cfg.CheckpointDir, "checkpoint-dir", "", "directory the trainer saves checkpoints in (gpupack manifest format)")
	fs.StringVar(&cfg.LocalCheckpointDir, "local-checkpoint-dir", "", "tiered checkpoints: the node-local directory the trainer saves to first; the agent uploads to --checkpoint-dir")
	fs.DurationVar(&cfg.UploadTimeout, "upload-timeout", DefaultUploadTimeout, "tiered: bound of the upload at start and at an exit without a request")
	fs.DurationVar(&cfg.Grace, "grace", DefaultGrace, "the pod's termination grace period")
	fs.DurationVar(&cfg.KillMargin, "kill-margin", DefaultKillMargin, "SIGKILL the trainer this long before the grace period ends")
	fs.DurationVar(&cfg.PolicyKillMargin, "policy-kill-margin", DefaultPolicyKillMargin, "SIGKILL this long after a cluster-policy checkpoint deadline (gpupack.io/checkpoint-deadline) when that is before the grace period's kill")
	fs.DurationVar(&cfg.MaxClockSkew, "max-clock-skew", DefaultMaxClockSkew, "a cluster-policy deadline bounds the wait by its duration (deadline - request time, both the coordinator's clock) from when the request was seen, and by the deadline + this on the node's clock")
	fs.DurationVar(&cfg.ExitWait, "exit-wait", DefaultExitWait, "after a verified checkpoint, time the trainer has to exit before SIGTERM")
	fs.StringVar(&cfg.AnnotationsFile, "annotations-file", DefaultAnnotationsFile, "downward-API file of the pod's annotations (empty: none)")
	fs.StringVar(&cfg.TerminationLog, "termination-log", DefaultTerminationLog, "file the final report is written to (empty: none)")
	fs.DurationVar(&cfg.Poll, "poll", DefaultPoll, "how often the annotations file and the checkpoint directory are read")
	report := fs.Bool("report-annotation", true, "annotate the pod with "+"gpupack.io/checkpoint-step when running in a cluster ("+EnvPodName+"/"+EnvPodNamespace+" set)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	cfg.Command = fs.Args()
	if len(cfg.Command) == 0 {
		return Config{}, errors.New("no command given (usage: gpupack-ckpt [flags] -- CMD [ARGS...])")
	}
	s, err := ParseSignal(*sig)
	if err != nil {
		return Config{}, fmt.Errorf("--checkpoint-signal: %w", err)
	}
	cfg.CheckpointSignal = s
	if err := cfg.validate(); err != nil {
		return Config{}, err
	}
	if *report {
		r, err := InClusterReporter()
		switch {
		case err == nil:
			cfg.Reporter = r
		case !errors.Is(err, ErrNotInCluster):
			return Config{}, err
		}
	}
	return cfg, nil
}

func (c *Config) validate() error {
	switch {
	case c.CheckpointSignal == syscall.SIGTERM || c.CheckpointSignal == syscall.SIGINT:
		// Sent to every process with a handler: torchrun forwards it to
		// its workers as a stop, DataLoader workers die of it, and the
		// save never happens.
		return fmt.Errorf("--checkpoint-signal %s is refused: SIGTERM and SIGINT stop torchrun and DataLoader workers, so no checkpoint gets written; use SIGUSR1 (the default) or SIGUSR2", SignalName(c.CheckpointSignal))
	case c.CheckpointTimeout <= 0:
		return fmt.Errorf("--checkpoint-timeout %v must be > 0", c.CheckpointTimeout)
	case c.Grace <= 0:
		return fmt.Errorf("--grace %v must be > 0", c.Grace)
	case c.PolicyKillMargin < 0:
		return fmt.Errorf("--policy-kill-margin %v must not be negative", c.PolicyKillMargin)
	case c.KillMargin < 0 || c.KillMargin >= c.Grace:
		return fmt.Errorf("--kill-margin %v must be in [0, --grace %v)", c.KillMargin, c.Grace)
	case c.MaxClockSkew < 0:
		return fmt.Errorf("--max-clock-skew %v must not be negative", c.MaxClockSkew)
	case c.ExitWait < 0:
		return fmt.Errorf("--exit-wait %v must be >= 0", c.ExitWait)
	case c.Poll <= 0:
		return fmt.Errorf("--poll %v must be > 0", c.Poll)
	case c.LocalCheckpointDir != "" && c.CheckpointDir == "":
		return errors.New("--local-checkpoint-dir needs --checkpoint-dir (where the checkpoints are uploaded to)")
	case c.LocalCheckpointDir != "" && filepath.Clean(c.LocalCheckpointDir) == filepath.Clean(c.CheckpointDir):
		return errors.New("--local-checkpoint-dir and --checkpoint-dir must differ")
	case c.LocalCheckpointDir != "" && c.UploadTimeout <= 0:
		return fmt.Errorf("--upload-timeout %v must be > 0", c.UploadTimeout)
	}
	// A timeout longer than the grace period cannot be honoured; the kill
	// deadline wins and the run loop says so.
	return nil
}

var signalNames = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM,
	"ALRM": syscall.SIGALRM, "CONT": syscall.SIGCONT, "WINCH": syscall.SIGWINCH,
	"PWR": syscall.SIGPWR, "XCPU": syscall.SIGXCPU, "URG": syscall.SIGURG,
}

// ParseSignal accepts "SIGUSR1", "USR1" or "10". SIGKILL and SIGSTOP are
// refused: a trainer cannot checkpoint on them.
func ParseSignal(s string) (syscall.Signal, error) {
	name := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "SIG")
	if sig, ok := signalNames[name]; ok {
		return sig, nil
	}
	if n, err := strconv.Atoi(name); err == nil && n > 0 && n < 65 {
		sig := syscall.Signal(n)
		if sig == syscall.SIGKILL || sig == syscall.SIGSTOP {
			return 0, fmt.Errorf("signal %q cannot be caught by a trainer", s)
		}
		return sig, nil
	}
	return 0, fmt.Errorf("unknown signal %q (want e.g. SIGUSR1, USR2, 10)", s)
}

// SignalName is the SIG… name of a signal (or its number).
func SignalName(s syscall.Signal) string {
	for n, v := range signalNames {
		if v == s {
			return "SIG" + n
		}
	}
	switch s {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGSTOP:
		return "SIGSTOP"
	}
	return strconv.Itoa(int(s))
}

// Main runs gpupack-ckpt with args (without the program name) and returns
// its exit status. cmd/gpupack-ckpt calls it.
func Main(args []string) int {
	cfg, err := ParseArgs(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpupack-ckpt: %v\n", err)
		return ExitAgentError
	}
	return Run(cfg)
}
