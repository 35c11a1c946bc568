// ORT adapters of the hard-NMS nodes, for any device:
// - mmcv::NonMaxSuppression(boxes [N, 4], scores [N]) -> indices [M] int64 in decreasing score order, attributes
//   iou_threshold (float, required) and offset (int, 0 or 1): the node mmcv's exporter writes for mmcv.ops.nms
//   (two-stage detectors' RPN and test-time NMS). Not ONNX's NonMaxSuppression: mmcv's domain, mmcv's contract.
// - opbridge::NmsRotated(boxes [N, 5], scores [N], labels [N] int64, optional) -> keep [K] int64, attributes
//   iou_threshold (float) and clockwise (0 or 1): opbridge.nms_rotated's node.
// - mmdeploy::NMSRotated(boxes [B, N, 5], scores [B, C, N]) -> [K, 3] int64 (batch, class, box), attributes
//   iou_threshold and score_threshold (floats): the node mmdeploy's exporter writes for mmrotate's detectors, for
//   which mmdeploy's own ONNX Runtime kernel builds only against ORT <= 1.15.
// - mmdeploy::NMSMatch(boxes [B, N, 4], scores [B, C, N], iou_threshold [1], score_threshold [1]) -> [K, 4] int64
//   rows (batch, class, kept box, box it suppressed): mmdeploy's multiclass_nms_match; the thresholds are
//   inputs (float tensors of one element, read in host memory), not attributes.
// The kept count is the data's, so `Device` returns the kept indices through `allocate(count)`, which allocates
// the output: the CPU library's device (nms.cc, nms_rotated.cc: float, double and float16, computed in float32)
// runs kernels/nms.h and nms_rotated.h; the CUDA one's (cuda/<op>.cc: the same types) kernels/nms.cuh.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/nms.h"
#include "kernels/nms_rotated.h"
#include "ort/api.h"

namespace opbridge::ort::nms_adapter {

inline constexpr char kNmsOp[] = "mmcv::NonMaxSuppression";
inline constexpr char kNmsRotatedOp[] = "opbridge::NmsRotated";
inline constexpr char kMmdeployNmsRotatedOp[] = "mmdeploy::NMSRotated";
inline constexpr char kNmsMatchOp[] = "mmdeploy::NMSMatch";

// Allocates the output for `count` kept boxes and returns where their indices go.
using Allocate = std::function<int64_t*(int64_t count)>;

inline void throw_if(const kernels::Status& status) {
  if (!status.ok()) throw std::invalid_argument(status.message);
}

// A float attribute that must be present and finite.
inline float required_float(const OrtApi* api, const OrtKernelInfo* info, const char* op, const char* name) {
  const float value = float_attribute(api, info, op, name, NAN);
  if (!std::isfinite(value)) {
    throw std::invalid_argument(std::string(op) + ": attribute '" + name + "' (a finite float) is required");
  }
  return value;
}

template <class Device, class T>
struct NonMaxSuppression {
  NonMaxSuppression(const OrtApi* api, const OrtKernelInfo* info)
      : iou_threshold(required_float(api, info, kNmsOp, "iou_threshold")),
        offset(int_attribute(api, info, kNmsOp, "offset", 0)) {
    throw_if(kernels::check_nms_offset(kNmsOp, offset));
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& boxes,
                      const Ort::Custom::Tensor<T>& scores, Ort::Custom::Tensor<int64_t>& indices) {
    return guarded(kNmsOp, [&] {
      int64_t count = 0;
      const auto status = kernels::check_nms(kNmsOp, boxes.Shape(), scores.Shape(), count);
      if (!status.ok()) return from_kernel(status);
      const Allocate allocate = [&](int64_t kept) { return indices.Allocate({kept}); };
      if (count == 0) {
        allocate(0);
        return Ort::Status(nullptr);
      }
      Device::template nms<T>(context, boxes.Data(), scores.Data(), count, iou_threshold, offset, allocate);
      return Ort::Status(nullptr);
    });
  }

