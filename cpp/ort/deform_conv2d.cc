// The CPU ORT kernels of the deformable convolutions (deform_conv2d.h): kernels/deform_conv2d.h on the session's
// threads, with the library's GEMM.
#include "ort/deform_conv2d.h"

#include "ort/gemm.h"

namespace opbridge::ort {
namespace {

struct Cpu {
  static constexpr const char* kProvider = "CPUExecutionProvider";
  template <class T>
  static void deform_conv2d(OrtKernelContext* context, const T* x, const T* w, const T* offset, const T* mask,
                            const T* bias, T* out, const kernels::DeformConv2dShape& shape) {
    kernels::deform_conv2d(x, w, offset, mask, bias, out, shape, SessionThreads(context), gemm<T>);
  }
};

void append_deform_conv2d(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) { deform_conv2d_adapter::append<Cpu>(ops); }
void append_mmcv_modulated_deform_conv2d(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  deform_conv2d_adapter::append_mmcv_modulated<Cpu>(ops);
}
void append_mmcv_deform_conv2d(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  deform_conv2d_adapter::append_mmcv_v1<Cpu>(ops);
}

}  // namespace

OPBRIDGE_ORT_OP(DeformConv2d, 1, append_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);

}  // namespace opbridge::ort
