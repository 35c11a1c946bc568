// opbridge::rotated_feature_align and its backward on CUDA: kernels/rotated.cuh's kernels (shared with the ORT CUDA
// library) on torch's stream. The backward scatters with atomics: the order of those additions, and so the
// gradient's last bits, can vary between runs (python/opbridge/ops/rotated_feature_align.py follows
// torch.use_deterministic_algorithms).
#include "cuda/common.cuh"
#include "kernels/rotated.cuh"
#include "torch/rotated_feature_align.h"

namespace opbridge {
namespace {

using api::Tensor;

Tensor rotated_feature_align_cuda(const Tensor& features, const Tensor& best_rboxes, double spatial_scale,
                                  int64_t points) {
  constexpr const char* kOp = "opbridge::rotated_feature_align";
  const auto shape = rotated_feature_align_op::checked(kOp, "features", features, best_rboxes, spatial_scale, points);
  if (api::is_half(features.scalar_type())) {  // half storage: float32 arithmetic, one rounding at the end
    return api::to(rotated_feature_align_cuda(api::widened(features), api::widened(best_rboxes), spatial_scale, points),
                   features.scalar_type());
  }
  auto out = api::empty_on(api::sizes(features), features.scalar_type(), features);
  if (out.numel() == 0) return out;
  const cuda::Context context(features);
  const auto x = api::contiguous(features), b = api::contiguous(best_rboxes);
  api::dispatch_floating(features.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    cuda::check_launch(
        kOp, kernels::cuda::rotated_feature_align_forward(api::data<T>(x), api::data<T>(b), api::data<T>(out), shape,
                                                          spatial_scale, context.stream));
  });
  return out;
}

Tensor rotated_feature_align_backward_cuda(const Tensor& grad_output, const Tensor& best_rboxes, double spatial_scale,
                                           int64_t points) {
  constexpr const char* kOp = "opbridge::rotated_feature_align_backward";
  const auto shape =
      rotated_feature_align_op::checked(kOp, "grad_output", grad_output, best_rboxes, spatial_scale, points);
  if (api::is_half(grad_output.scalar_type())) {  // a float32 gradient buffer, rounded once
    return api::to(rotated_feature_align_backward_cuda(api::widened(grad_output), api::widened(best_rboxes),
                                                       spatial_scale, points),
                   grad_output.scalar_type());
  }
  const auto g = api::contiguous(grad_output), b = api::contiguous(best_rboxes);
  auto grad = api::empty_on(api::sizes(grad_output), grad_output.scalar_type(), grad_output);
  if (grad.numel() == 0) return grad;
  const cuda::Context context(grad_output);
  api::dispatch_floating(grad_output.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    cuda::check_launch(
        kOp, kernels::cuda::rotated_feature_align_backward(api::data<T>(g), api::data<T>(b), api::data<T>(grad), shape,
                                                           spatial_scale, context.stream));
  });
  return grad;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) {
  OPBRIDGE_IMPL(m, "rotated_feature_align", rotated_feature_align_cuda);
  OPBRIDGE_IMPL(m, "rotated_feature_align_backward", rotated_feature_align_backward_cuda);
}

}  // namespace opbridge
