// The ORT CUDA library's mmcv's MMCVCARAFE and MMCVCARAFENaive: the adapter of ort/carafe.h with a device that queues
// this op's launches (cuda/carafe.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/carafe.h"
#include "ort/cuda/carafe.h"
#include "ort/cuda/device.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void carafe(OrtKernelContext* context, const T* features, const T* masks, T* out,
                     const kernels::CarafeShape& s) {
    void* stream = stream_of(context);
    const int64_t scaled = s.height * s.scale * s.width * s.scale;
    const DeviceInput<T> f(features, s.batch * s.channels * s.height * s.width, stream);
    const DeviceInput<T> m(masks, s.batch * s.group * s.kernel * s.kernel * scaled, stream);
    DeviceOutput<T> y(out, s.batch * s.channels * scaled, stream);
    check(cuda::carafe(f.get(), m.get(), y.get(), s, stream));
    y.finish();
  }
};

void append_carafe(Ops& ops) {
  carafe_adapter::append<Cuda, float>(ops);
  carafe_adapter::append<Cuda, double>(ops);
  carafe_adapter::append<Cuda, Ort::Float16_t>(ops);
}
void append_carafe_naive(Ops& ops) {
  carafe_adapter::append_naive<Cuda, float>(ops);
  carafe_adapter::append_naive<Cuda, double>(ops);
  carafe_adapter::append_naive<Cuda, Ort::Float16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCARAFE, 1, append_carafe);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCARAFENaive, 1, append_carafe_naive);

}  // namespace opbridge::ort
