// The ORT CUDA library's kernel launches (launch.cu, compiled by nvcc; the kernels are kernels/<op>.cuh's, as in
// the torch CUDA ops), callable from the adapters in plain C++. Each returns nullptr once the kernel is queued on
// `stream`, or a message saying why it could not be.
#pragma once

#include <cstdint>

#include "kernels/broadcast.h"
#include "kernels/deform_conv2d.h"
#include "kernels/ms_deform_attn.h"

namespace opbridge::ort::cuda {

// T: float or double; my_add also float16 as uint16_t bits.
template <class T>
const char* my_add(const T* a, const T* b, T* out, const kernels::BinaryLoop& loop, void* stream);

// The level table (spatial_shapes, level_start_index) in host memory, checked by check_ms_deform_attn.
template <class T>
const char* ms_deform_attn(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                           const T* locations, const T* weights, T* out, const kernels::MSDeformAttnShape& shape,
                           void* stream);

template <class T>
const char* deform_conv2d(const T* input, const T* weight, const T* offset, const T* mask, const T* bias, T* out,
                          const kernels::DeformConv2dShape& shape, void* stream);

}  // namespace opbridge::ort::cuda
