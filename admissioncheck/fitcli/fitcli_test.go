package fitcli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	rc := Main(args, &out, &errb)
	return rc, out.String(), errb.String()
}

func runJSON(t *testing.T, args ...string) Output {
	t.Helper()
	rc, out, errs := run(t, append(args, "-o", "json")...)
	if rc != 0 {
		t.Fatalf("rc = %d, stderr: %s", rc, errs)
	}
	var o Output
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		t.Fatalf("stdout is not the JSON object: %v\n%s", err, out)
	}
	if dec.More() {
		t.Fatalf("stdout has more than one JSON value:\n%s", out)
	}
	return o
}

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkPlan: every pod of each pod set once, distinct GPUs per pod, GPUs
// listed in nodes.yaml under that node.
func checkPlan(t *testing.T, o Output, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	used := map[string]int64{}
	for _, a := range o.Assignments {
		got[a.PodSet]++
		mine := map[string]bool{}
		for _, g := range a.GPUs {
			if mine[g.UUID] || !strings.HasPrefix(g.UUID, a.Node+"-") && !strings.HasPrefix(g.UUID, "GPU-h") {
				t.Errorf("pod %s-%d on %s: GPU %s repeated or not on that node", a.PodSet, a.Index, a.Node, g.UUID)
			}
			mine[g.UUID] = true
			used[g.UUID] += g.MemoryMiB
			if used[g.UUID] > 72228 {
				t.Errorf("GPU %s overcommitted: %d MiB", g.UUID, used[g.UUID])
			}
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("pods per pod set (-want +got):\n%s", d)
	}
}

func TestPyTorchJobWholeCluster(t *testing.T) {
	o := runJSON(t, "--nodes", "testdata/nodes.yaml", "--workload", "testdata/pytorchjob.yaml")
	if !o.Fits || o.Level != "" || o.Domain != "" {
		t.Fatalf("fits=%v level=%q domain=%q reasons=%q", o.Fits, o.Level, o.Domain, o.Reasons)
	}
	checkPlan(t, o, map[string]int{"master": 1, "worker": 7})
	if !slicesContain(o.Reasons, "1 node without GPU inventory left out") {
		t.Errorf("the CPU node is not mentioned: %q", o.Reasons)
	}
}

func TestPyTorchJobInOneRackWithUsage(t *testing.T) {
	o := runJSON(t, "fit", "--nodes", "testdata/nodes.yaml", "--pods", "testdata/pods.yaml",
		"--workload", "testdata/pytorchjob.yaml", "--params", "testdata/params-rack.yaml")
	if !o.Fits || o.Level != "rack" || o.Domain != "rack-a" {
		t.Fatalf("fits=%v level=%q domain=%q reasons=%q", o.Fits, o.Level, o.Domain, o.Reasons)
	}
	checkPlan(t, o, map[string]int{"master": 1, "worker": 7})
	for _, a := range o.Assignments {
		if a.Node != "a1" && a.Node != "a2" {
			t.Errorf("pod %s-%d on %s, outside rack-a", a.PodSet, a.Index, a.Node)
		}
	}
}

func TestFragmentationHeldWithReason(t *testing.T) {
	// Three 80 GiB GPUs, one already holding a 30 GiB share: Kueue's
	// aggregate would admit 3 × 50 GiB; per GPU it cannot be placed.
	nodes := write(t, "nodes.yaml", `apiVersion: v1
kind: NodeList
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: gpu-node
    annotations:
      gpupack.io/gpus: '[{"uuid":"gpu-node-g0","memoryMiB":81920},{"uuid":"gpu-node-g1","memoryMiB":81920},{"uuid":"gpu-node-g2","memoryMiB":81920}]'
  status:
    conditions: [{type: Ready, status: "True"}]
`)
	pods := write(t, "pods.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: small
  namespace: team-a
  annotations: {gpupack.io/devices: "gpu-node-g2:30720"}
spec:
  nodeName: gpu-node
  containers:
  - name: m
    image: x
    resources: {limits: {gpupack.io/vgpu: 1, gpupack.io/gpu-memory: 30720}}
status: {phase: Running}
`)
	o := runJSON(t, "--nodes", nodes, "--pods", pods, "--workload", "testdata/job-50gi.yaml")
	if o.Fits {
		t.Fatalf("3 × 50 GiB fit next to a 30 GiB share on 3 × 80 GiB: %+v", o)
	}
	want := "cluster: 2 of 3 pods fit; binding constraint: only 2 GPUs have 51200 MiB free (need 51200 MiB per GPU on 3 GPUs)"
	if !slicesContain(o.Reasons, want) || o.Reasons[0] != "Retry: it does not fit now" {
		t.Errorf("reasons = %q, want Retry first and %q", o.Reasons, want)
	}
	if len(o.Assignments) != 0 || o.Assignments == nil {
		t.Errorf("assignments = %#v, want an empty list", o.Assignments)
	}
	job30 := write(t, "job.yaml", strings.Replace(mustRead(t, "testdata/job-50gi.yaml"), "50Gi", "30Gi", 1))
	o = runJSON(t, "--nodes", nodes, "--pods", pods, "--workload", job30)
	if !o.Fits {
		t.Fatalf("3 × 30 GiB does not fit: %q", o.Reasons)
	}
	checkPlan(t, o, map[string]int{"main": 3})
	for _, a := range o.Assignments {
		if a.GPUs[0].MemoryMiB != 30720 {
			t.Errorf("pod %d reserves %d MiB, want 30720", a.Index, a.GPUs[0].MemoryMiB)
		}
	}
}

func TestWorkloadWithTopologyAnnotation(t *testing.T) {
	o := runJSON(t, "--nodes", "testdata/nodes.yaml", "--pods", "testdata/pods.yaml", "--workload", "testdata/workload.yaml")
	if !o.Fits || o.Level != "rack" {
		t.Fatalf("fits=%v level=%q reasons=%q", o.Fits, o.Level, o.Reasons)
	}
	checkPlan(t, o, map[string]int{"main": 4})
}

func TestPendingWhileTerminatingPodsHoldGPUs(t *testing.T) {
	pods := write(t, "pods.yaml", strings.Split(mustRead(t, "testdata/pods.yaml"), "- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: other-0")[0]+
		"- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: leaving-0"+strings.SplitN(mustRead(t, "testdata/pods.yaml"), "name: leaving-0", 2)[1])
	wl := write(t, "wl.yaml", `apiVersion: batch/v1
kind: Job
metadata: {name: big}
spec:
  parallelism: 1
  template:
    spec:
      containers:
      - name: m
        image: x
        resources: {limits: {nvidia.com/gpu: 8}}
`)
	o := runJSON(t, "--nodes", "testdata/nodes.yaml", "--pods", pods, "--workload", wl)
	if o.Fits || len(o.Reasons) == 0 || !strings.HasPrefix(o.Reasons[0], "Pending: it fits once 1 terminating pod holding GPUs") {
		t.Fatalf("fits=%v reasons=%q", o.Fits, o.Reasons)
	}
	// Without the pods file the same job fits on b1.
	if o := runJSON(t, "--nodes", "testdata/nodes.yaml", "--workload", wl); !o.Fits || o.Assignments[0].Node != "b1" {
		t.Errorf("without usage: %+v", o)
	}
}

func TestRejectedWhenItCanNeverFit(t *testing.T) {
	wl := write(t, "wl.yaml", `apiVersion: batch/v1
kind: Job
metadata: {name: huge}
spec:
  template:
    spec:
      containers:
      - name: m
        image: x
        resources: {limits: {nvidia.com/gpu: 16}}
`)
	o := runJSON(t, "--nodes", "testdata/nodes.yaml", "--workload", wl)
	if o.Fits || !strings.HasPrefix(o.Reasons[0], "Rejected: it does not fit even on an empty cluster") {
		t.Fatalf("reasons = %q", o.Reasons)
	}
}

// The template's required node affinity steers the plan, and one that no
// node matches is rejected with the count of nodes it excludes.
func TestRequiredNodeAffinity(t *testing.T) {
	job := func(expr string) string {
		return write(t, "wl.yaml", `apiVersion: batch/v1
kind: Job
metadata: {name: pinned}
spec:
  parallelism: 2
  template:
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - `+expr+`
      containers:
      - name: m
        image: x
        resources: {limits: {nvidia.com/gpu: 4}}
`)
	}
	// Without the affinity BestFit would take a1 and a2, the fuller nodes.
	o := runJSON(t, "--nodes", "testdata/nodes.yaml", "--workload", job("{key: kubernetes.io/hostname, operator: In, values: [b1]}"))
	if !o.Fits {
		t.Fatalf("reasons = %q", o.Reasons)
	}
	for _, a := range o.Assignments {
		if a.Node != "b1" {
			t.Errorf("pod %s-%d on %s, the affinity allows b1 only", a.PodSet, a.Index, a.Node)
		}
	}
	o = runJSON(t, "--nodes", "testdata/nodes.yaml", "--workload", job("{key: gpu.example/product, operator: In, values: [B200]}"))
	if o.Fits || !strings.HasPrefix(o.Reasons[0], "Rejected: it does not fit even on an empty cluster") ||
		!strings.Contains(o.Reasons[0], "4 nodes do not match its required node affinity (gpu.example/product In [B200])") {
		t.Fatalf("reasons = %q", o.Reasons)
	}
}

func TestTextOutputAndBench(t *testing.T) {
	rc, out, errs := run(t, "--nodes", "testdata/nodes.yaml", "--workload", "testdata/pytorchjob.yaml", "--bench", "5")
	if rc != 0 {
		t.Fatalf("rc=%d stderr=%s", rc, errs)
	}
	for _, want := range []string{"PyTorchJob llama: 8 pods in 2 pod sets", "master: 1 × 1 GPU (whole)", "Decision: Ready", "master-0 → ", "bench: 5 decisions: p50="} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	rc, out, errs = run(t, "--nodes", "testdata/nodes.yaml", "--workload", "testdata/pytorchjob.yaml", "--bench", "3", "-o", "json")
	if rc != 0 || !strings.Contains(errs, "bench: 3 decisions") || json.Unmarshal([]byte(out), &Output{}) != nil {
		t.Errorf("json + bench: rc=%d stdout=%s stderr=%s", rc, out, errs)
	}
}

func TestBadInput(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no nodes", []string{"--workload", "testdata/job-50gi.yaml"}, "gpupack fit: --nodes is required"},
		{"no workload", []string{"--nodes", "testdata/nodes.yaml"}, "gpupack fit: --workload is required"},
		{"bad output", []string{"--nodes", "testdata/nodes.yaml", "--workload", "testdata/job-50gi.yaml", "-o", "yaml"}, `-o "yaml": want text or json`},
		{"unsupported kind", []string{"--nodes", "testdata/nodes.yaml", "--workload", "testdata/bad-kind.yaml"}, `apps/v1 "Deployment" is not supported`},
		{"missing file", []string{"--nodes", "testdata/nope.yaml", "--workload", "testdata/job-50gi.yaml"}, "no such file"},
		{"nodes file of pods", []string{"--nodes", "testdata/pods.yaml", "--workload", "testdata/job-50gi.yaml"}, `item 0 is a "Pod", want Node`},
		{"params of the wrong kind", []string{"--nodes", "testdata/nodes.yaml", "--workload", "testdata/job-50gi.yaml", "--params", "testdata/workload.yaml"}, "want kind GangFitParameters"},
		{"stray argument", []string{"--nodes", "testdata/nodes.yaml", "--workload", "testdata/job-50gi.yaml", "extra"}, `unexpected argument "extra"`},
	}
	for _, tc := range cases {
		rc, out, errs := run(t, tc.args...)
		if rc == 0 || out != "" || !strings.Contains(errs, tc.want) || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%s: rc=%d stdout=%q stderr=%q, want one line with %q", tc.name, rc, out, errs, tc.want)
		}
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func slicesContain(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func TestJobCountIsParallelismCappedByCompletions(t *testing.T) {
	wl := write(t, "wl.yaml", `apiVersion: batch/v1
kind: Job
metadata: {name: few}
spec:
  parallelism: 4
  completions: 2
  template:
    spec:
      containers:
      - name: m
        image: x
        resources: {limits: {nvidia.com/gpu: 1}}
`)
	o := runJSON(t, "--nodes", "testdata/nodes.yaml", "--workload", wl)
	if !o.Fits {
		t.Fatalf("reasons %q", o.Reasons)
	}
	checkPlan(t, o, map[string]int{"main": 2})
}

func TestUnreadableNodeIsLeftOutWithANote(t *testing.T) {
	nodes := write(t, "nodes.yaml", mustRead(t, "testdata/nodes.yaml")+`- apiVersion: v1
  kind: Node
  metadata:
    name: broken
    annotations:
      gpupack.io/gpus: 'not json'
  status:
    conditions: [{type: Ready, status: "True"}]
`)
	o := runJSON(t, "--nodes", nodes, "--workload", "testdata/pytorchjob.yaml")
	if !o.Fits {
		t.Fatalf("reasons %q", o.Reasons)
	}
	found := false
	for _, r := range o.Reasons {
		found = found || strings.HasPrefix(r, "node broken ignored: node broken: gpupack.io/gpus: not a JSON array")
	}
	if !found {
		t.Errorf("no note about the broken node: %q", o.Reasons)
	}
}

const oneNode = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: n1
    labels: {rack: r1}
    annotations:
      gpupack.io/gpus: '[{"uuid": "n1-g0", "index": 0, "model": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559}, {"uuid": "n1-g1", "index": 1, "model": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559}]'
  status:
    conditions: [{type: Ready, status: "True"}]
`

// The old pod of a re-admitted workload, still terminating, names the new
// plan (same name) in gpupack.io/plan; it is not bound to it by UID.
const oldPod = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata:
    name: wl-0
    namespace: ns
    uid: old-pod
    deletionTimestamp: "2026-01-01T00:00:00Z"
    annotations: {gpupack.io/devices: "n1-g0:71903", gpupack.io/plan: wl}
  spec:
    nodeName: n1
    containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
  status: {phase: Running}
`

const newPlan = `apiVersion: v1
kind: List
items:
- apiVersion: gpupack.io/v1alpha1
  kind: GPUPlan
  metadata: {name: wl, namespace: ns, uid: plan-2}
  spec:
    workloadName: wl
    workloadUID: wl-uid-2
    podCount: 1
    gpuCount: 1
    assignments:
    - {podSet: main, index: 0, node: n1, gpus: [{uuid: n1-g1, memoryMiB: 71903, exclusive: true}]}
  status:
    phase: Planned
    bindings: [{podSet: main, index: 0, podName: wl-0, podUID: new-pod}]
`

const oneGPUJob = `apiVersion: batch/v1
kind: Job
metadata: {name: other}
spec:
  parallelism: 1
  template:
    spec:
      containers: [{name: m, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
`

// --plans: the same verdict as the check (TestReadmittedPlanDoesNotHideTerminatingPods
// in package admissioncheck): plans reserve their slots; a pod of the same
// plan name but another UID still holds its own GPU.
func TestPlansThroughTheSameUsageRule(t *testing.T) {
	nodes, pods, plans, job := write(t, "nodes.yaml", oneNode), write(t, "pods.yaml", oldPod), write(t, "plans.yaml", newPlan), write(t, "job.yaml", oneGPUJob)
	if o := runJSON(t, "--nodes", nodes, "--pods", pods, "--workload", job); !o.Fits || o.Assignments[0].GPUs[0].UUID != "n1-g1" {
		t.Fatalf("without plans: %+v", o)
	}
	o := runJSON(t, "--nodes", nodes, "--pods", pods, "--plans", plans, "--workload", job)
	if o.Fits || len(o.Reasons) == 0 || !strings.HasPrefix(o.Reasons[0], "Pending: it fits once 1 terminating pod") {
		t.Fatalf("with the re-admitted plan: fits=%v reasons=%q", o.Fits, o.Reasons)
	}
}

func TestPlansFileMustHoldPlans(t *testing.T) {
	rc, _, errs := run(t, "--nodes", write(t, "n.yaml", oneNode), "--plans", write(t, "p.yaml", oldPod), "--workload", write(t, "j.yaml", oneGPUJob))
	if rc != 2 || !strings.Contains(errs, `is a "Pod", want GPUPlan`) {
		t.Errorf("rc=%d stderr=%q", rc, errs)
	}
	bad := strings.Replace(newPlan, "workloadUID", "workloadUUID", 1)
	rc, _, errs = run(t, "--nodes", write(t, "n.yaml", oneNode), "--plans", write(t, "p.yaml", bad), "--workload", write(t, "j.yaml", oneGPUJob))
	if rc != 2 || !strings.Contains(errs, "workloadUUID") {
		t.Errorf("unknown field: rc=%d stderr=%q", rc, errs)
	}
}

func TestExplainPrintsFreeCapacityPerDomain(t *testing.T) {
	rc, out, errs := run(t, "--nodes", write(t, "n.yaml", oneNode), "--pods", write(t, "p.yaml", oldPod), "--workload", write(t, "j.yaml", oneGPUJob),
		"--params", "testdata/params-rack.yaml", "--explain")
	if rc != 0 {
		t.Fatalf("rc=%d %s", rc, errs)
	}
	// r1: 2 GPUs, one whole free; 1 free GPU of 71903 MiB = 7 pods of 10Gi, 3 of 20Gi, 1 of 40Gi.
	for _, want := range []string{"Free now, per rack", "r1", "NVIDIA-H100-80GB-HBM3", "    2      1        1      71903  7/3/1", "0.00"} {
		if !strings.Contains(out, want) {
			t.Errorf("--explain output lacks %q:\n%s", want, out)
		}
	}
	o := runJSON(t, "--nodes", write(t, "n.yaml", oneNode), "--workload", write(t, "j.yaml", oneGPUJob), "--explain")
	if len(o.Domains) != 1 || o.Domains[0].WholeFree != 2 || o.Domains[0].Domain != "" {
		t.Errorf("-o json --explain domains = %+v", o.Domains)
	}
}

// TestPodAntiAffinity: `gpupack fit` reads pod anti-affinity as the check
// does (inventory.GangFromPodSets, gpucache.Snapshot.Decide): one pod per
// node, and not beside a bound pod of the same label in the workload's
// namespace.
func TestPodAntiAffinity(t *testing.T) {
	job := func(n int) string {
		return write(t, "wl.yaml", fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: ring}
spec:
  parallelism: %d
  template:
    metadata: {labels: {app: ring}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app: ring}}
      containers:
      - name: m
        image: x
        resources: {limits: {nvidia.com/gpu: 1}}
`, n))
	}
	pods := write(t, "pods.yaml", `apiVersion: v1
kind: Pod
metadata: {name: ring-old, namespace: default, labels: {app: ring}}
spec:
  nodeName: a1
  containers: [{name: c, image: x}]
status: {phase: Running}
`)
	o := runJSON(t, "--nodes", "testdata/nodes.yaml", "--pods", pods, "--workload", job(3))
	if !o.Fits {
		t.Fatalf("reasons = %q", o.Reasons)
	}
	seen := map[string]bool{}
	for _, a := range o.Assignments {
		if seen[a.Node] || a.Node == "a1" {
			t.Errorf("pod %s-%d on %s: two on one node, or beside ring-old", a.PodSet, a.Index, a.Node)
		}
		seen[a.Node] = true
	}
	o = runJSON(t, "--nodes", "testdata/nodes.yaml", "--pods", pods, "--workload", job(4))
	if o.Fits || !strings.HasPrefix(o.Reasons[0], "Retry") || !strings.Contains(strings.Join(o.Reasons, "\n"), "at most 1 pod per node") {
		t.Fatalf("fits=%v reasons = %q", o.Fits, o.Reasons)
	}
}
