// The CPU library's nodes of kernels/cumulative.h (their adapters, for both libraries, in ort/cummax.h):
// mmcv::cummax, mmcv::cummin and mmcv::MMCVCornerPool on the session's threads; float16 computed in float32.
#include "ort/cummax.h"

#include <cstdint>
#include <vector>

namespace opbridge::ort {
namespace {

using namespace cumulative_adapter;

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <bool Max, class T>
  static void cumulative_extreme(OrtKernelContext* context, const T* input, T* values, int64_t* indices,
                                 const kernels::CumulativeShape& s, bool reverse) {
    const int64_t count = s.outer * s.length * s.inner;
    KernelOutput<T> v(values, count);
    kernels::cumulative_extreme<Max>(KernelInput<T>(input, count).get(), v.get(), indices, s, reverse,
                                     SessionThreads(context));
    v.finish();
  }
};

template <bool Max, const char* Op>
void append_typed(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_cumulative<Cpu, float, Max, Op>(op_type, ops);
  append_cumulative<Cpu, double, Max, Op>(op_type, ops);
  append_cumulative<Cpu, int64_t, Max, Op>(op_type, ops);
  append_cumulative<Cpu, Ort::Float16_t, Max, Op>(op_type, ops);
  append_cumulative<Cpu, Ort::BFloat16_t, Max, Op>(op_type, ops);
}

void append_cummax(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) { append_typed<true, kCummax>("cummax", ops); }
void append_cummin(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) { append_typed<false, kCummin>("cummin", ops); }

void append_corner_pools(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_corner_pool<Cpu, float>(ops);
  append_corner_pool<Cpu, double>(ops);
  append_corner_pool<Cpu, Ort::Float16_t>(ops);
  append_corner_pool<Cpu, Ort::BFloat16_t>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, cummax, 1, append_cummax);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, cummin, 1, append_cummin);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCornerPool, 1, append_corner_pools);

}  // namespace opbridge::ort
