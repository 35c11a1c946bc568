// The ORT CUDA library's launches of mmcv's MMCVCARAFE and MMCVCARAFENaive (carafe.cu, compiled by nvcc), callable from
// the adapters in plain C++ (carafe.cc). Each returns nullptr once the kernel is queued on `stream`, or why it could
// not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/carafe.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

// mmcv's CARAFE: out [N, C, H * s, W * s].
template <class T>
const char* carafe(const T* features, const T* masks, T* out, const kernels::CarafeShape& shape, void* stream);

}  // namespace opbridge::ort::cuda
