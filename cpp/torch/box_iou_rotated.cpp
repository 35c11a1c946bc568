// opbridge::box_iou_rotated: the overlaps of rotated boxes (mmcv's box_iou_rotated), CPU adapter of
// kernels/box_iou_rotated.h. mode 0 is IoU, 1 IoF (python/opbridge/ops/box_iou_rotated.py takes the names).
#include "torch/box_iou_rotated.h"

OPBRIDGE_LIBRARY_FRAGMENT(m) {
  m.def("box_iou_rotated(Tensor boxes1, Tensor boxes2, int mode=0, bool aligned=False, bool clockwise=True) -> Tensor");
}

namespace opbridge {
namespace {

using api::Tensor;

Tensor box_iou_rotated_cpu(const Tensor& boxes1, const Tensor& boxes2, int64_t mode, bool aligned, bool clockwise) {
  constexpr const char* kOp = "opbridge::box_iou_rotated";
  OPBRIDGE_CHECK(api::is_cpu(boxes1) && api::is_cpu(boxes2), kOp, ": expected CPU tensors, got boxes1 on ",
                 api::device_name(boxes1), " and boxes2 on ", api::device_name(boxes2));
  const auto shape = rotated_op::checked_box_iou(kOp, boxes1, boxes2, mode, aligned);
  const auto dtype = boxes1.scalar_type();
  if (api::is_half(dtype)) {  // half storage: the geometry in float32, the IoUs rounded once
    return api::to(box_iou_rotated_cpu(api::widened(boxes1), api::widened(boxes2), mode, aligned, clockwise), dtype);
  }
  auto out = aligned ? api::empty({shape.rows}, dtype) : api::empty({shape.rows, shape.cols}, dtype);
  if (out.numel() == 0) return out;
  const auto a = api::contiguous(boxes1), b = api::contiguous(boxes2);
  api::dispatch_floating(dtype, kOp, [&](auto tag) {
    using T = decltype(tag);
    kernels::box_iou_rotated(api::data<T>(a), api::data<T>(b), api::data<T>(out), shape, mode, clockwise,
                             [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); });
  });
  return out;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CPU(m) { OPBRIDGE_IMPL(m, "box_iou_rotated", box_iou_rotated_cpu); }

}  // namespace opbridge
