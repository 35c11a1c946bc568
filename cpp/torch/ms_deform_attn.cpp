// opbridge::ms_deform_attn: multi-scale deformable attention (Deformable DETR's
// MSDeformAttnFunction, mmcv's MultiScaleDeformableAttnFunction) and its backward,
// CPU adapters of kernels/ms_deform_attn.h.
#include <tuple>
#include <vector>

#include "kernels/ms_deform_attn.h"
#include "torch/api.h"

OPBRIDGE_LIBRARY_FRAGMENT(m) {
  m.def(
      "ms_deform_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index, Tensor sampling_locations, "
      "Tensor attention_weights) -> Tensor");
  // The gradients of value, sampling_locations and attention_weights: the autograd formula of ms_deform_attn
  // (python/opbridge/ops/ms_deform_attn.py).
  m.def(
      "ms_deform_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_locations, Tensor attention_weights) -> (Tensor, Tensor, Tensor)");
}

namespace opbridge {
namespace {

constexpr kernels::MSDeformAttnNames kNames{"opbridge::ms_deform_attn", "value",
                                            "spatial_shapes",           "level_start_index",
                                            "sampling_locations",       "attention_weights"};

using api::Shape;
using api::Tensor;

// The checked inputs: floating tensors contiguous, the level table as int64 on the CPU.
struct Inputs {
  Tensor value, spatial_shapes, level_start_index, sampling_locations, attention_weights;
  kernels::MSDeformAttnShape shape;
};

Inputs checked(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
               const Tensor& sampling_locations, const Tensor& attention_weights) {
  const auto dtype = value.scalar_type();
  OPBRIDGE_CHECK(dtype == api::ScalarType::Float || dtype == api::ScalarType::Double,
                 "opbridge::ms_deform_attn: expected float32 or float64 tensors, got value of dtype ",
                 api::dtype_name(dtype));
  for (const auto& [name, tensor] :
       {std::pair{"sampling_locations", &sampling_locations}, std::pair{"attention_weights", &attention_weights}}) {
    OPBRIDGE_CHECK(tensor->scalar_type() == dtype, "opbridge::ms_deform_attn: ", name,
                   " must have the dtype of value (", api::dtype_name(dtype), "), got ",
                   api::dtype_name(tensor->scalar_type()));
  }
  for (const auto& [name, tensor] :
       {std::pair{"value", &value}, std::pair{"spatial_shapes", &spatial_shapes},
        std::pair{"level_start_index", &level_start_index}, std::pair{"sampling_locations", &sampling_locations},
        std::pair{"attention_weights", &attention_weights}}) {
    OPBRIDGE_CHECK(api::is_cpu(*tensor), "opbridge::ms_deform_attn: ", name, " must be on the CPU, got ",
                   api::device_name(*tensor));
  }
  for (const auto& [name, tensor] :
       {std::pair{"spatial_shapes", &spatial_shapes}, std::pair{"level_start_index", &level_start_index}}) {
    OPBRIDGE_CHECK(api::is_integral(tensor->scalar_type()), "opbridge::ms_deform_attn: ", name,
                   " must be an integer tensor (int64), got ", api::dtype_name(tensor->scalar_type()));
  }
  Inputs in{api::contiguous(value),
            api::contiguous(api::to(spatial_shapes, api::ScalarType::Long)),
            api::contiguous(api::to(level_start_index, api::ScalarType::Long)),
            api::contiguous(sampling_locations),
            api::contiguous(attention_weights),
            {}};
  OPBRIDGE_CHECK(in.spatial_shapes.dim() == 2 && in.spatial_shapes.size(1) == 2 && in.spatial_shapes.size(0) >= 1 &&
                     in.level_start_index.dim() == 1 && in.level_start_index.size(0) == in.spatial_shapes.size(0),
                 "opbridge::ms_deform_attn: spatial_shapes must have shape [levels, 2] (levels >= 1) and ",
                 "level_start_index shape [levels], got ", api::shape_of(spatial_shapes), " and ",
                 api::shape_of(level_start_index));
  const auto status = kernels::check_ms_deform_attn(
      kNames, api::sizes(value), api::sizes(spatial_shapes), api::sizes(level_start_index),
      api::sizes(sampling_locations), api::sizes(attention_weights), api::data<int64_t>(in.spatial_shapes),
      api::data<int64_t>(in.level_start_index), in.shape);
  OPBRIDGE_CHECK(status.ok(), status.message);
  return in;
}

const auto parallel_for = [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); };

Tensor ms_deform_attn_cpu(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
                          const Tensor& sampling_locations, const Tensor& attention_weights) {
  const auto in = checked(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  const auto& s = in.shape;
  auto out = api::empty({s.batch, s.queries, s.heads * s.channels}, value.scalar_type());
  if (out.numel() == 0) return out;
  api::dispatch_floating(value.scalar_type(), "opbridge::ms_deform_attn", [&](auto tag) {
    using T = decltype(tag);
    kernels::ms_deform_attn(api::data<T>(in.value), api::data<int64_t>(in.spatial_shapes),
                            api::data<int64_t>(in.level_start_index), api::data<T>(in.sampling_locations),
                            api::data<T>(in.attention_weights), api::data<T>(out), s, parallel_for);
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor> ms_deform_attn_backward_cpu(const Tensor& grad_output, const Tensor& value,
                                                               const Tensor& spatial_shapes,
                                                               const Tensor& level_start_index,
                                                               const Tensor& sampling_locations,
                                                               const Tensor& attention_weights) {
  const auto in = checked(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  const auto& s = in.shape;
  const std::vector<int64_t> out_shape{s.batch, s.queries, s.heads * s.channels};
  const auto dtype = value.scalar_type();
  OPBRIDGE_CHECK(api::is_cpu(grad_output) && grad_output.scalar_type() == dtype,
                 "opbridge::ms_deform_attn_backward: grad_output must be a CPU tensor of value's dtype (",
                 api::dtype_name(dtype), "), got ", api::dtype_name(grad_output.scalar_type()), " on ",
                 api::device_name(grad_output));
  OPBRIDGE_CHECK(api::sizes(grad_output) == out_shape, "opbridge::ms_deform_attn_backward: grad_output ",
                 "must have the output's shape ", Shape{out_shape}, ", got ", api::shape_of(grad_output));
  const auto g = api::contiguous(grad_output);
  auto grad_value = api::zeros(api::sizes(value), dtype);
  auto grad_locations = api::empty(api::sizes(sampling_locations), dtype);
  auto grad_weights = api::empty(api::sizes(attention_weights), dtype);
  api::dispatch_floating(dtype, "opbridge::ms_deform_attn_backward", [&](auto tag) {
    using T = decltype(tag);
    kernels::ms_deform_attn_backward(api::data<T>(g), api::data<T>(in.value), api::data<int64_t>(in.spatial_shapes),
                                     api::data<int64_t>(in.level_start_index), api::data<T>(in.sampling_locations),
                                     api::data<T>(in.attention_weights), s, api::data<T>(grad_value),
                                     api::data<T>(grad_locations), api::data<T>(grad_weights), parallel_for);
  });
  return {grad_value, grad_locations, grad_weights};
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CPU(m) {
  OPBRIDGE_IMPL(m, "ms_deform_attn", ms_deform_attn_cpu);
  OPBRIDGE_IMPL(m, "ms_deform_attn_backward", ms_deform_attn_backward_cpu);
}

}  // namespace opbridge
