// Package fitcli is `gpupack fit`: the gang-fit decision, offline, on
// files an SRE can dump with kubectl — "why is my job not admitted?".
//
//	gpupack fit --nodes NODES.yaml [--pods PODS.yaml] --workload FILE.yaml
//	            [--params PARAMS.yaml] [-o json|text] [--bench N]
//
// It runs the same engine (package fit) on the same inputs (package
// inventory) as the admission check.
package fitcli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/inventory"
	"github.com/gpupack/gpupack/admissioncheck/usage"
	"github.com/gpupack/gpupack/flavors"
)

// Output is the -o json object.
type Output struct {
	Fits        bool     `json:"fits"`
	Domain      string   `json:"domain"`
	Level       string   `json:"level"`
	Assignments []OutPod `json:"assignments"`
	Reasons     []string `json:"reasons"`
}

// OutPod is one assignment.
type OutPod struct {
	PodSet string   `json:"podSet"`
	Index  int      `json:"index"`
	Node   string   `json:"node"`
	GPUs   []OutGPU `json:"gpus"`
}

// OutGPU is one GPU of an assignment.
type OutGPU struct {
	UUID      string `json:"uuid"`
	MemoryMiB int64  `json:"memoryMiB"`
}

// Main runs `gpupack fit` with args (the words after "fit"; a leading "fit"
// is tolerated). It returns 0 when a decision was made, fitting or not, and
// 2 with a one-line error on bad input.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "fit" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("gpupack fit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodesPath := fs.String("nodes", "", "NodeList YAML (kubectl get nodes -o yaml)")
	podsPath := fs.String("pods", "", "PodList YAML of pods holding GPUs (kubectl get pods -A -o yaml)")
	wlPath := fs.String("workload", "", "a Kueue Workload, PyTorchJob or batch Job")
	paramsPath := fs.String("params", "", "GangFitParameters YAML")
	output := fs.String("o", "text", "output: text or json")
	bench := fs.Int("bench", 0, "repeat the decision N times and print p50/p99/max")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpupack fit --nodes NODES.yaml [--pods PODS.yaml] --workload FILE.yaml [--params PARAMS.yaml] [-o json|text] [--bench N]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // flag already printed the problem
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "gpupack fit: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return fail(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	case *nodesPath == "":
		return fail(errors.New("--nodes is required"))
	case *wlPath == "":
		return fail(errors.New("--workload is required"))
	case *output != "text" && *output != "json":
		return fail(fmt.Errorf("-o %q: want text or json", *output))
	case *bench < 0:
		return fail(errors.New("--bench must be ≥ 0"))
	}
	d, err := decide(*nodesPath, *podsPath, *wlPath, *paramsPath)
	if err != nil {
		return fail(err)
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(d.json()); err != nil {
			return fail(err)
		}
	} else {
		d.text(stdout)
	}
	if *bench > 0 {
		w := stdout
		if *output == "json" {
			w = stderr // keep stdout one JSON object
		}
		fmt.Fprintln(w, d.bench(*bench))
	}
	return 0
}

// decision is everything loaded and decided.
type decision struct {
	wl        *workload
	model     *fit.Model
	gang      fit.Gang
	opts      fit.Options
	nodes     []fit.Node
	res       fit.Result
	never     bool
	neverWhy  string
	pending   int // terminating pods whose release would make it fit
	skipped   int // nodes without GPU inventory
	warnings  []string
	levelFrom string
}

func decide(nodesPath, podsPath, wlPath, paramsPath string) (*decision, error) {
	d := &decision{}
	buf := flavors.DefaultBuffer()
	d.opts = fit.Options{}
	if paramsPath != "" {
		p, err := loadParams(paramsPath)
		if err != nil {
			return nil, err
		}
		buf = flavors.NewBuffer(p.Spec.Buffer.DriverOverheadMiB, p.Spec.Buffer.BufferPercent)
		d.opts.Levels = p.Spec.TopologyLevels
		d.opts.Level = p.Spec.RequiredLevel
		d.opts.Policy = p.Spec.Policy
		if p.Spec.Search.MaxSteps != nil {
			d.opts.MaxSteps = *p.Spec.Search.MaxSteps
		}
		if p.Spec.Search.MaxDomains != nil {
			d.opts.MaxDomains = int(*p.Spec.Search.MaxDomains)
		}
		if d.opts.Level != "" {
			d.levelFrom = "requiredLevel of " + p.Name
		}
	}
	wl, err := loadWorkload(wlPath)
	if err != nil {
		return nil, err
	}
	d.wl = wl
	if l, ok := wl.annotations[v1alpha1.AnnotationGangTopology]; ok {
		d.opts.Level = l
		d.levelFrom = v1alpha1.AnnotationGangTopology + " on " + wl.kind + " " + wl.name
	}
	d.gang, err = inventory.GangFromPodSets(wl.podSets)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", wlPath, err)
	}
	objs, err := loadNodes(nodesPath)
	if err != nil {
		return nil, err
	}
	for i := range objs {
		n, err := inventory.NodeFromObject(&objs[i], buf, "")
		if errors.Is(err, inventory.ErrNoInventory) {
			d.skipped++
			continue
		}
		if err != nil {
			// As the check does: a node with an unreadable inventory is left
			// out, and said so, rather than failing every decision.
			d.warnings = append(d.warnings, fmt.Sprintf("node %s ignored: %v", objs[i].Name, err))
			continue
		}
		d.nodes = append(d.nodes, n)
	}
	d.model = fit.NewModel(d.nodes)
	d.warnings = append(d.warnings, d.model.Warnings()...)
	var terminating []fit.Usage
	if podsPath != "" {
		pods, err := loadPods(podsPath)
		if err != nil {
			return nil, err
		}
		holders, warnings := usage.Ledger(pods, nil)
		d.warnings = append(d.warnings, warnings...)
		for _, h := range holders {
			for _, u := range h.GPUs {
				if err := d.model.Use(u); err != nil {
					d.warnings = append(d.warnings, fmt.Sprintf("pod %s: %v; not counted", h.Pod, err))
					continue
				}
				if h.Terminating {
					terminating = append(terminating, u)
				}
			}
		}
	}
	d.res = d.model.Fit(d.gang, d.opts)
	if !d.res.Fits {
		if len(terminating) > 0 {
			after := d.model.Clone()
			for _, u := range terminating {
				after.Release(u)
			}
			if after.Fit(d.gang, d.opts).Fits {
				d.pending = len(terminating)
			}
		}
		d.never, d.neverWhy = fit.Never(d.nodes, d.gang, d.opts)
	}
	return d, nil
}

