// ORT adapter of kernels/roi_align_rotated.h, under three node names with one contract: inputs (input
// [N, C, H, W], rois [K, 6] = (batch index, cx, cy, w, h, angle)), output [K, C, output_height, output_width],
// attributes output_height, output_width, spatial_scale (float), sampling_ratio, aligned and clockwise (0 or 1):
// - opbridge::RoiAlignRotated, opbridge.roi_align_rotated's node;
// - mmcv::MMCVRoIAlignRotated, the node mmcv's RoIAlignRotated symbolic writes;
// - mmdeploy::MMCVRoIAlignRotated, the node mmdeploy's rewrite of it writes (mmrotate's Oriented R-CNN and RoI
//   Transformer heads); mmdeploy's own ONNX Runtime kernel builds only against ORT <= 1.15.
// float, double and float16 (computed in float32) on the CPU (here) and on CUDA (cuda/<op>.cc).
#include <vector>

#include "kernels/roi_align_rotated.h"
#include "ort/rotated.h"

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void roi_align_rotated(OrtKernelContext* context, const T* input,
                                const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                                const kernels::RoiAlignRotatedShape& s) {
    const KernelInput<T> x(input, s.batch * s.channels * s.height * s.width);
    KernelOutput<T> y(out, s.rois * s.channels * s.pooled_height * s.pooled_width);
    kernels::roi_align_rotated(x.get(), rois, y.get(), s, SessionThreads(context));
    y.finish();
  }
};

template <const char* Op>
void append_for(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  rotated_adapter::append_roi_align_rotated<Cpu, float, Op>(op_type, ops);
  rotated_adapter::append_roi_align_rotated<Cpu, double, Op>(op_type, ops);
  rotated_adapter::append_roi_align_rotated<Cpu, Ort::Float16_t, Op>(op_type, ops);
  rotated_adapter::append_roi_align_rotated<Cpu, Ort::BFloat16_t, Op>(op_type, ops);
}

void append_roi_align_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<rotated_adapter::kRoiAlignOp>("RoiAlignRotated", ops);
}
void append_mmcv_roi_align_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<rotated_adapter::kMmcvRoiAlignOp>("MMCVRoIAlignRotated", ops);
}
void append_mmdeploy_roi_align_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<rotated_adapter::kMmdeployRoiAlignOp>("MMCVRoIAlignRotated", ops);
}

}  // namespace

OPBRIDGE_ORT_OP(RoiAlignRotated, 1, append_roi_align_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRoIAlignRotated, 1, append_mmcv_roi_align_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVRoIAlignRotated, 1, append_mmdeploy_roi_align_rotated);

}  // namespace opbridge::ort
