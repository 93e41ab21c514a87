package inventory

import (
	"github.com/gpupack/gpupack/admissioncheck/api/v1alpha1"
	"github.com/gpupack/gpupack/admissioncheck/fit"
)

// What a pod or a plan holds is package usage's rule, not this package's.

// PlanFromResult renders a fit result as a plan spec (the controller fills
// in the workload's name and UID).
func PlanFromResult(r fit.Result) v1alpha1.GPUPlanSpec {
	spec := v1alpha1.GPUPlanSpec{Level: r.Level, Domain: r.Domain, PodCount: int32(len(r.Assignments)), Assignments: []v1alpha1.PodAssignment{}}
	for _, a := range r.Assignments {
		pa := v1alpha1.PodAssignment{PodSet: a.PodSet, Index: int32(a.Index), Node: a.Node}
		for _, u := range a.GPUs {
			pa.GPUs = append(pa.GPUs, v1alpha1.GPUAssignment{UUID: u.UUID, MemoryMiB: u.MemoryMiB, Cores: u.Cores, Exclusive: u.Exclusive})
		}
		spec.GPUCount += int32(len(a.GPUs))
		spec.Assignments = append(spec.Assignments, pa)
	}
	return spec
}
