// The ORT CUDA library's launches of the deformable convolution nodes (opbridge's, mmcv's and mmdeploy's)
// (deform_conv2d.cu, compiled by nvcc), callable from the adapters in plain C++ (deform_conv2d.cc). Each returns
// nullptr once the kernel is queued on `stream`, or why it could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/deform_conv2d.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

template <class T>
const char* deform_conv2d(const T* input, const T* weight, const T* offset, const T* mask, const T* bias, T* out,
                          const kernels::DeformConv2dShape& shape, void* stream);

}  // namespace opbridge::ort::cuda
