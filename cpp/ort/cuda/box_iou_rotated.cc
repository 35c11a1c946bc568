// The ORT CUDA library's BoxIouRotated: the adapter of ort/rotated.h with a device that queues
// this op's launches (cuda/box_iou_rotated.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/box_iou_rotated.h"
#include "ort/cuda/device.h"
#include "ort/rotated.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void box_iou_rotated(OrtKernelContext* context, const T* boxes1, const T* boxes2, T* out,
                              const kernels::BoxIouRotatedShape& s, int64_t mode, bool clockwise) {
    void* stream = stream_of(context);
    const DeviceInput<T> a(boxes1, s.rows * 5, stream), b(boxes2, s.cols * 5, stream);
    DeviceOutput<T> y(out, s.aligned ? s.rows : s.rows * s.cols, stream);
    check(cuda::box_iou_rotated(a.get(), b.get(), y.get(), s, mode, clockwise, stream));
    y.finish();
  }
};

void append_box_iou_rotated(Ops& ops) {
  rotated_adapter::append_box_iou_rotated<Cuda, float>(ops);
  rotated_adapter::append_box_iou_rotated<Cuda, double>(ops);
  rotated_adapter::append_box_iou_rotated<Cuda, Ort::Float16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_OP(BoxIouRotated, 1, append_box_iou_rotated);

}  // namespace opbridge::ort
