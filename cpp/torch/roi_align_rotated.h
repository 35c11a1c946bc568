// The checks of opbridge::roi_align_rotated's arguments, shared by its CPU adapter (roi_align_rotated.cpp) and its
// CUDA adapter (cpp/cuda/roi_align_rotated.cu): dtypes, one device, shapes, and every roi's batch index and
// sampling grid (read on the host: a roi naming an image that is not there gives a RuntimeError, not a read out of
// bounds; on CUDA that costs one copy of the rois to the host per call).
#pragma once

#include <vector>

#include "kernels/roi_align_rotated.h"
#include "torch/api.h"

namespace opbridge::roi_align_rotated_op {

using api::Tensor;
namespace k = kernels;

struct Checked {
  k::RoiAlignRotatedShape shape;
  Tensor rois;  // contiguous, float32 where given in a half type, on the host
  std::vector<k::roi_align_rotated_detail::Roi> read;
};

inline Checked checked(const char* op, const Tensor& input, const Tensor& rois, const k::RoiAlignRotatedAttributes& a) {
  OPBRIDGE_CHECK(api::same_device(input, rois), op, ": input and rois must be on one device, got input on ",
                 api::device_name(input), " and rois on ", api::device_name(rois));
  const auto dtype = input.scalar_type();
  OPBRIDGE_CHECK(api::is_float_storage(dtype), op, ": expected ", api::kFloatStorageNames, " input, got ",
                 api::dtype_name(dtype));
  OPBRIDGE_CHECK(api::pairs_with(dtype, rois.scalar_type()), op, ": rois must have the dtype of input (",
                 api::dtype_name(dtype), ")", api::is_half(dtype) ? " or float32" : "", ", got ",
                 api::dtype_name(rois.scalar_type()));
  const k::RoiAlignRotatedNames names{op, "input", "rois"};
  Checked c{{}, api::contiguous(api::to_cpu(api::widened(rois))), {}};  // half rois read as float32
  auto status = k::check_roi_align_rotated(names, api::sizes(input), api::sizes(rois), a, c.shape);
  OPBRIDGE_CHECK(status.ok(), status.message);
  api::dispatch_floating(c.rois.scalar_type(), op, [&](auto tag) {
    using T = decltype(tag);
    status = k::read_rotated_rois(names, api::data<T>(c.rois), c.shape, a, c.read);
  });
  OPBRIDGE_CHECK(status.ok(), status.message);
  return c;
}

inline k::RoiAlignRotatedAttributes attributes(int64_t pooled_height, int64_t pooled_width, double spatial_scale,
                                               int64_t sampling_ratio, bool aligned, bool clockwise) {
  return {pooled_height, pooled_width, sampling_ratio, spatial_scale, aligned, clockwise};
}

// The backward's grad_output: on input's device, of its dtype and the output's shape.
inline void check_grad_output(const char* op, const Tensor& grad_output, const Tensor& input,
                              const k::RoiAlignRotatedShape& s) {
  const std::vector<int64_t> out_shape{s.rois, s.channels, s.pooled_height, s.pooled_width};
  OPBRIDGE_CHECK(api::same_device(grad_output, input) && grad_output.scalar_type() == input.scalar_type() &&
                     api::sizes(grad_output) == out_shape,
                 op, ": grad_output must be a tensor of input's dtype (", api::dtype_name(input.scalar_type()),
                 ") on its device (", api::device_name(input), ") with the output's shape ", api::Shape{out_shape},
                 ", got ", api::dtype_name(grad_output.scalar_type()), " ", api::shape_of(grad_output), " on ",
                 api::device_name(grad_output));
}

}  // namespace opbridge::roi_align_rotated_op
