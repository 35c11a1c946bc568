// The ORT CUDA library's launches of mmcv's cummax, cummin and MMCVCornerPool (cummax.cu, compiled by nvcc), callable
// from the adapters in plain C++ (cummax.cc). Each returns nullptr once the kernel is queued on `stream`, or why it
// could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/cumulative.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

// Running extremes (mmcv's cummax, cummin, MMCVCornerPool): max or min, from the far end when `reverse`; indices
// may be null. T: float, double or int64_t.
template <class T>
const char* cumulative_extreme(const T* input, T* values, int64_t* indices, const kernels::CumulativeShape& shape,
                               bool max, bool reverse, void* stream);

}  // namespace opbridge::ort::cuda