// verdict is what the admission check would set.
func (d *decision) verdict() string {
	switch {
	case d.res.Fits:
		return "Ready: the whole gang fits now"
	case d.never:
		return "Rejected: " + d.neverWhy
	case d.pending > 0:
		return fmt.Sprintf("Pending: it fits once terminating pods release %d GPU reservations", d.pending)
	}
	return "Retry: it does not fit now"
}

func (d *decision) json() Output {
	o := Output{Fits: d.res.Fits, Domain: d.res.Domain, Level: d.res.Level, Assignments: []OutPod{}, Reasons: []string{}}
	for _, a := range d.res.Assignments {
		p := OutPod{PodSet: a.PodSet, Index: a.Index, Node: a.Node, GPUs: []OutGPU{}}
		for _, u := range a.GPUs {
			p.GPUs = append(p.GPUs, OutGPU{UUID: u.UUID, MemoryMiB: u.MemoryMiB})
		}
		o.Assignments = append(o.Assignments, p)
	}
	if !d.res.Fits {
		o.Reasons = append(o.Reasons, d.verdict())
	}
	o.Reasons = append(o.Reasons, d.res.Reasons...)
	o.Reasons = append(o.Reasons, d.notes()...)
	return o
}

func (d *decision) notes() []string {
	var out []string
	if d.skipped > 0 {
		out = append(out, plural(d.skipped, "node", "nodes")+" without GPU inventory left out")
	}
	return append(out, d.warnings...)
}

func (d *decision) text(w io.Writer) {
	fmt.Fprintf(w, "%s %s: %s in %s", d.wl.kind, d.wl.name, plural(d.gang.Pods(), "pod", "pods"), plural(len(d.gang.PodSets), "pod set", "pod sets"))
	for _, ps := range d.gang.PodSets {
		fmt.Fprintf(w, "\n  %s: %d × %s", ps.Name, ps.Count, describe(ps))
	}
	fmt.Fprintln(w)
	scope := "the whole cluster is one domain"
	if d.opts.Level != "" {
		scope = "every pod shares one value of " + d.opts.Level
		if d.levelFrom != "" {
			scope += " (" + d.levelFrom + ")"
		}
	}
	fmt.Fprintf(w, "Topology: %s. Nodes: %d with GPUs.\n", scope, len(d.nodes))
	fmt.Fprintf(w, "Decision: %s\n", d.verdict())
	if d.res.Fits {
		where := "the cluster"
		if d.res.Level != "" {
			where = fmt.Sprintf("domain %s=%s", d.res.Level, d.res.Domain)
		}
		fmt.Fprintf(w, "Plan in %s:\n", where)
		for _, a := range d.res.Assignments {
			gs := make([]string, len(a.GPUs))
			for i, u := range a.GPUs {
				if u.Exclusive {
					gs[i] = u.UUID + " (whole)"
				} else {
					gs[i] = fmt.Sprintf("%s (%d MiB", u.UUID, u.MemoryMiB)
					if u.Cores > 0 {
						gs[i] += fmt.Sprintf(", %d%% SM", u.Cores)
					}
					gs[i] += ")"
				}
			}
			fmt.Fprintf(w, "  %s-%d → %s: %s\n", a.PodSet, a.Index, a.Node, strings.Join(gs, ", "))
		}
	} else {
		fmt.Fprintln(w, "Why, per candidate domain (closest first):")
		for _, r := range d.res.Reasons {
			fmt.Fprintf(w, "  - %s\n", r)
		}
	}
	for _, n := range d.notes() {
		fmt.Fprintf(w, "Note: %s\n", n)
	}
}

func describe(ps fit.PodSet) string {
	s := fmt.Sprintf("%d GPU", ps.GPUsPerPod)
	if ps.GPUsPerPod != 1 {
		s += "s"
	}
	switch {
	case ps.Exclusive():
		s += " (whole)"
	case ps.MemoryMiB > 0:
		s += fmt.Sprintf(" × %d MiB", ps.MemoryMiB)
	default:
		s += fmt.Sprintf(" × %d%% of memory", ps.MemoryPercent)
	}
	if !ps.Exclusive() && ps.Cores > 0 {
		s += fmt.Sprintf(", %d%% SM", ps.Cores)
	}
	return s
}

// bench repeats the decision on the loaded model.
func (d *decision) bench(n int) string {
	ds := make([]time.Duration, n)
	for i := range ds {
		t0 := time.Now()
		d.model.Fit(d.gang, d.opts)
		ds[i] = time.Since(t0)
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[int(p*float64(n-1))] }
	return fmt.Sprintf("bench: %d decisions: p50=%v p99=%v max=%v", n, q(0.5), q(0.99), ds[n-1])
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
