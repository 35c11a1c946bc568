// opbridge::deform_conv2d: the op's schema (torchvision.ops.deform_conv2d's
// signature and semantics; groups and offset groups follow from the shapes) and
// its CPU adapter of kernels/deform_conv2d.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <optional>

#include "kernels/deform_conv2d.h"
#include "kernels/deform_conv2d_backward.h"

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
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

std::vector<int64_t> to_vector(c10::IntArrayRef values) { return {values.begin(), values.end()}; }

// Checks dtypes, devices and shapes (messages name the op, the argument and the expectation) and
// returns the kernel's shape.
kernels::DeformConv2dShape checked_shape(const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
                                         const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                         c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                         const std::optional<at::Tensor>& mask) {
  TORCH_CHECK(input.device().is_cpu(), "opbridge::deform_conv2d: input must be on the CPU, got ", input.device());
  const auto dtype = input.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
              "opbridge::deform_conv2d: expected float32 or float64 tensors, got input of dtype ", dtype);
  std::vector<std::pair<const char*, const at::Tensor*>> tensors{{"offset", &offset}, {"weight", &weight}};
  if (bias) tensors.emplace_back("bias", &*bias);
  if (mask) tensors.emplace_back("mask", &*mask);
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor->scalar_type() == dtype, "opbridge::deform_conv2d: ", name, " must have the dtype of input (",
                dtype, "), got ", tensor->scalar_type());
    TORCH_CHECK(tensor->device().is_cpu(), "opbridge::deform_conv2d: ", name, " must be on the CPU, got ",
                tensor->device());
  }
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2,
              "opbridge::deform_conv2d: stride, padding and dilation need 2 values each");
  TORCH_CHECK(weight.dim() == 4 && offset.dim() == 4,
              "opbridge::deform_conv2d: weight and offset must be 4-D, got weight of shape ", weight.sizes(),
              " and offset of shape ", offset.sizes());
  TORCH_CHECK(weight.size(1) > 0 && weight.size(2) > 0 && weight.size(3) > 0,
              "opbridge::deform_conv2d: weight must have positive in_channels / groups and kernel size, got shape ",
              weight.sizes());
  TORCH_CHECK(input.dim() != 4 || input.size(1) % weight.size(1) == 0, "opbridge::deform_conv2d: weight.shape[1] ",
              "(in_channels / groups = ", weight.size(1), ") must divide the ", input.size(1),
              " channels of input; got input of shape ", input.sizes(), " and weight of shape ", weight.sizes());
  const int64_t taps = weight.size(2) * weight.size(3);
  TORCH_CHECK(offset.size(1) % (2 * taps) == 0, "opbridge::deform_conv2d: offset.shape[1] (", offset.size(1),
              ") must be a multiple of 2 * kernel_h * kernel_w = ", 2 * taps);

  kernels::DeformConv2dAttributes attributes;
  attributes.strides = to_vector(stride);
  attributes.dilations = to_vector(dilation);
  attributes.pads = {padding[0], padding[1], padding[0], padding[1]};
  attributes.groups = input.dim() == 4 ? input.size(1) / weight.size(1) : 1;
  attributes.offset_groups = offset.size(1) / (2 * taps);
  kernels::DeformConv2dShape shape;
  const auto bias_shape = bias ? to_vector(bias->sizes()) : std::vector<int64_t>{};
  const auto mask_shape = mask ? to_vector(mask->sizes()) : std::vector<int64_t>{};
  const auto status = kernels::check_deform_conv2d(kNames, to_vector(input.sizes()), to_vector(weight.sizes()),
                                                   to_vector(offset.sizes()), mask ? &mask_shape : nullptr,
                                                   bias ? &bias_shape : nullptr, attributes, shape);
  TORCH_CHECK(status.ok(), status.message);

  return shape;
}

const auto parallel_for = [](int64_t tasks, const auto& task) {
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) task(t);
  });
};

