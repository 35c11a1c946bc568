// opbridge::roi_align_rotated and its backward on CUDA: kernels/rotated.cuh's kernels (shared with the ORT CUDA
// library) on torch's stream. The rois are checked and read on the host
// (torch/roi_align_rotated.h: a wrong batch index is a RuntimeError, not a read out of bounds), then handed to the
// kernels. The backward scatters with atomics: the order of those additions, and so the gradient's last bits, can
// vary between runs (python/opbridge/ops/roi_align_rotated.py follows torch.use_deterministic_algorithms).
#include <vector>

#include "cuda/common.cuh"
#include "kernels/rotated.cuh"
#include "torch/roi_align_rotated.h"

namespace opbridge {
namespace {

using api::Tensor;
using kernels::roi_align_rotated_detail::Roi;

// The rois read on the host, copied to the device (from pageable memory: the copy has left `read` when it returns).
Tensor rois_on_device(const std::vector<Roi>& read, const Tensor& like, cudaStream_t stream, const char* op) {
  const auto bytes = static_cast<int64_t>(read.size() * sizeof(Roi));
  auto buffer = api::empty_on({bytes > 0 ? bytes : 1}, api::ScalarType::Byte, like);
  if (bytes > 0) {
    cuda::check_launch(op, cudaMemcpyAsync(buffer.mutable_data_ptr(), read.data(), static_cast<size_t>(bytes),
                                           cudaMemcpyHostToDevice, stream));
  }
  return buffer;
}

Tensor roi_align_rotated_cuda(const Tensor& input, const Tensor& rois, int64_t pooled_height, int64_t pooled_width,
                              double spatial_scale, int64_t sampling_ratio, bool aligned, bool clockwise) {
  constexpr const char* kOp = "opbridge::roi_align_rotated";
  const auto a =
      roi_align_rotated_op::attributes(pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise);
  if (api::is_half(input.scalar_type())) {  // half storage: float32 arithmetic, one rounding at the end
    roi_align_rotated_op::checked(kOp, input, rois, a);
    return api::to(roi_align_rotated_cuda(api::widened(input), api::widened(rois), pooled_height, pooled_width,
                                          spatial_scale, sampling_ratio, aligned, clockwise),
                   input.scalar_type());
  }
  const auto c = roi_align_rotated_op::checked(kOp, input, rois, a);
  const auto& s = c.shape;
  auto out = api::empty_on({s.rois, s.channels, s.pooled_height, s.pooled_width}, input.scalar_type(), input);
  if (out.numel() == 0) return out;
  const cuda::Context context(input);
  const auto x = api::contiguous(input);
  const auto table = rois_on_device(c.read, input, context.stream, kOp);
  api::dispatch_floating(input.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    cuda::check_launch(
        kOp, kernels::cuda::roi_align_rotated_forward(api::data<T>(x), static_cast<const Roi*>(table.const_data_ptr()),
                                                      api::data<T>(out), s, context.stream));
  });
  return out;
}

Tensor roi_align_rotated_backward_cuda(const Tensor& grad_output, const Tensor& input, const Tensor& rois,
                                       int64_t pooled_height, int64_t pooled_width, double spatial_scale,
                                       int64_t sampling_ratio, bool aligned, bool clockwise) {
  constexpr const char* kOp = "opbridge::roi_align_rotated_backward";
  const auto a =
      roi_align_rotated_op::attributes(pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise);
  const auto c = roi_align_rotated_op::checked(kOp, input, rois, a);
  const auto& s = c.shape;
  roi_align_rotated_op::check_grad_output(kOp, grad_output, input, s);
  if (api::is_half(input.scalar_type())) {  // a float32 gradient buffer (a sum over rois), rounded once
    return api::to(
        roi_align_rotated_backward_cuda(api::widened(grad_output), api::widened(input), api::widened(rois),
                                        pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, clockwise),
        input.scalar_type());
  }
  auto grad_input = api::zeros_on(api::sizes(input), input.scalar_type(), input);
  if (grad_output.numel() == 0 || grad_input.numel() == 0) return grad_input;
  const cuda::Context context(input);
  const auto g = api::contiguous(grad_output);
  const auto table = rois_on_device(c.read, input, context.stream, kOp);
  api::dispatch_floating(input.scalar_type(), kOp, [&](auto tag) {
    using T = decltype(tag);
    cuda::check_launch(
        kOp, kernels::cuda::roi_align_rotated_backward(api::data<T>(g), static_cast<const Roi*>(table.const_data_ptr()),
                                                       api::data<T>(grad_input), s, context.stream));
  });
  return grad_input;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) {
  OPBRIDGE_IMPL(m, "roi_align_rotated", roi_align_rotated_cuda);
  OPBRIDGE_IMPL(m, "roi_align_rotated_backward", roi_align_rotated_backward_cuda);
}

}  // namespace opbridge
