// The ORT CUDA library's RotatedFeatureAlign and mmcv's MMCVRotatedFeatureAlign: the adapter of ort/rotated.h with a
// device that queues this op's launches (cuda/rotated_feature_align.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/rotated_feature_align.h"
#include "ort/rotated.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void rotated_feature_align(OrtKernelContext* context, const T* features, const T* boxes, T* out,
                                    const kernels::RotatedFeatureAlignShape& s, double spatial_scale) {
    void* stream = stream_of(context);
    const int64_t count = s.batch * s.channels * s.height * s.width;
    const DeviceInput<T> x(features, count, stream), b(boxes, s.batch * s.height * s.width * 5, stream);
    DeviceOutput<T> y(out, count, stream);
    check(cuda::rotated_feature_align(x.get(), b.get(), y.get(), s, spatial_scale, stream));
    y.finish();
  }
};

template <const char* Op>
void append_rotated_feature_align(const char* op_type, Ops& ops) {
  rotated_adapter::append_rotated_feature_align<Cuda, float, Op>(op_type, ops);
  rotated_adapter::append_rotated_feature_align<Cuda, double, Op>(op_type, ops);
  rotated_adapter::append_rotated_feature_align<Cuda, Ort::Float16_t, Op>(op_type, ops);
}
void append_opbridge_rotated_feature_align(Ops& ops) {
  append_rotated_feature_align<rotated_adapter::kFeatureAlignOp>("RotatedFeatureAlign", ops);
}
void append_mmcv_rotated_feature_align(Ops& ops) {
  append_rotated_feature_align<rotated_adapter::kMmcvFeatureAlignOp>("MMCVRotatedFeatureAlign", ops);
}

}  // namespace

OPBRIDGE_ORT_OP(RotatedFeatureAlign, 1, append_opbridge_rotated_feature_align);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRotatedFeatureAlign, 1, append_mmcv_rotated_feature_align);

}  // namespace opbridge::ort
