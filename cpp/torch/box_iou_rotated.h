// The checks of opbridge::box_iou_rotated's and opbridge::nms_rotated's arguments, shared by their CPU adapters
// (box_iou_rotated.cpp, nms_rotated.cpp) and CUDA adapters (cpp/cuda/box_iou_rotated.cu, nms_rotated.cu): dtypes,
// one device, shapes.
#pragma once

#include <optional>
#include <vector>

#include "kernels/nms_rotated.h"
#include "torch/api.h"

namespace opbridge::rotated_op {

using api::Tensor;

inline kernels::BoxIouRotatedShape checked_box_iou(const char* op, const Tensor& boxes1, const Tensor& boxes2,
                                                   int64_t mode, bool aligned) {
  OPBRIDGE_CHECK(api::same_device(boxes1, boxes2), op, ": boxes1 and boxes2 must be on one device, got ",
                 api::device_name(boxes1), " and ", api::device_name(boxes2));
  const auto dtype = boxes1.scalar_type();
  OPBRIDGE_CHECK(dtype == boxes2.scalar_type(), op, ": boxes1 and boxes2 must have the same dtype, got ",
                 api::dtype_name(dtype), " and ", api::dtype_name(boxes2.scalar_type()));
  OPBRIDGE_CHECK(api::is_float_storage(dtype), op, ": expected ", api::kFloatStorageNames, " boxes, got ",
                 api::dtype_name(dtype));
  kernels::BoxIouRotatedShape shape;
  const auto status = kernels::check_box_iou_rotated(op, "boxes1", api::sizes(boxes1), "boxes2", api::sizes(boxes2),
                                                     mode, aligned, shape);
  OPBRIDGE_CHECK(status.ok(), status.message);
  return shape;
}

// The number of boxes.
inline int64_t checked_nms(const char* op, const Tensor& boxes, const Tensor& scores,
                           const std::optional<Tensor>& labels) {
  OPBRIDGE_CHECK(api::same_device(boxes, scores) && (!labels || api::same_device(boxes, *labels)), op,
                 ": boxes, scores and labels must be on one device, got boxes on ", api::device_name(boxes),
                 ", scores on ", api::device_name(scores), labels ? ", labels on " + api::device_name(*labels) : "");
  const auto dtype = boxes.scalar_type();
  OPBRIDGE_CHECK(dtype == scores.scalar_type(), op, ": boxes and scores must have the same dtype, got ",
                 api::dtype_name(dtype), " and ", api::dtype_name(scores.scalar_type()));
  OPBRIDGE_CHECK(!labels || api::is_integral(labels->scalar_type()), op, ": labels must be an integer tensor, got ",
                 api::dtype_name(labels ? labels->scalar_type() : dtype));
  OPBRIDGE_CHECK(api::is_float_storage(dtype), op, ": expected ", api::kFloatStorageNames, " boxes and scores, got ",
                 api::dtype_name(dtype));
  const auto label_shape = labels ? api::sizes(*labels) : std::vector<int64_t>{};
  int64_t count = 0;
  const auto status =
      kernels::check_nms_rotated(op, api::sizes(boxes), api::sizes(scores), labels ? &label_shape : nullptr, count);
  OPBRIDGE_CHECK(status.ok(), status.message);
  return count;
}

}  // namespace opbridge::rotated_op
