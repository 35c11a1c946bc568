// ORT adapters of kernels/nms.h, under the nodes mmcv's exporter writes for mmcv.ops.nms and mmcv.ops.soft_nms
// (two-stage detectors' RPN and test-time NMS; soft NMS in mmdetection's test_cfg):
// - mmcv::NonMaxSuppression (ort/nms.h, its adapter for both libraries). mmcv's symbolic drops nms's
//   score_threshold and max_num: the node has neither.
// - mmcv::SoftNonMaxSuppression(boxes [N, 4], scores [N]) -> (dets [M, 5] = (x1, y1, x2, y2, decayed score),
//   inds [M] int64), attributes iou_threshold, sigma, min_score (floats), method (0 naive, 1 linear, 2
//   gaussian) and offset (ints).
// - mmdeploy::NMSMatch (ort/nms.h, its adapter for both libraries): mmdeploy's multiclass_nms_match.
// mmcv's kernels require every attribute; absent here, they take mmcv.ops.nms's and soft_nms's Python defaults
// (iou_threshold 0.3 for soft NMS, sigma 0.5, min_score 1e-3, method linear, offset 0; NMS has no default
// threshold, so it is required). float, double and float16 (computed in float32); SoftNonMaxSuppression on the CPU
// only: one sequential round per picked box (2.6 ms for 1000 clustered boxes, 24.6 ms for 5000, one thread,
// 2026-11-28), which a GPU could run as one block-wide reduction and compaction a round; not written yet.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/nms.h"
#include "ort/api.h"
#include "ort/nms.h"

namespace opbridge::ort {
namespace {

constexpr char kSoftNmsOp[] = "mmcv::SoftNonMaxSuppression";
constexpr char kCpu[] = "CPUExecutionProvider";
using nms_adapter::throw_if;

template <class T>
struct SoftNonMaxSuppression {
  SoftNonMaxSuppression(const OrtApi* api, const OrtKernelInfo* info)
      : iou_threshold(float_attribute(api, info, kSoftNmsOp, "iou_threshold", 0.3f)),
        sigma(float_attribute(api, info, kSoftNmsOp, "sigma", 0.5f)),
        min_score(float_attribute(api, info, kSoftNmsOp, "min_score", 1e-3f)),
        method(int_attribute(api, info, kSoftNmsOp, "method", 1)),
        offset(int_attribute(api, info, kSoftNmsOp, "offset", 0)) {
    throw_if(kernels::check_nms_offset(kSoftNmsOp, offset));
    throw_if(kernels::check_soft_nms_method(kSoftNmsOp, method));
    if (!std::isfinite(iou_threshold) || std::isnan(min_score)) {
      throw std::invalid_argument(std::string(kSoftNmsOp) +
                                  ": attributes 'iou_threshold' and 'min_score' must be numbers, got " +
                                  std::to_string(iou_threshold) + " and " + std::to_string(min_score));
    }
    if (method == 2 && !(std::isfinite(sigma) && sigma > 0)) {
      throw std::invalid_argument(std::string(kSoftNmsOp) +
                                  ": attribute 'sigma' must be a positive finite float for the gaussian method, got " +
                                  std::to_string(sigma));
    }
  }

  Ort::Status Compute(const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      Ort::Custom::Tensor<T>& dets, Ort::Custom::Tensor<int64_t>& inds) {
    return guarded(kSoftNmsOp, [&] {
      int64_t count = 0;
      const auto status = kernels::check_nms(kSoftNmsOp, boxes.Shape(), scores.Shape(), count);
      if (!status.ok()) return from_kernel(status);
      std::vector<kernel_type<T>> rows;
      std::vector<int64_t> picked;
      if (count > 0) {
        kernels::soft_nms(KernelInput<T>(boxes).get(), KernelInput<T>(scores).get(), count, iou_threshold, sigma,
                          min_score, static_cast<kernels::SoftNmsMethod>(method), offset, rows, picked);
      }
      const auto kept = static_cast<int64_t>(picked.size());
      KernelOutput<T> out(dets.Allocate({kept, 5}), kept * 5);
      std::copy(rows.begin(), rows.end(), out.get());
      out.finish();
      std::copy(picked.begin(), picked.end(), inds.Allocate({kept}));
      return Ort::Status(nullptr);
    });
  }

  double iou_threshold, sigma, min_score;
  int64_t method, offset;
};

void append_nms(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  nms_adapter::append_nms<nms_adapter::Cpu, float>(ops);
  nms_adapter::append_nms<nms_adapter::Cpu, double>(ops);
  nms_adapter::append_nms<nms_adapter::Cpu, Ort::Float16_t>(ops);
  nms_adapter::append_nms<nms_adapter::Cpu, Ort::BFloat16_t>(ops);
}

void append_nms_match(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  nms_adapter::append_nms_match<nms_adapter::Cpu, float>(ops);
  nms_adapter::append_nms_match<nms_adapter::Cpu, double>(ops);
  nms_adapter::append_nms_match<nms_adapter::Cpu, Ort::Float16_t>(ops);
  nms_adapter::append_nms_match<nms_adapter::Cpu, Ort::BFloat16_t>(ops);
}

void append_soft_nms(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<SoftNonMaxSuppression<float>>("SoftNonMaxSuppression", kCpu)));
  ops.push_back(
      complete_op(Ort::Custom::CreateLiteCustomOp<SoftNonMaxSuppression<double>>("SoftNonMaxSuppression", kCpu)));
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp<SoftNonMaxSuppression<Ort::Float16_t>>("SoftNonMaxSuppression", kCpu)));
  ops.push_back(complete_op(
      Ort::Custom::CreateLiteCustomOp<SoftNonMaxSuppression<Ort::BFloat16_t>>("SoftNonMaxSuppression", kCpu)));
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, NonMaxSuppression, 1, append_nms);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, SoftNonMaxSuppression, 1, append_soft_nms);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, NMSMatch, 1, append_nms_match);

}  // namespace opbridge::ort
