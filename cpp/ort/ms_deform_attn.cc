// The CPU ORT kernels of multi-scale deformable attention (ms_deform_attn.h): kernels/ms_deform_attn.h on the
// session's threads.
#include "ort/ms_deform_attn.h"

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void ms_deform_attn(OrtKernelContext* context, const char*, const T* value, const int64_t* spatial_shapes,
                             const int64_t* level_start_index, const T* locations, const T* weights, T* out,
                             const kernels::MSDeformAttnShape& shape) {
    kernels::ms_deform_attn(value, spatial_shapes, level_start_index, locations, weights, out, shape,
                            SessionThreads(context));
  }
};

void append_ms_deform_attn(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ms_deform_attn_adapter::append<Cpu>(ops);
}

void append_mmdeploy_ms_deform_attn(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ms_deform_attn_adapter::append_mmdeploy<Cpu>(ops);
}

}  // namespace

OPBRIDGE_ORT_OP(MultiScaleDeformableAttention, 1, append_ms_deform_attn);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVMultiScaleDeformableAttention, 1, append_mmdeploy_ms_deform_attn);

}  // namespace opbridge::ort
