// The ORT CUDA library's launches of BoxIouRotated (cuda/box_iou_rotated.h).
#include "ort/cuda/box_iou_rotated.h"

#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "kernels/rotated.cuh"
#include "ort/cuda/launch.cuh"

namespace opbridge::ort::cuda {

template <class T>
const char* box_iou_rotated(const T* boxes1, const T* boxes2, T* out, const kernels::BoxIouRotatedShape& shape,
                            int64_t mode, bool clockwise, void* stream) {
  using kernels::rotated::Polygon;
  const auto s = static_cast<cudaStream_t>(stream);
  const DeviceScratch polygons(sizeof(Polygon) * (shape.rows + shape.cols), s);
  if (polygons.error() != nullptr) return polygons.error();
  return message(kernels::cuda::box_iou_rotated_forward(
      boxes1, boxes2, out, shape, mode, clockwise, polygons.get<Polygon>(), polygons.get<Polygon>() + shape.rows, s));
}

template const char* box_iou_rotated(const float*, const float*, float*, const kernels::BoxIouRotatedShape&, int64_t,
                                     bool, void*);
template const char* box_iou_rotated(const double*, const double*, double*, const kernels::BoxIouRotatedShape&, int64_t,
                                     bool, void*);

}  // namespace opbridge::ort::cuda
