// The CPU ORT kernels of the deformable convolutions (deform_conv2d.h): kernels/deform_conv2d.h on the session's
// threads, with the library's GEMM.
#include "ort/deform_conv2d.h"

#include "kernels/linear_bf16.h"
#include "ort/gemm.h"

#include <type_traits>
#include <vector>

namespace opbridge::ort {
namespace {

// bfloat16 nodes on CPUs with AVX512-BF16 (kernels::bf16_products_chosen): the columns sampled in float32 and
// rounded to bfloat16, multiplied by kernels/linear_bf16.h (float32 sums, the bias added before the output's
// rounding): two roundings, as the torch op's bfloat16 path (which multiplies with torch's oneDNN GEMM instead on
// CPUs with AMX tiles).
void bf16_products(OrtKernelContext* context, const Ort::BFloat16_t* x, const Ort::BFloat16_t* w,
                   const Ort::BFloat16_t* offset, const Ort::BFloat16_t* mask, const Ort::BFloat16_t* bias,
                   Ort::BFloat16_t* out, const kernels::DeformConv2dShape& s) {
  using kernels::BFloat16;
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  if (s.batch * s.out_channels * pixels == 0) return;
  const KernelInput<Ort::BFloat16_t> offset_f(offset, s.batch * s.offset_groups * taps * 2 * pixels);
  const KernelInput<Ort::BFloat16_t> mask_f(mask, mask ? s.batch * s.offset_groups * taps * pixels : 0);
  const auto halves = [](const auto* p) { return reinterpret_cast<const BFloat16*>(p); };
  kernels::LinearBf16Packing linear;  // each weight group packed once for this call
  kernels::deform_conv2d_bf16_products(halves(x), halves(w), offset_f.get(), mask ? mask_f.get() : nullptr,
                                       bias ? halves(bias) : nullptr, reinterpret_cast<BFloat16*>(out), s,
                                       SessionThreads(context), linear);
}

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  // Per kernel instance: the runtime's GEMM where it replaces the library's (gemm.h).
  struct DeformConv2dState {
    explicit DeformConv2dState(const OrtKernelInfo* info) : runtime_gemm(info) {}
    RuntimeGemm runtime_gemm;
  };
  template <class T>
  static void deform_conv2d(const DeformConv2dState& state, OrtKernelContext* context, const T* x, const T* w,
                            const T* offset, const T* mask, const T* bias, T* out,
                            const kernels::DeformConv2dShape& shape) {
    if constexpr (std::is_same_v<T, Ort::BFloat16_t>) {
      if (kernels::bf16_products_chosen()) return bf16_products(context, x, w, offset, mask, bias, out, shape);
    }
    if constexpr (is_half_v<T>) {
      const auto& s = shape;
      const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
      const KernelInput<T> xf(x, s.batch * s.in_channels * s.height * s.width);
      const KernelInput<T> wf(w, s.out_channels * (s.in_channels / s.groups) * taps);
      const KernelInput<T> of(offset, s.batch * s.offset_groups * taps * 2 * pixels);
      const KernelInput<T> mf(mask, mask ? s.batch * s.offset_groups * taps * pixels : 0);
      const KernelInput<T> bf(bias, bias ? s.out_channels : 0);
      KernelOutput<T> y(out, s.batch * s.out_channels * pixels);
      deform_conv2d<float>(state, context, xf.get(), wf.get(), of.get(), mask ? mf.get() : nullptr,
                           bias ? bf.get() : nullptr, y.get(), shape);
      y.finish();
    } else {
      if constexpr (std::is_same_v<T, float>) {
        if (state.runtime_gemm) {
          auto runtime_gemm = [&](int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                                  int64_t ldb, float* c,
                                  int64_t ldc) { state.runtime_gemm(context, m, n, k, a, lda, b, ldb, c, ldc); };
          return kernels::deform_conv2d(x, w, offset, mask, bias, out, shape, SessionThreads(context), runtime_gemm);
        }
      }
      kernels::deform_conv2d(x, w, offset, mask, bias, out, shape, SessionThreads(context), gemm<T>);
    }
  }
};

void append_deform_conv2d(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  deform_conv2d_adapter::append<Cpu, true>(ops);
}
void append_mmcv_modulated_deform_conv2d(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  deform_conv2d_adapter::append_mmcv_modulated<Cpu, true>(ops);
}
void append_mmcv_deform_conv2d(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  deform_conv2d_adapter::append_mmcv_v1<Cpu, true>(ops);
}

}  // namespace

OPBRIDGE_ORT_OP(DeformConv2d, 1, append_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);

}  // namespace opbridge::ort
