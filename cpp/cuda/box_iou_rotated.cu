// opbridge::box_iou_rotated on CUDA: kernels/box_iou_rotated.h's geometry (the same double-precision functions as
// the CPU op), one thread an overlap. The boxes are prepared once each (center, corners) into a device buffer.
#include "cuda/common.cuh"
#include "torch/box_iou_rotated.h"

namespace opbridge {
namespace {

using api::Tensor;
using kernels::rotated::Polygon;

template <class T>
__global__ void prepare_kernel(const T* __restrict__ boxes, int64_t count, bool clockwise, Polygon* polygons) {
  OPBRIDGE_GRID_LOOP(i, count) polygons[i] = kernels::rotated::prepare(boxes + 5 * i, clockwise);
}

template <class T>
__global__ void overlap_kernel(const Polygon* __restrict__ a, const Polygon* __restrict__ b,
                               kernels::BoxIouRotatedShape shape, int64_t mode, T* __restrict__ out) {
  const int64_t total = shape.aligned ? shape.rows : shape.rows * shape.cols;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t i = shape.aligned ? t : t / shape.cols, j = shape.aligned ? t : t % shape.cols;
    out[t] = static_cast<T>(kernels::rotated::overlap(a[i], b[j], mode));
  }
}

// A device buffer of `count` prepared boxes.
Tensor polygons_on(int64_t count, const Tensor& like) {
  return api::empty_on({count * static_cast<int64_t>(sizeof(Polygon))}, api::ScalarType::Byte, like);
}

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
  auto pa = polygons_on(shape.rows, boxes1), pb = polygons_on(shape.cols, boxes1);
  auto* polygons_a = static_cast<Polygon*>(pa.mutable_data_ptr());
  auto* polygons_b = static_cast<Polygon*>(pb.mutable_data_ptr());
  api::dispatch_floating(dtype, kOp, [&](auto tag) {
    using T = decltype(tag);
    prepare_kernel<T><<<cuda::blocks_for(shape.rows), cuda::kThreads, 0, context.stream>>>(api::data<T>(a), shape.rows,
                                                                                           clockwise, polygons_a);
    cuda::check_launch(kOp);
    prepare_kernel<T><<<cuda::blocks_for(shape.cols), cuda::kThreads, 0, context.stream>>>(api::data<T>(b), shape.cols,
                                                                                           clockwise, polygons_b);
    cuda::check_launch(kOp);
    overlap_kernel<T><<<cuda::blocks_for(out.numel()), cuda::kThreads, 0, context.stream>>>(
        polygons_a, polygons_b, shape, mode, api::data<T>(out));
    cuda::check_launch(kOp);
  });
  return out;
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) { OPBRIDGE_IMPL(m, "box_iou_rotated", box_iou_rotated_cuda); }

}  // namespace opbridge
