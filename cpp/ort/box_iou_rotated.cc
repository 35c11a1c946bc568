// ORT adapter of kernels/box_iou_rotated.h: opbridge::BoxIouRotated(boxes1 [N, 5], boxes2 [M, 5]) -> [N, M] (or
// [N] with aligned=1), attributes mode (0: iou, 1: iof), aligned and clockwise (0 or 1), float and double.
#include <string>
#include <vector>

#include "kernels/box_iou_rotated.h"
#include "ort/api.h"

namespace opbridge::ort {
namespace {

constexpr const char* kOp = "opbridge::BoxIouRotated";

template <class T>
struct BoxIouRotated {
  BoxIouRotated(const OrtApi* api, const OrtKernelInfo* info)
      : mode(int_attribute(api, info, kOp, "mode", 0)),
        aligned(bool_attribute(api, info, kOp, "aligned", false)),
        clockwise(bool_attribute(api, info, kOp, "clockwise", true)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& boxes1,
                      const Ort::Custom::Tensor<T>& boxes2, Ort::Custom::Tensor<T>& out) {
    return guarded(kOp, [&] {
      kernels::BoxIouRotatedShape shape;
      const auto status =
          kernels::check_box_iou_rotated(kOp, "input boxes1 (index 0)", boxes1.Shape(), "input boxes2 (index 1)",
                                         boxes2.Shape(), mode, aligned, shape);
      if (!status.ok()) return from_kernel(status);
      T* y = aligned ? out.Allocate({shape.rows}) : out.Allocate({shape.rows, shape.cols});
      if (shape.rows == 0 || shape.cols == 0) return Ort::Status(nullptr);
      kernels::box_iou_rotated(boxes1.Data(), boxes2.Data(), y, shape, mode, clockwise, SessionThreads(context));
      return Ort::Status(nullptr);
    });
  }

  int64_t mode;
  bool aligned, clockwise;
};

void append_box_iou_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<BoxIouRotated<float>>("BoxIouRotated", "CPUExecutionProvider")));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<BoxIouRotated<double>>("BoxIouRotated", "CPUExecutionProvider")));
}

}  // namespace

OPBRIDGE_ORT_OP(BoxIouRotated, 1, append_box_iou_rotated);

}  // namespace opbridge::ort
