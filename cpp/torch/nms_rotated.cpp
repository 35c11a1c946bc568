// opbridge::nms_rotated: greedy non-maximum suppression of rotated boxes (mmcv's nms_rotated), CPU adapter of
// kernels/nms_rotated.h. Returns the kept indices (int64) in decreasing score order: how many depends on the
// data (python/opbridge/ops/nms_rotated.py declares that size to the tracers and builds mmcv's dets).
#include <algorithm>
#include <optional>
#include <vector>

#include "torch/box_iou_rotated.h"

OPBRIDGE_LIBRARY_FRAGMENT(m) {
  m.def(
      "nms_rotated(Tensor boxes, Tensor scores, float iou_threshold, Tensor? labels=None, bool clockwise=True) "
      "-> Tensor");
}

namespace opbridge {
namespace {

using api::Tensor;

Tensor nms_rotated_cpu(const Tensor& boxes, const Tensor& scores, double iou_threshold,
                       const std::optional<Tensor>& labels, bool clockwise) {
  constexpr const char* kOp = "opbridge::nms_rotated";
  OPBRIDGE_CHECK(api::is_cpu(boxes) && api::is_cpu(scores) && (!labels || api::is_cpu(*labels)), kOp,
                 ": expected CPU tensors, got boxes on ", api::device_name(boxes), " and scores on ",
                 api::device_name(scores));
  const int64_t count = rotated_op::checked_nms(kOp, boxes, scores, labels);
  const auto dtype = boxes.scalar_type();
  if (api::is_half(dtype)) {  // half storage: the overlaps computed in float32
    return nms_rotated_cpu(api::widened(boxes), api::widened(scores), iou_threshold, labels, clockwise);
  }
  std::vector<int64_t> keep;
  if (count > 0) {
    const auto b = api::contiguous(boxes), s = api::contiguous(scores);
    const auto l =
        labels ? std::optional<Tensor>(api::contiguous(api::to(*labels, api::ScalarType::Long))) : std::nullopt;
    api::dispatch_floating(dtype, kOp, [&](auto tag) {
      using T = decltype(tag);
      keep = kernels::nms_rotated(api::data<T>(b), api::data<T>(s), l ? api::data<int64_t>(*l) : nullptr, count,
                                  iou_threshold, clockwise);
    });
  }
  auto out = api::empty({static_cast<int64_t>(keep.size())}, api::ScalarType::Long);
  std::copy(keep.begin(), keep.end(), api::data<int64_t>(out));
  return out;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CPU(m) { OPBRIDGE_IMPL(m, "nms_rotated", nms_rotated_cpu); }

}  // namespace opbridge
