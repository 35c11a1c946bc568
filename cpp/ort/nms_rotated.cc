// The CPU library's nodes of kernels/nms_rotated.h (their adapters, for both libraries, in ort/nms.h):
// opbridge::NmsRotated (opbridge.nms_rotated's node) and mmdeploy::NMSRotated (mmrotate's detectors). float, double
// and float16 (the overlaps computed in float32).
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/nms_rotated.h"
#include "ort/api.h"
#include "ort/nms.h"

namespace opbridge::ort {
namespace {

void append_nms_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  using nms_adapter::Cpu;
  nms_adapter::append_nms_rotated<Cpu, float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>(ops);
  nms_adapter::append_nms_rotated<Cpu, double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>(ops);
  nms_adapter::append_nms_rotated<Cpu, Ort::Float16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>(ops);
  nms_adapter::append_nms_rotated<Cpu, Ort::BFloat16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16>(ops);
}

void append_mmdeploy_nms_rotated(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  nms_adapter::append_mmdeploy_nms_rotated<nms_adapter::Cpu, float>(ops);
  nms_adapter::append_mmdeploy_nms_rotated<nms_adapter::Cpu, double>(ops);
  nms_adapter::append_mmdeploy_nms_rotated<nms_adapter::Cpu, Ort::Float16_t>(ops);
  nms_adapter::append_mmdeploy_nms_rotated<nms_adapter::Cpu, Ort::BFloat16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_OP(NmsRotated, 1, append_nms_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, NMSRotated, 1, append_mmdeploy_nms_rotated);

}  // namespace opbridge::ort
