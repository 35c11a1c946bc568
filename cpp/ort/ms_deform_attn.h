// ORT adapter of multi-scale deformable attention, for any device: opbridge::MultiScaleDeformableAttention(value,
// spatial_shapes, level_start_index, sampling_locations, attention_weights), and the same kernel as
// mmdeploy::MMCVMultiScaleDeformableAttention (the node mmdeploy's exporter writes for mmcv's
// MultiScaleDeformableAttnFunction; same inputs in the same order, its attribute im2col_step, a CUDA batching
// knob, is accepted and ignored), so that models mmdeploy exported run in ONNX Runtime, for which mmdeploy ships
// no kernel. `Device` runs the checked call: the CPU library's (ms_deform_attn.cc) or the CUDA one's
// (cuda/<op>.cc); both read the level table on the host.
#pragma once

#include <string>
#include <vector>

#include "kernels/ms_deform_attn.h"
#include "ort/api.h"

namespace opbridge::ort::ms_deform_attn_adapter {

template <class Device, class T>
Ort::Status run(OrtKernelContext* context, const char* op, const Ort::Custom::Tensor<T>& value,
                const Ort::Custom::Tensor<int64_t>& spatial_shapes,
                const Ort::Custom::Tensor<int64_t>& level_start_index, const Ort::Custom::Tensor<T>& sampling_locations,
                const Ort::Custom::Tensor<T>& attention_weights, Ort::Custom::Tensor<T>& out) {
  return guarded(op, [&] {
    const kernels::MSDeformAttnNames names{op,
                                           "input value (index 0)",
                                           "input spatial_shapes (index 1)",
                                           "input level_start_index (index 2)",
                                           "input sampling_locations (index 3)",
                                           "input attention_weights (index 4)"};
    const auto spatial_shape = spatial_shapes.Shape(), start_shape = level_start_index.Shape();
    // The level table's data is read by the check: its shape first.
    if (spatial_shape.size() != 2 || spatial_shape[1] != 2 || spatial_shape[0] < 1 || start_shape.size() != 1 ||
        start_shape[0] != spatial_shape[0]) {
      return invalid_argument(std::string(op) + ": " + names.spatial_shapes + " must have shape [levels, 2] " +
                              "(levels >= 1) and " + names.level_start_index + " shape [levels], got " +
                              kernels::shape_to_string(spatial_shape) + " and " +
                              kernels::shape_to_string(start_shape));
    }
    kernels::MSDeformAttnShape shape;
    const auto status = kernels::check_ms_deform_attn(names, value.Shape(), spatial_shape, start_shape,
                                                      sampling_locations.Shape(), attention_weights.Shape(),
                                                      spatial_shapes.Data(), level_start_index.Data(), shape);
    if (!status.ok()) return from_kernel(status);
    T* y = out.Allocate({shape.batch, shape.queries, shape.heads * shape.channels});
    if (shape.batch == 0 || shape.queries == 0 || shape.heads * shape.channels == 0) return Ort::Status(nullptr);
    Device::template ms_deform_attn<T>(context, op, value.Data(), spatial_shapes.Data(), level_start_index.Data(),
                                       sampling_locations.Data(), attention_weights.Data(), y, shape);
    return Ort::Status(nullptr);
  });
}

inline constexpr char kOp[] = "opbridge::MultiScaleDeformableAttention";
inline constexpr char kMmdeployOp[] = "mmdeploy::MMCVMultiScaleDeformableAttention";

// The kernel function of one node name (the name goes into its error messages).
template <class Device, class T, const char* Op>
Ort::Status compute(OrtKernelContext* context, const Ort::Custom::Tensor<T>& value,
                    const Ort::Custom::Tensor<int64_t>& spatial_shapes,
                    const Ort::Custom::Tensor<int64_t>& level_start_index,
                    const Ort::Custom::Tensor<T>& sampling_locations, const Ort::Custom::Tensor<T>& attention_weights,
                    Ort::Custom::Tensor<T>& out) {
  return run<Device>(context, Op, value, spatial_shapes, level_start_index, sampling_locations, attention_weights, out);
}

// The level table (spatial_shapes, level_start_index: inputs 1 and 2) is read on the host on every device.
template <class Device, class T, const char* Op>
Ort::Custom::OrtLiteCustomOp* make_op(const char* op_type) {
  auto* op = complete_op(Ort::Custom::CreateLiteCustomOp(op_type, Device::kProvider, compute<Device, T, Op>));
  op->GetInputMemoryType = [](const OrtCustomOp*, size_t index) {
    return index == 1 || index == 2 ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  };
  return op;
}

template <class Device, const char* Op>
void append_for(const char* op_type, std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  ops.push_back(make_op<Device, float, Op>(op_type));
  ops.push_back(make_op<Device, double, Op>(op_type));
}

template <class Device>
void append(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<Device, kOp>("MultiScaleDeformableAttention", ops);
}

template <class Device>
void append_mmdeploy(std::vector<Ort::Custom::OrtLiteCustomOp*>& ops) {
  append_for<Device, kMmdeployOp>("MMCVMultiScaleDeformableAttention", ops);
}

}  // namespace opbridge::ort::ms_deform_attn_adapter
