// The ORT CUDA library's nodes: the same adapters as the CPU library (ort/<op>.h: node names, attributes, checks,
// error messages) with a device that queues the shared CUDA kernels (launch.h) on the session's CUDA stream.
// Inputs and outputs are in the CUDA execution provider's device memory, except the inputs an adapter asks for in
// host memory to check them there (MSDA's level table, the RoI tables, MaskedConv2d's mask, NMSMatch's
// thresholds). Every node takes float, double and float16 (cummax and cummin also int64, as on the CPU): MyAdd, MSDA,
// grid_sampler and the deformable convolutions read float16 as stored and compute in float32; the others widen it to
// float32 on the device and round their output once, as the CPU library does.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ort/carafe.h"
#include "ort/cuda/launch.h"
#include "ort/cummax.h"
#include "ort/deform_conv2d.h"
#include "ort/grid_sampler.h"
#include "ort/masked_conv2d.h"
#include "ort/ms_deform_attn.h"
#include "ort/my_add.h"
#include "ort/nms.h"
#include "ort/psa_mask.h"
#include "ort/roi_align.h"
#include "ort/rotated.h"

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

// An input as a float32 launch reads it: the tensor's own device memory, or (float16) a float32 copy widened on the
// device (the CPU library's KernelInput, on the GPU).
template <class T>
class DeviceInput {
 public:
  DeviceInput(const T* data, int64_t count, void* stream) {
    if constexpr (std::is_same_v<T, Ort::Float16_t>) {
      scratch_.emplace(sizeof(float) * static_cast<size_t>(std::max<int64_t>(count, 0)), stream);
      check(scratch_->error());
      check(cuda::widen_float16(reinterpret_cast<const uint16_t*>(data), scratch_->get<float>(), count, stream));
      data_ = scratch_->get<float>();
    } else {
      data_ = data;
    }
  }
  const kernel_type<T>* get() const { return data_; }

 private:
  std::optional<cuda::DeviceScratch> scratch_;
  const kernel_type<T>* data_ = nullptr;
};

// An output as a float32 launch writes it: the tensor's device memory, or (float16) a float32 buffer that
// finish() rounds into the tensor once (the CPU library's KernelOutput, on the GPU).
template <class T>
class DeviceOutput {
 public:
  DeviceOutput(T* out, int64_t count, void* stream) : out_(out), count_(count), stream_(stream) {
    if constexpr (std::is_same_v<T, Ort::Float16_t>) {
      scratch_.emplace(sizeof(float) * static_cast<size_t>(std::max<int64_t>(count, 0)), stream);
      check(scratch_->error());
      data_ = scratch_->get<float>();
    } else {
      data_ = out;
    }
  }
  kernel_type<T>* get() const { return data_; }
  void finish() {
    if constexpr (std::is_same_v<T, Ort::Float16_t>) {
      check(cuda::narrow_float16(data_, reinterpret_cast<uint16_t*>(out_), count_, stream_));
    }
  }

