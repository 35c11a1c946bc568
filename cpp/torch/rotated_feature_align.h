// The checks of opbridge::rotated_feature_align's arguments, shared by its CPU adapter (rotated_feature_align.cpp)
// and its CUDA adapter (cpp/cuda/rotated_feature_align.cu): dtypes, one device, shapes.
#pragma once

#include "kernels/rotated_feature_align.h"
#include "torch/api.h"

namespace opbridge::rotated_feature_align_op {

using api::Tensor;

inline kernels::RotatedFeatureAlignShape checked(const char* op, const char* features_name, const Tensor& features,
                                                 const Tensor& boxes, double spatial_scale, int64_t points) {
  OPBRIDGE_CHECK(api::same_device(features, boxes), op, ": ", features_name,
                 " and best_rboxes must be on one device, got ", api::device_name(features), " and ",
                 api::device_name(boxes));
  const auto dtype = features.scalar_type();
  OPBRIDGE_CHECK(api::is_float_storage(dtype), op, ": expected ", api::kFloatStorageNames, " ", features_name, ", got ",
                 api::dtype_name(dtype));
  OPBRIDGE_CHECK(api::pairs_with(dtype, boxes.scalar_type()), op, ": best_rboxes must have the dtype of ",
                 features_name, " (", api::dtype_name(dtype), ")", api::is_half(dtype) ? " or float32" : "", ", got ",
                 api::dtype_name(boxes.scalar_type()));
  kernels::RotatedFeatureAlignShape shape;
  const auto status = kernels::check_rotated_feature_align({op, features_name, "best_rboxes"}, api::sizes(features),
                                                           api::sizes(boxes), spatial_scale, points, shape);
  OPBRIDGE_CHECK(status.ok(), status.message);
  return shape;
}

}  // namespace opbridge::rotated_feature_align_op