  double iou_threshold;
  int64_t offset;
};

template <class Device, class T>
struct NmsRotated {
  NmsRotated(const OrtApi* api, const OrtKernelInfo* info)
      : iou_threshold(float_attribute(api, info, kNmsRotatedOp, "iou_threshold", 0.5f)),
        clockwise(bool_attribute(api, info, kNmsRotatedOp, "clockwise", true)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& boxes,
                      const Ort::Custom::Tensor<T>& scores, Ort::Custom::Tensor<int64_t>& keep) {
    return guarded(kNmsRotatedOp, [&] {
      Ort::KernelContext ctx(context);
      const auto labels = optional_input(ctx, 2);  // read here: the lite API's optional tensors need all inputs
      std::vector<int64_t> label_shape;
      if (labels) label_shape = labels->GetTensorTypeAndShapeInfo().GetShape();
      int64_t count = 0;
      const auto status = kernels::check_nms_rotated(kNmsRotatedOp, boxes.Shape(), scores.Shape(),
                                                     labels ? &label_shape : nullptr, count);
      if (!status.ok()) return from_kernel(status);
      const Allocate allocate = [&](int64_t kept) { return keep.Allocate({kept}); };
      if (count == 0) {
        allocate(0);
        return Ort::Status(nullptr);
      }
      Device::template nms_rotated<T>(context, boxes.Data(), scores.Data(),
                                      labels ? labels->GetTensorData<int64_t>() : nullptr, count, iou_threshold,
                                      clockwise, allocate);
      return Ort::Status(nullptr);
    });
  }

  double iou_threshold;
  bool clockwise;
};

template <class Device, class T>
struct MmdeployNmsRotated {
  MmdeployNmsRotated(const OrtApi* api, const OrtKernelInfo* info)
      : iou_threshold(float_attribute(api, info, kMmdeployNmsRotatedOp, "iou_threshold", 0.5f)),
        score_threshold(float_attribute(api, info, kMmdeployNmsRotatedOp, "score_threshold", 0.0f)) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& boxes,
                      const Ort::Custom::Tensor<T>& scores, Ort::Custom::Tensor<int64_t>& selected) {
    return guarded(kMmdeployNmsRotatedOp, [&] {
      int64_t batch = 0, classes = 0, count = 0;
      const auto status = kernels::check_batched_nms_rotated(kMmdeployNmsRotatedOp, boxes.Shape(), scores.Shape(),
                                                             batch, classes, count);
      if (!status.ok()) return from_kernel(status);
      const Allocate allocate = [&](int64_t rows) { return selected.Allocate({rows, 3}); };
      if (batch == 0 || classes == 0 || count == 0) {
        allocate(0);
        return Ort::Status(nullptr);
      }
      Device::template batched_nms_rotated<T>(context, boxes.Data(), scores.Data(), batch, classes, count,
                                              iou_threshold, score_threshold, allocate);
      return Ort::Status(nullptr);
    });
  }

  double iou_threshold, score_threshold;
};

template <class Device, class T>
struct NmsMatch {
  NmsMatch(const OrtApi*, const OrtKernelInfo*) {}

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& boxes,
                      const Ort::Custom::Tensor<T>& scores, const Ort::Custom::Tensor<T>& iou_threshold,
                      const Ort::Custom::Tensor<T>& score_threshold, Ort::Custom::Tensor<int64_t>& matches) {
    return guarded(kNmsMatchOp, [&] {
      int64_t batch = 0, classes = 0, count = 0;
      const auto status = kernels::check_nms_match(kNmsMatchOp, boxes.Shape(), scores.Shape(), batch, classes, count);
      if (!status.ok()) return from_kernel(status);
      for (const auto* threshold : {&iou_threshold, &score_threshold}) {
        if (threshold->NumberOfElement() < 1) {
          return invalid_argument(
              std::string(kNmsMatchOp) + ": input " +
              (threshold == &iou_threshold ? "iou_threshold (index 2)" : "score_threshold (index 3)") +
              " must hold one number (shape [1]), got shape " + kernels::shape_to_string(threshold->Shape()));
        }
      }
      const Allocate allocate = [&](int64_t rows) { return matches.Allocate({rows, 4}); };
      if (batch == 0 || classes == 0 || count == 0) {
        allocate(0);
        return Ort::Status(nullptr);
      }
      Device::template nms_match<T>(context, boxes.Data(), scores.Data(), batch, classes, count, iou_threshold.Data(),
                                    score_threshold.Data(), allocate);
      return Ort::Status(nullptr);
    });
  }
};

