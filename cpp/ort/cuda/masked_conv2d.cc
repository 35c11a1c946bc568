// The ORT CUDA library's mmcv's MMCVMaskedConv2d: the adapter of ort/masked_conv2d.h with a device that queues
// this op's launches (cuda/masked_conv2d.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/masked_conv2d.h"
#include "ort/masked_conv2d.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void masked_conv2d(OrtKernelContext* context, const T* features, const std::vector<int64_t>& positions,
                            const T* weight, const T* bias, T* out, const kernels::MaskedConv2dShape& s) {
    void* stream = stream_of(context);
    const DeviceInput<T> f(features, s.channels * s.height * s.width, stream);
    const DeviceInput<T> w(weight, s.out_channels * s.channels * s.kernel_h * s.kernel_w, stream);
    const std::optional<DeviceInput<T>> b =
        bias != nullptr ? std::optional<DeviceInput<T>>(std::in_place, bias, s.out_channels, stream) : std::nullopt;
    DeviceOutput<T> y(out, s.out_channels * s.out_h * s.out_w, stream);
    check(cuda::masked_conv2d(f.get(), positions, w.get(), b ? b->get() : nullptr, y.get(), s, stream));
    y.finish();
  }
};

void append_masked_conv2d(Ops& ops) {
  masked_conv2d_adapter::append<Cuda>(ops);
  masked_conv2d_adapter::append_half<Cuda>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVMaskedConv2d, 1, append_masked_conv2d);

}  // namespace opbridge::ort
