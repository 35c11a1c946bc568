// The ORT CUDA library's launches of the multi-scale deformable attention nodes (opbridge's and mmdeploy's)
// (ms_deform_attn.cu, compiled by nvcc), callable from the adapters in plain C++ (ms_deform_attn.cc). Each returns
// nullptr once the kernel is queued on `stream`, or why it could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/ms_deform_attn.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

// The level table (spatial_shapes, level_start_index) in host memory, checked by check_ms_deform_attn.
template <class T>
const char* ms_deform_attn(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                           const T* locations, const T* weights, T* out, const kernels::MSDeformAttnShape& shape,
                           void* stream);

}  // namespace opbridge::ort::cuda
