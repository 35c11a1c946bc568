// The ORT CUDA library's launches of the multi-scale deformable attention nodes (opbridge's and mmdeploy's)
// (cuda/ms_deform_attn.h).
#include "ort/cuda/ms_deform_attn.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/ms_deform_attn.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* ms_deform_attn(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                           const T* locations, const T* weights, T* out, const kernels::MSDeformAttnShape& shape,
                           void* stream) {
  if (const char* unsupported = kernels::cuda::ms_deform_attn_unsupported(shape)) return unsupported;
  kernels::cuda::MSDeformAttnTable table;
  kernels::cuda::ms_deform_attn_levels(shape, spatial_shapes, level_start_index, table.levels);
  using D = typename Device<T>::type;  // float16 (bits): __half storage, float32 arithmetic
  return message(kernels::cuda::ms_deform_attn_forward(
      reinterpret_cast<const D*>(value), reinterpret_cast<const D*>(locations), reinterpret_cast<const D*>(weights),
      reinterpret_cast<D*>(out), shape, table, static_cast<cudaStream_t>(stream)));
}

template const char* ms_deform_attn(const float*, const int64_t*, const int64_t*, const float*, const float*, float*,
                                    const kernels::MSDeformAttnShape&, void*);
template const char* ms_deform_attn(const double*, const int64_t*, const int64_t*, const double*, const double*,
                                    double*, const kernels::MSDeformAttnShape&, void*);
template const char* ms_deform_attn(const uint16_t*, const int64_t*, const int64_t*, const uint16_t*, const uint16_t*,
                                    uint16_t*, const kernels::MSDeformAttnShape&, void*);

}  // namespace opbridge::ort::cuda
