package mutation

import (
	"fmt"

	"github.com/gpupack/gpupack/flavors"
)

// HAMi's device selection annotations. HAMi's scheduler filters GPUs by
// type or UUID with them; gpupack's gang-fit plan picks the node and the
// GPUs itself and reads none of them, so a pod carrying one would be
// placed as if it were not there. They are refused where they are written
// (a pod, a job, a job's pod template), never silently ignored.
const (
	AnnotationHAMiUseGPUType   = "nvidia.com/use-gputype"
	AnnotationHAMiNoUseGPUType = "nvidia.com/nouse-gputype"
	AnnotationHAMiUseGPUUUID   = "nvidia.com/use-gpuuuid"
	AnnotationHAMiNoUseGPUUUID = "nvidia.com/nouse-gpuuuid"
)

// HAMiSelectionAnnotations are the annotations refuseHAMiSelection refuses, in the order it looks.
var HAMiSelectionAnnotations = []string{AnnotationHAMiUseGPUType, AnnotationHAMiNoUseGPUType, AnnotationHAMiUseGPUUUID, AnnotationHAMiNoUseGPUUUID}

// refuseHAMiSelection returns an error naming the first HAMi selection
// annotation of anns and what to use instead.
func refuseHAMiSelection(anns ...map[string]string) error {
	for _, k := range HAMiSelectionAnnotations {
		for _, ann := range anns {
			v, ok := ann[k]
			if !ok {
				continue
			}
			switch k {
			case AnnotationHAMiUseGPUType, AnnotationHAMiNoUseGPUType:
				return fmt.Errorf("annotation %s=%q is HAMi's GPU type selection, which gpupack's placement does not read (the pod would land on any GPU model); choose the model with nodeSelector %s (for example %s: NVIDIA-H100-80GB-HBM3), or queue the job to a ClusterQueue whose ResourceFlavor's nodeLabels name that model, and remove the annotation",
					k, v, flavors.LabelGPUProduct, flavors.LabelGPUProduct)
			default:
				return fmt.Errorf("annotation %s=%q is HAMi's GPU selection by UUID, which gpupack's placement does not read (the gang-fit plan picks the GPUs); to keep a job on or off some hardware use a nodeSelector or node affinity (%s, kubernetes.io/hostname) or a ResourceFlavor, and remove the annotation",
					k, v, flavors.LabelGPUProduct)
			}
		}
	}
	return nil
}
