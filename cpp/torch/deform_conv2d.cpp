// opbridge::deform_conv2d: the op's schema (torchvision.ops.deform_conv2d's
// signature and semantics; groups and offset groups follow from the shapes) and
// its CPU adapter of kernels/deform_conv2d.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <optional>

#include "kernels/deform_conv2d.h"

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  m.def(
      "deform_conv2d(Tensor input, Tensor offset, Tensor weight, Tensor? bias=None, int[2] stride=1, "
      "int[2] padding=0, int[2] dilation=1, Tensor? mask=None) -> Tensor");
}

namespace opbridge {
namespace {

constexpr kernels::DeformConv2dNames kNames{"opbridge::deform_conv2d", "input", "weight", "offset", "mask", "bias"};

std::vector<int64_t> to_vector(c10::IntArrayRef values) { return {values.begin(), values.end()}; }

at::Tensor deform_conv2d_cpu(const at::Tensor& input, const at::Tensor& offset, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, const std::optional<at::Tensor>& mask) {
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

  const auto x = input.contiguous(), w = weight.contiguous(), o = offset.contiguous();
  const auto m = mask ? mask->contiguous() : at::Tensor();
  const auto b = bias ? bias->contiguous() : at::Tensor();
  auto out = at::empty({shape.batch, shape.out_channels, shape.out_h, shape.out_w}, input.options());
  if (out.numel() == 0) return out;
  auto parallel_for = [](int64_t tasks, const auto& task) {
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) task(t);
    });
  };
  AT_DISPATCH_FLOATING_TYPES(dtype, "opbridge::deform_conv2d", [&] {
    // torch's own BLAS (MKL or OpenBLAS through at::mm) on strided views: inside
    // a parallel region it runs on the calling thread.
    auto gemm = [options = input.options()](int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
                                            const scalar_t* bm, int64_t ldb, scalar_t* c, int64_t ldc) {
      auto c_t = at::from_blob(c, {m, n}, {ldc, 1}, options);
      at::mm_out(c_t, at::from_blob(const_cast<scalar_t*>(a), {m, k}, {lda, 1}, options),
                 at::from_blob(const_cast<scalar_t*>(bm), {n, k}, {ldb, 1}, options).t());
    };
    kernels::deform_conv2d(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(), o.const_data_ptr<scalar_t>(),
                           mask ? m.const_data_ptr<scalar_t>() : nullptr, bias ? b.const_data_ptr<scalar_t>() : nullptr,
                           out.mutable_data_ptr<scalar_t>(), shape, parallel_for, gemm);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opbridge, CPU, m) { m.impl("deform_conv2d", &deform_conv2d_cpu); }

}  // namespace opbridge