// torch's own BLAS (MKL or OpenBLAS through at::mm) on strided views: inside a parallel region it runs on the
// calling thread. c[m, n] = a[m, k] * b[n, k]^T.
template <class T>
auto make_gemm(const at::TensorOptions& options) {
  return
      [options](int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
        auto c_t = at::from_blob(c, {m, n}, {ldc, 1}, options);
        at::mm_out(c_t, at::from_blob(const_cast<T*>(a), {m, k}, {lda, 1}, options),
                   at::from_blob(const_cast<T*>(b), {n, k}, {ldb, 1}, options).t());
      };
}

at::Tensor deform_conv2d_cpu(const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, const std::optional<at::Tensor>& mask) {
  const auto shape = checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  const auto dtype = input.scalar_type();
  const auto x = input.contiguous(), w = weight.contiguous(), o = offset.contiguous();
  const auto m = mask ? mask->contiguous() : at::Tensor();
  const auto b = bias ? bias->contiguous() : at::Tensor();
  auto out = at::empty({shape.batch, shape.out_channels, shape.out_h, shape.out_w}, input.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(dtype, "opbridge::deform_conv2d", [&] {
    kernels::deform_conv2d(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(), o.const_data_ptr<scalar_t>(),
                           mask ? m.const_data_ptr<scalar_t>() : nullptr, bias ? b.const_data_ptr<scalar_t>() : nullptr,
                           out.mutable_data_ptr<scalar_t>(), shape, parallel_for, make_gemm<scalar_t>(input.options()));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    const std::optional<at::Tensor>& mask) {
  const auto shape = checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  const std::vector<int64_t> out_shape{shape.batch, shape.out_channels, shape.out_h, shape.out_w};
  TORCH_CHECK(grad_out.device().is_cpu() && grad_out.scalar_type() == input.scalar_type(),
              "opbridge::deform_conv2d_backward: grad_out must be a CPU tensor of the input's dtype (",
              input.scalar_type(), "), got ", grad_out.scalar_type(), " on ", grad_out.device());
  TORCH_CHECK(grad_out.sizes() == c10::IntArrayRef(out_shape), "opbridge::deform_conv2d_backward: grad_out must ",
              "have the output's shape ", c10::IntArrayRef(out_shape), ", got ", grad_out.sizes());
  const auto x = input.contiguous(), w = weight.contiguous(), o = offset.contiguous(), g = grad_out.contiguous();
  const auto m = mask ? mask->contiguous() : at::Tensor();
  auto grad_input = at::empty(x.sizes(), x.options()), grad_offset = at::zeros(o.sizes(), o.options());
  auto grad_weight = at::empty(w.sizes(), w.options());
  auto grad_bias = bias ? at::empty({shape.out_channels}, w.options()) : at::empty({0}, w.options());
  auto grad_mask = mask ? at::zeros(m.sizes(), m.options()) : at::empty({0}, x.options());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opbridge::deform_conv2d_backward", [&] {
    kernels::DeformConv2dGrads<scalar_t> grads;
    grads.input = grad_input.mutable_data_ptr<scalar_t>();
    grads.offset = grad_offset.mutable_data_ptr<scalar_t>();
    grads.weight = grad_weight.mutable_data_ptr<scalar_t>();
    grads.bias = bias ? grad_bias.mutable_data_ptr<scalar_t>() : nullptr;
    grads.mask = mask ? grad_mask.mutable_data_ptr<scalar_t>() : nullptr;
    kernels::deform_conv2d_backward(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                                    o.const_data_ptr<scalar_t>(), mask ? m.const_data_ptr<scalar_t>() : nullptr,
                                    g.const_data_ptr<scalar_t>(), shape, grads, parallel_for,
                                    make_gemm<scalar_t>(input.options()));
  });
  return {grad_input, grad_offset, grad_weight, grad_bias, grad_mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(opbridge, CPU, m) {
  m.impl("deform_conv2d", &deform_conv2d_cpu);
  m.impl("deform_conv2d_backward", &deform_conv2d_backward_cpu);
}

}  // namespace opbridge
