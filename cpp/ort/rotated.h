// ORT adapters of the rotated-detection nodes, for any device (the nodes' contracts are in roi_align_rotated.cc,
// rotated_feature_align.cc and box_iou_rotated.cc, which run them on the CPU; cuda/<op>.cc on the CUDA execution
// provider; float, double and float16, computed in float32, on both). `Device` runs the checked call;
// roi_align_rotated's rois are read and checked on the host on every device (the node asks for them in host memory), so
// a wrong batch index is an error status.
#pragma once

#include <string>
#include <vector>

#include "kernels/box_iou_rotated.h"
#include "kernels/rotated_feature_align.h"
#include "ort/api.h"

namespace opbridge::ort::rotated_adapter {

inline constexpr char kRoiAlignOp[] = "opbridge::RoiAlignRotated";
inline constexpr char kMmcvRoiAlignOp[] = "mmcv::MMCVRoIAlignRotated";
inline constexpr char kMmdeployRoiAlignOp[] = "mmdeploy::MMCVRoIAlignRotated";
inline constexpr char kFeatureAlignOp[] = "opbridge::RotatedFeatureAlign";
inline constexpr char kMmcvFeatureAlignOp[] = "mmcv::MMCVRotatedFeatureAlign";
inline constexpr char kBoxIouOp[] = "opbridge::BoxIouRotated";

template <class Device, class T, const char* Op>
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
      T* y = out.Allocate(out_shape);
      if (shape.rois == 0 || shape.channels == 0) return Ort::Status(nullptr);
      Device::template roi_align_rotated<T>(context, input.Data(), read, y, shape);
      return Ort::Status(nullptr);
    });
  }

  kernels::RoiAlignRotatedAttributes attributes;
};

template <class Device, class T, const char* Op>
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
      T* y = out.Allocate(features.Shape());
      if (shape.batch * shape.channels * shape.height * shape.width == 0) return Ort::Status(nullptr);
      Device::template rotated_feature_align<T>(context, features.Data(), boxes.Data(), y, shape, spatial_scale);
      return Ort::Status(nullptr);
    });
  }

  double spatial_scale;
  int64_t points;
};

template <class Device, class T>
struct BoxIouRotated {
  BoxIouRotated(const OrtApi* api, const OrtKernelInfo* info)
      : mode(int_attribute(api, info, kBoxIouOp, "mode", 0)),
        aligned(bool_attribute(api, info, kBoxIouOp, "aligned", false)),
        clockwise(bool_attribute(api, info, kBoxIouOp, "clockwise", true)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& boxes1,
                      const Ort::Custom::Tensor<T>& boxes2, Ort::Custom::Tensor<T>& out) {
    return guarded(kBoxIouOp, [&] {
      kernels::BoxIouRotatedShape shape;
      const auto status =
          kernels::check_box_iou_rotated(kBoxIouOp, "input boxes1 (index 0)", boxes1.Shape(), "input boxes2 (index 1)",
                                         boxes2.Shape(), mode, aligned, shape);
      if (!status.ok()) return from_kernel(status);
      const std::vector<int64_t> out_shape =
          aligned ? std::vector<int64_t>{shape.rows} : std::vector<int64_t>{shape.rows, shape.cols};
      T* y = out.Allocate(out_shape);
      if (shape.rows == 0 || shape.cols == 0) return Ort::Status(nullptr);
      Device::template box_iou_rotated<T>(context, boxes1.Data(), boxes2.Data(), y, shape, mode, clockwise);
      return Ort::Status(nullptr);
    });
  }

  int64_t mode;
  bool aligned, clockwise;
};

// One node type of kernel struct `Kernel` (its rois, input 1, in host memory where `rois_on_host`).
template <class Device, class Kernel>
Ort::Custom::OrtLiteCustomOp* make_op(const char* op_type, bool rois_on_host = false) {
  auto* op = complete_op(Ort::Custom::CreateLiteCustomOp<Kernel>(op_type, Device::kProvider));
  if (rois_on_host) {
    op->GetInputMemoryType = [](const OrtCustomOp*, size_t index) {
      return index == 1 ? OrtMemTypeCPUInput : OrtMemTypeDefault;
    };
  }
  return op;
}

template <class Device, class T, const char* Op>
void append_roi_align_rotated(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_op<Device, RoiAlignRotated<Device, T, Op>>(op_type, true));
}

template <class Device, class T, const char* Op>
void append_rotated_feature_align(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_op<Device, RotatedFeatureAlign<Device, T, Op>>(op_type));
}

template <class Device, class T>
void append_box_iou_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_op<Device, BoxIouRotated<Device, T>>("BoxIouRotated"));
}

}  // namespace opbridge::ort::rotated_adapter
