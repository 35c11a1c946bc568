// The ORT CUDA library's RoiAlignRotated and mmcv's/mmdeploy's MMCVRoIAlignRotated: the adapter of ort/rotated.h with a
// device that queues this op's launches (cuda/roi_align_rotated.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/roi_align_rotated.h"
#include "ort/rotated.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void roi_align_rotated(OrtKernelContext* context, const T* input,
                                const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                                const kernels::RoiAlignRotatedShape& s) {
    void* stream = stream_of(context);
    const DeviceInput<T> x(input, s.batch * s.channels * s.height * s.width, stream);
    DeviceOutput<T> y(out, s.rois * s.channels * s.pooled_height * s.pooled_width, stream);
    check(cuda::roi_align_rotated(x.get(), rois, y.get(), s, stream));
    y.finish();
  }
};

template <const char* Op>
void append_roi_align_rotated(const char* op_type, Ops& ops) {
  rotated_adapter::append_roi_align_rotated<Cuda, float, Op>(op_type, ops);
  rotated_adapter::append_roi_align_rotated<Cuda, double, Op>(op_type, ops);
  rotated_adapter::append_roi_align_rotated<Cuda, Ort::Float16_t, Op>(op_type, ops);
}
void append_opbridge_roi_align_rotated(Ops& ops) {
  append_roi_align_rotated<rotated_adapter::kRoiAlignOp>("RoiAlignRotated", ops);
}
void append_mmcv_roi_align_rotated(Ops& ops) {
  append_roi_align_rotated<rotated_adapter::kMmcvRoiAlignOp>("MMCVRoIAlignRotated", ops);
}
void append_mmdeploy_roi_align_rotated(Ops& ops) {
  append_roi_align_rotated<rotated_adapter::kMmdeployRoiAlignOp>("MMCVRoIAlignRotated", ops);
}

}  // namespace

OPBRIDGE_ORT_OP(RoiAlignRotated, 1, append_opbridge_roi_align_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRoIAlignRotated, 1, append_mmcv_roi_align_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVRoIAlignRotated, 1, append_mmdeploy_roi_align_rotated);

}  // namespace opbridge::ort
