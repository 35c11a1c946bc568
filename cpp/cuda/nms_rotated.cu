// opbridge::nms_rotated on CUDA: kernels/nms.cuh's suppression (the boxes sorted by score on the GPU, a bitmask of
// the overlapping pairs, the greedy pass in one block) with box_iou_rotated.h's double-precision IoU, the CPU op's.
// The host waits once, for the number of kept boxes (the output's size depends on the data).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "cuda/common.cuh"
#include "kernels/nms.cuh"
#include "torch/box_iou_rotated.h"

namespace opbridge {
namespace {

using api::Tensor;

template <class T>
Tensor suppress(const char* op, const Tensor& boxes, const Tensor& scores, const std::optional<Tensor>& labels,
                int64_t count, double iou_threshold, bool clockwise, cudaStream_t stream) {
  namespace kc = kernels::cuda;
  const auto b = api::contiguous(boxes), s = api::contiguous(scores);
  const Tensor* l = nullptr;
  Tensor long_labels;
  if (labels) {
    long_labels = api::contiguous(api::to(*labels, api::ScalarType::Long));
    l = &long_labels;
  }
  OPBRIDGE_CHECK(count <= kc::nms_device::kMaxBoxes, op, ": at most ", kc::nms_device::kMaxBoxes,
                 " boxes on CUDA (the grid of the suppression mask), got ", count, "; pre-filter the boxes by score");
  kc::NmsPlan<T, kernels::rotated::Polygon> plan;
  cuda::check_launch(op, kc::NmsPlan<T, kernels::rotated::Polygon>::make(count, plan));
  auto workspace = api::empty_on({static_cast<int64_t>(plan.bytes)}, api::ScalarType::Byte, boxes);
  const int64_t* keep = nullptr;
  int64_t kept = 0;
  cuda::check_launch(op, kc::nms(plan, workspace.mutable_data_ptr(), api::data<T>(s),
                                 l ? api::data<int64_t>(*l) : nullptr, kc::RotatedBoxes<T>{api::data<T>(b), clockwise},
                                 kc::RotatedOverlaps{iou_threshold}, stream, keep, kept));
  auto out = api::empty_on({kept}, api::ScalarType::Long, boxes);
  if (kept > 0) {
    cuda::check_launch(
        op, cudaMemcpyAsync(api::data<int64_t>(out), keep, sizeof(int64_t) * kept, cudaMemcpyDeviceToDevice, stream));
  }
  return out;
}

Tensor nms_rotated_cuda(const Tensor& boxes, const Tensor& scores, double iou_threshold,
                        const std::optional<Tensor>& labels, bool clockwise) {
  constexpr const char* kOp = "opbridge::nms_rotated";
  const int64_t count = rotated_op::checked_nms(kOp, boxes, scores, labels);
  const auto dtype = boxes.scalar_type();
  if (api::is_half(dtype)) {  // half storage: the overlaps computed in double, as for float32
    return nms_rotated_cuda(api::widened(boxes), api::widened(scores), iou_threshold, labels, clockwise);
  }
  if (count == 0) return api::empty_on({0}, api::ScalarType::Long, boxes);
  const cuda::Context context(boxes);
  Tensor out;
  api::dispatch_floating(dtype, kOp, [&](auto tag) {
    using T = decltype(tag);
    out = suppress<T>(kOp, boxes, scores, labels, count, iou_threshold, clockwise, context.stream);
  });
  return out;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) { OPBRIDGE_IMPL(m, "nms_rotated", nms_rotated_cuda); }

}  // namespace opbridge
