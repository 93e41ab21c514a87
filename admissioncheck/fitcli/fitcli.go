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

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/admissioncheck/gpucache"
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
	// Domains: with --explain, free capacity per domain and GPU model.
	Domains []gpucache.DomainFree `json:"domains,omitempty"`
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
	plansPath := fs.String("plans", "", "GPUPlanList YAML (kubectl get gpuplans -A -o yaml): plans of admitted workloads still reserving GPUs")
	explain := fs.Bool("explain", false, "also print free capacity and fragmentation per topology domain and GPU model")
	output := fs.String("o", "text", "output: text or json")
	bench := fs.Int("bench", 0, "repeat the decision N times and print p50/p99/max")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpupack fit --nodes NODES.yaml [--pods PODS.yaml] [--plans PLANS.yaml] --workload FILE.yaml [--params PARAMS.yaml] [--explain] [-o json|text] [--bench N]")
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
	d, err := decide(*nodesPath, *podsPath, *plansPath, *wlPath, *paramsPath)
	if err != nil {
		return fail(err)
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		o := d.json()
		if *explain {
			o.Domains = d.free
		}
		if err := enc.Encode(o); err != nil {
			return fail(err)
		}
	} else {
		d.text(stdout)
		if *explain {
			d.explain(stdout)
		}
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
	aff       []inventory.PodAffinity
	opts      fit.Options
	nodes     []fit.Node
	v         gpucache.Verdict
	res       fit.Result
	terminate int // terminating pods holding GPUs
	skipped   int // nodes without GPU inventory
	warnings  []string
	levelFrom string
	free      []gpucache.DomainFree
	level     string
}

// decide loads the files into the check's own model (package gpucache,
// the usage rule of package usage) and takes the verdict the controller
// would: Snapshot.Decide.
func decide(nodesPath, podsPath, plansPath, wlPath, paramsPath string) (*decision, error) {
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
	d.gang, d.aff, err = inventory.GangFromPodSets(wl.namespace, wl.podSets)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", wlPath, err)
	}
	objs, err := loadNodes(nodesPath)
	if err != nil {
		return nil, err
	}
	c := gpucache.New(nil)
	for i := range objs {
		c.UpsertNode(&objs[i])
	}
	if podsPath != "" {
		pods, err := loadPods(podsPath)
		if err != nil {
			return nil, err
		}
		// As the check does: a pod whose devices cannot be read is not
		// counted, and said so.
		_, warns := usage.Ledger(pods, nil)
		d.warnings = append(d.warnings, warns...)
		for i := range pods {
			// The model keys pods by UID (as plan bindings name them); a
			// hand-written file may have none.
			if pods[i].UID == "" {
				pods[i].UID = types.UID("fitcli:" + pods[i].Namespace + "/" + pods[i].Name)
			}
			c.UpsertPod(&pods[i])
		}
	}
	if plansPath != "" {
		plans, err := loadPlans(plansPath)
		if err != nil {
			return nil, err
		}
		for i := range plans {
			c.UpsertPlan(&plans[i])
		}
	}
	if len(d.opts.Levels) > 0 {
		d.level = d.opts.Levels[0]
	} else if d.opts.Level != "" {
		d.level = d.opts.Level
	}
	c.Read(buf, func(s *gpucache.Snapshot) {
		d.nodes = s.Nodes
		d.skipped = len(objs) - len(s.Nodes) - len(s.Unread)
		d.warnings = append(d.warnings, s.Warnings...)
		for _, u := range s.Unread {
			if !slices.Contains(d.warnings, u) {
				d.warnings = append(d.warnings, u)
			}
		}
		d.terminate = s.Terminating
		d.v = s.Decide(d.gang, d.aff, d.opts)
		d.res = d.v.Result
		d.model = s.Model.Clone()
		d.free = s.Fragmentation(d.level)
	})
	return d, nil
}

// verdict is what the admission check would set.
func (d *decision) verdict() string {
	switch {
	case d.res.Fits:
		return "Ready: the whole gang fits now"
	case d.v.SettledFits:
		return fmt.Sprintf("Pending: it fits once %s holding GPUs are gone", plural(d.terminate, "terminating pod", "terminating pods"))
	case d.v.Never && d.v.Incomplete != "":
		return "Retry: it does not fit the nodes read (" + d.v.NeverWhy + "), but " + d.v.Incomplete + "; the check does not reject while the inventory is incomplete"
	case d.v.Never:
		return "Rejected: " + d.v.NeverWhy
	}
	return "Retry: it does not fit now"
}

// explain prints free capacity and fragmentation per domain.
func (d *decision) explain(w io.Writer) {
	where := "the whole cluster"
	if d.level != "" {
		where = "each " + d.level
	}
	fmt.Fprintf(w, "Free now, per %s and GPU model (healthy GPUs of Ready nodes):\n", strings.TrimPrefix(where, "each "))
	sizes := make([]string, len(gpucache.FractionalSizesMiB))
	for i, s := range gpucache.FractionalSizesMiB {
		sizes[i] = fmt.Sprintf("%dGi", s/1024)
	}
	fmt.Fprintf(w, "  %-16s %-24s %5s %6s %8s %10s  pods at %s  %s\n", "domain", "model", "GPUs", "whole", "widest", "free MiB", strings.Join(sizes, "/"), "fragmentation")
	for _, f := range d.free {
		name := f.Domain
		if name == "" {
			name = "(cluster)"
		}
		at := make([]string, len(f.PodsAt))
		for i, n := range f.PodsAt {
			at[i] = fmt.Sprint(n)
		}
		fmt.Fprintf(w, "  %-16s %-24s %5d %6d %8d %10d  %-*s  %.2f\n", name, f.Model, f.GPUs, f.WholeFree, f.LargestNodeWhole, f.FreeMiB,
			len("pods at ")+len(strings.Join(sizes, "/"))-len("pods at "), strings.Join(at, "/"), f.Fragmentation)
	}
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
