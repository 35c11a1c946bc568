// Which of torch's libraries runs the float32 GEMMs of opbridge's CPU ops (deform_conv2d's forward and backward):
//
//   blas     torch's BLAS through aten::mm (MKL in the x86 wheels of PyPI);
//   onednn   oneDNN's matmul through torch's own mkldnn::_linear_pointwise (oneDNN ships inside every x86 torch).
//
// MKL runs its AVX2 code on x86 CPUs that are not Intel's, AVX-512 or not. On an AMD EPYC with AVX-512 (Zen 5),
// torch 2.14, one thread, the 256 x 4200 x 2304 product of a C256 3x3 deformable convolution takes 44 ms through
// MKL and 20 ms through oneDNN (which picks its kernels by instruction set), the 256 x 352 x 2304 block one task
// multiplies 3.7 ms against 1.6 ms (docs/architecture.md). So by default: oneDNN on non-Intel x86 CPUs with
// AVX-512F, torch's BLAS everywhere else (MKL's own kernels on Intel; MKL's AVX2 kernels are its best on AVX2-only
// CPUs). The environment variable OPBRIDGE_CPU_GEMM (blas or onednn) overrides that choice, read once.
//
// float64 always goes to torch's BLAS (oneDNN has no float64 matmul). Both compute float32 products in float32
// unless the user asked torch for lower precision (torch.backends.mkldnn.matmul.fp32_precision), which then
// applies to these products as it does to torch's own matmul. A oneDNN call that fails (a torch built without
// oneDNN) falls back to torch's BLAS for the rest of the process.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/linear_bf16.h"

namespace opbridge::api {

enum class CpuGemm { blas, onednn };

// The library the float32 GEMMs use: the choice above, decided once per process.
inline CpuGemm cpu_gemm_choice() {
  static const CpuGemm choice = [] {
    if (const char* forced = std::getenv("OPBRIDGE_CPU_GEMM")) {
      if (std::strcmp(forced, "blas") == 0) return CpuGemm::blas;
      if (std::strcmp(forced, "onednn") == 0) return CpuGemm::onednn;
      std::fprintf(stderr, "opbridge: OPBRIDGE_CPU_GEMM=%s is not one of blas, onednn; ignored\n", forced);
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!__builtin_cpu_is("intel") && __builtin_cpu_supports("avx512f")) return CpuGemm::onednn;
#endif
    return CpuGemm::blas;
  }();
  return choice;
}

// Set when a oneDNN call failed: every later GEMM goes to torch's BLAS.
inline std::atomic<bool>& onednn_gemm_failed() {
  static std::atomic<bool> failed{false};
  return failed;
}

// Whether deform_conv2d's bfloat16 forward multiplies in bfloat16 (kernels::deform_conv2d_bf16_products: its
// sampled columns rounded to bfloat16, then a bfloat16 GEMM, float32 sums; two roundings instead of the float32
// path's one): by default on x86 CPUs with AVX512-BF16 (Intel's with AMX have it too), where the library's bfloat16
// GEMM (kernels/linear_bf16.h: AMX tiles or vdpbf16ps) takes half the float32 one's time or less (oneDNN's: AMD
// EPYC Zen 5, one thread, 256 x 448 x 2304: 1.05 ms against 2.09, 2026-11-28). OPBRIDGE_CPU_BF16_GEMM=0 or 1
// overrides that choice (1 on a CPU without those instructions is correct and slow: torch emulates them), read once
// (kernels::bf16_products_chosen, which the ORT library's bfloat16 nodes ask too); python/opbridge/ops/deform_conv2d.py
// mirrors it.
inline bool use_bf16_products() { return kernels::bf16_products_chosen(); }

inline bool use_onednn_gemm() {
  return cpu_gemm_choice() == CpuGemm::onednn && !onednn_gemm_failed().load(std::memory_order_relaxed);
}

}  // namespace opbridge::api
