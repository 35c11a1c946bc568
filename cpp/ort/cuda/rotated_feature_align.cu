// The ORT CUDA library's launches of RotatedFeatureAlign and mmcv's MMCVRotatedFeatureAlign
// (cuda/rotated_feature_align.h).
#include "ort/cuda/rotated_feature_align.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/rotated.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* rotated_feature_align(const T* features, const T* boxes, T* out,
                                  const kernels::RotatedFeatureAlignShape& shape, double spatial_scale, void* stream) {
  return message(kernels::cuda::rotated_feature_align_forward(features, boxes, out, shape, spatial_scale,
                                                              static_cast<cudaStream_t>(stream)));
}

template const char* rotated_feature_align(const float*, const float*, float*, const kernels::RotatedFeatureAlignShape&,
                                           double, void*);
template const char* rotated_feature_align(const double*, const double*, double*,
                                           const kernels::RotatedFeatureAlignShape&, double, void*);

}  // namespace opbridge::ort::cuda
