// The ORT CUDA library's launches of RoiAlignRotated and mmcv's/mmdeploy's MMCVRoIAlignRotated
// (cuda/roi_align_rotated.h).
#include "ort/cuda/roi_align_rotated.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/rotated.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* roi_align_rotated(const T* input, const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                              const kernels::RoiAlignRotatedShape& shape, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return with_rois(rois, s, [&](const auto* table) {
    return kernels::cuda::roi_align_rotated_forward(input, table, out, shape, s);
  });
}

template const char* roi_align_rotated(const float*, const std::vector<kernels::roi_align_rotated_detail::Roi>&, float*,
                                       const kernels::RoiAlignRotatedShape&, void*);
template const char* roi_align_rotated(const double*, const std::vector<kernels::roi_align_rotated_detail::Roi>&,
                                       double*, const kernels::RoiAlignRotatedShape&, void*);

}  // namespace opbridge::ort::cuda
