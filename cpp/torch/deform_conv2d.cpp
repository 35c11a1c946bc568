// opbridge::deform_conv2d: the op's schema (torchvision.ops.deform_conv2d's
// signature and semantics; groups and offset groups follow from the shapes) and
// its CPU adapter of kernels/deform_conv2d.h.
#include <optional>
#include <tuple>

#include "kernels/deform_conv2d.h"
#include "kernels/deform_conv2d_backward.h"
#include "torch/api.h"

OPBRIDGE_LIBRARY_FRAGMENT(m) {
  m.def(
      "deform_conv2d(Tensor input, Tensor offset, Tensor weight, Tensor? bias=None, int[2] stride=1, "
      "int[2] padding=0, int[2] dilation=1, Tensor? mask=None) -> Tensor");
  // The gradients of input, offset, weight, bias and mask (bias and mask: empty when absent); the autograd
  // formula of deform_conv2d (python/opbridge/ops/deform_conv2d.py).
  m.def(
      "deform_conv2d_backward(Tensor grad_out, Tensor input, Tensor offset, Tensor weight, Tensor? bias, "
      "int[2] stride, int[2] padding, int[2] dilation, Tensor? mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

namespace opbridge {
namespace {

constexpr kernels::DeformConv2dNames kNames{"opbridge::deform_conv2d", "input", "weight", "offset", "mask", "bias"};

using api::IntList;
using api::Shape;
using api::Tensor;

std::vector<int64_t> to_vector(IntList values) { return {values.begin(), values.end()}; }

// Checks dtypes, devices and shapes (messages name the op, the argument and the expectation) and
// returns the kernel's shape.
kernels::DeformConv2dShape checked_shape(const Tensor& input, const Tensor& offset, const Tensor& weight,
                                         const std::optional<Tensor>& bias, IntList stride, IntList padding,
                                         IntList dilation, const std::optional<Tensor>& mask) {
  OPBRIDGE_CHECK(api::is_cpu(input), "opbridge::deform_conv2d: input must be on the CPU, got ",
                 api::device_name(input));
  const auto dtype = input.scalar_type();
  OPBRIDGE_CHECK(dtype == api::ScalarType::Float || dtype == api::ScalarType::Double,
                 "opbridge::deform_conv2d: expected float32 or float64 tensors, got input of dtype ",
                 api::dtype_name(dtype));
  std::vector<std::pair<const char*, const Tensor*>> tensors{{"offset", &offset}, {"weight", &weight}};
  if (bias) tensors.emplace_back("bias", &*bias);
  if (mask) tensors.emplace_back("mask", &*mask);
  for (const auto& [name, tensor] : tensors) {
    OPBRIDGE_CHECK(tensor->scalar_type() == dtype, "opbridge::deform_conv2d: ", name, " must have the dtype of input (",
                   api::dtype_name(dtype), "), got ", api::dtype_name(tensor->scalar_type()));
    OPBRIDGE_CHECK(api::is_cpu(*tensor), "opbridge::deform_conv2d: ", name, " must be on the CPU, got ",
                   api::device_name(*tensor));
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

const auto parallel_for = [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); };

Tensor deform_conv2d_cpu(const Tensor& input, const Tensor& offset, const Tensor& weight,
                         const std::optional<Tensor>& bias, IntList stride, IntList padding, IntList dilation,
                         const std::optional<Tensor>& mask) {
  const auto shape = checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  const auto dtype = input.scalar_type();
  const auto x = api::contiguous(input), w = api::contiguous(weight), o = api::contiguous(offset);
  const auto m = mask ? std::optional<Tensor>(api::contiguous(*mask)) : std::nullopt;
  const auto b = bias ? std::optional<Tensor>(api::contiguous(*bias)) : std::nullopt;
  auto out = api::empty({shape.batch, shape.out_channels, shape.out_h, shape.out_w}, dtype);
  if (out.numel() == 0) return out;
  api::dispatch_floating(dtype, "opbridge::deform_conv2d", [&](auto tag) {
    using T = decltype(tag);
    kernels::deform_conv2d(api::data<T>(x), api::data<T>(w), api::data<T>(o), m ? api::data<T>(*m) : nullptr,
                           b ? api::data<T>(*b) : nullptr, api::data<T>(out), shape, parallel_for, api::gemm<T>());
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_backward_cpu(
    const Tensor& grad_out, const Tensor& input, const Tensor& offset, const Tensor& weight,
    const std::optional<Tensor>& bias, IntList stride, IntList padding, IntList dilation,
    const std::optional<Tensor>& mask) {
  const auto shape = checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  const std::vector<int64_t> out_shape{shape.batch, shape.out_channels, shape.out_h, shape.out_w};
  const auto dtype = input.scalar_type();
  OPBRIDGE_CHECK(api::is_cpu(grad_out) && grad_out.scalar_type() == dtype,
                 "opbridge::deform_conv2d_backward: grad_out must be a CPU tensor of the input's dtype (",
                 api::dtype_name(dtype), "), got ", api::dtype_name(grad_out.scalar_type()), " on ",
                 api::device_name(grad_out));
  OPBRIDGE_CHECK(api::sizes(grad_out) == out_shape, "opbridge::deform_conv2d_backward: grad_out must ",
                 "have the output's shape ", Shape{out_shape}, ", got ", api::shape_of(grad_out));
  const auto x = api::contiguous(input), w = api::contiguous(weight), o = api::contiguous(offset);
  const auto g = api::contiguous(grad_out);
  const auto m = mask ? std::optional<Tensor>(api::contiguous(*mask)) : std::nullopt;
  auto grad_input = api::empty(api::sizes(x), dtype), grad_offset = api::zeros(api::sizes(o), dtype);
  auto grad_weight = api::empty(api::sizes(w), dtype);
  auto grad_bias = api::empty({bias ? shape.out_channels : 0}, dtype);
  auto grad_mask = m ? api::zeros(api::sizes(*m), dtype) : api::empty({0}, dtype);
  api::dispatch_floating(dtype, "opbridge::deform_conv2d_backward", [&](auto tag) {
    using T = decltype(tag);
    kernels::DeformConv2dGrads<T> grads;
    grads.input = api::data<T>(grad_input);
    grads.offset = api::data<T>(grad_offset);
    grads.weight = api::data<T>(grad_weight);
    grads.bias = bias ? api::data<T>(grad_bias) : nullptr;
    grads.mask = mask ? api::data<T>(grad_mask) : nullptr;
    kernels::deform_conv2d_backward(api::data<T>(x), api::data<T>(w), api::data<T>(o), m ? api::data<T>(*m) : nullptr,
                                    api::data<T>(g), shape, grads, parallel_for, api::gemm<T>());
  });
  return {grad_input, grad_offset, grad_weight, grad_bias, grad_mask};
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CPU(m) {
  OPBRIDGE_IMPL(m, "deform_conv2d", deform_conv2d_cpu);
  OPBRIDGE_IMPL(m, "deform_conv2d_backward", deform_conv2d_backward_cpu);
}

}  // namespace opbridge
