// The checks of opbridge::ms_deform_attn's arguments, shared by its CPU adapter (ms_deform_attn.cpp) and its
// CUDA adapter (cpp/cuda/ms_deform_attn.cu): dtypes, one device for all tensors, shapes and the level table.
#pragma once

#include <utility>
#include <vector>

#include "kernels/ms_deform_attn.h"
#include "torch/api.h"

namespace opbridge::ms_deform_attn_op {

constexpr kernels::MSDeformAttnNames kNames{"opbridge::ms_deform_attn", "value",
                                            "spatial_shapes",           "level_start_index",
                                            "sampling_locations",       "attention_weights"};

using api::Shape;
using api::Tensor;

// The checked inputs: floating tensors contiguous (on their device), the level table as contiguous int64 on the CPU
// (checked) or on value's device (table_on_host false: its values not checked yet).
struct Inputs {
  Tensor value, spatial_shapes, level_start_index, sampling_locations, attention_weights;
  kernels::MSDeformAttnShape shape;
  bool table_on_host = true;
};

inline Inputs checked(const Tensor& value, const Tensor& spatial_shapes, const Tensor& level_start_index,
                      const Tensor& sampling_locations, const Tensor& attention_weights) {
  const auto dtype = value.scalar_type();
  OPBRIDGE_CHECK(api::is_float_storage(dtype), "opbridge::ms_deform_attn: expected ", api::kFloatStorageNames,
                 " tensors, got value of dtype ", api::dtype_name(dtype));
  for (const auto& [name, tensor] :
       {std::pair{"sampling_locations", &sampling_locations}, std::pair{"attention_weights", &attention_weights}}) {
    OPBRIDGE_CHECK(api::pairs_with(dtype, tensor->scalar_type()), "opbridge::ms_deform_attn: ", name,
                   " must have the dtype of value (", api::dtype_name(dtype), ")",
                   api::is_half(dtype) ? " or float32" : "", ", got ", api::dtype_name(tensor->scalar_type()));
  }
  for (const auto& [name, tensor] :
       {std::pair{"sampling_locations", &sampling_locations}, std::pair{"attention_weights", &attention_weights}}) {
    OPBRIDGE_CHECK(api::same_device(*tensor, value), "opbridge::ms_deform_attn: ", name,
                   " must be on the device of value (", api::device_name(value), "), got ", api::device_name(*tensor));
  }
  // The level table: on value's device, or on the CPU (then checked here also for a CUDA call).
  const bool table_on_host = api::is_cpu(spatial_shapes) && api::is_cpu(level_start_index);
  OPBRIDGE_CHECK(
      table_on_host || (api::same_device(spatial_shapes, value) && api::same_device(level_start_index, value)),
      "opbridge::ms_deform_attn: spatial_shapes and level_start_index must both be on the device of value (",
      api::device_name(value), ") or both on the CPU, got ", api::device_name(spatial_shapes), " and ",
      api::device_name(level_start_index));
  for (const auto& [name, tensor] :
       {std::pair{"spatial_shapes", &spatial_shapes}, std::pair{"level_start_index", &level_start_index}}) {
    OPBRIDGE_CHECK(api::is_integral(tensor->scalar_type()), "opbridge::ms_deform_attn: ", name,
                   " must be an integer tensor (int64), got ", api::dtype_name(tensor->scalar_type()));
  }
  // A table on the host is checked here: every sample's rows are then known to lie inside value. One on the GPU is
  // not copied to the host (a synchronization on every call): the CUDA kernels check it before they read value
  // (kernels/ms_deform_attn.cuh).
  Inputs in{api::contiguous(value),
            api::contiguous(api::to(spatial_shapes, api::ScalarType::Long)),
            api::contiguous(api::to(level_start_index, api::ScalarType::Long)),
            api::contiguous(sampling_locations),
            api::contiguous(attention_weights),
            {},
            table_on_host};
  OPBRIDGE_CHECK(in.spatial_shapes.dim() == 2 && in.spatial_shapes.size(1) == 2 && in.spatial_shapes.size(0) >= 1 &&
                     in.level_start_index.dim() == 1 && in.level_start_index.size(0) == in.spatial_shapes.size(0),
                 "opbridge::ms_deform_attn: spatial_shapes must have shape [levels, 2] (levels >= 1) and ",
                 "level_start_index shape [levels], got ", api::shape_of(spatial_shapes), " and ",
                 api::shape_of(level_start_index));
  const auto status = kernels::check_ms_deform_attn(
      kNames, api::sizes(value), api::sizes(spatial_shapes), api::sizes(level_start_index),
      api::sizes(sampling_locations), api::sizes(attention_weights),
      table_on_host ? api::data<int64_t>(in.spatial_shapes) : nullptr,
      table_on_host ? api::data<int64_t>(in.level_start_index) : nullptr, in.shape);
  OPBRIDGE_CHECK(status.ok(), status.message);
  return in;
}

}  // namespace opbridge::ms_deform_attn_op
