// ORT adapter of the deformable convolution, for any device: opbridge::DeformConv2d, with the
// inputs (X, W, offset, optional B, optional mask) and attributes (dilations,
// group, kernel_shape, offset_group, pads, strides) of ONNX DeformConv, so it
// runs deformable convolutions on ORT versions without a DeformConv kernel.
// The mmcv/mmdeploy nodes below run the same kernel. `Device` runs the checked call: the CPU library's
// (deform_conv2d.cc) or the CUDA one's (cuda/deform_conv2d.cc).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/deform_conv2d.h"
#include "ort/api.h"

namespace opbridge::ort::deform_conv2d_adapter {

inline constexpr const char* kOp = "opbridge::DeformConv2d";
inline constexpr kernels::DeformConv2dNames kNames{kOp,
                                                   "input X (index 0)",
                                                   "input W (index 1)",
                                                   "input offset (index 2)",
                                                   "input mask (index 4)",
                                                   "input B (index 3)"};

// The part both node forms share: the checks, the output and the kernel. `mask` and `bias` may be absent.
template <class Device, class T>
Ort::Status run_deform_conv2d(const typename Device::DeformConv2dState& state, OrtKernelContext* context,
                              const kernels::DeformConv2dNames& names,
                              const kernels::DeformConv2dAttributes& attributes, const Ort::Custom::Tensor<T>& x,
                              const Ort::Custom::Tensor<T>& w, const Ort::Custom::Tensor<T>& offset,
                              const std::optional<Ort::ConstValue>& mask, const std::optional<Ort::ConstValue>& bias,
                              Ort::Custom::Tensor<T>& y) {
  std::vector<int64_t> bias_shape, mask_shape;
  if (bias) bias_shape = bias->GetTensorTypeAndShapeInfo().GetShape();
  if (mask) mask_shape = mask->GetTensorTypeAndShapeInfo().GetShape();
  kernels::DeformConv2dShape shape;
  const auto status =
      kernels::check_deform_conv2d(names, x.Shape(), w.Shape(), offset.Shape(), mask ? &mask_shape : nullptr,
                                   bias ? &bias_shape : nullptr, attributes, shape);
  if (!status.ok()) return from_kernel(status);
  T* out = y.Allocate({shape.batch, shape.out_channels, shape.out_h, shape.out_w});
  if (shape.batch == 0) return Ort::Status(nullptr);
  Device::template deform_conv2d<T>(state, context, x.Data(), w.Data(), offset.Data(),
                                    mask ? mask->GetTensorData<T>() : nullptr,
                                    bias ? bias->GetTensorData<T>() : nullptr, out, shape);
  return Ort::Status(nullptr);
}

template <class Device, class T>
struct DeformConv2d {
  DeformConv2d(const OrtApi* api, const OrtKernelInfo* info) : state(info) {
    attributes.strides = ints_attribute(api, info, kOp, "strides", {1, 1});
    attributes.dilations = ints_attribute(api, info, kOp, "dilations", {1, 1});
    attributes.pads = ints_attribute(api, info, kOp, "pads", {0, 0, 0, 0});
    attributes.kernel_shape = ints_attribute(api, info, kOp, "kernel_shape", {});
    attributes.groups = int_attribute(api, info, kOp, "group", 1);
    attributes.offset_groups = int_attribute(api, info, kOp, "offset_group", 1);
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& x, const Ort::Custom::Tensor<T>& w,
                      const Ort::Custom::Tensor<T>& offset, Ort::Custom::Tensor<T>& y) {
    return guarded(kOp, [&] {
      // B and mask are optional and may be omitted by an empty name, which the
      // lite API's optional tensors do not survive: read them here.
      Ort::KernelContext ctx(context);
      return run_deform_conv2d<Device>(state, context, kNames, attributes, x, w, offset, optional_input(ctx, 4),
                                       optional_input(ctx, 3), y);
    });
  }

  kernels::DeformConv2dAttributes attributes;
  typename Device::DeformConv2dState state;
};

template <class Device, class T, ONNXTensorElementDataType Element>
Ort::Custom::OrtLiteCustomOp* make_op() {
  auto* op =
      complete_op<0b11000>(Ort::Custom::CreateLiteCustomOp<DeformConv2d<Device, T>>("DeformConv2d", Device::kProvider));
  // Five inputs, as ONNX DeformConv; the lite API only saw the three it passes.
  op->GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 5; };
  op->GetInputType = [](const OrtCustomOp*, size_t) { return Element; };
  return op;
}

// float, double and float16 (a model after .half()), and bfloat16 where kBFloat16 (the CPU library): each device
// reads a half type as stored or widens it, computes in float32 and rounds once.
template <class Device, bool kBFloat16 = false>
void append(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_op<Device, float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>());
  ops.push_back(make_op<Device, double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>());
  ops.push_back(make_op<Device, Ort::Float16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>());
  if constexpr (kBFloat16) ops.push_back(make_op<Device, Ort::BFloat16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16>());
}

// The nodes mmcv's and mmdeploy's exporters write, in the "mmcv" or "mmdeploy" domain, with int attributes
// stride, padding, dilation (height, width; one int serves both), groups and deform_groups. Same kernel.
// - DCNv2 (ModulatedDeformConv2dFunction's symbolic): MMCVModulatedDeformConv2d(input, offset, mask, weight[,
//   bias]). mmdeploy's own ONNX Runtime kernel for it builds only against ORT <= 1.15.
// - DCNv1 (DeformConv2dFunction's symbolic): MMCVDeformConv2d(input, offset, weight), no mask and no bias
//   (mmcv's attribute bias is always 0; im2col_step only batches mmcv's own kernel and is ignored). mmdeploy
//   writes padding as four values [top, bottom, left, right] (each of (pad_h, pad_w) twice); neither project
//   ever had an ONNX Runtime kernel for it.
inline constexpr char kModulatedOp[] = "MMCVModulatedDeformConv2d";
inline constexpr char kDcnV1Op[] = "MMCVDeformConv2d";
inline constexpr kernels::DeformConv2dNames kModulatedNames{
    kModulatedOp,           "input input (index 0)", "input weight (index 3)", "input offset (index 1)",
    "input mask (index 2)", "input bias (index 4)"};
