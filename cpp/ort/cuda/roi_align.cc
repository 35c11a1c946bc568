// The ORT CUDA library's mmcv's and mmdeploy's MMCVRoiAlign: the adapter of ort/roi_align.h with a device that queues
// this op's launches (cuda/roi_align.h) on the session's CUDA stream (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/device.h"
#include "ort/cuda/roi_align.h"
#include "ort/roi_align.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void roi_align(OrtKernelContext* context, const T* input,
                        const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                        const kernels::RoiAlignRotatedShape& s, bool max_pool) {
    void* stream = stream_of(context);
    const DeviceInput<T> x(input, s.batch * s.channels * s.height * s.width, stream);
    DeviceOutput<T> y(out, s.rois * s.channels * s.pooled_height * s.pooled_width, stream);
    check(cuda::roi_align(x.get(), rois, y.get(), s, max_pool, stream));
    y.finish();
  }
};

template <const char* Op>
void append_roi_align(Ops& ops) {
  roi_align_adapter::append_typed<Cuda, float, Op>(ops);
  roi_align_adapter::append_typed<Cuda, double, Op>(ops);
  roi_align_adapter::append_typed<Cuda, Ort::Float16_t, Op>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRoiAlign, 1, append_roi_align<roi_align_adapter::kOp>);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVRoiAlign, 1, append_roi_align<roi_align_adapter::kMmdeployOp>);

}  // namespace opbridge::ort
