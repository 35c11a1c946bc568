// The ORT CUDA library's launches of BoxIouRotated (box_iou_rotated.cu, compiled by nvcc), callable from
// the adapters in plain C++ (box_iou_rotated.cc). Each returns nullptr once the kernel is queued on `stream`, or why it
// could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/box_iou_rotated.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

template <class T>
const char* box_iou_rotated(const T* boxes1, const T* boxes2, T* out, const kernels::BoxIouRotatedShape& shape,
                            int64_t mode, bool clockwise, void* stream);

}  // namespace opbridge::ort::cuda
