// The ORT CUDA library's the multi-scale deformable attention nodes (opbridge's and mmdeploy's): float, double and
// float16 read as stored: the adapter of ort/ms_deform_attn.h with a device that queues this op's launches
// (cuda/ms_deform_attn.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/ms_deform_attn.h"
#include "ort/ms_deform_attn.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void ms_deform_attn(OrtKernelContext* context, const char*, const T* value, const int64_t* spatial_shapes,
                             const int64_t* level_start_index, const T* locations, const T* weights, T* out,
                             const kernels::MSDeformAttnShape& shape) {
    using B = typename Bits<T>::type;  // float16: read as stored, float32 arithmetic, one rounding
    check(cuda::ms_deform_attn(reinterpret_cast<const B*>(value), spatial_shapes, level_start_index,
                               reinterpret_cast<const B*>(locations), reinterpret_cast<const B*>(weights),
                               reinterpret_cast<B*>(out), shape, stream_of(context)));
  }
};

// MSDA also in float16 (a model after .half()): the kernel reads and writes float16 and computes in float32.
void append_ms_deform_attn(Ops& ops) {
  ms_deform_attn_adapter::append<Cuda>(ops);
  ops.push_back(ms_deform_attn_adapter::make_op<Cuda, Ort::Float16_t, ms_deform_attn_adapter::kOp>(
      "MultiScaleDeformableAttention"));
}
void append_mmdeploy_ms_deform_attn(Ops& ops) {
  ms_deform_attn_adapter::append_mmdeploy<Cuda>(ops);
  ops.push_back(ms_deform_attn_adapter::make_op<Cuda, Ort::Float16_t, ms_deform_attn_adapter::kMmdeployOp>(
      "MMCVMultiScaleDeformableAttention"));
}

}  // namespace

OPBRIDGE_ORT_OP(MultiScaleDeformableAttention, 1, append_ms_deform_attn);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVMultiScaleDeformableAttention, 1, append_mmdeploy_ms_deform_attn);

}  // namespace opbridge::ort
