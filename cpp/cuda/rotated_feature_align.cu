// opbridge::rotated_feature_align and its backward on CUDA: one thread an output element, each pixel's samples from
// kernels/rotated_feature_align.h's box_samples (the CPU op's arithmetic). The backward scatters with atomics: the
// order of those additions, and so the gradient's last bits, can vary between runs
// (python/opbridge/ops/rotated_feature_align.py follows torch.use_deterministic_algorithms).
#include <limits>

#include "cuda/common.cuh"
#include "torch/rotated_feature_align.h"

namespace opbridge {
namespace {

using api::Tensor;
using kernels::RotatedFeatureAlignShape;
using kernels::roi_align_rotated_detail::Sample;

template <class T>
__global__ void forward_kernel(const T* __restrict__ features, const T* __restrict__ boxes, RotatedFeatureAlignShape s,
                               double scale, T* __restrict__ out) {
  const int64_t plane = s.height * s.width, total = s.batch * s.channels * plane;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t p = t % plane, n = t / (s.channels * plane);
    const T* map = features + (t - p);
    Sample samples[5];
    if (!kernels::rotated_feature_align_detail::box_samples(boxes + (n * plane + p) * 5, s.points, s.height, s.width,
                                                            scale, samples)) {
      out[t] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    double value = map[p];
    for (int64_t i = 0; i < s.points; ++i) value += kernels::roi_align_rotated_detail::sample_value(samples[i], map);
    out[t] = static_cast<T>(value);
  }
}

// grad (holding grad_output already: the identity term) += each sample's share at its four pixels.
template <class T>
__global__ void backward_kernel(const T* __restrict__ grad_output, const T* __restrict__ boxes,
                                RotatedFeatureAlignShape s, double scale, T* grad) {
  const int64_t plane = s.height * s.width, total = s.batch * s.channels * plane;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t p = t % plane, n = t / (s.channels * plane);
    Sample samples[5];
    if (!kernels::rotated_feature_align_detail::box_samples(boxes + (n * plane + p) * 5, s.points, s.height, s.width,
                                                            scale, samples)) {
      continue;
    }
    const T g = grad_output[t];
    T* map = grad + (t - p);
    for (int64_t i = 0; i < s.points; ++i) {
      if (!samples[i].inside) continue;
      for (int corner = 0; corner < 4; ++corner) {
        atomicAdd(map + samples[i].index[corner], static_cast<T>(g * samples[i].weight[corner]));
      }
    }
  }
}

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
    forward_kernel<T><<<cuda::blocks_for(out.numel()), cuda::kThreads, 0, context.stream>>>(
        api::data<T>(x), api::data<T>(b), shape, spatial_scale, api::data<T>(out));
  });
  cuda::check_launch(kOp);
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
    cuda::check_launch(kOp, cudaMemcpyAsync(api::data<T>(grad), api::data<T>(g), sizeof(T) * grad.numel(),
                                            cudaMemcpyDeviceToDevice, context.stream));
    backward_kernel<T><<<cuda::blocks_for(grad.numel()), cuda::kThreads, 0, context.stream>>>(
        api::data<T>(g), api::data<T>(b), shape, spatial_scale, api::data<T>(grad));
  });
  cuda::check_launch(kOp);
  return grad;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) {
  OPBRIDGE_IMPL(m, "rotated_feature_align", rotated_feature_align_cuda);
  OPBRIDGE_IMPL(m, "rotated_feature_align_backward", rotated_feature_align_backward_cuda);
}

}  // namespace opbridge
