// The ORT CUDA library's launches of mmcv's cummax, cummin and MMCVCornerPool (cuda/cummax.h).
#include "ort/cuda/cummax.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cumulative.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* cumulative_extreme(const T* input, T* values, int64_t* indices, const kernels::CumulativeShape& shape,
                               bool max, bool reverse, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return message(max ? kernels::cuda::cumulative_extreme<true>(input, values, indices, shape, reverse, s)
                     : kernels::cuda::cumulative_extreme<false>(input, values, indices, shape, reverse, s));
}

template const char* cumulative_extreme(const float*, float*, int64_t*, const kernels::CumulativeShape&, bool, bool,
                                        void*);
template const char* cumulative_extreme(const double*, double*, int64_t*, const kernels::CumulativeShape&, bool, bool,
                                        void*);
template const char* cumulative_extreme(const int64_t*, int64_t*, int64_t*, const kernels::CumulativeShape&, bool, bool,
                                        void*);

}  // namespace opbridge::ort::cuda
