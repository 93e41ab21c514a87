// Package v1alpha1 holds gpupack's API: the gpupack.io/v1alpha1 CRDs
// (GangFitParameters, GPUPlan) and the public contracts every part of gpupack
// shares — annotation keys, resource names, hook environment variables and the
// node inventory / device assignment formats (see DESIGN.md).
//
// +kubebuilder:object:generate=true
// +groupName=gpupack.io
package v1alpha1
