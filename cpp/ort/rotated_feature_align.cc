// ORT adapter of kernels/rotated_feature_align.h: opbridge::RotatedFeatureAlign and mmcv::MMCVRotatedFeatureAlign
// (the node mmcv 1.x's RotatedFeatureAlign symbolic writes, for S2A-Net and R3Det), one contract: inputs
// (features [N, C, H, W], best_rboxes [N, H, W, 5]), output [N, C, H, W], attributes spatial_scale (float) and
// points (1 or 5). float, double and float16 (computed in float32).
#include <string>
#include <vector>

#include "kernels/rotated_feature_align.h"
#include "ort/api.h"

namespace opbridge::ort {
namespace {

constexpr char kOp[] = "opbridge::RotatedFeatureAlign";
constexpr char kMmcvOp[] = "mmcv::MMCVRotatedFeatureAlign";

template <class T, const char* Op>
struct RotatedFeatureAlign {
  RotatedFeatureAlign(const OrtApi* api, const OrtKernelInfo* info)
      : spatial_scale(float_attribute(api, info, Op, "spatial_scale", 1.0f)),
        points(int_attribute(api, info, Op, "points", 1)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& features,
                      const Ort::Custom::Tensor<T>& boxes, Ort::Custom::Tensor<T>& out) {
    return guarded(Op, [&] {
      kernels::RotatedFeatureAlignShape shape;
      const auto status =
          kernels::check_rotated_feature_align({Op, "input features (index 0)", "input best_rboxes (index 1)"},
                                               features.Shape(), boxes.Shape(), spatial_scale, points, shape);
      if (!status.ok()) return from_kernel(status);
      KernelOutput<T> y(out.Allocate(features.Shape()), element_count(features.Shape()));
      if (shape.batch * shape.channels * shape.height * shape.width == 0) return Ort::Status(nullptr);
      kernels::rotated_feature_align(KernelInput<T>(features).get(), KernelInput<T>(boxes).get(), y.get(), shape,
                                     spatial_scale, SessionThreads(context));
      y.finish();
      return Ort::Status(nullptr);
    });
  }

  double spatial_scale;
  int64_t points;
};

template <const char* Op>
void append_for(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<RotatedFeatureAlign<float, Op>>(op_type, "CPUExecutionProvider")));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<RotatedFeatureAlign<double, Op>>(op_type, "CPUExecutionProvider")));
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp<RotatedFeatureAlign<Ort::Float16_t, Op>>(op_type, "CPUExecutionProvider")));
}

void append_rotated_feature_align(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<kOp>("RotatedFeatureAlign", ops);
}
void append_mmcv_rotated_feature_align(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<kMmcvOp>("MMCVRotatedFeatureAlign", ops);
}

}  // namespace

OPBRIDGE_ORT_OP(RotatedFeatureAlign, 1, append_rotated_feature_align);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRotatedFeatureAlign, 1, append_mmcv_rotated_feature_align);

}  // namespace opbridge::ort
