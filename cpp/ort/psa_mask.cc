// The CPU library's mmcv::MMCVPSAMask (its adapter, for both libraries, in ort/psa_mask.h): kernels/psa_mask.h on
// the session's threads; float16 computed in float32.
#include "ort/psa_mask.h"

#include <cstdint>
#include <vector>

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void psa_mask(OrtKernelContext* context, const T* input, T* out, const kernels::PsaMaskShape& s) {
    const int64_t pixels = s.height * s.width;
    KernelOutput<T> y(out, s.batch * pixels * pixels);
    kernels::psa_mask(KernelInput<T>(input, s.batch * s.mask_h * s.mask_w * pixels).get(), y.get(), s,
                      SessionThreads(context));
    y.finish();
  }
};

void append_psa_mask(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  psa_mask_adapter::append<Cpu, float>(ops);
  psa_mask_adapter::append<Cpu, double>(ops);
  psa_mask_adapter::append<Cpu, Ort::Float16_t>(ops);
  psa_mask_adapter::append<Cpu, Ort::BFloat16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVPSAMask, 1, append_psa_mask);

}  // namespace opbridge::ort
