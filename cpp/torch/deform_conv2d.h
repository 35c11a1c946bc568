// The checks of opbridge::deform_conv2d's arguments, shared by its CPU adapter (deform_conv2d.cpp) and its CUDA
// adapter (cpp/cuda/deform_conv2d.cu): dtypes, one device for all tensors, and every shape relation.
#pragma once

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/deform_conv2d.h"
#include "torch/api.h"

namespace opbridge::deform_conv2d_op {

constexpr kernels::DeformConv2dNames kNames{"opbridge::deform_conv2d", "input", "weight", "offset", "mask", "bias"};

using api::IntList;
using api::Shape;
using api::Tensor;

inline std::vector<int64_t> to_vector(IntList values) { return {values.begin(), values.end()}; }

// Checks dtypes, devices and shapes (messages name the op, the argument and the expectation) and
// returns the kernel's shape.
inline kernels::DeformConv2dShape checked_shape(const Tensor& input, const Tensor& offset, const Tensor& weight,
                                                const std::optional<Tensor>& bias, IntList stride, IntList padding,
                                                IntList dilation, const std::optional<Tensor>& mask) {
  const auto dtype = input.scalar_type();
  OPBRIDGE_CHECK(api::is_float_storage(dtype), "opbridge::deform_conv2d: expected ", api::kFloatStorageNames,
                 " tensors, got input of dtype ", api::dtype_name(dtype));
  // weight and bias in input's dtype; offset and mask also float32 beside half storage (api::pairs_with).
  std::vector<std::tuple<const char*, const Tensor*, bool>> tensors{{"offset", &offset, true},
                                                                    {"weight", &weight, false}};
  if (bias) tensors.emplace_back("bias", &*bias, false);
  if (mask) tensors.emplace_back("mask", &*mask, true);
  for (const auto& [name, tensor, precise] : tensors) {
    const auto other = tensor->scalar_type();
    OPBRIDGE_CHECK(precise ? api::pairs_with(dtype, other) : other == dtype, "opbridge::deform_conv2d: ", name,
                   " must have the dtype of input (", api::dtype_name(dtype), ")",
                   precise && api::is_half(dtype) ? " or float32" : "", ", got ", api::dtype_name(other));
    OPBRIDGE_CHECK(api::same_device(*tensor, input), "opbridge::deform_conv2d: ", name,
                   " must be on the device of input (", api::device_name(input), "), got ", api::device_name(*tensor));
  }
  OPBRIDGE_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2,
                 "opbridge::deform_conv2d: stride, padding and dilation need 2 values each");
  OPBRIDGE_CHECK(weight.dim() == 4 && offset.dim() == 4,
                 "opbridge::deform_conv2d: weight and offset must be 4-D, got weight of shape ", api::shape_of(weight),
                 " and offset of shape ", api::shape_of(offset));
  OPBRIDGE_CHECK(weight.size(1) > 0 && weight.size(2) > 0 && weight.size(3) > 0,
                 "opbridge::deform_conv2d: weight must have positive in_channels / groups and kernel size, got shape ",
                 api::shape_of(weight));
  OPBRIDGE_CHECK(input.dim() != 4 || input.size(1) % weight.size(1) == 0,
                 "opbridge::deform_conv2d: weight.shape[1] (in_channels / groups = ", weight.size(1),
                 ") must divide the ", input.dim() == 4 ? input.size(1) : 0, " channels of input; got input of shape ",
                 api::shape_of(input), " and weight of shape ", api::shape_of(weight));
  const int64_t taps = weight.size(2) * weight.size(3);
  OPBRIDGE_CHECK(offset.size(1) % (2 * taps) == 0, "opbridge::deform_conv2d: offset.shape[1] (", offset.size(1),
                 ") must be a multiple of 2 * kernel_h * kernel_w = ", 2 * taps);

  kernels::DeformConv2dAttributes attributes;
  attributes.strides = to_vector(stride);
  attributes.dilations = to_vector(dilation);
  attributes.pads = {padding[0], padding[1], padding[0], padding[1]};
  attributes.groups = input.dim() == 4 ? input.size(1) / weight.size(1) : 1;
  attributes.offset_groups = offset.size(1) / (2 * taps);
  kernels::DeformConv2dShape shape;
  const auto bias_shape = bias ? api::sizes(*bias) : std::vector<int64_t>{};
  const auto mask_shape = mask ? api::sizes(*mask) : std::vector<int64_t>{};
  const auto status =
      kernels::check_deform_conv2d(kNames, api::sizes(input), api::sizes(weight), api::sizes(offset),
                                   mask ? &mask_shape : nullptr, bias ? &bias_shape : nullptr, attributes, shape);
  OPBRIDGE_CHECK(status.ok(), status.message);
  return shape;
}

}  // namespace opbridge::deform_conv2d_op
