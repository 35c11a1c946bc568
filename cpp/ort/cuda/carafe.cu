// The ORT CUDA library's launches of mmcv's MMCVCARAFE and MMCVCARAFENaive (cuda/carafe.h).
#include "ort/cuda/carafe.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/carafe.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* carafe(const T* features, const T* masks, T* out, const kernels::CarafeShape& shape, void* stream) {
  return message(kernels::cuda::carafe(features, masks, out, shape, static_cast<cudaStream_t>(stream)));
}

template const char* carafe(const float*, const float*, float*, const kernels::CarafeShape&, void*);
template const char* carafe(const double*, const double*, double*, const kernels::CarafeShape&, void*);

}  // namespace opbridge::ort::cuda