// The CPU library's device: the kernels of kernels/nms.h and nms_rotated.h (half types widened to float32).
struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";

  template <class T>
  static void nms(OrtKernelContext*, const T* boxes, const T* scores, int64_t count, double iou_threshold,
                  int64_t offset, const Allocate& allocate) {
    const auto kept = kernels::nms(KernelInput<T>(boxes, count * 4).get(), KernelInput<T>(scores, count).get(), count,
                                   iou_threshold, offset);
    std::copy(kept.begin(), kept.end(), allocate(static_cast<int64_t>(kept.size())));
  }

  template <class T>
  static void nms_rotated(OrtKernelContext*, const T* boxes, const T* scores, const int64_t* labels, int64_t count,
                          double iou_threshold, bool clockwise, const Allocate& allocate) {
    const auto kept = kernels::nms_rotated(KernelInput<T>(boxes, count * 5).get(), KernelInput<T>(scores, count).get(),
                                           labels, count, iou_threshold, clockwise);
    std::copy(kept.begin(), kept.end(), allocate(static_cast<int64_t>(kept.size())));
  }

  template <class T>
  static void batched_nms_rotated(OrtKernelContext* context, const T* boxes, const T* scores, int64_t batch,
                                  int64_t classes, int64_t count, double iou_threshold, double score_threshold,
                                  const Allocate& allocate) {
    const auto rows = kernels::batched_nms_rotated(
        KernelInput<T>(boxes, batch * count * 5).get(), KernelInput<T>(scores, batch * classes * count).get(), batch,
        classes, count, iou_threshold, score_threshold, SessionThreads(context));
    std::copy(rows.begin(), rows.end(), allocate(static_cast<int64_t>(rows.size() / 3)));
  }

  // The thresholds in host memory.
  template <class T>
  static void nms_match(OrtKernelContext* context, const T* boxes, const T* scores, int64_t batch, int64_t classes,
                        int64_t count, const T* iou_threshold, const T* score_threshold, const Allocate& allocate) {
    const auto rows = kernels::nms_match(KernelInput<T>(boxes, batch * count * 4).get(),
                                         KernelInput<T>(scores, batch * classes * count).get(), batch, classes, count,
                                         KernelInput<T>(iou_threshold, 1).get()[0],
                                         KernelInput<T>(score_threshold, 1).get()[0], SessionThreads(context));
    std::copy(rows.begin(), rows.end(), allocate(static_cast<int64_t>(rows.size() / 4)));
  }
};

template <class Device, class T>
void append_nms(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp<NonMaxSuppression<Device, T>>("NonMaxSuppression", Device::kProvider)));
}

template <class Device, class T, ONNXTensorElementDataType Element>
void append_nms_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  auto* op =
      complete_op<0b100>(Ort::Custom::CreateLiteCustomOp<NmsRotated<Device, T>>("NmsRotated", Device::kProvider));
  op->GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 3; };  // and the optional labels
  op->GetInputType = [](const OrtCustomOp*, size_t index) {
    return index == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : Element;
  };
  ops.push_back(op);
}

template <class Device, class T>
void append_mmdeploy_nms_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<MmdeployNmsRotated<Device, T>>("NMSRotated", Device::kProvider)));
}

// The thresholds (inputs 2 and 3) in host memory, where the CUDA provider's kernel reads them too.
template <class Device, class T>
void append_nms_match(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  auto* op = complete_op(Ort::Custom::CreateLiteCustomOp<NmsMatch<Device, T>>("NMSMatch", Device::kProvider));
  op->GetInputMemoryType = [](const OrtCustomOp*, size_t index) {
    return index >= 2 ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  };
  ops.push_back(op);
}

}  // namespace opbridge::ort::nms_adapter
