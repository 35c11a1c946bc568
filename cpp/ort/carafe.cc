// The CPU library's mmcv::MMCVCARAFE and MMCVCARAFENaive (their adapter, for both libraries, in ort/carafe.h):
// kernels/carafe.h on the session's threads; float16 computed in float32.
#include "ort/carafe.h"

#include <cstdint>
#include <vector>

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void carafe(OrtKernelContext* context, const T* features, const T* masks, T* out,
                     const kernels::CarafeShape& s) {
    const int64_t scaled = s.height * s.scale * s.width * s.scale;
    KernelOutput<T> y(out, s.batch * s.channels * scaled);
    kernels::carafe(KernelInput<T>(features, s.batch * s.channels * s.height * s.width).get(),
                    KernelInput<T>(masks, s.batch * s.group * s.kernel * s.kernel * scaled).get(), y.get(), s,
                    SessionThreads(context));
    y.finish();
  }
};

void append_mmcv_carafe(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  carafe_adapter::append<Cpu, float>(ops);
  carafe_adapter::append<Cpu, double>(ops);
  carafe_adapter::append<Cpu, Ort::Float16_t>(ops);
  carafe_adapter::append<Cpu, Ort::BFloat16_t>(ops);
}

void append_mmcv_carafe_naive(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  carafe_adapter::append_naive<Cpu, float>(ops);
  carafe_adapter::append_naive<Cpu, double>(ops);
  carafe_adapter::append_naive<Cpu, Ort::Float16_t>(ops);
  carafe_adapter::append_naive<Cpu, Ort::BFloat16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCARAFE, 1, append_mmcv_carafe);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCARAFENaive, 1, append_mmcv_carafe_naive);

}  // namespace opbridge::ort
