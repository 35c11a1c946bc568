// opbridge::ms_deform_attn: multi-scale deformable attention (Deformable DETR's
// MSDeformAttnFunction, mmcv's MultiScaleDeformableAttnFunction) and its backward,
// CPU adapters of kernels/ms_deform_attn.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "kernels/ms_deform_attn.h"

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
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

std::vector<int64_t> sizes(const at::Tensor& tensor) { return {tensor.sizes().begin(), tensor.sizes().end()}; }

// The checked inputs: floating tensors contiguous, the level table as int64 on the CPU.
struct Inputs {
  at::Tensor value, spatial_shapes, level_start_index, sampling_locations, attention_weights;
  kernels::MSDeformAttnShape shape;
};

Inputs checked(const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
               const at::Tensor& sampling_locations, const at::Tensor& attention_weights) {
  const auto dtype = value.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
              "opbridge::ms_deform_attn: expected float32 or float64 tensors, got value of dtype ", dtype);
  for (const auto& [name, tensor] :
       {std::pair{"sampling_locations", &sampling_locations}, std::pair{"attention_weights", &attention_weights}}) {
    TORCH_CHECK(tensor->scalar_type() == dtype, "opbridge::ms_deform_attn: ", name, " must have the dtype of value (",
                dtype, "), got ", tensor->scalar_type());
  }
  for (const auto& [name, tensor] :
       {std::pair{"value", &value}, std::pair{"spatial_shapes", &spatial_shapes},
        std::pair{"level_start_index", &level_start_index}, std::pair{"sampling_locations", &sampling_locations},
        std::pair{"attention_weights", &attention_weights}}) {
    TORCH_CHECK(tensor->device().is_cpu(), "opbridge::ms_deform_attn: ", name, " must be on the CPU, got ",
                tensor->device());
  }
  for (const auto& [name, tensor] :
       {std::pair{"spatial_shapes", &spatial_shapes}, std::pair{"level_start_index", &level_start_index}}) {
    TORCH_CHECK(at::isIntegralType(tensor->scalar_type(), /*includeBool=*/false), "opbridge::ms_deform_attn: ", name,
                " must be an integer tensor (int64), got ", tensor->scalar_type());
  }
  Inputs in{value.contiguous(),
            spatial_shapes.to(at::kLong).contiguous(),
            level_start_index.to(at::kLong).contiguous(),
            sampling_locations.contiguous(),
            attention_weights.contiguous(),
            {}};
  TORCH_CHECK(in.spatial_shapes.dim() == 2 && in.spatial_shapes.size(1) == 2 && in.spatial_shapes.size(0) >= 1 &&
                  in.level_start_index.dim() == 1 && in.level_start_index.size(0) == in.spatial_shapes.size(0),
              "opbridge::ms_deform_attn: spatial_shapes must have shape [levels, 2] (levels >= 1) and ",
              "level_start_index shape [levels], got ", spatial_shapes.sizes(), " and ", level_start_index.sizes());
  const auto status = kernels::check_ms_deform_attn(
      kNames, sizes(value), sizes(spatial_shapes), sizes(level_start_index), sizes(sampling_locations),
      sizes(attention_weights), in.spatial_shapes.const_data_ptr<int64_t>(),
      in.level_start_index.const_data_ptr<int64_t>(), in.shape);
  TORCH_CHECK(status.ok(), status.message);
  return in;
}

const auto parallel_for = [](int64_t tasks, const auto& task) {
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) task(t);
  });
};

at::Tensor ms_deform_attn_cpu(const at::Tensor& value, const at::Tensor& spatial_shapes,
                              const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                              const at::Tensor& attention_weights) {
  const auto in = checked(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  const auto& s = in.shape;
  auto out = at::empty({s.batch, s.queries, s.heads * s.channels}, value.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "opbridge::ms_deform_attn", [&] {
    kernels::ms_deform_attn(
        in.value.const_data_ptr<scalar_t>(), in.spatial_shapes.const_data_ptr<int64_t>(),
        in.level_start_index.const_data_ptr<int64_t>(), in.sampling_locations.const_data_ptr<scalar_t>(),
        in.attention_weights.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), s, parallel_for);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ms_deform_attn_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& value, const at::Tensor& spatial_shapes,
    const at::Tensor& level_start_index, const at::Tensor& sampling_locations, const at::Tensor& attention_weights) {
  const auto in = checked(value, spatial_shapes, level_start_index, sampling_locations, attention_weights);
  const auto& s = in.shape;
  const std::vector<int64_t> out_shape{s.batch, s.queries, s.heads * s.channels};
  TORCH_CHECK(grad_output.device().is_cpu() && grad_output.scalar_type() == value.scalar_type(),
              "opbridge::ms_deform_attn_backward: grad_output must be a CPU tensor of value's dtype (",
              value.scalar_type(), "), got ", grad_output.scalar_type(), " on ", grad_output.device());
  TORCH_CHECK(grad_output.sizes() == c10::IntArrayRef(out_shape), "opbridge::ms_deform_attn_backward: grad_output ",
              "must have the output's shape ", c10::IntArrayRef(out_shape), ", got ", grad_output.sizes());
  const auto g = grad_output.contiguous();
  auto grad_value = at::zeros(value.sizes(), value.options());
  auto grad_locations = at::empty(sampling_locations.sizes(), sampling_locations.options());
  auto grad_weights = at::empty(attention_weights.sizes(), attention_weights.options());
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "opbridge::ms_deform_attn_backward", [&] {
    kernels::ms_deform_attn_backward(
        g.const_data_ptr<scalar_t>(), in.value.const_data_ptr<scalar_t>(), in.spatial_shapes.const_data_ptr<int64_t>(),
        in.level_start_index.const_data_ptr<int64_t>(), in.sampling_locations.const_data_ptr<scalar_t>(),
        in.attention_weights.const_data_ptr<scalar_t>(), s, grad_value.mutable_data_ptr<scalar_t>(),
        grad_locations.mutable_data_ptr<scalar_t>(), grad_weights.mutable_data_ptr<scalar_t>(), parallel_for);
  });
  return {grad_value, grad_locations, grad_weights};
}

}  // namespace

TORCH_LIBRARY_IMPL(opbridge, CPU, m) {
  m.impl("ms_deform_attn", &ms_deform_attn_cpu);
  m.impl("ms_deform_attn_backward", &ms_deform_attn_backward_cpu);
}

}  // namespace opbridge
