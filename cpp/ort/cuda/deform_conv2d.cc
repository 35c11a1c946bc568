// The ORT CUDA library's the deformable convolution nodes (opbridge's, mmcv's and mmdeploy's): the adapter of
// ort/deform_conv2d.h with a device that queues this op's launches (cuda/deform_conv2d.h) on the session's CUDA stream
// (cuda/device.h).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ort/cuda/deform_conv2d.h"
#include "ort/cuda/device.h"
#include "ort/deform_conv2d.h"

namespace opbridge::ort {
namespace {

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  // Per kernel instance: nothing here.
  struct DeformConv2dState {
    explicit DeformConv2dState(const OrtKernelInfo*) {}
  };
  template <class T>
  static void deform_conv2d(const DeformConv2dState&, OrtKernelContext* context, const T* x, const T* w,
                            const T* offset, const T* mask, const T* bias, T* out,
                            const kernels::DeformConv2dShape& shape) {
    using B = typename Bits<T>::type;  // float16: read as stored, float32 arithmetic, one rounding
    check(cuda::deform_conv2d(reinterpret_cast<const B*>(x), reinterpret_cast<const B*>(w),
                              reinterpret_cast<const B*>(offset), reinterpret_cast<const B*>(mask),
                              reinterpret_cast<const B*>(bias), reinterpret_cast<B*>(out), shape, stream_of(context)));
  }
};

void append_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append<Cuda>(ops); }
void append_mmcv_modulated_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append_mmcv_modulated<Cuda>(ops); }
void append_mmcv_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append_mmcv_v1<Cuda>(ops); }

}  // namespace

OPBRIDGE_ORT_OP(DeformConv2d, 1, append_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);

}  // namespace opbridge::ort
