// ORT adapters of kernels/nms_rotated.h:
// - opbridge::NmsRotated(boxes [N, 5], scores [N], labels [N] int64, optional) -> keep [K] int64, attributes
//   iou_threshold (float) and clockwise (0 or 1): opbridge.nms_rotated's node;
// - mmdeploy::NMSRotated(boxes [B, N, 5], scores [B, C, N]) -> [K, 3] int64 (batch, class, box), attributes
//   iou_threshold and score_threshold (floats): the node mmdeploy's exporter writes for mmrotate's detectors, for
//   which mmdeploy's own ONNX Runtime kernel builds only against ORT <= 1.15.
// float, double and float16 (the overlaps computed in float32).
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/nms_rotated.h"
#include "ort/api.h"

namespace opbridge::ort {
namespace {

constexpr const char* kOp = "opbridge::NmsRotated";
constexpr const char* kMmdeployOp = "mmdeploy::NMSRotated";

template <class T>
struct NmsRotated {
  NmsRotated(const OrtApi* api, const OrtKernelInfo* info)
      : iou_threshold(float_attribute(api, info, kOp, "iou_threshold", 0.5f)),
        clockwise(bool_attribute(api, info, kOp, "clockwise", true)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& boxes,
                      const Ort::Custom::Tensor<T>& scores, Ort::Custom::Tensor<int64_t>& keep) {
    return guarded(kOp, [&] {
      Ort::KernelContext ctx(context);
      const auto labels = optional_input(ctx, 2);  // read here: the lite API's optional tensors need all inputs
      std::vector<int64_t> label_shape;
      if (labels) label_shape = labels->GetTensorTypeAndShapeInfo().GetShape();
      int64_t count = 0;
      const auto status =
          kernels::check_nms_rotated(kOp, boxes.Shape(), scores.Shape(), labels ? &label_shape : nullptr, count);
      if (!status.ok()) return from_kernel(status);
      std::vector<int64_t> kept;
      if (count > 0) {
        kept =
            kernels::nms_rotated(KernelInput<T>(boxes).get(), KernelInput<T>(scores).get(),
                                 labels ? labels->GetTensorData<int64_t>() : nullptr, count, iou_threshold, clockwise);
      }
      int64_t* out = keep.Allocate({static_cast<int64_t>(kept.size())});
      std::copy(kept.begin(), kept.end(), out);
      return Ort::Status(nullptr);
    });
  }

  double iou_threshold;
  bool clockwise;
};

template <class T, ONNXTensorElementDataType Element>
Ort::Custom::OrtLiteCustomOp* make_op() {
  auto* op = complete_op<0b100>(Ort::Custom::CreateLiteCustomOp<NmsRotated<T>>("NmsRotated", "CPUExecutionProvider"));
  op->GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 3; };  // and the optional labels
  op->GetInputType = [](const OrtCustomOp*, size_t index) {
    return index == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : Element;
  };
  return op;
}

void append_nms_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_op<float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>());
  ops.push_back(make_op<double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>());
  ops.push_back(make_op<Ort::Float16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>());
}

template <class T>
struct MmdeployNmsRotated {
  MmdeployNmsRotated(const OrtApi* api, const OrtKernelInfo* info)
      : iou_threshold(float_attribute(api, info, kMmdeployOp, "iou_threshold", 0.5f)),
        score_threshold(float_attribute(api, info, kMmdeployOp, "score_threshold", 0.0f)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& boxes,
                      const Ort::Custom::Tensor<T>& scores, Ort::Custom::Tensor<int64_t>& selected) {
    return guarded(kMmdeployOp, [&] {
      int64_t batch = 0, classes = 0, count = 0;
      const auto status =
          kernels::check_batched_nms_rotated(kMmdeployOp, boxes.Shape(), scores.Shape(), batch, classes, count);
      if (!status.ok()) return from_kernel(status);
      std::vector<int64_t> rows;
      if (batch > 0 && classes > 0 && count > 0) {
        rows = kernels::batched_nms_rotated(KernelInput<T>(boxes).get(), KernelInput<T>(scores).get(), batch, classes,
                                            count, iou_threshold, score_threshold, SessionThreads(context));
      }
      int64_t* out = selected.Allocate({static_cast<int64_t>(rows.size() / 3), 3});
      std::copy(rows.begin(), rows.end(), out);
      return Ort::Status(nullptr);
    });
  }

  double iou_threshold, score_threshold;
};

void append_mmdeploy_nms_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<MmdeployNmsRotated<float>>("NMSRotated", "CPUExecutionProvider")));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<MmdeployNmsRotated<double>>("NMSRotated", "CPUExecutionProvider")));
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp<MmdeployNmsRotated<Ort::Float16_t>>("NMSRotated", "CPUExecutionProvider")));
}

}  // namespace

OPBRIDGE_ORT_OP(NmsRotated, 1, append_nms_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, NMSRotated, 1, append_mmdeploy_nms_rotated);

}  // namespace opbridge::ort
