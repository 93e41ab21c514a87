package webhooks

import (
	"context"
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	cradmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpupack/gpupack/webhooks/mutation"
)

// FuzzJobKindHandlers: for any request body, the job kinds' handlers never
// panic; an allowed answer's patch applies to the body, and the result is a
// fixed point (mutating it again yields no patch).
func FuzzJobKindHandlers(f *testing.F) {
	f.Add(0, false, []byte(`{"metadata":{"annotations":{"gpupack.io/gpu-memory":"20Gi"}},"spec":{"replicatedJobs":[{"name":"w","template":{"spec":{"template":{"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}}}}]}}`))
	f.Add(1, true, []byte(`{"spec":{"leaderWorkerTemplate":{"leaderTemplate":{"metadata":{"annotations":{"nvidia.com/gpumem":"3000"}},"spec":{"containers":[{"name":"l","resources":{"limits":{"nvidia.com/gpu":1}}}]}},"workerTemplate":{"spec":{"containers":[]}}}}}`))
	f.Add(2, false, []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpumem-percentage":"25"}}}],"nodeSelector":{"nvidia.com/gpu.product":"NVIDIA-H100-80GB-HBM3"}}}}}`))
	f.Add(3, false, []byte(`{"spec":{"template":null}}`))
	f.Add(0, true, []byte(`{"spec":{"replicatedJobs":[null,{"template":{"spec":{"template":{"metadata":{"annotations":{"gpupack.io/plan":"p"}}}}}}]}}`))
	f.Add(0, false, []byte(`[1,2]`))
	// TrainJob (4), TrainingRuntime (5), ClusterTrainingRuntime (6), RayJob (7), RayCluster (8), MPIJob (9).
	f.Add(4, false, []byte(`{"metadata":{"annotations":{"gpupack.io/gpu-memory":"20Gi"}},"spec":{"runtimeRef":{"name":"torch"},"trainer":{"resourcesPerNode":{"limits":{"nvidia.com/gpu":"2","cpu":"4"}}}}}`))
	f.Add(4, true, []byte(`{"spec":{"suspend":true,"trainer":{"resourcesPerNode":{"limits":{"nvidia.com/gpu":1,"nvidia.com/gpumem":3000}}}}}`))
	f.Add(4, false, []byte(`{"spec":{"trainer":null}}`))
	f.Add(5, false, []byte(`{"spec":{"template":{"spec":{"replicatedJobs":[{"name":"node","template":{"spec":{"template":{"metadata":{"annotations":{"gpupack.io/gpu-memory":"8Gi"}},"spec":{"containers":[{"name":"node","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}}}}]}}}}`))
	f.Add(6, false, []byte(`{"metadata":{"annotations":{"nvidia.com/gpumem":"4096"}},"spec":{"template":{"spec":{"replicatedJobs":[{"name":"node","template":{"spec":{"template":{"spec":{"containers":[{"name":"node","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}}}}]}}}}`))
	f.Add(7, false, []byte(`{"metadata":{"annotations":{"gpupack.io/gpu-memory":"16Gi"}},"spec":{"rayClusterSpec":{"headGroupSpec":{"template":{"spec":{"containers":[{"name":"h"}]}}},"workerGroupSpecs":[{"groupName":"g","template":{"spec":{"containers":[{"name":"w","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}}]},"submitterPodTemplate":{"spec":{"containers":[{"name":"s"}]}}}}`))
	f.Add(7, true, []byte(`{"spec":{"suspend":false,"rayClusterSpec":{"headGroupSpec":{"template":{"metadata":{"annotations":{"gpupack.io/plan":"p"}},"spec":{"containers":[{"name":"h","resources":{"limits":{"gpupack.io/vgpu":"1","gpupack.io/gpu-memory":"1024"}}}]}}}}}}`))
	f.Add(8, false, []byte(`{"spec":{"headGroupSpec":{"template":{"spec":{"containers":[{"name":"h","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpucores":"30","nvidia.com/gpumem":"2000"}}}]}}},"workerGroupSpecs":[null]}}`))
	f.Add(9, false, []byte(`{"metadata":{"annotations":{"gpupack.io/gpu-memory":"10Gi"}},"spec":{"mpiReplicaSpecs":{"Launcher":{"template":{"spec":{"containers":[{"name":"l"}]}}},"Worker":{"template":{"spec":{"containers":[{"name":"w","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}},"Bogus":null}}}`))
	m, err := mutation.New(Config{})
	if err != nil {
		f.Fatal(err)
	}
	hs := kindHandlers(m, kueueView{m: m})
	f.Fuzz(func(t *testing.T, kind int, update bool, raw []byte) {
		jk := jobKinds[AllJobKinds[((kind%len(AllJobKinds))+len(AllJobKinds))%len(AllJobKinds)]]
		op := admissionv1.Create
		if update {
			op = admissionv1.Update
		}
		req := func(b []byte) cradmission.Request {
			return cradmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Namespace: "ns",
				Object: kruntime.RawExtension{Raw: b}, OldObject: kruntime.RawExtension{Raw: b}}}
		}
		resp := hs[jk.mutate].Handle(context.Background(), req(raw))
		_ = hs[jk.validate].Handle(context.Background(), req(raw))
		if !resp.Allowed || len(resp.Patches) == 0 {
			return
		}
		ops, err := json.Marshal(resp.Patches)
		if err != nil {
			t.Fatal(err)
		}
		p, err := jsonpatch.DecodePatch(ops)
		if err != nil {
			t.Fatalf("undecodable patch %s: %v", ops, err)
		}
		out, err := p.Apply(raw)
		if err != nil {
			t.Fatalf("patch %s does not apply to %s: %v", ops, raw, err)
		}
		again := hs[jk.mutate].Handle(context.Background(), req(out))
		if !again.Allowed || len(again.Patches) != 0 {
			t.Errorf("%s: not a fixed point: allowed %v, patches %v\nfirst %s\nafter %s", jk.kind, again.Allowed, again.Patches, raw, out)
		}
	})
}
