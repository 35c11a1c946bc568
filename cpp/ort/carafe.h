// ORT adapter of kernels/carafe.h, for any device, under the nodes mmcv's CARAFE symbolics write (mmdetection's
// CARAFE FPN): mmcv::MMCVCARAFE and mmcv::MMCVCARAFENaive(features [N, C, H, W], masks [N, group_size *
// kernel_size^2, H * s, W * s]) -> [N, C, H * s, W * s], int attributes kernel_size and group_size, float
// scale_factor (an integer value). The two nodes compute the same thing (mmcv's two kernels differ in speed only).
// No ONNX Runtime kernel existed for either. `Device` runs the checked call: the CPU library's (carafe.cc: float,
// double and float16) or the CUDA one's (cuda/<op>.cc: the same; float16 computed in float32 on both).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/carafe.h"
#include "ort/api.h"

namespace opbridge::ort::carafe_adapter {

inline constexpr char kOp[] = "mmcv::MMCVCARAFE";
inline constexpr char kNaiveOp[] = "mmcv::MMCVCARAFENaive";

template <class Device, class T, const char* Op>
struct Carafe {
  Carafe(const OrtApi* api, const OrtKernelInfo* info)
      : kernel(int_attribute(api, info, Op, "kernel_size", 0)),
        group(int_attribute(api, info, Op, "group_size", 1)),
        scale(float_attribute(api, info, Op, "scale_factor", 0.0f)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& features,
                      const Ort::Custom::Tensor<T>& masks, Ort::Custom::Tensor<T>& out) {
    return guarded(Op, [&] {
      kernels::CarafeShape shape;
      const auto status = kernels::check_carafe(Op, features.Shape(), masks.Shape(), kernel, group, scale, shape);
      if (!status.ok()) return from_kernel(status);
      const std::vector<int64_t> out_shape{shape.batch, shape.channels, shape.height * shape.scale,
                                           shape.width * shape.scale};
      T* y = out.Allocate(out_shape);
      if (element_count(out_shape) == 0) return Ort::Status(nullptr);
      Device::template carafe<T>(context, features.Data(), masks.Data(), y, shape);
      return Ort::Status(nullptr);
    });
  }

  int64_t kernel, group;
  double scale;
};

template <class Device, class T>
void append(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(Ort::Custom::CreateLiteCustomOp<Carafe<Device, T, kOp>>("MMCVCARAFE", Device::kProvider)));
}

template <class Device, class T>
void append_naive(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<Carafe<Device, T, kNaiveOp>>("MMCVCARAFENaive", Device::kProvider)));
}

}  // namespace opbridge::ort::carafe_adapter
