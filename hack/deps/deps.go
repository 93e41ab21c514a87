//go:build tools

// Package deps pins the libraries gpupack is built on, so that parallel work
// on different parts shares one go.mod. It is never compiled.
package deps

import (
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
	_ "github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	_ "github.com/open-policy-agent/cert-controller/pkg/rotator"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "google.golang.org/grpc"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/apis/meta/v1"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	_ "sigs.k8s.io/controller-runtime"
	_ "sigs.k8s.io/controller-runtime/pkg/envtest"
	_ "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	_ "sigs.k8s.io/kueue/pkg/util/admissioncheck"
	_ "sigs.k8s.io/kueue/pkg/workload"
	_ "sigs.k8s.io/yaml"
	_ "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	_ "volcano.sh/apis/pkg/apis/topology/v1alpha1"
)
