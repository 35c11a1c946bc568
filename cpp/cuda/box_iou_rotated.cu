// opbridge::box_iou_rotated on CUDA: kernels/rotated.cuh's kernels (shared with the ORT CUDA library) on torch's
// stream, the boxes prepared once each (center, corners) into buffers from torch's allocator.
#include "cuda/common.cuh"
#include "kernels/rotated.cuh"
#include "torch/box_iou_rotated.h"

namespace opbridge {
namespace {

using api::Tensor;
using kernels::rotated::Polygon;

Tensor box_iou_rotated_cuda(const Tensor& boxes1, const Tensor& boxes2, int64_t mode, bool aligned, bool clockwise) {
  constexpr const char* kOp = "opbridge::box_iou_rotated";
  const auto shape = rotated_op::checked_box_iou(kOp, boxes1, boxes2, mode, aligned);
  const auto dtype = boxes1.scalar_type();
  if (api::is_half(dtype)) {  // half storage: the geometry in double, the IoUs rounded once
    return api::to(box_iou_rotated_cuda(api::widened(boxes1), api::widened(boxes2), mode, aligned, clockwise), dtype);
  }
  auto out =
      aligned ? api::empty_on({shape.rows}, dtype, boxes1) : api::empty_on({shape.rows, shape.cols}, dtype, boxes1);
  if (out.numel() == 0) return out;
  const cuda::Context context(boxes1);
  const auto a = api::contiguous(boxes1), b = api::contiguous(boxes2);
  auto polygons = [&](int64_t count) {
    return api::empty_on({count * static_cast<int64_t>(sizeof(Polygon))}, api::ScalarType::Byte, boxes1);
  };
  auto polygons1 = polygons(shape.rows), polygons2 = polygons(shape.cols);
  api::dispatch_floating(dtype, kOp, [&](auto tag) {
    using T = decltype(tag);
    cuda::check_launch(kOp, kernels::cuda::box_iou_rotated_forward(
                                api::data<T>(a), api::data<T>(b), api::data<T>(out), shape, mode, clockwise,
                                static_cast<Polygon*>(polygons1.mutable_data_ptr()),
                                static_cast<Polygon*>(polygons2.mutable_data_ptr()), context.stream));
  });
  return out;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) { OPBRIDGE_IMPL(m, "box_iou_rotated", box_iou_rotated_cuda); }

}  // namespace opbridge
