// The ORT CUDA library's nodes: the same adapters as the CPU library (ort/<op>.h: node names, attributes, checks,
// error messages) with a device that queues the shared CUDA kernels (launch.h) on the session's CUDA stream.
// Inputs and outputs are in the CUDA execution provider's device memory, except MSDA's level table, which the
// adapter asks for in host memory (it is checked there and passed to the kernel by value).
#include <stdexcept>
#include <string>

#include "ort/cuda/launch.h"
#include "ort/deform_conv2d.h"
#include "ort/ms_deform_attn.h"
#include "ort/my_add.h"

namespace opbridge::ort {
namespace {

void* stream_of(OrtKernelContext* context) { return Ort::KernelContext(context).GetGPUComputeStream(); }

void check(const char* error) {
  if (error != nullptr) throw std::runtime_error(std::string("CUDA kernel not launched: ") + error);
}

template <class T>
struct Bits {
  using type = T;
};
template <>
struct Bits<Ort::Float16_t> {
  using type = uint16_t;
};

struct Cuda {
  static constexpr const char* kProvider = "CUDAExecutionProvider";

  template <class T>
  static void my_add(OrtKernelContext* context, const T* a, const T* b, T* out, const kernels::BinaryLoop& loop) {
    using B = typename Bits<T>::type;
    check(cuda::my_add(reinterpret_cast<const B*>(a), reinterpret_cast<const B*>(b), reinterpret_cast<B*>(out), loop,
                       stream_of(context)));
  }

  template <class T>
  static void ms_deform_attn(OrtKernelContext* context, const char*, const T* value, const int64_t* spatial_shapes,
                             const int64_t* level_start_index, const T* locations, const T* weights, T* out,
                             const kernels::MSDeformAttnShape& shape) {
    check(cuda::ms_deform_attn(value, spatial_shapes, level_start_index, locations, weights, out, shape,
                               stream_of(context)));
  }

  // Per kernel instance: nothing here.
  struct DeformConv2dState {
    explicit DeformConv2dState(const OrtKernelInfo*) {}
  };
  template <class T>
  static void deform_conv2d(const DeformConv2dState&, OrtKernelContext* context, const T* x, const T* w,
                            const T* offset, const T* mask, const T* bias, T* out,
                            const kernels::DeformConv2dShape& shape) {
    check(cuda::deform_conv2d(x, w, offset, mask, bias, out, shape, stream_of(context)));
  }
};

using Ops = std::vector<Ort::Custom::OrtLiteCustomOp*>;
void append_my_add(Ops& ops) { my_add_adapter::append<Cuda>(ops); }
void append_ms_deform_attn(Ops& ops) { ms_deform_attn_adapter::append<Cuda>(ops); }
void append_mmdeploy_ms_deform_attn(Ops& ops) { ms_deform_attn_adapter::append_mmdeploy<Cuda>(ops); }
void append_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append<Cuda>(ops); }
void append_mmcv_modulated_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append_mmcv_modulated<Cuda>(ops); }
void append_mmcv_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append_mmcv_v1<Cuda>(ops); }

}  // namespace

OPBRIDGE_ORT_OP(MyAdd, 1, append_my_add);
OPBRIDGE_ORT_OP(MultiScaleDeformableAttention, 1, append_ms_deform_attn);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVMultiScaleDeformableAttention, 1, append_mmdeploy_ms_deform_attn);
OPBRIDGE_ORT_OP(DeformConv2d, 1, append_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);

}  // namespace opbridge::ort
