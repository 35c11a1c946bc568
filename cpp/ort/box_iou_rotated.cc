// ORT adapter of kernels/box_iou_rotated.h: opbridge::BoxIouRotated(boxes1 [N, 5], boxes2 [M, 5]) -> [N, M] (or
// [N] with aligned=1), attributes mode (0: iou, 1: iof), aligned and clockwise (0 or 1). float, double and float16
// (computed in float32) on the CPU (here) and on CUDA (cuda/<op>.cc).
#include <vector>

#include "ort/rotated.h"

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void box_iou_rotated(OrtKernelContext* context, const T* boxes1, const T* boxes2, T* out,
                              const kernels::BoxIouRotatedShape& s, int64_t mode, bool clockwise) {
    const KernelInput<T> a(boxes1, s.rows * 5), b(boxes2, s.cols * 5);
    KernelOutput<T> y(out, s.aligned ? s.rows : s.rows * s.cols);
    kernels::box_iou_rotated(a.get(), b.get(), y.get(), s, mode, clockwise, SessionThreads(context));
    y.finish();
  }
};

void append_box_iou_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  rotated_adapter::append_box_iou_rotated<Cpu, float>(ops);
  rotated_adapter::append_box_iou_rotated<Cpu, double>(ops);
  rotated_adapter::append_box_iou_rotated<Cpu, Ort::Float16_t>(ops);
  rotated_adapter::append_box_iou_rotated<Cpu, Ort::BFloat16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_OP(BoxIouRotated, 1, append_box_iou_rotated);

}  // namespace opbridge::ort
