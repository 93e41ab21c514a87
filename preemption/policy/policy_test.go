package policy

import (
	"testing"
	"time"
)

func TestEffective(t *testing.T) {
	p := Policy{
		MaxByPriorityClass: map[string]time.Duration{"batch-low": 2 * time.Minute, "research": 30 * time.Minute},
		MaxByClusterQueue:  map[string]time.Duration{"shared": 10 * time.Minute},
	}
	cases := []struct {
		name string
		v    Victim
		want Decision
	}{
		{"no annotation: the default", Victim{}, Decision{5 * time.Minute, 5 * time.Minute, SourceDefault, 5*time.Minute + DefaultMargin}},
		{"tenant asks less", Victim{Requested: time.Minute}, Decision{time.Minute, 5 * time.Minute, SourceTenant, time.Minute + DefaultMargin}},
		// The promise: a tenant's longer annotation never wins over the cap.
		{"tenant asks more than the global cap", Victim{Requested: 2 * time.Hour}, Decision{5 * time.Minute, 5 * time.Minute, SourceCap, 5*time.Minute + DefaultMargin}},
		{"priority class cap below the default", Victim{PriorityClass: "batch-low"}, Decision{2 * time.Minute, 2 * time.Minute, SourceCap, 2*time.Minute + DefaultMargin}},
		{"priority class cap above: tenant may use it", Victim{PriorityClass: "research", Requested: 20 * time.Minute}, Decision{20 * time.Minute, 30 * time.Minute, SourceTenant, 20*time.Minute + DefaultMargin}},
		{"priority class cap above, tenant asks more", Victim{PriorityClass: "research", Requested: time.Hour}, Decision{30 * time.Minute, 30 * time.Minute, SourceCap, 30*time.Minute + DefaultMargin}},
		{"class and queue: the smaller wins", Victim{PriorityClass: "research", ClusterQueue: "shared", Requested: time.Hour}, Decision{10 * time.Minute, 10 * time.Minute, SourceCap, 10*time.Minute + DefaultMargin}},
		{"queue only", Victim{ClusterQueue: "shared", Requested: 8 * time.Minute}, Decision{8 * time.Minute, 10 * time.Minute, SourceTenant, 8*time.Minute + DefaultMargin}},
		{"unknown names fall back to Max", Victim{PriorityClass: "x", ClusterQueue: "y", Requested: time.Hour}, Decision{5 * time.Minute, 5 * time.Minute, SourceCap, 5*time.Minute + DefaultMargin}},
	}
	for _, tc := range cases {
		if got := p.Effective(tc.v); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := p.MaxGrace("batch-low", ""); got != 2*time.Minute+DefaultMargin {
		t.Errorf("MaxGrace(batch-low) %v, want the class cap + the margin", got)
	}
	if got := (Policy{Margin: 10 * time.Second}).Effective(Victim{Requested: time.Hour}).Grace; got != 5*time.Minute+10*time.Second {
		t.Errorf("grace of a capped victim %v, want cap + margin", got)
	}
	if got := p.CapOfClass("batch-low"); got != 2*time.Minute {
		t.Errorf("CapOfClass(batch-low) %v, want its entry", got)
	}
	if got := p.CapOfClass("x"); got != 10*time.Minute {
		t.Errorf("CapOfClass of an unnamed class %v, want the largest of Max and the queue entries (10m)", got)
	}
	if got := p.LongestGrace(); got != 30*time.Minute+DefaultMargin {
		t.Errorf("LongestGrace %v", got)
	}
	if got := p.Longest(); got != 30*time.Minute {
		t.Errorf("Longest %v, want 30m", got)
	}
	// A default above the cap is clipped too.
	if got := (Policy{Default: time.Hour, Max: time.Minute}).Effective(Victim{}); got.Timeout != time.Minute {
		t.Errorf("default above the cap: %v", got)
	}
}

// Property: the effective timeout never exceeds the cap nor (when set) the
// tenant's request, and is positive.
func TestEffectiveNeverExceeds(t *testing.T) {
	p := Policy{Default: 3 * time.Minute, Max: 4 * time.Minute,
		MaxByPriorityClass: map[string]time.Duration{"a": time.Minute, "b": time.Hour},
		MaxByClusterQueue:  map[string]time.Duration{"q": 90 * time.Second}}
	for _, pc := range []string{"", "a", "b", "z"} {
		for _, cq := range []string{"", "q", "z"} {
			for _, req := range []time.Duration{0, time.Second, time.Minute, 2 * time.Minute, time.Hour, 100 * time.Hour} {
				d := p.Effective(Victim{PriorityClass: pc, ClusterQueue: cq, Requested: req})
				if c := p.CapOfClass(pc); d.Cap > c || p.MaxGraceOfClass(pc) != c+DefaultMargin {
					t.Errorf("pc=%q cq=%q: cap %v above the class's cap over every queue %v", pc, cq, d.Cap, c)
				}
				if d.Timeout <= 0 || d.Timeout > d.Cap || d.Cap != p.Cap(pc, cq) || (req > 0 && d.Timeout > req) || d.Cap > p.Longest() || d.Grace != d.Timeout+DefaultMargin || d.Grace > p.MaxGrace(pc, cq) {
					t.Errorf("pc=%q cq=%q req=%v: %+v", pc, cq, req, d)
				}
			}
		}
	}
}

func TestParseCaps(t *testing.T) {
	m, err := ParseCaps(" low=2m, high=1h30m ,")
	if err != nil || len(m) != 2 || m["low"] != 2*time.Minute || m["high"] != 90*time.Minute {
		t.Fatalf("ParseCaps: %v %v", m, err)
	}
	if got := FormatCaps(m); got != "high=1h30m0s,low=2m0s" {
		t.Errorf("FormatCaps %q", got)
	}
	for _, bad := range []string{"low", "=2m", "low=", "low=-1s", "low=0", "low=2x", "a=1m,a=2m"} {
		if _, err := ParseCaps(bad); err == nil {
			t.Errorf("ParseCaps(%q) accepted", bad)
		}
	}
	if m, err := ParseCaps(""); err != nil || len(m) != 0 {
		t.Errorf("empty: %v %v", m, err)
	}
}

func TestDeadline(t *testing.T) {
	at := time.Date(2026, 12, 1, 20, 0, 0, 900_000_000, time.FixedZone("x", 3600))
	v := FormatDeadline(at)
	if v != "2026-12-01T19:00:00Z" {
		t.Fatalf("FormatDeadline %q", v)
	}
	got, err := ParseDeadline(v)
	if err != nil || got.After(at) {
		t.Fatalf("ParseDeadline %v %v: must not be later than asked", got, err)
	}
	if _, err := ParseDeadline("soon"); err == nil {
		t.Error("ParseDeadline accepted garbage")
	}
}

func FuzzParseCaps(f *testing.F) {
	for _, s := range []string{"", "a=1m", "a=1m,b=2h", "a", "=", "a=1m,a=1m", " a = 3s ,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseCaps(s)
		if err != nil {
			return
		}
		for k, d := range m {
			if k == "" || d <= 0 {
				t.Fatalf("%q: bad entry %q=%v", s, k, d)
			}
		}
		back, err := ParseCaps(FormatCaps(m))
		if err != nil || len(back) != len(m) {
			t.Fatalf("%q: round trip %v %v", s, back, err)
		}
		if (Policy{MaxByPriorityClass: m}).Validate() != nil {
			t.Fatalf("%q: parsed caps do not validate", s)
		}
	})
}

// Shortest is the smallest cap of Max and every entry (for a pod whose class
// cannot be told): never the longest.
func TestShortest(t *testing.T) {
	p := Policy{Max: 5 * time.Minute, MaxByPriorityClass: map[string]time.Duration{"low": time.Minute, "research": 30 * time.Minute},
		MaxByClusterQueue: map[string]time.Duration{"big": 10 * time.Minute}, Margin: 15 * time.Second}
	if got := p.Shortest(); got != time.Minute {
		t.Errorf("Shortest = %s, want 1m", got)
	}
	if got := p.ShortestGrace(); got != time.Minute+15*time.Second {
		t.Errorf("ShortestGrace = %s, want 1m15s", got)
	}
	if got := (Policy{}).Shortest(); got != DefaultMax {
		t.Errorf("zero policy Shortest = %s, want %s", got, DefaultMax)
	}
}
