// The ORT CUDA library's launches (launch.h) of the shared CUDA kernels (kernels/<op>.cuh).
#include "ort/cuda/launch.h"

#include <cuda_fp16.h>

#include "kernels/deform_conv2d.cuh"
#include "kernels/ms_deform_attn.cuh"
#include "kernels/my_add.cuh"

namespace opbridge::ort::cuda {
namespace {

const char* message(cudaError_t error) { return error == cudaSuccess ? nullptr : cudaGetErrorString(error); }

template <class T>
struct Device {
  using type = T;
};
template <>
struct Device<uint16_t> {
  using type = __half;
};

}  // namespace

template <class T>
const char* my_add(const T* a, const T* b, T* out, const kernels::BinaryLoop& loop, void* stream) {
  if (!kernels::cuda::my_add_fits(loop)) return "more than 16 dimensions after merging broadcast ones";
  using D = typename Device<T>::type;
  using Acc = std::conditional_t<std::is_same_v<D, double>, double, float>;
  return message(kernels::cuda::my_add<D, Acc>(reinterpret_cast<const D*>(a), reinterpret_cast<const D*>(b),
                                               reinterpret_cast<D*>(out), loop, static_cast<cudaStream_t>(stream)));
}

template <class T>
const char* ms_deform_attn(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                           const T* locations, const T* weights, T* out, const kernels::MSDeformAttnShape& shape,
                           void* stream) {
  if (const char* unsupported = kernels::cuda::ms_deform_attn_unsupported(shape)) return unsupported;
  kernels::cuda::MSDeformAttnTable table;
  kernels::cuda::ms_deform_attn_levels(shape, spatial_shapes, level_start_index, table.levels);
  return message(kernels::cuda::ms_deform_attn_forward(value, locations, weights, out, shape, table,
                                                       static_cast<cudaStream_t>(stream)));
}

template <class T>
const char* deform_conv2d(const T* input, const T* weight, const T* offset, const T* mask, const T* bias, T* out,
                          const kernels::DeformConv2dShape& shape, void* stream) {
  return message(kernels::cuda::deform_conv2d_forward(input, weight, offset, mask, bias, shape, out,
                                                      static_cast<cudaStream_t>(stream)));
}

template const char* my_add(const float*, const float*, float*, const kernels::BinaryLoop&, void*);
template const char* my_add(const double*, const double*, double*, const kernels::BinaryLoop&, void*);
template const char* my_add(const uint16_t*, const uint16_t*, uint16_t*, const kernels::BinaryLoop&, void*);
template const char* ms_deform_attn(const float*, const int64_t*, const int64_t*, const float*, const float*, float*,
                                    const kernels::MSDeformAttnShape&, void*);
template const char* ms_deform_attn(const double*, const int64_t*, const int64_t*, const double*, const double*,
                                    double*, const kernels::MSDeformAttnShape&, void*);
template const char* deform_conv2d(const float*, const float*, const float*, const float*, const float*, float*,
                                   const kernels::DeformConv2dShape&, void*);
template const char* deform_conv2d(const double*, const double*, const double*, const double*, const double*, double*,
                                   const kernels::DeformConv2dShape&, void*);

}  // namespace opbridge::ort::cuda
