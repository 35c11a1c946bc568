// opbridge::roi_align_rotated: RoIAlign over rotated regions (mmcv's roi_align_rotated) and its backward (the
// gradient of the input; rois get none), CPU adapters of kernels/roi_align_rotated.h.
#include <vector>

#include "kernels/roi_align_rotated.h"
#include "torch/api.h"

OPBRIDGE_LIBRARY_FRAGMENT(m) {
  m.def(
      "roi_align_rotated(Tensor input, Tensor rois, int pooled_height, int pooled_width, float spatial_scale=1.0, "
      "int sampling_ratio=0, bool aligned=True, bool clockwise=False) -> Tensor");
  // The autograd formula of roi_align_rotated (python/opbridge/ops/roi_align_rotated.py); `input` gives the
  // gradient's shape and dtype.
  m.def(
      "roi_align_rotated_backward(Tensor grad_output, Tensor input, Tensor rois, int pooled_height, "
      "int pooled_width, float spatial_scale, int sampling_ratio, bool aligned, bool clockwise) -> Tensor");
}

namespace opbridge {
namespace {

using api::Tensor;
namespace k = kernels;

struct Checked {
  k::RoiAlignRotatedShape shape;
  Tensor rois;
  std::vector<k::roi_align_rotated_detail::Roi> read;
};

Checked checked(const char* op, const Tensor& input, const Tensor& rois, const k::RoiAlignRotatedAttributes& a) {
  OPBRIDGE_CHECK(api::is_cpu(input) && api::is_cpu(rois), op, ": expected CPU tensors, got input on ",
                 api::device_name(input), " and rois on ", api::device_name(rois));
  const auto dtype = input.scalar_type();
  OPBRIDGE_CHECK(api::is_float_storage(dtype), op, ": expected ", api::kFloatStorageNames, " input, got ",
                 api::dtype_name(dtype));
  OPBRIDGE_CHECK(api::pairs_with(dtype, rois.scalar_type()), op, ": rois must have the dtype of input (",
                 api::dtype_name(dtype), ")", api::is_half(dtype) ? " or float32" : "", ", got ",
                 api::dtype_name(rois.scalar_type()));
  const k::RoiAlignRotatedNames names{op, "input", "rois"};
  Checked c{{}, api::contiguous(api::widened(rois)), {}};  // half rois read as float32
  auto status = k::check_roi_align_rotated(names, api::sizes(input), api::sizes(rois), a, c.shape);
  OPBRIDGE_CHECK(status.ok(), status.message);
  api::dispatch_floating(c.rois.scalar_type(), op, [&](auto tag) {
    using T = decltype(tag);
    status = k::read_rotated_rois(names, api::data<T>(c.rois), c.shape, a, c.read);
  });
  OPBRIDGE_CHECK(status.ok(), status.message);
  return c;
}

k::RoiAlignRotatedAttributes attributes(int64_t pooled_height, int64_t pooled_width, double spatial_scale,
                                        int64_t sampling_ratio, bool aligned, bool clockwise) {
  return {pooled_height, pooled_width, sampling_ratio, spatial_scale, aligned, clockwise};
}

const auto parallel_for = [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); };

Tensor roi_align_rotated_cpu(const Tensor& input, const Tensor& rois, int64_t pooled_height, int64_t pooled_width,
                             double spatial_scale, int64_t sampling_ratio, bool aligned, bool clockwise) {
  constexpr const char* kOp = "opbridge::roi_align_rotated";
  const auto a = attributes(pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise);
  const auto c = checked(kOp, input, rois, a);
  if (api::is_half(input.scalar_type())) {  // half storage: float32 arithmetic, one rounding at the end
    return api::to(roi_align_rotated_cpu(api::widened(input), api::widened(rois), pooled_height, pooled_width,
                                         spatial_scale, sampling_ratio, aligned, clockwise),
                   input.scalar_type());
  }
  const auto& s = c.shape;
  auto out = api::empty({s.rois, s.channels, s.pooled_height, s.pooled_width}, input.scalar_type());
  if (out.numel() == 0) return out;
  const auto x = api::contiguous(input);
  api::dispatch_floating(input.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    k::roi_align_rotated(api::data<T>(x), c.read, api::data<T>(out), s, parallel_for);
  });
  return out;
}

Tensor roi_align_rotated_backward_cpu(const Tensor& grad_output, const Tensor& input, const Tensor& rois,
                                      int64_t pooled_height, int64_t pooled_width, double spatial_scale,
                                      int64_t sampling_ratio, bool aligned, bool clockwise) {
  constexpr const char* kOp = "opbridge::roi_align_rotated_backward";
  const auto a = attributes(pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise);
  const auto c = checked(kOp, input, rois, a);
  if (api::is_half(input.scalar_type())) {  // a float32 gradient buffer (a sum over rois), rounded once
    OPBRIDGE_CHECK(grad_output.scalar_type() == input.scalar_type(), kOp, ": grad_output must have input's dtype (",
                   api::dtype_name(input.scalar_type()), "), got ", api::dtype_name(grad_output.scalar_type()));
    return api::to(
        roi_align_rotated_backward_cpu(api::widened(grad_output), api::widened(input), api::widened(rois),
                                       pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise),
        input.scalar_type());
  }
  const auto& s = c.shape;
  const std::vector<int64_t> out_shape{s.rois, s.channels, s.pooled_height, s.pooled_width};
  OPBRIDGE_CHECK(api::is_cpu(grad_output) && grad_output.scalar_type() == input.scalar_type() &&
                     api::sizes(grad_output) == out_shape,
                 kOp, ": grad_output must be a CPU tensor of input's dtype and the output's shape ",
                 api::Shape{out_shape}, ", got ", api::dtype_name(grad_output.scalar_type()), " ",
                 api::shape_of(grad_output));
  auto grad_input = api::zeros(api::sizes(input), input.scalar_type());
  if (grad_output.numel() == 0 || grad_input.numel() == 0) return grad_input;
  const auto g = api::contiguous(grad_output);
  api::dispatch_floating(input.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    k::roi_align_rotated_backward(api::data<T>(g), c.read, api::data<T>(grad_input), s, parallel_for);
  });
  return grad_input;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CPU(m) {
  OPBRIDGE_IMPL(m, "roi_align_rotated", roi_align_rotated_cpu);
  OPBRIDGE_IMPL(m, "roi_align_rotated_backward", roi_align_rotated_backward_cpu);
}

}  // namespace opbridge