 private:
  T* out_;
  int64_t count_;
  void* stream_;
  std::optional<cuda::DeviceScratch> scratch_;
  kernel_type<T>* data_ = nullptr;
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
    using B = typename Bits<T>::type;  // float16: read as stored, float32 arithmetic, one rounding
    check(cuda::ms_deform_attn(reinterpret_cast<const B*>(value), spatial_shapes, level_start_index,
                               reinterpret_cast<const B*>(locations), reinterpret_cast<const B*>(weights),
                               reinterpret_cast<B*>(out), shape, stream_of(context)));
  }

  template <class T>
  static void grid_sample(OrtKernelContext* context, const T* input, const T* grid, T* out,
                          const kernels::GridSampleShape& shape, const kernels::GridSampleAttributes& attributes) {
    using B = typename Bits<T>::type;  // float16: read as stored, float32 arithmetic, one rounding
    check(cuda::grid_sample(reinterpret_cast<const B*>(input), reinterpret_cast<const B*>(grid),
                            reinterpret_cast<B*>(out), shape, attributes, stream_of(context)));
  }

  // The nodes below take float16 as the CPU library does: inputs widened to float32 (on the device), the float32
  // kernel, the output rounded once (DeviceInput / DeviceOutput), so both libraries give the same bits.
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

  template <class T>
  static void box_iou_rotated(OrtKernelContext* context, const T* boxes1, const T* boxes2, T* out,
                              const kernels::BoxIouRotatedShape& s, int64_t mode, bool clockwise) {
    void* stream = stream_of(context);
    const DeviceInput<T> a(boxes1, s.rows * 5, stream), b(boxes2, s.cols * 5, stream);
    DeviceOutput<T> y(out, s.aligned ? s.rows : s.rows * s.cols, stream);
    check(cuda::box_iou_rotated(a.get(), b.get(), y.get(), s, mode, clockwise, stream));
    y.finish();
  }

  template <class T>
  static void nms(OrtKernelContext* context, const T* boxes, const T* scores, int64_t count, double iou_threshold,
                  int64_t offset, const nms_adapter::Allocate& allocate) {
    void* stream = stream_of(context);
    const DeviceInput<T> b(boxes, count * 4, stream), s(scores, count, stream);
    check(cuda::nms(b.get(), s.get(), count, iou_threshold, offset, allocate, stream));
  }

  template <class T>
  static void nms_rotated(OrtKernelContext* context, const T* boxes, const T* scores, const int64_t* labels,
                          int64_t count, double iou_threshold, bool clockwise, const nms_adapter::Allocate& allocate) {
    void* stream = stream_of(context);
    const DeviceInput<T> b(boxes, count * 5, stream), s(scores, count, stream);
    check(cuda::nms_rotated(b.get(), s.get(), labels, count, iou_threshold, clockwise, allocate, stream));
  }

  template <class T>
  static void batched_nms_rotated(OrtKernelContext* context, const T* boxes, const T* scores, int64_t batch,
                                  int64_t classes, int64_t count, double iou_threshold, double score_threshold,
                                  const nms_adapter::Allocate& allocate) {
    void* stream = stream_of(context);
    const DeviceInput<T> b(boxes, batch * count * 5, stream), s(scores, batch * classes * count, stream);
    check(cuda::batched_nms_rotated(b.get(), s.get(), batch, classes, count, iou_threshold, score_threshold, allocate,
                                    stream));
  }

  // The thresholds in host memory (the adapter asks for them there).
  template <class T>
  static void nms_match(OrtKernelContext* context, const T* boxes, const T* scores, int64_t batch, int64_t classes,
                        int64_t count, const T* iou_threshold, const T* score_threshold,
                        const nms_adapter::Allocate& allocate) {
    void* stream = stream_of(context);
    const DeviceInput<T> b(boxes, batch * count * 4, stream), s(scores, batch * classes * count, stream);
    check(cuda::nms_match(b.get(), s.get(), batch, classes, count, KernelInput<T>(iou_threshold, 1).get()[0],
                          KernelInput<T>(score_threshold, 1).get()[0], allocate, stream));
  }

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

  template <class T>
  static void psa_mask(OrtKernelContext* context, const T* input, T* out, const kernels::PsaMaskShape& s) {
    void* stream = stream_of(context);
    const int64_t pixels = s.height * s.width;
    const DeviceInput<T> x(input, s.batch * s.mask_h * s.mask_w * pixels, stream);
    DeviceOutput<T> y(out, s.batch * pixels * pixels, stream);
    check(cuda::psa_mask(x.get(), y.get(), s, stream));
    y.finish();
  }

  template <class T>
  static void carafe(OrtKernelContext* context, const T* features, const T* masks, T* out,
                     const kernels::CarafeShape& s) {
    void* stream = stream_of(context);
    const int64_t scaled = s.height * s.scale * s.width * s.scale;
    const DeviceInput<T> f(features, s.batch * s.channels * s.height * s.width, stream);
    const DeviceInput<T> m(masks, s.batch * s.group * s.kernel * s.kernel * scaled, stream);
    DeviceOutput<T> y(out, s.batch * s.channels * scaled, stream);
    check(cuda::carafe(f.get(), m.get(), y.get(), s, stream));
    y.finish();
  }

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

