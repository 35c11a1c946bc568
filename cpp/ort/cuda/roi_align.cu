// The ORT CUDA library's launches of mmcv's and mmdeploy's MMCVRoiAlign (cuda/roi_align.h).
#include "ort/cuda/roi_align.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/roi_align.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* roi_align(const T* input, const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                      const kernels::RoiAlignRotatedShape& shape, bool max_pool, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return with_rois(rois, s, [&](const auto* table) {
    return kernels::cuda::roi_align_forward(input, table, out, shape, max_pool, s);
  });
}

template const char* roi_align(const float*, const std::vector<kernels::roi_align_rotated_detail::Roi>&, float*,
                               const kernels::RoiAlignRotatedShape&, bool, void*);
template const char* roi_align(const double*, const std::vector<kernels::roi_align_rotated_detail::Roi>&, double*,
                               const kernels::RoiAlignRotatedShape&, bool, void*);

}  // namespace opbridge::ort::cuda
