// opbridge::rotated_feature_align: S2A-Net's / R3Det's feature refinement (mmcv's rotated_feature_align) and its
// backward (the gradient of the features; the boxes get none), CPU adapters of kernels/rotated_feature_align.h.
#include "torch/rotated_feature_align.h"

OPBRIDGE_LIBRARY_FRAGMENT(m) {
  m.def("rotated_feature_align(Tensor features, Tensor best_rboxes, float spatial_scale, int points=1) -> Tensor");
  m.def(
      "rotated_feature_align_backward(Tensor grad_output, Tensor best_rboxes, float spatial_scale, int points) "
      "-> Tensor");
}

namespace opbridge {
namespace {

using api::Tensor;
namespace k = kernels;

// CPU tensors only here (the CUDA adapter is cpp/cuda/rotated_feature_align.cu).
k::RotatedFeatureAlignShape checked(const char* op, const char* features_name, const Tensor& features,
                                    const Tensor& boxes, double spatial_scale, int64_t points) {
  OPBRIDGE_CHECK(api::is_cpu(features) && api::is_cpu(boxes), op, ": expected CPU tensors, got ", features_name, " on ",
                 api::device_name(features), " and best_rboxes on ", api::device_name(boxes));
  return rotated_feature_align_op::checked(op, features_name, features, boxes, spatial_scale, points);
}

const auto parallel_for = [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); };

Tensor rotated_feature_align_cpu(const Tensor& features, const Tensor& best_rboxes, double spatial_scale,
                                 int64_t points) {
  constexpr const char* kOp = "opbridge::rotated_feature_align";
  const auto shape = checked(kOp, "features", features, best_rboxes, spatial_scale, points);
  if (api::is_half(features.scalar_type())) {  // half storage: float32 arithmetic, one rounding at the end
    return api::to(rotated_feature_align_cpu(api::widened(features), api::widened(best_rboxes), spatial_scale, points),
                   features.scalar_type());
  }
  auto out = api::empty(api::sizes(features), features.scalar_type());
  if (out.numel() == 0) return out;
  const auto x = api::contiguous(features), b = api::contiguous(best_rboxes);
  api::dispatch_floating(features.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    k::rotated_feature_align(api::data<T>(x), api::data<T>(b), api::data<T>(out), shape, spatial_scale, parallel_for);
  });
  return out;
}

Tensor rotated_feature_align_backward_cpu(const Tensor& grad_output, const Tensor& best_rboxes, double spatial_scale,
                                          int64_t points) {
  constexpr const char* kOp = "opbridge::rotated_feature_align_backward";
  const auto shape = checked(kOp, "grad_output", grad_output, best_rboxes, spatial_scale, points);
  if (api::is_half(grad_output.scalar_type())) {  // a float32 gradient buffer, rounded once
    return api::to(
        rotated_feature_align_backward_cpu(api::widened(grad_output), api::widened(best_rboxes), spatial_scale, points),
        grad_output.scalar_type());
  }
  auto grad = api::empty(api::sizes(grad_output), grad_output.scalar_type());
  if (grad.numel() == 0) return grad;
  const auto g = api::contiguous(grad_output), b = api::contiguous(best_rboxes);
  api::dispatch_floating(grad_output.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    k::rotated_feature_align_backward(api::data<T>(g), api::data<T>(b), api::data<T>(grad), shape, spatial_scale,
                                      parallel_for);
  });
  return grad;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CPU(m) {
  OPBRIDGE_IMPL(m, "rotated_feature_align", rotated_feature_align_cpu);
  OPBRIDGE_IMPL(m, "rotated_feature_align_backward", rotated_feature_align_backward_cpu);
}

}  // namespace opbridge