using Ops = std::vector<Ort::Custom::OrtLiteCustomOp*>;
void append_my_add(Ops& ops) { my_add_adapter::append<Cuda>(ops); }
// MSDA also in float16 (a model after .half()): the kernel reads and writes float16 and computes in float32.
void append_ms_deform_attn(Ops& ops) {
  ms_deform_attn_adapter::append<Cuda>(ops);
  ops.push_back(ms_deform_attn_adapter::make_op<Cuda, Ort::Float16_t, ms_deform_attn_adapter::kOp>(
      "MultiScaleDeformableAttention"));
}
void append_mmdeploy_ms_deform_attn(Ops& ops) {
  ms_deform_attn_adapter::append_mmdeploy<Cuda>(ops);
  ops.push_back(ms_deform_attn_adapter::make_op<Cuda, Ort::Float16_t, ms_deform_attn_adapter::kMmdeployOp>(
      "MMCVMultiScaleDeformableAttention"));
}
void append_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append<Cuda>(ops); }
void append_mmcv_modulated_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append_mmcv_modulated<Cuda>(ops); }
void append_mmcv_deform_conv2d(Ops& ops) { deform_conv2d_adapter::append_mmcv_v1<Cuda>(ops); }
template <const char* Op>
void append_grid_sampler(Ops& ops) {
  grid_sampler_adapter::append<Cuda, Op>(ops);
  grid_sampler_adapter::append_typed<Cuda, Ort::Float16_t, Op>(ops);  // a float16 model's (Mask2Former after .half())
}
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
template <const char* Op>
void append_roi_align(Ops& ops) {
  roi_align_adapter::append_typed<Cuda, float, Op>(ops);
  roi_align_adapter::append_typed<Cuda, double, Op>(ops);
  roi_align_adapter::append_typed<Cuda, Ort::Float16_t, Op>(ops);
}
void append_box_iou_rotated(Ops& ops) {
  rotated_adapter::append_box_iou_rotated<Cuda, float>(ops);
  rotated_adapter::append_box_iou_rotated<Cuda, double>(ops);
  rotated_adapter::append_box_iou_rotated<Cuda, Ort::Float16_t>(ops);
}
void append_nms(Ops& ops) {
  nms_adapter::append_nms<Cuda, float>(ops);
  nms_adapter::append_nms<Cuda, double>(ops);
  nms_adapter::append_nms<Cuda, Ort::Float16_t>(ops);
}
void append_nms_rotated(Ops& ops) {
  nms_adapter::append_nms_rotated<Cuda, float, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT>(ops);
  nms_adapter::append_nms_rotated<Cuda, double, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE>(ops);
  nms_adapter::append_nms_rotated<Cuda, Ort::Float16_t, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16>(ops);
}
void append_mmdeploy_nms_rotated(Ops& ops) {
  nms_adapter::append_mmdeploy_nms_rotated<Cuda, float>(ops);
  nms_adapter::append_mmdeploy_nms_rotated<Cuda, double>(ops);
  nms_adapter::append_mmdeploy_nms_rotated<Cuda, Ort::Float16_t>(ops);
}
void append_nms_match(Ops& ops) {
  nms_adapter::append_nms_match<Cuda, float>(ops);
  nms_adapter::append_nms_match<Cuda, double>(ops);
  nms_adapter::append_nms_match<Cuda, Ort::Float16_t>(ops);
}
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
void append_psa_mask(Ops& ops) {
  psa_mask_adapter::append<Cuda, float>(ops);
  psa_mask_adapter::append<Cuda, double>(ops);
  psa_mask_adapter::append<Cuda, Ort::Float16_t>(ops);
}
void append_carafe(Ops& ops) {
  carafe_adapter::append<Cuda, float>(ops);
  carafe_adapter::append<Cuda, double>(ops);
  carafe_adapter::append<Cuda, Ort::Float16_t>(ops);
}
void append_carafe_naive(Ops& ops) {
  carafe_adapter::append_naive<Cuda, float>(ops);
  carafe_adapter::append_naive<Cuda, double>(ops);
  carafe_adapter::append_naive<Cuda, Ort::Float16_t>(ops);
}
void append_masked_conv2d(Ops& ops) {
  masked_conv2d_adapter::append<Cuda>(ops);
  masked_conv2d_adapter::append_half<Cuda>(ops);
}

}  // namespace

OPBRIDGE_ORT_OP(MyAdd, 1, append_my_add);
OPBRIDGE_ORT_OP(MultiScaleDeformableAttention, 1, append_ms_deform_attn);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVMultiScaleDeformableAttention, 1, append_mmdeploy_ms_deform_attn);
OPBRIDGE_ORT_OP(DeformConv2d, 1, append_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVModulatedDeformConv2d, 1, append_mmcv_modulated_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVDeformConv2d, 1, append_mmcv_deform_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, grid_sampler, 1, append_grid_sampler<grid_sampler_adapter::kMmcvOp>);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, grid_sampler, 1, append_grid_sampler<grid_sampler_adapter::kMmdeployOp>);
OPBRIDGE_ORT_OP(RoiAlignRotated, 1, append_opbridge_roi_align_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRoIAlignRotated, 1, append_mmcv_roi_align_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVRoIAlignRotated, 1, append_mmdeploy_roi_align_rotated);
OPBRIDGE_ORT_OP(RotatedFeatureAlign, 1, append_opbridge_rotated_feature_align);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRotatedFeatureAlign, 1, append_mmcv_rotated_feature_align);
OPBRIDGE_ORT_OP(BoxIouRotated, 1, append_box_iou_rotated);
OPBRIDGE_ORT_OP(NmsRotated, 1, append_nms_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, NMSRotated, 1, append_mmdeploy_nms_rotated);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, NMSMatch, 1, append_nms_match);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, cummax, 1, append_cummax);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, cummin, 1, append_cummin);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCornerPool, 1, append_corner_pool);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVPSAMask, 1, append_psa_mask);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCARAFE, 1, append_carafe);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVCARAFENaive, 1, append_carafe_naive);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVMaskedConv2d, 1, append_masked_conv2d);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, NonMaxSuppression, 1, append_nms);
OPBRIDGE_ORT_FOREIGN_OP(mmcv, MMCVRoiAlign, 1, append_roi_align<roi_align_adapter::kOp>);
OPBRIDGE_ORT_FOREIGN_OP(mmdeploy, MMCVRoiAlign, 1, append_roi_align<roi_align_adapter::kMmdeployOp>);

}  // namespace opbridge::ort
