// ORT adapter of kernels/rotated_feature_align.h: opbridge::RotatedFeatureAlign and mmcv::MMCVRotatedFeatureAlign
// (the node mmcv 1.x's RotatedFeatureAlign symbolic writes, for S2A-Net and R3Det), one contract: inputs
// (features [N, C, H, W], best_rboxes [N, H, W, 5]), output [N, C, H, W], attributes spatial_scale (float) and
// points (1 or 5). float, double and float16 (computed in float32) on the CPU (here) and on CUDA (cuda/<op>.cc).
#include <vector>

#include "ort/rotated.h"

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void rotated_feature_align(OrtKernelContext* context, const T* features, const T* boxes, T* out,
                                    const kernels::RotatedFeatureAlignShape& s, double spatial_scale) {
    const int64_t count = s.batch * s.channels * s.height * s.width;
    const KernelInput<T> x(features, count), b(boxes, s.batch * s.height * s.width * 5);
    KernelOutput<T> y(out, count);
    kernels::rotated_feature_align(x.get(), b.get(), y.get(), s, spatial_scale, SessionThreads(context));
    y.finish();
  }
};

template <const char* Op>
void append_for(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  rotated_adapter::append_rotated_feature_align<Cpu, float, Op>(op_type, ops);
  rotated_adapter::append_rotated_feature_align<Cpu, double, Op>(op_type, ops);
  rotated_adapter::append_rotated_feature_align<Cpu, Ort::Float16_t, Op>(op_type, ops);
  rotated_adapter::append_rotated_feature_align<Cpu, Ort::BFloat16_t, Op>(op_type, ops);
}

void append_rotated_feature_align(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<rotated_adapter::kFeatureAlignOp>("RotatedFeatureAlign", ops);
}
void append_mmcv_rotated_feature_align(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<rotated_adapter::kMmcvFeatureAlignOp>("MMCVRotatedFeatureAlign", ops);
}

}  // namespace

OPBRIDGE_ORT_OP(RotatedFeatureAlign, 1, append_rotated_feature_align);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRotatedFeatureAlign, 1, append_mmcv_rotated_feature_align);

}  // namespace opbridge::ort
