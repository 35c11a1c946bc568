// The ORT CUDA library's launches of mmcv's MMCVMaskedConv2d (cuda/masked_conv2d.h).
#include "ort/cuda/masked_conv2d.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/masked_conv2d.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* masked_conv2d(const T* features, const std::vector<int64_t>& positions, const T* weight, const T* bias,
                          T* out, const kernels::MaskedConv2dShape& shape, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const auto count = static_cast<int64_t>(positions.size());
  const DeviceScratch table(sizeof(int64_t) * positions.size(), s);
  if (table.error() != nullptr) return table.error();
  if (count > 0) {
    // From pageable memory: returns once `positions` is staged.
    const cudaError_t copied = cudaMemcpyAsync(table.get<int64_t>(), positions.data(),
                                               sizeof(int64_t) * positions.size(), cudaMemcpyHostToDevice, s);
    if (copied != cudaSuccess) return message(copied);
  }
  return message(kernels::cuda::masked_conv2d(features, table.get<int64_t>(), count, weight, bias, out, shape, s));
}

template const char* masked_conv2d(const float*, const std::vector<int64_t>&, const float*, const float*, float*,
                                   const kernels::MaskedConv2dShape&, void*);
template const char* masked_conv2d(const double*, const std::vector<int64_t>&, const double*, const double*, double*,
                                   const kernels::MaskedConv2dShape&, void*);

}  // namespace opbridge::ort::cuda
