package inventory

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
	"github.com/gpupack/gpupack/flavors"
	"github.com/gpupack/gpupack/webhooks/gpureq"
)

// FuzzParseHAMiRegister: never panics; what it accepts is a usable
// inventory, and the legacy form round-trips.
func FuzzParseHAMiRegister(f *testing.F) {
	for _, s := range []string{
		"GPU-0,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:GPU-1,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:",
		"GPU-0,10,32768,100,x,0,false,3,hami-core:",
		`[{"id":"GPU-x","index":2,"count":10,"devmem":81559,"devcore":100,"type":"NVIDIA-H100","numa":0,"mode":"hami-core","health":true}]`,
		`[{"id":"a","devmem":-5}]`, ":::", "a,b,c,d,e,f,g", `[{"id":"a","devmem":1e99}]`, "a,1,1,1,x,0,true,-1,m:",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		devs, err := ParseHAMiRegister(s)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, d := range devs {
			if d.ID == "" || seen[d.ID] || d.DevMem <= 0 || (d.Index != nil && *d.Index < 0) {
				t.Fatalf("accepted a bad device %+v from %q", d, s)
			}
			seen[d.ID] = true
		}
		// A node built from it must be a valid fit.Node.
		n := mkNode("n").ann(v1alpha1.AnnotationHAMiNodeRegister, s).obj()
		fn, err := NodeFromObject(n, flavors.DefaultBuffer(), "")
		if err != nil || len(fn.GPUs) != len(devs) {
			t.Fatalf("NodeFromObject after a good parse: %v", err)
		}
		for _, g := range fn.GPUs {
			if g.AllocatableMiB < 0 || g.AllocatableMiB*100 > 90*g.PhysicalMiB {
				t.Fatalf("allocatable %d of %d breaks the 90%% line", g.AllocatableMiB, g.PhysicalMiB)
			}
		}
		if strings.HasPrefix(strings.TrimSpace(s), "[") {
			return
		}
		for _, d := range devs {
			if strings.ContainsAny(d.ID+d.Type+d.Mode, ",:") || strings.TrimSpace(d.ID) != d.ID || strings.TrimSpace(d.Mode) != d.Mode {
				return // not representable again
			}
		}
		again, err := ParseHAMiRegister(FormatHAMiLegacy(devs))
		if err != nil || len(again) != len(devs) {
			t.Fatalf("round trip of %q: %v", s, err)
		}
	})
}

// FuzzTemplateRequest: arbitrary resources and annotations either give a
// clear error or a pod set the engine accepts.
func FuzzTemplateRequest(f *testing.F) {
	f.Add(int64(1), int64(0), int64(0), int64(0), "20Gi", "30", "", "", "")
	f.Add(int64(0), int64(2), int64(40960), int64(60), "", "", "", "", "")
	f.Add(int64(0), int64(1), int64(0), int64(0), "", "", "", "50", "")
	f.Add(int64(2), int64(0), int64(0), int64(0), "", "", "3000", "", "0")
	f.Add(int64(-1), int64(3), int64(7), int64(301), "x", "101", "-2", "0", "abc")
	f.Fuzz(func(t *testing.T, gpus, vgpus, mem, cores int64, gm, gc, hm, hp, hc string) {
		tmpl := corev1.PodTemplateSpec{}
		tmpl.Annotations = map[string]string{}
		for k, v := range map[string]string{v1alpha1.AnnotationGPUMemory: gm, v1alpha1.AnnotationGPUCores: gc,
			v1alpha1.AnnotationHAMiGPUMem: hm, v1alpha1.AnnotationHAMiGPUMemPercentage: hp, v1alpha1.AnnotationHAMiGPUCores: hc} {
			if v != "" {
				tmpl.Annotations[k] = v
			}
		}
		res := corev1.ResourceList{}
		for n, v := range map[string]int64{v1alpha1.ResourceNvidiaGPU: gpus, v1alpha1.ResourceVGPU: vgpus, v1alpha1.ResourceGPUMemory: mem, v1alpha1.ResourceGPUCores: cores} {
			if v != 0 {
				res[corev1.ResourceName(n)] = *resource.NewQuantity(v, resource.DecimalSI)
			}
		}
		tmpl.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: res}}}
		ps, ok, err := TemplateRequest(&tmpl)
		if err != nil || !ok {
			return
		}
		ps.Name, ps.Count = "p", 1
		bad := ps.GPUsPerPod < 1 || ps.GPUsPerPod > 1024 || ps.MemoryMiB < 0 || ps.MemoryMiB > gpureq.MaxMemoryMiB ||
			ps.MemoryPercent < 0 || ps.MemoryPercent > 100 || ps.Cores < 0 || ps.Cores > 100 ||
			(ps.MemoryMiB > 0 && ps.MemoryPercent > 0)
		if bad {
			t.Fatalf("accepted an invalid request %+v", ps)
		}
		// The engine must take it without calling it invalid.
		r := fit.NewModel(nil).Fit(fit.Gang{PodSets: []fit.PodSet{ps}}, fit.Options{})
		for _, why := range r.Reasons {
			if strings.HasPrefix(why, "invalid request") {
				t.Fatalf("engine rejects %+v: %s", ps, why)
			}
		}
	})
}
