// opbridge::roi_align_rotated: RoIAlign over rotated regions (mmcv's roi_align_rotated) and its backward (the
// gradient of the input; rois get none), CPU adapters of kernels/roi_align_rotated.h.
#include <vector>

#include "torch/roi_align_rotated.h"

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

// CPU tensors only here (the CUDA adapter is cpp/cuda/roi_align_rotated.cu).
void check_cpu(const char* op, const Tensor& input) {
  OPBRIDGE_CHECK(api::is_cpu(input), op, ": expected CPU tensors, got input on ", api::device_name(input));
}

using roi_align_rotated_op::attributes;
using roi_align_rotated_op::checked;

const auto parallel_for = [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); };

Tensor roi_align_rotated_cpu(const Tensor& input, const Tensor& rois, int64_t pooled_height, int64_t pooled_width,
                             double spatial_scale, int64_t sampling_ratio, bool aligned, bool clockwise) {
  constexpr const char* kOp = "opbridge::roi_align_rotated";
  const auto a = attributes(pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise);
  check_cpu(kOp, input);
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
  check_cpu(kOp, input);
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
  roi_align_rotated_op::check_grad_output(kOp, grad_output, input, s);
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
