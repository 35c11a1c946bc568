// ORT adapter of kernels/roi_align_rotated.h, under three node names with one contract: inputs (input
// [N, C, H, W], rois [K, 6] = (batch index, cx, cy, w, h, angle)), output [K, C, output_height, output_width],
// attributes output_height, output_width, spatial_scale (float), sampling_ratio, aligned and clockwise (0 or 1):
// - opbridge::RoiAlignRotated, opbridge.roi_align_rotated's node;
// - mmcv::MMCVRoIAlignRotated, the node mmcv's RoIAlignRotated symbolic writes;
// - mmdeploy::MMCVRoIAlignRotated, the node mmdeploy's rewrite of it writes (mmrotate's Oriented R-CNN and RoI
//   Transformer heads); mmdeploy's own ONNX Runtime kernel builds only against ORT <= 1.15.
// float, double and float16 (computed in float32).
#include <string>
#include <vector>

#include "kernels/roi_align_rotated.h"
#include "ort/api.h"

namespace opbridge::ort {
namespace {

constexpr char kOp[] = "opbridge::RoiAlignRotated";
constexpr char kMmcvOp[] = "mmcv::MMCVRoIAlignRotated";
constexpr char kMmdeployOp[] = "mmdeploy::MMCVRoIAlignRotated";

template <class T, const char* Op>
struct RoiAlignRotated {
  RoiAlignRotated(const OrtApi* api, const OrtKernelInfo* info) {
    attributes.pooled_height = int_attribute(api, info, Op, "output_height", 1);
    attributes.pooled_width = int_attribute(api, info, Op, "output_width", 1);
    attributes.spatial_scale = float_attribute(api, info, Op, "spatial_scale", 1.0f);
    attributes.sampling_ratio = int_attribute(api, info, Op, "sampling_ratio", 0);
    attributes.aligned = bool_attribute(api, info, Op, "aligned", true);
    attributes.clockwise = bool_attribute(api, info, Op, "clockwise", false);
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& input,
                      const Ort::Custom::Tensor<T>& rois, Ort::Custom::Tensor<T>& out) {
    return guarded(Op, [&] {
      const kernels::RoiAlignRotatedNames names{Op, "input input (index 0)", "input rois (index 1)"};
      kernels::RoiAlignRotatedShape shape;
      auto status = kernels::check_roi_align_rotated(names, input.Shape(), rois.Shape(), attributes, shape);
      if (!status.ok()) return from_kernel(status);
      std::vector<kernels::roi_align_rotated_detail::Roi> read;
      status = kernels::read_rotated_rois(names, KernelInput<T>(rois).get(), shape, attributes, read);
      if (!status.ok()) return from_kernel(status);
      const std::vector<int64_t> out_shape{shape.rois, shape.channels, shape.pooled_height, shape.pooled_width};
      KernelOutput<T> y(out.Allocate(out_shape), element_count(out_shape));
      if (shape.rois == 0 || shape.channels == 0) return Ort::Status(nullptr);
      kernels::roi_align_rotated(KernelInput<T>(input).get(), read, y.get(), shape, SessionThreads(context));
      y.finish();
      return Ort::Status(nullptr);
    });
  }

  kernels::RoiAlignRotatedAttributes attributes;
};

template <const char* Op>
void append_for(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<RoiAlignRotated<float, Op>>(op_type, "CPUExecutionProvider")));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<RoiAlignRotated<double, Op>>(op_type, "CPUExecutionProvider")));
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp<RoiAlignRotated<Ort::Float16_t, Op>>(op_type, "CPUExecutionProvider")));
}

void append_roi_align_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<kOp>("RoiAlignRotated", ops);
}
void append_mmcv_roi_align_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<kMmcvOp>("MMCVRoIAlignRotated", ops);
}
void append_mmdeploy_roi_align_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<kMmdeployOp>("MMCVRoIAlignRotated", ops);
}

}  // namespace

OPBRIDGE_ORT_OP(RoiAlignRotated, 1, append_roi_align_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRoIAlignRotated, 1, append_mmcv_roi_align_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVRoIAlignRotated, 1, append_mmdeploy_roi_align_rotated);

}  // namespace opbridge::ort
