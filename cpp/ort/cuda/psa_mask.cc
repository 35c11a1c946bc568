// The ORT CUDA library's mmcv's MMCVPSAMask: the adapter of ort/psa_mask.h with a device that queues
// this op's launches (cuda/psa_mask.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/psa_mask.h"
#include "ort/psa_mask.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void psa_mask(OrtKernelContext* context, const T* input, T* out, const kernels::PsaMaskShape& s) {
    void* stream = stream_of(context);
    const int64_t pixels = s.height * s.width;
    const DeviceInput<T> x(input, s.batch * s.mask_h * s.mask_w * pixels, stream);
    DeviceOutput<T> y(out, s.batch * pixels * pixels, stream);
    check(cuda::psa_mask(x.get(), y.get(), s, stream));
    y.finish();
  }
};

void append_psa_mask(Ops& ops) {
  psa_mask_adapter::append<Cuda, float>(ops);
  psa_mask_adapter::append<Cuda, double>(ops);
  psa_mask_adapter::append<Cuda, Ort::Float16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVPSAMask, 1, append_psa_mask);

}  // namespace opbridge::ort
