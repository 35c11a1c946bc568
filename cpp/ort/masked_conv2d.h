// ORT adapter of kernels/masked_conv2d.h, for any device, under the node mmcv's MaskedConv2d symbolic writes
// (mmdetection's Guided Anchoring heads: GA-RPN, GA-Faster R-CNN, GA-RetinaNet): mmcv::MMCVMaskedConv2d(features
// [1, C, H, W], mask [1, H, W] (float or bool: positions where mask > 0), weight [O, C, kh, kw], bias [O]
// (optional)) -> [1, O, Ho, Wo], ints padding and stride (pairs, or one int; stride must be 1). No ONNX Runtime
// kernel existed for it. The mask is read in host memory (its positions are found and checked there); `Device`
// runs the checked call: the CPU library's (masked_conv2d.cc) or the CUDA one's (cuda/<op>.cc); float, double and
// float16 (computed in float32) on both.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/masked_conv2d.h"
#include "ort/api.h"

namespace opbridge::ort::masked_conv2d_adapter {

inline constexpr char kOp[] = "mmcv::MMCVMaskedConv2d";

template <class Device, class T, class M>
struct MaskedConv2d {
  MaskedConv2d(const OrtApi* api, const OrtKernelInfo* info)
      : padding(int_or_ints_attribute(api, info, kOp, "padding", {0, 0}, 2)),
        stride(int_or_ints_attribute(api, info, kOp, "stride", {1, 1}, 2)) {
    if (padding.size() == 1) padding.push_back(padding[0]);
    if (stride.size() == 1) stride.push_back(stride[0]);
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& features,
                      const Ort::Custom::Tensor<M>& mask, const Ort::Custom::Tensor<T>& weight,
                      Ort::Custom::Tensor<T>& out) {
    return guarded(kOp, [&] {
      Ort::KernelContext ctx(context);
      const auto bias = optional_input(ctx, 3);  // read here: the lite API's optional tensors need all inputs
      std::vector<int64_t> bias_shape;
      if (bias) bias_shape = bias->GetTensorTypeAndShapeInfo().GetShape();
      kernels::MaskedConv2dShape shape;
      auto status = kernels::check_masked_conv2d(kOp, features.Shape(), mask.Shape(), weight.Shape(),
                                                 bias ? &bias_shape : nullptr, padding, stride, shape);
      if (!status.ok()) return from_kernel(status);
      std::vector<int64_t> positions;
      status = kernels::masked_positions(kOp, KernelInput<M>(mask).get(), shape, positions);
      if (!status.ok()) return from_kernel(status);
      T* y = out.Allocate({1, shape.out_channels, shape.out_h, shape.out_w});
      if (shape.out_channels * shape.out_h * shape.out_w == 0) return Ort::Status(nullptr);
      Device::template masked_conv2d<T>(context, features.Data(), positions, weight.Data(),
                                        bias ? bias->GetTensorData<T>() : nullptr, y, shape);
      return Ort::Status(nullptr);
    });
  }

  std::vector<int64_t> padding, stride;
};

template <class Device, class T, class M, ONNXTensorElementDataType Element, ONNXTensorElementDataType MaskElement>
Ort::Custom::OrtLiteCustomOp* make_op() {
  auto* op = complete_op<0b1000>(
      Ort::Custom::CreateLiteCustomOp<MaskedConv2d<Device, T, M>>("MMCVMaskedConv2d", Device::kProvider));
  op->GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 4; };  // and the optional bias
  op->GetInputType = [](const OrtCustomOp*, size_t index) { return index == 1 ? MaskElement : Element; };
  op->GetInputMemoryType = [](const OrtCustomOp*, size_t index) {
    return index == 1 ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  };
  return op;
}

// float and double features, each with a mask of their own type or bool.
template <class Device>
void append(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  constexpr auto kFloat = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, kDouble = ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
  constexpr auto kBool = ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
  ops.push_back(make_op<Device, float, float, kFloat, kFloat>());
  ops.push_back(make_op<Device, float, bool, kFloat, kBool>());
  ops.push_back(make_op<Device, double, double, kDouble, kDouble>());
  ops.push_back(make_op<Device, double, bool, kDouble, kBool>());
}

// float16 (or, on the CPU, bfloat16) features, with a mask of their type or bool.
template <class Device, class Half = Ort::Float16_t,
          ONNXTensorElementDataType kHalf = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>
void append_half(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_op<Device, Half, Half, kHalf, kHalf>());
  ops.push_back(make_op<Device, Half, bool, kHalf, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL>());
}

}  // namespace opbridge::ort::masked_conv2d_adapter
