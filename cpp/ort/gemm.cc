#include "ort/gemm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cpu_isa.h"

namespace opbridge::ort {

#ifdef OPBRIDGE_WITH_OPENBLAS
// Global to this OpenBLAS copy, which only libraries linked to scipy-openblas32 share.
void init_gemm() { scipy_openblas_set_num_threads(1); }
#else
void init_gemm() {}
#endif

namespace {

// Whether the library's own GEMM runs at the CPU's width: OpenBLAS's AVX-512 kernels on an AVX-512 CPU.
bool library_gemm_is_full_width() {
#ifdef OPBRIDGE_WITH_OPENBLAS
#if defined(OPBRIDGE_ISA_DISPATCH)
  if (kernels::cpu_isa() != kernels::CpuIsa::avx512f) return true;
  const std::string core = scipy_openblas_get_corename();
  return core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
#else
  return true;
#endif
#else
  return false;  // the portable loop
#endif
}

}  // namespace

bool use_runtime_gemm() {
  static const bool use = [] {
    if (const char* forced = std::getenv("OPBRIDGE_ORT_GEMM")) {
      if (std::strcmp(forced, "openblas") == 0) return false;
      if (std::strcmp(forced, "runtime") == 0) return true;
      std::fprintf(stderr, "opbridge: OPBRIDGE_ORT_GEMM=%s is not one of openblas, runtime; ignored\n", forced);
    }
    return !library_gemm_is_full_width();
  }();
  return use;
}

RuntimeGemm::RuntimeGemm(const OrtKernelInfo* info) {
  if (!use_runtime_gemm() || api_version() < 12) return;  // OrtApi::CreateOp: ORT 1.12
  try {
    const char* type_names[] = {"T"};
    const ONNXTensorElementDataType types[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
    // A standalone kernel has no schema to fill in defaults: every attribute the kernel reads is given.
    const int64_t trans_a = 0, trans_b = 1;
    const float alpha = 1.0f, beta = 0.0f;
    Ort::OpAttr attributes[] = {Ort::OpAttr("transA", &trans_a, 1, OrtOpAttrType::ORT_OP_ATTR_INT),
                                Ort::OpAttr("transB", &trans_b, 1, OrtOpAttrType::ORT_OP_ATTR_INT),
                                Ort::OpAttr("alpha", &alpha, 1, OrtOpAttrType::ORT_OP_ATTR_FLOAT),
                                Ort::OpAttr("beta", &beta, 1, OrtOpAttrType::ORT_OP_ATTR_FLOAT)};
    op_ = Ort::Op::Create(info, "Gemm", "", 13, type_names, types, 1, attributes, 4, 2, 1);
  } catch (const Ort::Exception& error) {
    op_ = Ort::Op(nullptr);  // the library's GEMM runs instead, and says so once
    static std::once_flag once;
    std::call_once(once, [&] {
      std::fprintf(stderr,
                   "opbridge: the runtime's Gemm kernel could not be created (%s); OpenBLAS or the "
                   "portable loop runs the deformable convolutions' products\n",
                   error.what());
    });
  }
}

void RuntimeGemm::operator()(OrtKernelContext* context, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                             const float* b, int64_t ldb, float* c, int64_t ldc) const {
  // The runtime's tensors are dense: strided operands and results go through copies.
  auto dense = [k](const float* rows, int64_t count, int64_t ld, std::vector<float>& copy) {
    if (ld == k) return rows;
    copy.resize(static_cast<size_t>(count * k));
    for (int64_t i = 0; i < count; ++i) std::memcpy(copy.data() + i * k, rows + i * ld, sizeof(float) * size_t(k));
    return static_cast<const float*>(copy.data());
  };
  std::vector<float> a_copy, b_copy, result;
  a = dense(a, m, lda, a_copy);
  b = dense(b, n, ldb, b_copy);
  float* out = c;
  if (ldc != n) {
    result.resize(static_cast<size_t>(m * n));
    out = result.data();
  }
  const auto memory = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
  const int64_t a_shape[] = {m, k}, b_shape[] = {n, k}, c_shape[] = {m, n};
  Ort::Value inputs[] = {
      Ort::Value::CreateTensor<float>(memory, const_cast<float*>(a), static_cast<size_t>(m * k), a_shape, 2),
      Ort::Value::CreateTensor<float>(memory, const_cast<float*>(b), static_cast<size_t>(n * k), b_shape, 2)};
  Ort::Value outputs[] = {Ort::Value::CreateTensor<float>(memory, out, static_cast<size_t>(m * n), c_shape, 2)};
  const OrtValue* input_values[] = {inputs[0], inputs[1]};
  OrtValue* output_values[] = {outputs[0]};
  Ort::ThrowOnError(Ort::GetApi().InvokeOp(context, op_, input_values, 2, output_values, 1));
  if (out != c) {
    for (int64_t i = 0; i < m; ++i) std::memcpy(c + i * ldc, out + i * n, sizeof(float) * size_t(n));
  }
}

}  // namespace opbridge::ort
