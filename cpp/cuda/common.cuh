// The small CUDA layer under the torch CUDA adapters (cpp/cuda/<op>.cu): torch's current stream, the device
// guard, launch checks and grid sizes. The adapters are written against the stable-ABI torch layer
// (cpp/torch/api.h with OPBRIDGE_TORCH_STABLE): the library loads under every CUDA build of torch >= 2.10.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <torch/csrc/stable/accelerator.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_grid.cuh"
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

// Raises the error of the last launch (an invalid configuration, no kernel image for this GPU, ...), or the one
// a shared launcher (kernels/<op>.cuh) returned.
inline void check_launch(const char* op, cudaError_t error = cudaGetLastError()) {
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

using kernels::cuda::blocks_for;
using kernels::cuda::kThreads;

}  // namespace opbridge::cuda
