package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// StepReporter publishes the verified checkpoint step of this pod.
type StepReporter interface {
	ReportStep(ctx context.Context, step int64) error
}

// ErrNotInCluster: the downward-API or service-account environment is
// missing, so there is no pod to annotate.
var ErrNotInCluster = errors.New("not running in a cluster pod")

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// PodAnnotator patches the gpupack.io/checkpoint-step annotation of one pod
// through the API server (a JSON merge patch; only the standard library, so
// gpupack-ckpt stays a small static binary). The pod's service account needs
// "patch" on pods; without it the report still reaches the coordinator
// through the termination message.
type PodAnnotator struct {
	// BaseURL is the API server, e.g. https://10.0.0.1:443.
	BaseURL   string
	Namespace string
	Name      string
	// Token is the bearer token; re-read from TokenFile when set (projected
	// tokens rotate).
	Token     string
	TokenFile string
	Client    *http.Client
}

// InClusterReporter builds a PodAnnotator from the pod's environment:
// POD_NAME / POD_NAMESPACE (downward API), KUBERNETES_SERVICE_HOST/PORT and
// the mounted service-account token and CA.
func InClusterReporter() (*PodAnnotator, error) {
	name, ns := os.Getenv(EnvPodName), os.Getenv(EnvPodNamespace)
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if name == "" || ns == "" || host == "" || port == "" {
		return nil, ErrNotInCluster
	}
	if _, err := os.Stat(saDir + "/token"); err != nil {
		return nil, ErrNotInCluster
	}
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return nil, fmt.Errorf("in-cluster reporter: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("in-cluster reporter: %s/ca.crt holds no certificate", saDir)
	}
	return &PodAnnotator{
		BaseURL:   "https://" + net.JoinHostPort(host, port),
		Namespace: ns,
		Name:      name,
		TokenFile: saDir + "/token",
		Client: &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		},
	}, nil
}

// ReportStep sets gpupack.io/checkpoint-step on the pod.
func (p *PodAnnotator) ReportStep(ctx context.Context, step int64) error {
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{v1alpha1.AnnotationCheckpointStep: strconv.FormatInt(step, 10)},
	}})
	u := strings.TrimRight(p.BaseURL, "/") + "/api/v1/namespaces/" + url.PathEscape(p.Namespace) + "/pods/" + url.PathEscape(p.Name)
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	req.Header.Set("Accept", "application/json")
	tok := p.Token
	if p.TokenFile != "" {
		b, err := os.ReadFile(p.TokenFile)
		if err != nil {
			return fmt.Errorf("patch pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	c := p.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("patch pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("patch pod %s/%s: %s: %s", p.Namespace, p.Name, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// ParseAnnotations reads a downward-API annotations file: one `key="value"`
// per line, the value Go-quoted (that is how the kubelet writes it).
func ParseAnnotations(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("annotations line %d: %q is not key=\"value\"", n, line)
		}
		uv, err := strconv.Unquote(v)
		if err != nil {
			return nil, fmt.Errorf("annotations line %d: value of %q is not a quoted string", n, k)
		}
		out[k] = uv
	}
	return out, sc.Err()
}

// Report is the JSON the agent writes to the termination message. The
// coordinator reads it when the annotation could not be written.
type Report struct {
	// CheckpointStep is the step of the new verified checkpoint saved after
	// the request; absent when there was none.
	CheckpointStep *int64 `json:"checkpointStep,omitempty"`
	// LocalStep (tiered checkpoints) is the step this pod's ranks saved to
	// the node-local directory after the request; CheckpointStep is set
	// only once it was uploaded to the shared directory.
	LocalStep *int64 `json:"localStep,omitempty"`
	// UploadPending (tiered): LocalStep did not reach the shared directory
	// before the agent had to exit; the next start on this node uploads it.
	UploadPending bool `json:"uploadPending,omitempty"`
	// VerifiedSteps are the gang-consistent steps (every rank's manifest
	// verified) among the newest steps of the checkpoint directory when the
	// agent exited, newest first (at most 4).
	VerifiedSteps []int64 `json:"verifiedSteps,omitempty"`
	// WorldSize is the number of ranks of those steps.
	WorldSize int `json:"worldSize,omitempty"`
	// RankSteps are, per rank (decimal), the steps whose manifest for that
	// rank verified, newest first: which rank is missing from a torn step.
	RankSteps map[string][]int64 `json:"rankSteps,omitempty"`
	// RankStepsTruncated: RankSteps was left out to fit the 4096-byte
	// termination message.
	RankStepsTruncated bool `json:"rankStepsTruncated,omitempty"`
	// Outcome is one of the Outcome… constants.
	Outcome  string `json:"outcome"`
	ExitCode int    `json:"exitCode"`
	// CommandStatus is how the command itself ended (128+N: signal N);
	// ExitCode is the agent's verdict.
	CommandStatus *int `json:"commandStatus,omitempty"`
}

// Outcomes of a run.
const (
	OutcomeExited   = "Exited"   // the trainer exited without a request
	OutcomeSaved    = "Saved"    // a request was answered with a new verified checkpoint
	OutcomeTimedOut = "TimedOut" // a request got no new checkpoint in time; the trainer exited after SIGTERM
	OutcomeKilled   = "Killed"   // the trainer had to be SIGKILLed
)

// ParseReport reads a termination message written by the agent.
func ParseReport(s string) (Report, error) {
	var r Report
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(&r); err != nil {
		return Report{}, fmt.Errorf("gpupack-ckpt report: %w", err)
	}
	switch r.Outcome {
	case OutcomeExited, OutcomeSaved, OutcomeTimedOut, OutcomeKilled:
	default:
		return Report{}, fmt.Errorf("gpupack-ckpt report: unknown outcome %q", r.Outcome)
	}
	return r, nil
}
