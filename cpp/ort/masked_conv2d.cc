// The CPU library's mmcv::MMCVMaskedConv2d (its adapter, for both libraries, in ort/masked_conv2d.h):
// kernels/masked_conv2d.h on the session's threads with the library's GEMM (ort/gemm.h); float16 computed in
// float32.
#include "ort/masked_conv2d.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/gemm.h"

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void masked_conv2d(OrtKernelContext* context, const T* features, const std::vector<int64_t>& positions,
                            const T* weight, const T* bias, T* out, const kernels::MaskedConv2dShape& s) {
    const int64_t count = s.out_channels * s.out_h * s.out_w;
    KernelOutput<T> y(out, count);
    std::fill(y.get(), y.get() + count, kernel_type<T>(0));
    if (!positions.empty()) {
      const std::optional<KernelInput<T>> b =
          bias != nullptr ? std::optional<KernelInput<T>>(std::in_place, bias, s.out_channels) : std::nullopt;
      kernels::masked_conv2d(KernelInput<T>(features, s.channels * s.height * s.width).get(), positions,
                             KernelInput<T>(weight, s.out_channels * s.channels * s.kernel_h * s.kernel_w).get(),
                             b ? b->get() : nullptr, y.get(), s, SessionThreads(context), gemm<kernel_type<T>>);
    }
    y.finish();
  }
};

void append_masked_conv2d(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  masked_conv2d_adapter::append<Cpu>(ops);
  masked_conv2d_adapter::append_half<Cpu>(ops);
  masked_conv2d_adapter::append_half<Cpu, Ort::BFloat16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVMaskedConv2d, 1, append_masked_conv2d);

}  // namespace opbridge::ort
