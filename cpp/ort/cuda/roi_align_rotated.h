// The ORT CUDA library's launches of RoiAlignRotated and mmcv's/mmdeploy's MMCVRoIAlignRotated (roi_align_rotated.cu,
// compiled by nvcc), callable from the adapters in plain C++ (roi_align_rotated.cc). Each returns nullptr once the
// kernel is queued on `stream`, or why it could not be.
#pragma once

#include <cstdint>

#include <functional>
#include <vector>

#include "kernels/roi_align_rotated.h"
#include "ort/cuda/launch.h"

namespace opbridge::ort::cuda {

// The rois read and checked on the host; copied to the device here (stream-ordered memory, freed after the kernel).
template <class T>
const char* roi_align_rotated(const T* input, const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                              const kernels::RoiAlignRotatedShape& shape, void* stream);

}  // namespace opbridge::ort::cuda
