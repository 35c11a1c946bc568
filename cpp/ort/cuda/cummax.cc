// The ORT CUDA library's mmcv's cummax, cummin and MMCVCornerPool: the adapter of ort/cummax.h with a device that
// queues this op's launches (cuda/cummax.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/cummax.h"
#include "ort/cuda/device.h"
#include "ort/cummax.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <bool Max, class T>
  static void cumulative_extreme(OrtKernelContext* context, const T* input, T* values, int64_t* indices,
                                 const kernels::CumulativeShape& s, bool reverse) {
    void* stream = stream_of(context);
    const int64_t count = s.outer * s.length * s.inner;
    const DeviceInput<T> x(input, count, stream);
    DeviceOutput<T> v(values, count, stream);
    check(cuda::cumulative_extreme(x.get(), v.get(), indices, s, Max, reverse, stream));
    v.finish();
  }
};

template <bool Max, const char* Op>
void append_cumulative(const char* op_type, Ops& ops) {
  cumulative_adapter::append_cumulative<Cuda, float, Max, Op>(op_type, ops);
  cumulative_adapter::append_cumulative<Cuda, double, Max, Op>(op_type, ops);
  cumulative_adapter::append_cumulative<Cuda, int64_t, Max, Op>(op_type, ops);
  cumulative_adapter::append_cumulative<Cuda, Ort::Float16_t, Max, Op>(op_type, ops);
}
void append_cummax(Ops& ops) { append_cumulative<true, cumulative_adapter::kCummax>("cummax", ops); }
void append_cummin(Ops& ops) { append_cumulative<false, cumulative_adapter::kCummin>("cummin", ops); }
void append_corner_pool(Ops& ops) {
  cumulative_adapter::append_corner_pool<Cuda, float>(ops);
  cumulative_adapter::append_corner_pool<Cuda, double>(ops);
  cumulative_adapter::append_corner_pool<Cuda, Ort::Float16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, cummax, 1, append_cummax);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, cummin, 1, append_cummin);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCornerPool, 1, append_corner_pool);

}  // namespace opbridge::ort
