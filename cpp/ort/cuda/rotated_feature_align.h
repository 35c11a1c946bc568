// The ORT CUDA library's launches of RotatedFeatureAlign and mmcv's MMCVRotatedFeatureAlign (rotated_feature_align.cu,
// compiled by nvcc), callable from the adapters in plain C++ (rotated_feature_align.cc). Each returns nullptr once the
// kernel is queued on `stream`, or why it could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/rotated_feature_align.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

template <class T>
const char* rotated_feature_align(const T* features, const T* boxes, T* out,
                                  const kernels::RotatedFeatureAlignShape& shape, double spatial_scale, void* stream);

}  // namespace opbridge::ort::cuda
