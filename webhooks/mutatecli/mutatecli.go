// Package mutatecli is `gpupack mutate -f FILE.yaml [--config CONFIG.yaml]`:
// it runs the webhooks' mutation and validation offline and prints what the
// cluster would store, so users see what the webhook will do.
package mutatecli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	kftraining "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"

	"github.com/gpupack/gpupack/webhooks/mutation"
	trainer "github.com/gpupack/gpupack/webhooks/mutation/trainerapi/v1alpha1"
)

// DefaultUser is who `gpupack mutate` creates the objects as when --user
// is not given (the cluster writes the requester's own name).
const DefaultUser = "mutate-user"

// Exit codes.
const (
	ExitOK     = 0
	ExitDenied = 1
	ExitUsage  = 2
)

// Main runs the command; args exclude "mutate" itself.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpupack mutate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("f", "", "manifest to mutate (YAML; several documents allowed; - for stdin)")
	cfgPath := fs.String("config", "", "webhook configuration (YAML); default: built-in defaults")
	user := fs.String("user", DefaultUser, "the user name the objects are created as: the webhook writes it into gpupack.io/created-by of a Kueue pod group's pods (label kueue.x-k8s.io/pod-group-name)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: gpupack mutate -f FILE.yaml [--config CONFIG.yaml] [--user NAME]\n\n"+
			"Prints the objects as gpupack's webhooks would admit them (exit 0), or the\n"+
			"denial (exit 1). Warnings go to stderr. Handles Pod, batch/v1 Job,\n"+
			"kubeflow.org/v1 PyTorchJob, JobSet, LeaderWorkerSet, Deployment,\n"+
			"StatefulSet, TrainJob, TrainingRuntime, ClusterTrainingRuntime, RayJob,\n"+
			"RayCluster and MPIJob; other kinds are printed unchanged.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if *file == "" || fs.NArg() > 0 {
		fs.Usage()
		return ExitUsage
	}
	var data []byte
	var err error
	if *file == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(*file)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpupack mutate: %v\n", err)
		return ExitUsage
	}
	cfg, err := mutation.LoadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "gpupack mutate: %v\n", err)
		return ExitUsage
	}
	m, err := mutation.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "gpupack mutate: %v\n", err)
		return ExitUsage
	}
	docs := splitDocuments(data)
	var out []string
	for i, doc := range docs {
		res, warn, err := mutateDocument(m, doc, *user)
		for _, w := range warn {
			fmt.Fprintf(stderr, "Warning: %s\n", w)
		}
		var bad *badInput
		switch {
		case errors.As(err, &bad):
			fmt.Fprintf(stderr, "gpupack mutate: document %d: %v\n", i+1, bad.err)
			return ExitUsage
		case err != nil:
			fmt.Fprintf(stderr, "denied: %v\n", err)
			return ExitDenied
		}
		out = append(out, res)
	}
	fmt.Fprint(stdout, strings.Join(out, "---\n"))
	return ExitOK
}

type badInput struct{ err error }

func (b *badInput) Error() string { return b.err.Error() }

func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), data...), []byte("\n---")) {
		// A separator line may carry a comment or trailing spaces.
		if i := bytes.IndexByte(d, '\n'); i >= 0 && len(bytes.TrimSpace(d[:i])) > 0 && bytes.HasPrefix(bytes.TrimSpace(d[:i]), []byte("#")) {
			d = d[i:]
		}
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(d []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(d, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// mutateDocument returns the mutated YAML, the warnings, and a denial (or a
// *badInput for documents that are not valid objects).
func mutateDocument(m *mutation.Mutator, doc []byte, user string) (string, []string, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", nil, &badInput{fmt.Errorf("not YAML: %w", err)}
	}
	var obj runtime.Object
	var warn []string
	var err error
	switch {
	case tm.APIVersion == "v1" && tm.Kind == "Pod":
		p := &corev1.Pod{}
		if err := yaml.UnmarshalStrict(doc, p); err != nil {
			return "", nil, &badInput{err}
		}
		if warn, err = m.AdmitPod(p, mutation.PodContext{Creator: user}); err == nil {
			err = m.ValidatePod(p)
		}
		obj = p
	case tm.APIVersion == "batch/v1" && tm.Kind == "Job":
		j := &batchv1.Job{}
		if err := yaml.UnmarshalStrict(doc, j); err != nil {
			return "", nil, &badInput{err}
		}
		if warn, err = m.Job(j); err == nil {
			err = m.ValidateJob(j)
		}
		obj = j
	case tm.APIVersion == kftraining.GroupVersion.String() && tm.Kind == kftraining.PyTorchJobKind:
		j := &kftraining.PyTorchJob{}
		if err := yaml.UnmarshalStrict(doc, j); err != nil {
			return "", nil, &badInput{err}
		}
		if warn, err = m.PyTorchJob(j); err == nil {
			err = m.ValidatePyTorchJob(j)
		}
		obj = j
	case isTrainJob(tm): // kinds.go
		j := &trainer.TrainJob{}
		if err := yaml.UnmarshalStrict(doc, j); err != nil {
			return "", nil, &badInput{err}
		}
		if warn, err = m.TrainJob(j); err == nil {
			err = m.ValidateTrainJob(j)
		}
		obj = j
	case jobKindObject(tm) != nil: // kinds.go
		o := jobKindObject(tm)
		if err := yaml.UnmarshalStrict(doc, o); err != nil {
			return "", nil, &badInput{err}
		}
		ann, ts, _ := mutation.KindTemplates(o)
		if warn, err = m.Templates(ann, ts); err == nil {
			err = m.ValidateTemplates(ann, ts)
		}
		obj = o
	case tm.Kind == "":
		return "", nil, &badInput{errors.New("no kind")}
	default:
		return string(bytes.TrimLeft(doc, "\n")), []string{fmt.Sprintf("%s %s is not handled by gpupack's webhooks; printed unchanged", tm.APIVersion, tm.Kind)}, nil
	}
	if err != nil {
		return "", warn, err
	}
	out, err := render(obj)
	if err != nil {
		return "", warn, &badInput{err}
	}
	return out, warn, nil
}

// render prints obj without the empty status and null timestamps a typed
// round trip adds.
func render(obj runtime.Object) (string, error) {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return "", err
	}
	prune(u)
	if st, ok := u["status"].(map[string]interface{}); ok && len(st) == 0 {
		delete(u, "status")
	}
	b, err := yaml.Marshal(u)
	return string(b), err
}

// prune drops nulls (creationTimestamp: null). Empty maps stay: emptyDir: {}
// means something.
func prune(m map[string]interface{}) {
	for k, v := range m {
		switch x := v.(type) {
		case nil:
			delete(m, k)
		case map[string]interface{}:
			prune(x)
		case []interface{}:
			for _, e := range x {
				if em, ok := e.(map[string]interface{}); ok {
					prune(em)
				}
			}
		}
	}
}
