// Copyright 2024 The Kubeflow Authors
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//      http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// +k8s:defaulter-gen=TypeMeta
// +k8s:openapi-gen=true
// +k8s:deepcopy-gen=package

// Package v1alpha1 is the v1alpha1 version of the API.
//
// gpupack: an unmodified copy of the API types of
// github.com/kubeflow/trainer/v2@v2.2.0/pkg/apis/trainer/v1alpha1 (the
// Trainer release Kueue v0.17.0 requires), without zz_generated.openapi.go
// and zz_generated.defaults.go. That module's package does not compile
// against k8s.io/api v0.37 (its generated OpenAPI names
// corev1.WorkloadReference and corev1.PodStatusResult, which v0.37 no
// longer has), and moving k8s.io/* back to v0.35 for it would move
// controller-runtime and everything else. Refresh with
// hack/sync-trainer-api.sh when the module is bumped.
// +groupName=trainer.kubeflow.org

package v1alpha1
