// The ORT CUDA library's launches of mmcv's MMCVMaskedConv2d (masked_conv2d.cu, compiled by nvcc), callable from
// the adapters in plain C++ (masked_conv2d.cc). Each returns nullptr once the kernel is queued on `stream`, or why it
// could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/masked_conv2d.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

// mmcv's MaskedConv2d: out [O, Ho, Wo] zeroed, then the masked positions (flat h * W + w, read and checked on the
// host; copied to the device here) computed. bias may be null.
template <class T>
const char* masked_conv2d(const T* features, const std::vector<int64_t>& positions, const T* weight, const T* bias,
                          T* out, const kernels::MaskedConv2dShape& shape, void* stream);

}  // namespace opbridge::ort::cuda
