// The ORT CUDA library's launches of mmcv's and mmdeploy's MMCVRoiAlign (roi_align.cu, compiled by nvcc), callable from
// the adapters in plain C++ (roi_align.cc). Each returns nullptr once the kernel is queued on `stream`, or why it could
// not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/roi_align_rotated.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

template <class T>
const char* roi_align(const T* input, const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                      const kernels::RoiAlignRotatedShape& shape, bool max_pool, void* stream);

}  // namespace opbridge::ort::cuda
