package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// hist is a cumulative Prometheus histogram.
type hist struct {
	le    []float64
	cum   []uint64
	count uint64
	sum   float64
}

func (h hist) minus(o hist) hist {
	out := hist{le: h.le, count: h.count - o.count, sum: h.sum - o.sum}
	for i := range h.cum {
		c := h.cum[i]
		if i < len(o.cum) {
			c -= o.cum[i]
		}
		out.cum = append(out.cum, c)
	}
	return out
}

// quantile is the upper bound of the bucket holding quantile q (+Inf: above
// the last bucket).
func (h hist) quantile(q float64) float64 {
	if h.count == 0 {
		return math.NaN()
	}
	rank := uint64(math.Ceil(q * float64(h.count)))
	for i, c := range h.cum {
		if c >= rank {
			return h.le[i]
		}
	}
	return math.Inf(1)
}

// parseHistogram reads one histogram from the Prometheus text format.
func parseHistogram(text, name string) (hist, error) {
	var h hist
	found := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"_") {
			continue
		}
		sp := strings.LastIndexByte(l, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			return h, fmt.Errorf("%s: %w", l, err)
		}
		switch {
		case strings.HasPrefix(l, name+"_bucket{"):
			_, rest, _ := strings.Cut(l, `le="`)
			le, _, _ := strings.Cut(rest, `"`)
			if le == "+Inf" {
				continue
			}
			b, err := strconv.ParseFloat(le, 64)
			if err != nil {
				return h, fmt.Errorf("%s: %w", l, err)
			}
			h.le, h.cum = append(h.le, b), append(h.cum, uint64(v))
			found = true
		case strings.HasPrefix(l, name+"_sum"):
			h.sum = v
		case strings.HasPrefix(l, name+"_count"):
			h.count = uint64(v)
			found = true
		}
	}
	if !found {
		return h, fmt.Errorf("%s not in the metrics", name)
	}
	return h, nil
}

// counts are counter values by a label tuple ("a/b/c").
type counts map[string]float64

func (c counts) minus(o counts) counts {
	out := counts{}
	for k, v := range c {
		if d := v - o[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (c counts) add(o counts) counts {
	if c == nil {
		c = counts{}
	}
	for k, v := range o {
		c[k] += v
	}
	return c
}

// top renders the n largest entries, each divided by per.
func (c counts) top(n int, per float64) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c[a] != c[b] {
			if c[a] > c[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var total float64
	for _, v := range c {
		total += v
	}
	var s []string
	for _, k := range keys[:min(n, len(keys))] {
		s = append(s, fmt.Sprintf("%s %.2f", k, c[k]/per))
	}
	return fmt.Sprintf("%.1f in all: %s", total/per, strings.Join(s, ", "))
}

// parseCounter sums a counter from the Prometheus text format by the
// values of the given labels.
func parseCounter(text, name string, labels ...string) counts {
	out := counts{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"{") {
			continue
		}
		sp := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			continue
		}
		var key []string
		for _, lb := range labels {
			val := ""
			if _, rest, ok := strings.Cut(l, lb+`="`); ok {
				val, _, _ = strings.Cut(rest, `"`)
			}
			if val != "" {
				key = append(key, val)
			}
		}
		out[strings.Join(key, "/")] += v
	}
	return out
}

func q(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(math.Round(p*float64(len(s)-1)))]
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

// children are this process's child processes (etcd, kube-apiserver, Kueue,
// gpupack's manager) by command name.
func children() map[string]int {
	out := map[string]int{}
	me := os.Getpid()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pid, _ := strconv.Atoi(filepath.Base(d))
		if ppid == me {
			out[s[open+1:end]] = pid
		}
	}
	return out
}

// procCPU is a process's user+system CPU time (0 for pid 0 or unreadable).
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * time.Second / 100 // USER_HZ
}

func cpuOf(procs map[string]int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pid := range procs {
		out[name] = procCPU(pid)
	}
	return out
}

// procStatus reads a /proc/<pid>/status field in KiB.
func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

func secs(s float64) string {
	switch {
	case math.IsNaN(s):
		return "n/a"
	case math.IsInf(s, 1):
		return "> last bucket"
	}
	return ms(time.Duration(s * float64(time.Second)))
}

func mib(kib int64) string { return fmt.Sprintf("%.0f MiB", float64(kib)/1024) }

