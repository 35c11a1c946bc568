// The ORT CUDA library's launches of mmcv's and mmdeploy's grid_sampler (cuda/grid_sampler.h).
#include "ort/cuda/grid_sampler.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/grid_sample.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* grid_sample(const T* input, const T* grid, T* out, const kernels::GridSampleShape& shape,
                        const kernels::GridSampleAttributes& attributes, void* stream) {
  using D = typename Device<T>::type;  // float16 (bits): __half storage, float32 arithmetic
  return message(kernels::cuda::grid_sample_forward(reinterpret_cast<const D*>(input), reinterpret_cast<const D*>(grid),
                                                    reinterpret_cast<D*>(out), shape, attributes,
                                                    static_cast<cudaStream_t>(stream)));
}

template const char* grid_sample(const float*, const float*, float*, const kernels::GridSampleShape&,
                                 const kernels::GridSampleAttributes&, void*);
template const char* grid_sample(const double*, const double*, double*, const kernels::GridSampleShape&,
                                 const kernels::GridSampleAttributes&, void*);
template const char* grid_sample(const uint16_t*, const uint16_t*, uint16_t*, const kernels::GridSampleShape&,
                                 const kernels::GridSampleAttributes&, void*);

}  // namespace opbridge::ort::cuda
