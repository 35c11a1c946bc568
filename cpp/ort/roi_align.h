// ORT adapter of mmcv's RoIAlign, for any device.
// The node mmcv's exporter writes for mmcv.ops.RoIAlign (the RoI heads of two-stage detectors: Faster/Mask/Cascade
// R-CNN in mmdetection, mmocr's Mask R-CNN, mmtracking), and mmdeploy::MMCVRoiAlign, which mmdeploy 0.1-0.3 wrote
// with the same contract: mmcv::MMCVRoiAlign(input [N, C, H, W], rois [K, 5] = (batch index, x1, y1, x2, y2)) ->
// [K, C, output_height, output_width], attributes output_height, output_width, sampling_ratio (ints),
// spatial_scale (float), mode (string "avg" or "max") and aligned (int 0 or 1). mmcv's kernel required every
// attribute; absent here, they take mmcv.ops.RoIAlign's defaults (sampling_ratio 0, mode "avg", aligned 1, scale 1)
// except the output size, which is required. `Device` runs the checked call: the CPU library's (roi_align.cc: float,
// double and float16, computed in float32) or the CUDA one's (cuda/<op>.cc: the same); the rois are read and
// checked on the host on every device (the node asks for them in host memory).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/roi_align.h"
#include "ort/api.h"

namespace opbridge::ort::roi_align_adapter {

inline constexpr char kOp[] = "mmcv::MMCVRoiAlign";
inline constexpr char kMmdeployOp[] = "mmdeploy::MMCVRoiAlign";

template <class Device, class T, const char* Op>
struct MmcvRoiAlign {
  MmcvRoiAlign(const OrtApi* api, const OrtKernelInfo* info) {
    attributes.pooled_height = int_attribute(api, info, Op, "output_height", 0);
    attributes.pooled_width = int_attribute(api, info, Op, "output_width", 0);
    attributes.spatial_scale = float_attribute(api, info, Op, "spatial_scale", 1.0f);
    attributes.sampling_ratio = int_attribute(api, info, Op, "sampling_ratio", 0);
    attributes.aligned = bool_attribute(api, info, Op, "aligned", true);
    const std::string mode = string_attribute(api, info, Op, "mode", "avg");
    if (mode != "avg" && mode != "max") {
      throw std::invalid_argument(std::string(Op) + ": attribute 'mode' must be \"avg\" or \"max\", got \"" + mode +
                                  "\"");
    }
    attributes.max_pool = mode == "max";
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& input,
                      const Ort::Custom::Tensor<T>& rois, Ort::Custom::Tensor<T>& out) {
    return guarded(Op, [&] {
      const kernels::RoiAlignRotatedNames names{Op, "input input (index 0)", "input rois (index 1)"};
      kernels::RoiAlignRotatedShape shape;
      auto status = kernels::check_roi_align(names, input.Shape(), rois.Shape(), attributes, shape);
      if (!status.ok()) return from_kernel(status);
      std::vector<kernels::roi_align_rotated_detail::Roi> read;
      status = kernels::read_rois(names, KernelInput<T>(rois).get(), shape, attributes, read);
      if (!status.ok()) return from_kernel(status);
      const std::vector<int64_t> out_shape{shape.rois, shape.channels, shape.pooled_height, shape.pooled_width};
      T* y = out.Allocate(out_shape);
      if (shape.rois == 0 || shape.channels == 0) return Ort::Status(nullptr);
      Device::template roi_align<T>(context, input.Data(), read, y, shape, attributes.max_pool);
      return Ort::Status(nullptr);
    });
  }

  kernels::RoiAlignAttributes attributes;
};

template <class Device, class T, const char* Op>
void append_typed(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  auto* op =
      complete_op(Ort::Custom::CreateLiteCustomOp<MmcvRoiAlign<Device, T, Op>>("MMCVRoiAlign", Device::kProvider));
  op->GetInputMemoryType = [](const OrtCustomOp*, size_t index) {
    return index == 1 ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  };
  ops.push_back(op);
}

}  // namespace opbridge::ort::roi_align_adapter
