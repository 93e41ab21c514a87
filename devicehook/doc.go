// Package devicehook holds gpupack's CUDA driver-API interposer
// (libgpupack-hook.so, written in C under src/) and the Go tests that build
// it with `make -C devicehook` and drive it through the real dynamic linker
// against a fake libcuda.so.1 / libnvidia-ml.so.1 (fake/).
//
// The library enforces per-container GPU memory limits and SM-percentage
// throttling under HAMi-core's environment contract
// (CUDA_DEVICE_MEMORY_LIMIT[_i], CUDA_DEVICE_SM_LIMIT[_i],
// CUDA_DEVICE_MEMORY_SHARED_CACHE, LIBCUDA_LOG_LEVEL). See
// docs/devicehook.md. The node agent that installs it lives in
// devicehook/node.
package devicehook
