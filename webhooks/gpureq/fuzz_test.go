package gpureq

import (
	"testing"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
)

// FuzzParseMemoryMiB: never panics, and an accepted value is in range and is
// stable when printed back as plain MiB.
func FuzzParseMemoryMiB(f *testing.F) {
	for _, s := range []string{"20Gi", "20480", "1.5Gi", "1G", "0", "-1", "1e100", "100m", "1Ki", "9223372036854775807", "0x10", "1E3", "+5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseMemoryMiB(s)
		if err != nil {
			return
		}
		if n < 1 || n > MaxMemoryMiB {
			t.Fatalf("ParseMemoryMiB(%q) = %d out of range", s, n)
		}
		back, err := ParseMemoryMiB(itoa(n))
		if err != nil || back != n {
			t.Fatalf("round trip of %q: %d → %d, %v", s, n, back, err)
		}
	})
}

// FuzzEffective: never panics; a template that sets memory always wins.
func FuzzEffective(f *testing.F) {
	f.Add("20Gi", "30", "3000", "", "10Gi", "")
	f.Add("", "", "", "50", "", "100")
	f.Add("1", "1", "1", "1", "1", "1")
	f.Fuzz(func(t *testing.T, jm, jc, jh, jp, tm, tc string) {
		job := map[string]string{}
		set := func(m map[string]string, k, v string) {
			if v != "" {
				m[k] = v
			}
		}
		set(job, v1alpha1.AnnotationGPUMemory, jm)
		set(job, v1alpha1.AnnotationGPUCores, jc)
		set(job, v1alpha1.AnnotationHAMiGPUMem, jh)
		set(job, v1alpha1.AnnotationHAMiGPUMemPercentage, jp)
		tmpl := map[string]string{}
		set(tmpl, v1alpha1.AnnotationGPUMemory, tm)
		set(tmpl, v1alpha1.AnnotationHAMiGPUCores, tc)
		s, err := Effective(job, tmpl)
		if err != nil {
			return
		}
		if s.MemoryMiB < 0 || s.MemoryMiB > MaxMemoryMiB || s.Cores < 0 || s.Cores > 100 || s.MemoryPercent < 0 || s.MemoryPercent > 100 {
			t.Fatalf("out of range: %+v", s)
		}
		if s.MemoryMiB > 0 && s.MemoryPercent > 0 {
			t.Fatalf("both absolute and percent memory: %+v", s)
		}
		if tm != "" {
			want, _ := ParseMemoryMiB(tm)
			if s.MemoryMiB != want {
				t.Fatalf("template memory %q ignored: %+v", tm, s)
			}
		}
	})
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
