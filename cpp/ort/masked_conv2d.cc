// ORT adapter of kernels/masked_conv2d.h under the node mmcv's MaskedConv2d symbolic writes (mmdetection's Guided
// Anchoring heads: GA-RPN, GA-Faster R-CNN, GA-RetinaNet): mmcv::MMCVMaskedConv2d(features [1, C, H, W], mask
// [1, H, W] (float or bool: positions where mask > 0), weight [O, C, kh, kw], bias [O] (optional)) -> [1, O, Ho,
// Wo], ints padding and stride (pairs, or one int; stride must be 1). No ONNX Runtime kernel existed for it.
// float and double.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "kernels/masked_conv2d.h"
#include "ort/api.h"
#include "ort/gemm.h"

namespace opbridge::ort {
namespace {

constexpr char kOp[] = "mmcv::MMCVMaskedConv2d";

template <class T, class M>
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
      const int64_t count = shape.out_channels * shape.out_h * shape.out_w;
      KernelOutput<T> y(out.Allocate({1, shape.out_channels, shape.out_h, shape.out_w}), count);
      std::fill(y.get(), y.get() + count, kernel_type<T>(0));
      if (positions.empty() || shape.out_channels == 0) {
        y.finish();
        return Ort::Status(nullptr);
      }
      const std::optional<KernelInput<T>> b =
          bias ? std::optional<KernelInput<T>>(std::in_place, bias->GetTensorData<T>(), shape.out_channels)
               : std::nullopt;
      kernels::masked_conv2d(KernelInput<T>(features).get(), positions, KernelInput<T>(weight).get(),
                             b ? b->get() : nullptr, y.get(), shape, SessionThreads(context), gemm<kernel_type<T>>);
      y.finish();
      return Ort::Status(nullptr);
    });
  }

  std::vector<int64_t> padding, stride;
};

template <class T, class M, ONNXTensorElementDataType Element, ONNXTensorElementDataType MaskElement>
Ort::Custom::OrtLiteCustomOp* make_op() {
  auto* op = complete_op<0b1000>(
      Ort::Custom::CreateLiteCustomOp<MaskedConv2d<T, M>>("MMCVMaskedConv2d", "CPUExecutionProvider"));
  op->GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 4; };  // and the optional bias
  op->GetInputType = [](const OrtCustomOp*, size_t index) { return index == 1 ? MaskElement : Element; };
  return op;
}

void append_masked_conv2d(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_op<float, float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>());
  ops.push_back(make_op<float, bool, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL>());
  ops.push_back(make_op<double, double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>());
  ops.push_back(make_op<double, bool, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL>());
  constexpr auto kHalf = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  ops.push_back(make_op<Ort::Float16_t, Ort::Float16_t, kHalf, kHalf>());
  ops.push_back(make_op<Ort::Float16_t, bool, kHalf, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL>());
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVMaskedConv2d, 1, append_masked_conv2d);

}  // namespace opbridge::ort
