// The CPU ORT kernels of mmcv::MMCVRoiAlign and mmdeploy::MMCVRoiAlign (roi_align.h): kernels/roi_align.h on the
// session's threads; float16 computed in float32.
#include "ort/roi_align.h"

#include <vector>

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void roi_align(OrtKernelContext* context, const T* input,
                        const std::vector<kernels::roi_align_rotated_detail::Roi>& rois, T* out,
                        const kernels::RoiAlignRotatedShape& s, bool max_pool) {
    const KernelInput<T> x(input, s.batch * s.channels * s.height * s.width);
    KernelOutput<T> y(out, s.rois * s.channels * s.pooled_height * s.pooled_width);
    kernels::roi_align(x.get(), rois, y.get(), s, max_pool, SessionThreads(context));
    y.finish();
  }
};

template <const char* Op>
void append_mmcv_roi_align(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  roi_align_adapter::append_typed<Cpu, float, Op>(ops);
  roi_align_adapter::append_typed<Cpu, double, Op>(ops);
  roi_align_adapter::append_typed<Cpu, Ort::Float16_t, Op>(ops);
  roi_align_adapter::append_typed<Cpu, Ort::BFloat16_t, Op>(ops);
}

}  // namespace

OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRoiAlign, 1, append_mmcv_roi_align<roi_align_adapter::kOp>);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVRoiAlign, 1, append_mmcv_roi_align<roi_align_adapter::kMmdeployOp>);

}  // namespace opbridge::ort
