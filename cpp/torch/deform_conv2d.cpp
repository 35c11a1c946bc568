// opbridge::deform_conv2d: the op's schema (torchvision.ops.deform_conv2d's
// signature and semantics; groups and offset groups follow from the shapes) and
// its CPU adapter of kernels/deform_conv2d.h.
#include <atomic>
#include <cstdint>
#include <optional>
#include <tuple>

#include "kernels/deform_conv2d.h"
#include "kernels/deform_conv2d_backward.h"
#include "kernels/linear_bf16.h"
#include "torch/api.h"
#include "torch/deform_conv2d.h"

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

using api::IntList;
using api::Shape;
using api::Tensor;
using deform_conv2d_op::checked_shape;

const auto parallel_for = [](int64_t tasks, const auto& task) { api::parallel_for(tasks, task); };

// bfloat16 input on a CPU with bfloat16 GEMMs (api::use_bf16_products): the sampling in float32 (the input read
// into a float32 channels-last copy, offset and mask widened), the products in bfloat16 with float32 sums, the bias
// added before the output's one rounding.
Tensor deform_conv2d_bf16_products(const Tensor& input, const Tensor& offset, const Tensor& weight,
                                   const std::optional<Tensor>& bias, const std::optional<Tensor>& mask,
                                   const kernels::DeformConv2dShape& shape) {
  using kernels::BFloat16;
  auto out = api::empty({shape.batch, shape.out_channels, shape.out_h, shape.out_w}, api::ScalarType::BFloat16);
  if (out.numel() == 0) return out;
  const auto x = api::contiguous(input), o = api::contiguous(api::widened(offset));
  const auto w = api::contiguous(weight);
  const auto m = mask ? std::optional<Tensor>(api::contiguous(api::widened(*mask))) : std::nullopt;
  const auto b = bias ? std::optional<Tensor>(api::contiguous(*bias)) : std::nullopt;
  const auto* x_data = static_cast<const BFloat16*>(x.const_data_ptr());
  const auto* w_data = static_cast<const BFloat16*>(w.const_data_ptr());
  const auto* b_data = b ? static_cast<const BFloat16*>(b->const_data_ptr()) : nullptr;
  auto* out_data = static_cast<BFloat16*>(out.mutable_data_ptr());
  if (kernels::linear_bf16_has_instructions()) {
    // The library's bfloat16 GEMM (kernels/linear_bf16.h: AMX tiles where the CPU has them, else vdpbf16ps), its
    // weights packed once a forward, the ORT library's too (the same bits from both): the forward 1.04-1.07x faster
    // than with oneDNN's GEMM through aten::linear on AMD EPYC Zen 5 (vdpbf16ps) and 1.06-1.19x on an Intel Xeon
    // with AMX (2026-11-29, interleaved runs); aten::linear serves CPUs without AVX512-BF16 (OPBRIDGE_CPU_BF16_GEMM=1).
    kernels::LinearBf16Packing linear;
    kernels::deform_conv2d_bf16_products(x_data, w_data, api::data<float>(o), m ? api::data<float>(*m) : nullptr,
                                         b_data, out_data, shape, parallel_for, linear);
    return out;
  }
  std::atomic<bool> failed{false};
  auto linear = [&](int64_t n, int64_t m_, int64_t k, const BFloat16* a, int64_t lda, const BFloat16* w_, int64_t ldw,
                    const BFloat16* bias_, BFloat16* c, int64_t c_row, int64_t c_col) {
    const auto bits = [](const BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); };
    if (!api::linear_bf16(n, m_, k, bits(a), lda, bits(w_), ldw, bits(bias_), reinterpret_cast<uint16_t*>(c), c_row,
                          c_col)) {
      failed = true;
    }
  };
  kernels::deform_conv2d_bf16_products(x_data, w_data, api::data<float>(o), m ? api::data<float>(*m) : nullptr, b_data,
                                       out_data, shape, parallel_for, linear);
  OPBRIDGE_CHECK(!failed,
                 "opbridge::deform_conv2d: torch's bfloat16 linear (aten::linear) failed on this CPU; set "
                 "OPBRIDGE_CPU_BF16_GEMM=0 to compute bfloat16 input in float32 instead");
  return out;
}

Tensor deform_conv2d_cpu(const Tensor& input, const Tensor& offset, const Tensor& weight,
                         const std::optional<Tensor>& bias, IntList stride, IntList padding, IntList dilation,
                         const std::optional<Tensor>& mask) {
  OPBRIDGE_CHECK(api::is_cpu(input), "opbridge::deform_conv2d: input must be on the CPU, got ",
                 api::device_name(input));
  const auto shape = checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  if (input.scalar_type() == api::ScalarType::BFloat16 && api::use_bf16_products()) {
    return deform_conv2d_bf16_products(input, offset, weight, bias, mask, shape);
  }
  if (api::is_half(input.scalar_type())) {  // half storage: float32 arithmetic, one rounding at the end
    return api::to(deform_conv2d_cpu(api::widened(input), api::widened(offset), api::widened(weight),
                                     api::widened(bias), stride, padding, dilation, api::widened(mask)),
                   input.scalar_type());
  }
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
  OPBRIDGE_CHECK(api::is_cpu(input), "opbridge::deform_conv2d_backward: input must be on the CPU, got ",
                 api::device_name(input));
  const auto shape = checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  if (api::is_half(input.scalar_type())) {
    // Half storage: float32 arithmetic and float32 gradient buffers (sums over pixels, taps and the batch), each
    // gradient rounded once to its input's dtype.
    OPBRIDGE_CHECK(grad_out.scalar_type() == input.scalar_type(),
                   "opbridge::deform_conv2d_backward: grad_out must have the input's dtype (",
                   api::dtype_name(input.scalar_type()), "), got ", api::dtype_name(grad_out.scalar_type()));
    auto [grad_input, grad_offset, grad_weight, grad_bias, grad_mask] = deform_conv2d_backward_cpu(
        api::widened(grad_out), api::widened(input), api::widened(offset), api::widened(weight), api::widened(bias),
        stride, padding, dilation, api::widened(mask));
    return {api::to(grad_input, input.scalar_type()), api::to(grad_offset, offset.scalar_type()),
            api::to(grad_weight, weight.scalar_type()),
            api::to(grad_bias, bias ? bias->scalar_type() : input.scalar_type()),
            api::to(grad_mask, mask ? mask->scalar_type() : input.scalar_type())};
  }
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