inline constexpr kernels::DeformConv2dNames kDcnV1Names{
    kDcnV1Op, "input input (index 0)", "input weight (index 2)", "input offset (index 1)", "(no mask)", "(no bias)"};

// A pair of ints, or one int for both dimensions (mmcv's symbolics write a plain int when the model passes one,
// as TOOD's head calls deform_conv2d directly).
inline std::vector<int64_t> int_pair_attribute(const OrtApi* api, const OrtKernelInfo* info, const char* op,
                                               const char* name, int64_t fallback) {
  auto values = int_or_ints_attribute(api, info, op, name, {fallback, fallback}, 2);
  if (values.size() == 1) values.push_back(values[0]);  // a list of one int
  return values;
}

// mmcv's attributes as the kernel's (ONNX DeformConv's pads order: top, left, bottom, right).
inline kernels::DeformConv2dAttributes mmcv_attributes(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  kernels::DeformConv2dAttributes attributes;
  attributes.strides = int_pair_attribute(api, info, op, "stride", 1);
  attributes.dilations = int_pair_attribute(api, info, op, "dilation", 1);
  const auto padding = int_pair_attribute(api, info, op, "padding", 0);
  if (padding.size() == 2) {
    attributes.pads = {padding[0], padding[1], padding[0], padding[1]};
  } else if (padding.size() == 4) {  // mmdeploy's [top, bottom, left, right]
    attributes.pads = {padding[0], padding[2], padding[1], padding[3]};
  } else {
    throw std::invalid_argument(std::string(op) + ": attribute 'padding' must have 1, 2 (height, width) or 4 " +
                                "(top, bottom, left, right) values, got " + kernels::shape_to_string(padding));
  }
  attributes.groups = int_attribute(api, info, op, "groups", 1);
  attributes.offset_groups = int_attribute(api, info, op, "deform_groups", 1);
  return attributes;
}

template <class Device, class T>
struct MmcvModulatedDeformConv2d {
  MmcvModulatedDeformConv2d(const OrtApi* api, const OrtKernelInfo* info)
      : attributes(mmcv_attributes(api, info, kModulatedOp)), state(info) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& x, const Ort::Custom::Tensor<T>& offset,
                      const Ort::Custom::Tensor<T>& /*mask, read as input 2*/, const Ort::Custom::Tensor<T>& w,
                      Ort::Custom::Tensor<T>& y) {
    return guarded(kModulatedOp, [&] {
      Ort::KernelContext ctx(context);
      return run_deform_conv2d<Device>(state, context, kModulatedNames, attributes, x, w, offset, ctx.GetInput(2),
                                       optional_input(ctx, 4), y);
    });
  }

  kernels::DeformConv2dAttributes attributes;
  typename Device::DeformConv2dState state;
};

template <class Device, class T>
struct MmcvDeformConv2d {
  MmcvDeformConv2d(const OrtApi* api, const OrtKernelInfo* info)
      : attributes(mmcv_attributes(api, info, kDcnV1Op)), state(info) {
    if (int_attribute(api, info, kDcnV1Op, "bias", 0) != 0) {
      throw std::invalid_argument(std::string(kDcnV1Op) +
                                  ": attribute 'bias' must be 0 (mmcv's DeformConv2d has no bias input)");
    }
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& x, const Ort::Custom::Tensor<T>& offset,
                      const Ort::Custom::Tensor<T>& w, Ort::Custom::Tensor<T>& y) {
    return guarded(kDcnV1Op, [&] {
      return run_deform_conv2d<Device>(state, context, kDcnV1Names, attributes, x, w, offset, std::nullopt,
                                       std::nullopt, y);
    });
  }

  kernels::DeformConv2dAttributes attributes;
  typename Device::DeformConv2dState state;
};

template <class Device, class T, ONNXTensorElementDataType Element>
Ort::Custom::OrtLiteCustomOp* make_modulated_op() {
  auto* op = complete_op<0b10000>(
      Ort::Custom::CreateLiteCustomOp<MmcvModulatedDeformConv2d<Device, T>>(kModulatedOp, Device::kProvider));
  op->GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 5; };  // and the optional bias
  op->GetInputType = [](const OrtCustomOp*, size_t) { return Element; };
  return op;
}

template <class Device, bool kBFloat16 = false>
void append_mmcv_modulated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_modulated_op<Device, float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>());
  ops.push_back(make_modulated_op<Device, double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>());
  ops.push_back(make_modulated_op<Device, Ort::Float16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>());
  if constexpr (kBFloat16) {
    ops.push_back(make_modulated_op<Device, Ort::BFloat16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16>());
  }
}

template <class Device, class T>
Ort::Custom::OrtLiteCustomOp* make_v1_op() {
  return complete_op(Ort::Custom::CreateLiteCustomOp<MmcvDeformConv2d<Device, T>>(kDcnV1Op, Device::kProvider));
}

template <class Device, bool kBFloat16 = false>
void append_mmcv_v1(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_v1_op<Device, float>());
  ops.push_back(make_v1_op<Device, double>());
  ops.push_back(make_v1_op<Device, Ort::Float16_t>());
  if constexpr (kBFloat16) ops.push_back(make_v1_op<Device, Ort::BFloat16_t>());
}

}  // namespace opbridge::ort::deform_conv2d_adapter
