// The small CUDA layer under the torch CUDA adapters (cpp/cuda/<op>.cu): torch's current stream, the device
// guard, launch checks and grid sizes. The adapters are written against the stable-ABI torch layer
// (cpp/torch/api.h with OPBRIDGE_TORCH_STABLE): the library loads under every CUDA build of torch >= 2.10.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <torch/csrc/stable/accelerator.h>

#include <algorithm>
#include <cstdint>

#include "torch/api.h"

namespace opbridge::cuda {

// torch's current CUDA stream on `device`. The shim function that gives it (aoti_torch_get_current_cuda_stream)
// lives in libtorch_cuda.so, which a CUDA build of torch has loaded before opbridge loads this library; it is
// looked up at run time, so the library links only to libtorch_cpu and builds against a CPU-only torch as well.
inline cudaStream_t current_stream(int32_t device) {
  using Getter = int32_t (*)(int32_t, void**);
  static const Getter getter = [] {
    void* symbol = dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
    if (symbol == nullptr) {
      if (void* library = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD)) {
        symbol = dlsym(library, "aoti_torch_get_current_cuda_stream");
      }
    }
    return reinterpret_cast<Getter>(symbol);
  }();
  OPBRIDGE_CHECK(getter != nullptr,
                 "opbridge's CUDA ops need torch's CUDA library (libtorch_cuda.so) loaded: install a CUDA build of "
                 "torch, or move the tensors to the CPU");
  void* stream = nullptr;
  OPBRIDGE_CHECK(getter(device, &stream) == 0, "opbridge: torch could not give the current CUDA stream of device ",
                 device);
  return static_cast<cudaStream_t>(stream);
}

// Raises the error of the last launch (an invalid configuration, no kernel image for this GPU, ...).
inline void check_launch(const char* op) {
  const cudaError_t error = cudaGetLastError();
  OPBRIDGE_CHECK(error == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(error),
                 error == cudaErrorNoKernelImageForDevice
                     ? " (opbridge's CUDA library has no code for this GPU's architecture; see "
                       "opbridge._build_info.CUDA_ARCHITECTURES)"
                     : "");
}

// The device of a call's tensors, current for the scope (as at::cuda::CUDAGuard), and its stream.
struct Context {
  explicit Context(const api::Tensor& tensor)
      : guard(static_cast<torch::stable::accelerator::DeviceIndex>(api::device_index(tensor))),
        stream(current_stream(api::device_index(tensor))) {}
  torch::stable::accelerator::DeviceGuard guard;
  cudaStream_t stream;
};

constexpr int kThreads = 256;

// Blocks for `work` items of `per_block` each, capped (kernels loop over the rest with a grid stride).
inline unsigned blocks_for(int64_t work, int64_t per_block = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, int64_t(1) << 20));
}

// for (i = first thread; i < n; i += all threads), in int64 (tensors may pass 2^31 elements).
#define OPBRIDGE_GRID_LOOP(i, n)                                                         \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

}  // namespace opbridge::cuda
