// The CPU ORT kernels of multi-scale deformable attention (ms_deform_attn.h): kernels/ms_deform_attn.h on the
// session's threads.
#include "ort/ms_deform_attn.h"

#include <type_traits>
#include <vector>

namespace opbridge::ort {
namespace {

static_assert(sizeof(Ort::Float16_t) == sizeof(kernels::SoftFloat16), "float16 read as stored: binary16 bits");
static_assert(sizeof(Ort::BFloat16_t) == sizeof(kernels::BFloat16), "bfloat16 read as stored: its 16 bits");

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void ms_deform_attn(OrtKernelContext* context, const char* op, const T* value, const int64_t* spatial_shapes,
                             const int64_t* level_start_index, const T* locations, const T* weights, T* out,
                             const kernels::MSDeformAttnShape& s) {
    if constexpr (is_half_v<T>) {
      // The inputs read as stored and out rounded once by the kernel: bfloat16 always, float16 with AVX-512 (as
      // the torch op reads them).
      constexpr bool kBFloat16 = std::is_same_v<T, Ort::BFloat16_t>;
      if (kBFloat16 || kernels::ms_deform_attn_wide_half()) {
        using H = std::conditional_t<kBFloat16, kernels::BFloat16, kernels::SoftFloat16>;
        kernels::ms_deform_attn(reinterpret_cast<const H*>(value), spatial_shapes, level_start_index,
                                reinterpret_cast<const H*>(locations), reinterpret_cast<const H*>(weights),
                                reinterpret_cast<H*>(out), s, SessionThreads(context));
        return;
      }
      const int64_t samples = s.batch * s.queries * s.heads * s.levels * s.points;
      const KernelInput<T> l(locations, 2 * samples), w(weights, samples);
      const KernelInput<T> v(value, s.batch * s.keys * s.heads * s.channels);
      KernelOutput<T> y(out, s.batch * s.queries * s.heads * s.channels);
      ms_deform_attn<float>(context, op, v.get(), spatial_shapes, level_start_index, l.get(), w.get(), y.get(), s);
      y.finish();
    } else {
      kernels::ms_deform_attn(value, spatial_shapes, level_start_index, locations, weights, out, s,
                              SessionThreads(context));
    }
  }
};

using ms_deform_attn_adapter::kMmdeployOp;
using ms_deform_attn_adapter::kOp;
using ms_deform_attn_adapter::make_op;

// float16 on the CPU: value read as stored with AVX-512 (float32 arithmetic, the output rounded once), else widened
// into per-thread scratch (the CUDA library registers its own float16 nodes); bfloat16 read as stored (the CPU
// only).
void append_ms_deform_attn(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ms_deform_attn_adapter::append<Cpu>(ops);
  ops.push_back(make_op<Cpu, Ort::Float16_t, kOp>("MultiScaleDeformableAttention"));
  ops.push_back(make_op<Cpu, Ort::BFloat16_t, kOp>("MultiScaleDeformableAttention"));
}

void append_mmdeploy_ms_deform_attn(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ms_deform_attn_adapter::append_mmdeploy<Cpu>(ops);
  ops.push_back(make_op<Cpu, Ort::Float16_t, kMmdeployOp>("MMCVMultiScaleDeformableAttention"));
  ops.push_back(make_op<Cpu, Ort::BFloat16_t, kMmdeployOp>("MMCVMultiScaleDeformableAttention"));
}

}  // namespace

OPBRIDGE_ORT_OP(MultiScaleDeformableAttention, 1, append_ms_deform_attn);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVMultiScaleDeformableAttention, 1, append_mmdeploy_ms_deform_attn);

}  // namespace opbridge::ort
