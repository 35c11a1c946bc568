// opbridge::ms_deform_attn: multi-scale deformable attention (Deformable DETR's
// MSDeformAttnFunction, mmcv's MultiScaleDeformableAttnFunction) and its backward,
// CPU adapters of kernels/ms_deform_attn.h.
#include <tuple>
#include <vector>

#include "kernels/ms_deform_attn.h"
#include "torch/api.h"
#include "torch/ms_deform_attn.h"

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

using api::Shape;
using api::Tensor;
using ms_deform_attn_op::checked;

const auto parallel_for = [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); };

Tensor ms_deform_attn_cpu(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
                          const Tensor& sampling_locations, const Tensor& attention_weights) {
  OPBRIDGE_CHECK(api::is_cpu(value), "opbridge::ms_deform_attn: value must be on the CPU, got ",
                 api::device_name(value));
  const auto in = checked(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  const auto& s = in.shape;
  const bool bf16 = value.scalar_type() == api::ScalarType::BFloat16;
  if (bf16 || (value.scalar_type() == api::ScalarType::Half && kernels::ms_deform_attn_wide_half())) {
    // A half value read as it is stored (bfloat16 always; float16 where the CPU widens it a register at a time),
    // into float32 arithmetic: the same bits as value widened first, without the widened copy, and half the bytes
    // gathered. Locations and weights in float32; one rounding at the end, as the kernel writes out.
    auto out = api::empty({s.batch, s.queries, s.heads * s.channels}, value.scalar_type());
    if (out.numel() == 0) return out;
    // Locations and weights in value's half type are read as stored too (widened block by block); float32 ones,
    // or a mix, as float32.
    const bool inputs_half = in.sampling_locations.scalar_type() == value.scalar_type() &&
                             in.attention_weights.scalar_type() == value.scalar_type();
    const auto locations = inputs_half ? in.sampling_locations : api::widened(in.sampling_locations);
    const auto weights = inputs_half ? in.attention_weights : api::widened(in.attention_weights);
    const auto run = [&](auto storage) {
      using S = decltype(storage);
      const auto call = [&](auto inputs) {
        using L = decltype(inputs);
        kernels::ms_deform_attn(api::data<S>(in.value), api::data<int64_t>(in.spatial_shapes),
                                api::data<int64_t>(in.level_start_index), api::data<L>(locations),
                                api::data<L>(weights), api::data<S>(out), s, parallel_for);
      };
      inputs_half ? call(S{}) : call(float{});
    };
    bf16 ? run(kernels::BFloat16{}) : run(kernels::SoftFloat16{});
    return out;
  }
  if (api::is_half(value.scalar_type())) {  // float16 elsewhere: widened to float32, one rounding at the end
    return api::to(ms_deform_attn_cpu(api::widened(value), spatial_shapes, level_start_index,
                                      api::widened(sampling_locations), api::widened(attention_weights)),
                   value.scalar_type());
  }
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
  if (api::is_half(value.scalar_type())) {
    // Half storage: float32 arithmetic and float32 gradient buffers (grad_value is a sum over every sample that
    // reads a row), each gradient rounded once to its input's dtype.
    OPBRIDGE_CHECK(grad_output.scalar_type() == value.scalar_type(),
                   "opbridge::ms_deform_attn_backward: grad_output must have value's dtype (",
                   api::dtype_name(value.scalar_type()), "), got ", api::dtype_name(grad_output.scalar_type()));
    const auto [grad_value, grad_locations, grad_weights] =
        ms_deform_attn_backward_cpu(api::widened(grad_output), api::widened(value), spatial_shapes, level_start_index,
                                    api::widened(sampling_locations), api::widened(attention_weights));
    return {api::to(grad_value, value.scalar_type()), api::to(grad_locations, sampling_locations.scalar_type()),
            api::to(grad_weights, attention_weights.scalar_type())};
  }
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
