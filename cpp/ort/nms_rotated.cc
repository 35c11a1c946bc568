// ORT adapters of kernels/nms_rotated.h:
// - opbridge::NmsRotated (ort/nms.h, its adapter for both libraries): opbridge.nms_rotated's node;
// - mmdeploy::NMSRotated(boxes [B, N, 5], scores [B, C, N]) -> [K, 3] int64 (batch, class, box), attributes
//   iou_threshold and score_threshold (floats): the node mmdeploy's exporter writes for mmrotate's detectors, for
//   which mmdeploy's own ONNX Runtime kernel builds only against ORT <= 1.15.
// float, double and float16 (the overlaps computed in float32).
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/nms_rotated.h"
#include "ort/api.h"
#include "ort/nms.h"

namespace opbridge::ort {
namespace {

constexpr const char* kMmdeployOp = "mmdeploy::NMSRotated";

void append_nms_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  using nms_adapter::Cpu;
  nms_adapter::append_nms_rotated<Cpu, float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>(ops);
  nms_adapter::append_nms_rotated<Cpu, double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>(ops);
  nms_adapter::append_nms_rotated<Cpu, Ort::Float16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>(ops);
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
