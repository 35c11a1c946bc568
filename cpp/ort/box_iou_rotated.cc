// ORT adapter of kernels/box_iou_rotated.h: opbridge::BoxIouRotated(boxes1 [N, 5], boxes2 [M, 5]) -> [N, M] (or
// [N] with aligned=1), attributes mode (0: iou, 1: iof), aligned and clockwise (0 or 1), float, double and float16
// (computed in float32).
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
      const std::vector<int64_t> out_shape =
          aligned ? std::vector<int64_t>{shape.rows} : std::vector<int64_t>{shape.rows, shape.cols};
      KernelOutput<T> y(out.Allocate(out_shape), element_count(out_shape));
      if (shape.rows == 0 || shape.cols == 0) return Ort::Status(nullptr);
      kernels::box_iou_rotated(KernelInput<T>(boxes1).get(), KernelInput<T>(boxes2).get(), y.get(), shape, mode,
                               clockwise, SessionThreads(context));
      y.finish();
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
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp<BoxIouRotated<Ort::Float16_t>>("BoxIouRotated", "CPUExecutionProvider")));
}

}  // namespace

OPBRIDGE_ORT_OP(BoxIouRotated, 1, append_box_iou_rotated);

}  // namespace opbridge::ort