// report prints the table and returns the figures.
func report(out io.Writer, c Config, vs []*variant, rec *recorder, h hist, m *manager, mcpu time.Duration, mreq counts, eng engineFigures) *Report {
	rep := &Report{Admitted: map[string]int{}, RatePerSecond: map[string]float64{}, ManagerProcess: m.pid != 0}
	fmt.Fprintf(out, "\n## gang-fit end to end: %d nodes × 8 H100 (%d GPUs), %d holder pods, %d Workloads per variant (1×1 / 8×1 / 2×8), %d batches, load %s\n\n",
		c.Nodes, c.Nodes*8, c.Pods, c.Workloads, c.Batches, loadavg())
	fmt.Fprintln(out, "| variant | admitted | admitted/s (all batches) | per-batch /s min–max | create→Admitted p50 / p99 | QuotaReserved→Admitted p50 / p99 |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|")
	rates := map[string][]float64{}
	for _, v := range vs {
		var total time.Duration
		n := 0
		for i, d := range v.batches {
			total += d
			n += v.counts[i]
			rates[v.name] = append(rates[v.name], float64(v.counts[i])/d.Seconds())
		}
		var c2a, q2a []time.Duration
		rec.mu.Lock()
		for _, k := range v.keys {
			t := rec.get(k)
			c2a = append(c2a, t.admitted.Sub(t.created))
			if !t.quota.IsZero() {
				q2a = append(q2a, t.admitted.Sub(t.quota))
			}
		}
		rec.mu.Unlock()
		rate := float64(n) / total.Seconds()
		rep.Admitted[v.name], rep.RatePerSecond[v.name] = n, rate
		r := rates[v.name]
		fmt.Fprintf(out, "| %s | %d | %.1f | %.1f–%.1f | %s / %s | %s / %s |\n", v.name, n, rate, slices.Min(r), slices.Max(r),
			ms(q(c2a, 0.5)), ms(q(c2a, 0.99)), ms(q(q2a, 0.5)), ms(q(q2a, 0.99)))
	}
	var qr []time.Duration
	rec.mu.Lock()
	for _, k := range vs[0].keys {
		t := rec.get(k)
		if !t.quota.IsZero() && !t.ready.IsZero() {
			qr = append(qr, t.ready.Sub(t.quota))
		}
		if t.retry {
			rep.CheckRetries++
		}
		if t.rejected {
			rep.CheckRejected++
		}
	}
	var noop []time.Duration
	for _, v := range vs[1:] {
		if v.ns != nsNoop {
			continue
		}
		for _, k := range v.keys {
			if t := rec.get(k); !t.quota.IsZero() && !t.ready.IsZero() {
				noop = append(noop, t.ready.Sub(t.quota))
			}
		}
	}
	rec.mu.Unlock()
	rep.QuotaToReady = qr
	if len(noop) > 0 {
		defer fmt.Fprintf(out, "- QuotaReserved→Ready of the no-op check (the driver's one status write), %d Workloads: p50 %s, p99 %s\n", len(noop), ms(q(noop, 0.5)), ms(q(noop, 0.99)))
	}
	fmt.Fprintln(out)
	ratio := func(x, y *variant) (float64, []float64) {
		a, b := rates[x.name], rates[y.name]
		var per []float64
		for i := range min(len(a), len(b)) {
			per = append(per, a[i]/b[i])
		}
		slices.Sort(per)
		return rep.RatePerSecond[x.name] / rep.RatePerSecond[y.name], per
	}
	pairs := [][2]int{{0, 1}, {2, 1}, {0, 2}}
	for _, p := range pairs {
		if p[0] >= len(vs) || p[1] >= len(vs) {
			continue
		}
		r, per := ratio(vs[p[0]], vs[p[1]])
		if p == [2]int{0, 1} {
			rep.Ratio = r
		}
		goal := ""
		if p == [2]int{0, 1} {
			goal = "; goal ≥ 0.9×"
		}
		fmt.Fprintf(out, "- **admitted/s %s ÷ %s: %.2f×** (per-batch ratios %.2f–%.2f, median %.2f%s)\n",
			vs[p[0]].name, vs[p[1]].name, r, per[0], per[len(per)-1], per[len(per)/2], goal)
	}
	fmt.Fprintf(out, "- **QuotaReserved→check Ready** (seen on the driver's watch), %d Workloads: p50 %s, **p99 %s**, max %s (goal p99 ≤ 100 ms); Retry seen on %d, Rejected on %d\n",
		len(qr), ms(q(qr, 0.5)), ms(q(qr, 0.99)), ms(q(qr, 1)), rep.CheckRetries, rep.CheckRejected)
	rep.Decisions = h.count
	if h.count > 0 {
		fmt.Fprintf(out, "- manager decision histogram (%s: model read, fit, GPUPlan create, check write), %d decisions: mean %s, p50 ≤ %s, **p99 ≤ %s** (bucket bounds; goal p99 ≤ 50 ms at 100k GPUs)\n",
			decisionMetric, h.count, ms(time.Duration(h.sum/float64(h.count)*float64(time.Second))), secs(h.quantile(0.5)), secs(h.quantile(0.99)))
	}
	if m.pid != 0 {
		rep.ManagerHWMKiB = procStatus(m.pid, "VmHWM")
		per := time.Duration(0)
		if h.count > 0 {
			per = mcpu / time.Duration(h.count)
		}
		fmt.Fprintf(out, "- manager process (%s): **VmHWM %s**, VmRSS %s (goal ≤ 1 GiB); CPU %v over the measured batches (%s per decision)\n",
			m.kind, mib(rep.ManagerHWMKiB), mib(procStatus(m.pid, "VmRSS")), mcpu.Round(10*time.Millisecond), ms(per))
	} else {
		fmt.Fprintf(out, "- manager in the driver's process (no separate RSS)\n")
	}
	if len(mreq) > 0 && h.count > 0 {
		fmt.Fprintf(out, "- manager API requests per decision (method/code): %s\n", mreq.top(8, float64(h.count)))
	}
	for _, v := range vs {
		if len(v.requests) > 0 {
			fmt.Fprintf(out, "- apiserver requests per admitted Workload, %s (resource/subresource/verb/code, all clients, metrics scrapes included): %s\n",
				v.name, v.requests.top(10, float64(max(rep.Admitted[v.name], 1))))
		}
	}
	for _, v := range vs {
		sum, cnt := v.latency[0], v.latency[1]
		var keys []string
		for k, n := range cnt {
			if n >= 0.5*float64(max(rep.Admitted[v.name], 1)) && !strings.Contains(k, "WATCH") {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		if len(keys) == 0 {
			continue
		}
		fmt.Fprintf(out, "- apiserver mean request time, %s (requests made at least every other Workload):", v.name)
		for _, k := range keys {
			fmt.Fprintf(out, " %s %s;", k, ms(time.Duration(sum[k]/cnt[k]*float64(time.Second))))
		}
		fmt.Fprintln(out)
	}
	var procs []string
	for name := range vs[0].cpu {
		procs = append(procs, name)
	}
	slices.Sort(procs)
	if len(procs) > 0 {
		fmt.Fprintf(out, "- CPU per admitted Workload (process CPU during each variant's batches):")
		for _, p := range procs {
			fmt.Fprintf(out, " %s", p)
			for i, v := range vs {
				sep := " /"
				if i == 0 {
					sep = ""
				}
				n := max(rep.Admitted[v.name], 1)
				fmt.Fprintf(out, "%s %s", sep, ms(v.cpu[p]/time.Duration(n)))
			}
			fmt.Fprint(out, ";")
		}
		fmt.Fprintf(out, " (%s)\n", variantNames(vs))
		for name, pid := range children() {
			if hwm := procStatus(pid, "VmHWM"); hwm > 0 {
				fmt.Fprintf(out, "  - %s VmHWM %s\n", name, mib(hwm))
			}
		}
	}
	if len(eng.engine) > 0 {
		rep.EngineP99 = q(eng.engine, 0.99)
		fmt.Fprintf(out, "- engine only, on the same cluster (%d nodes, %d pods, %d GPUPlans as the apiserver holds them, model fed in %v), %d fits of the mix: p50 %s, **p99 %s**; in-process decision (model read under the lock, fit, assume, forget; no API writes): p50 %s, p99 %s\n",
			eng.nodes, eng.pods, eng.plans, eng.fedIn.Round(time.Millisecond), len(eng.engine), ms(q(eng.engine, 0.5)), ms(rep.EngineP99), ms(q(eng.decision, 0.5)), ms(q(eng.decision, 0.99)))
	}
	return rep
}

func variantNames(vs []*variant) string {
	var s []string
	for _, v := range vs {
		s = append(s, v.name)
	}
	return strings.Join(s, " / ")
}
