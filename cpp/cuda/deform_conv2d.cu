// opbridge::deform_conv2d and its backward on CUDA: the deformable im2col and its gradients per sample with
// kernels/deform_conv2d*.h's arithmetic (tap position, BilinearPoint), and the weight products on torch's matmul
// (cuBLAS) over chunks of images.
//
// Columns are [C_in * K, images * pixels] (row c * K + k, column image * pixels + p), so one product per weight
// group covers a whole chunk of images. The forward and the gradients of offset, mask, weight and bias own their
// elements; grad_input is scattered with atomics (four corners per sample), so its last bits can vary between
// runs (python/opbridge/ops/deform_conv2d.py raises or warns under torch.use_deterministic_algorithms).
#include <algorithm>
#include <optional>
#include <tuple>

#include "cuda/common.cuh"
#include "kernels/deform_conv2d.cuh"
#include "kernels/deform_conv2d_backward.h"
#include "torch/deform_conv2d.h"

namespace opbridge {
namespace {

using api::IntList;
using api::Tensor;
using kernels::BilinearPoint;
using kernels::DeformConv2dShape;

// Bytes of columns per chunk of images.
constexpr int64_t kColumnBudget = int64_t(256) << 20;

using kernels::cuda::mask_at;
using kernels::cuda::sample_at;

// columns[(c * K + k), b * P + p] for images [first, first + count): one thread per (channel, image, pixel).
template <class T>
__global__ void im2col_kernel(const T* __restrict__ input, const T* __restrict__ offset, const T* __restrict__ mask,
                              DeformConv2dShape s, int64_t first, int64_t count, T* __restrict__ columns) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const int64_t width = count * pixels, per_offset_group = s.in_channels / s.offset_groups;
  OPBRIDGE_GRID_LOOP(t, s.in_channels * width) {
    const int64_t c = t / width, column = t % width, b = column / pixels, p = column % pixels, image = first + b;
    const int64_t og = c / per_offset_group, oy = p / s.out_w, ox = p % s.out_w;
    const T* source = input + (image * s.in_channels + c) * plane;
    OPBRIDGE_FOR_EACH_TAP(s, k, i, j) {
      const auto point = sample_at(s, offset, image, og, k, i, j, p, oy, ox);
      T v[4];
      point.values(source, s.width, v);
      columns[(c * taps + k) * width + column] = point.value(v) * mask_at(s, mask, image, og, k, p);
    }
  }
}

// out[first + b, o, p] = buffer[o, b * P + p] (+ bias[o]).
template <class T>
__global__ void scatter_out_kernel(const T* __restrict__ buffer, const T* __restrict__ bias, DeformConv2dShape s,
                                   int64_t first, int64_t count, T* __restrict__ out) {
  const int64_t pixels = s.out_h * s.out_w, width = count * pixels;
  OPBRIDGE_GRID_LOOP(t, s.out_channels * width) {
    const int64_t o = t / width, column = t % width, b = column / pixels, p = column % pixels;
    out[((first + b) * s.out_channels + o) * pixels + p] = buffer[t] + (bias != nullptr ? bias[o] : T(0));
  }
}

// buffer[o, b * P + p] = grad_out[first + b, o, p].
template <class T>
__global__ void gather_grad_kernel(const T* __restrict__ grad_out, DeformConv2dShape s, int64_t first, int64_t count,
                                   T* __restrict__ buffer) {
  const int64_t pixels = s.out_h * s.out_w, width = count * pixels;
  OPBRIDGE_GRID_LOOP(t, s.out_channels * width) {
    const int64_t o = t / width, column = t % width, b = column / pixels, p = column % pixels;
    buffer[t] = grad_out[((first + b) * s.out_channels + o) * pixels + p];
  }
}

// grad_offset and grad_mask: one thread per (image, offset group, tap, pixel) sums over its group's channels.
template <class T>
__global__ void offset_grad_kernel(const T* __restrict__ input, const T* __restrict__ offset,
                                   const T* __restrict__ mask, const T* __restrict__ grad_columns, DeformConv2dShape s,
                                   int64_t first, int64_t count, T* __restrict__ grad_offset,
                                   T* __restrict__ grad_mask) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const int64_t width = count * pixels, per_offset_group = s.in_channels / s.offset_groups;
  OPBRIDGE_GRID_LOOP(t, count * s.offset_groups * taps * pixels) {
    const int64_t p = t % pixels, k = t / pixels % taps, og = t / (pixels * taps) % s.offset_groups;
    const int64_t b = t / (pixels * taps * s.offset_groups), image = first + b;
    const auto point = sample_at(s, offset, image, og, k, k / s.kernel_w, k % s.kernel_w, p, p / s.out_w, p % s.out_w);
    T grad_y = T(0), grad_x = T(0), grad_m = T(0);
    if (point.inside) {
      for (int64_t c = og * per_offset_group; c < (og + 1) * per_offset_group; ++c) {
        T v[4];
        point.values(input + (image * s.in_channels + c) * plane, s.width, v);
        point.add_gradients(v, grad_columns[(c * taps + k) * width + b * pixels + p], grad_y, grad_x, grad_m);
      }
    }
    const T m = mask_at(s, mask, image, og, k, p);
    T* target = grad_offset + ((image * s.offset_groups + og) * taps + k) * 2 * pixels;
    target[p] = grad_y * m;
    target[pixels + p] = grad_x * m;
    if (grad_mask != nullptr) grad_mask[((image * s.offset_groups + og) * taps + k) * pixels + p] = grad_m;
  }
}

// grad_input: one thread per (channel, image, pixel) adds its taps' four corners.
template <class T>
__global__ void input_grad_kernel(const T* __restrict__ offset, const T* __restrict__ mask,
                                  const T* __restrict__ grad_columns, DeformConv2dShape s, int64_t first, int64_t count,
                                  T* grad_input) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const int64_t width = count * pixels, per_offset_group = s.in_channels / s.offset_groups;
  OPBRIDGE_GRID_LOOP(t, s.in_channels * width) {
    const int64_t c = t / width, column = t % width, b = column / pixels, p = column % pixels, image = first + b;
    const int64_t og = c / per_offset_group, oy = p / s.out_w, ox = p % s.out_w;
    T* target = grad_input + (image * s.in_channels + c) * plane;
    OPBRIDGE_FOR_EACH_TAP(s, k, i, j) {
      const auto point = sample_at(s, offset, image, og, k, i, j, p, oy, ox);
      if (!point.inside) continue;
      const T scaled = grad_columns[(c * taps + k) * width + column] * mask_at(s, mask, image, og, k, p);
      for (int corner = 0; corner < 4; ++corner) {
        if (point.corner[corner]) atomicAdd(target + point.index(corner, s.width), point.weight(corner) * scaled);
      }
    }
  }
}

template <class T>
__global__ void add_kernel(T* __restrict__ target, const T* __restrict__ source, int64_t n) {
  OPBRIDGE_GRID_LOOP(i, n) { target[i] += source[i]; }
}

// Images per chunk: as many as keep the columns within the budget.
int64_t chunk_images(const DeformConv2dShape& s, size_t element_size) {
  const int64_t per_image =
      s.in_channels * s.kernel_h * s.kernel_w * s.out_h * s.out_w * static_cast<int64_t>(element_size);
  return std::clamp<int64_t>(kColumnBudget / std::max<int64_t>(1, per_image), 1, std::max<int64_t>(1, s.batch));
}

template <class T>
const T* optional_data(const std::optional<Tensor>& tensor) {
  return tensor ? api::data<T>(*tensor) : nullptr;
}

Tensor deform_conv2d_cuda(const Tensor& input, const Tensor& offset, const Tensor& weight,
                          const std::optional<Tensor>& bias, IntList stride, IntList padding, IntList dilation,
                          const std::optional<Tensor>& mask) {
  const auto s = deform_conv2d_op::checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  const auto dtype = input.scalar_type();
  auto out = api::empty_on({s.batch, s.out_channels, s.out_h, s.out_w}, dtype, input);
  if (out.numel() == 0) return out;
  const auto x = api::contiguous(input), w = api::contiguous(weight), o = api::contiguous(offset);
  const auto m = mask ? std::optional<Tensor>(api::contiguous(*mask)) : std::nullopt;
  const auto b = bias ? std::optional<Tensor>(api::contiguous(*bias)) : std::nullopt;
  const cuda::Context context(input);
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  const int64_t per_group = s.in_channels / s.groups, out_per_group = s.out_channels / s.groups;
  const int64_t depth = per_group * taps;
  api::dispatch_floating(dtype, "opbridge::deform_conv2d", [&](auto tag) {
    using T = decltype(tag);
    const int64_t chunk = chunk_images(s, sizeof(T));
    auto columns = api::empty_on({s.in_channels * taps * chunk * pixels}, dtype, input);
    auto buffer = api::empty_on({s.out_channels * chunk * pixels}, dtype, input);
    for (int64_t first = 0; first < s.batch; first += chunk) {
      const int64_t count = std::min(chunk, s.batch - first), width = count * pixels;
      im2col_kernel<T><<<cuda::blocks_for(s.in_channels * width), cuda::kThreads, 0, context.stream>>>(
          api::data<T>(x), api::data<T>(o), optional_data<T>(m), s, first, count, api::data<T>(columns));
      cuda::check_launch("opbridge::deform_conv2d");
      for (int64_t g = 0; g < s.groups; ++g) {
        api::mm_out(input.device(), out_per_group, width, depth, api::data<T>(w) + g * out_per_group * depth, depth, 1,
                    api::data<T>(columns) + g * depth * width, width, 1,
                    api::data<T>(buffer) + g * out_per_group * width, width);
      }
      scatter_out_kernel<T><<<cuda::blocks_for(s.out_channels * width), cuda::kThreads, 0, context.stream>>>(
          api::data<T>(buffer), optional_data<T>(b), s, first, count, api::data<T>(out));
      cuda::check_launch("opbridge::deform_conv2d");
    }
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_backward_cuda(
    const Tensor& grad_out, const Tensor& input, const Tensor& offset, const Tensor& weight,
    const std::optional<Tensor>& bias, IntList stride, IntList padding, IntList dilation,
    const std::optional<Tensor>& mask) {
  const auto s = deform_conv2d_op::checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  const std::vector<int64_t> out_shape{s.batch, s.out_channels, s.out_h, s.out_w};
  const auto dtype = input.scalar_type();
  OPBRIDGE_CHECK(api::same_device(grad_out, input) && grad_out.scalar_type() == dtype,
                 "opbridge::deform_conv2d_backward: grad_out must be a tensor of the input's dtype (",
                 api::dtype_name(dtype), ") on its device (", api::device_name(input), "), got ",
                 api::dtype_name(grad_out.scalar_type()), " on ", api::device_name(grad_out));
  OPBRIDGE_CHECK(api::sizes(grad_out) == out_shape, "opbridge::deform_conv2d_backward: grad_out must ",
                 "have the output's shape ", api::Shape{out_shape}, ", got ", api::shape_of(grad_out));
  const auto x = api::contiguous(input), w = api::contiguous(weight), o = api::contiguous(offset);
  const auto g = api::contiguous(grad_out);
  const auto m = mask ? std::optional<Tensor>(api::contiguous(*mask)) : std::nullopt;
  auto grad_input = api::zeros_on(api::sizes(x), dtype, input);
  auto grad_offset = api::empty_on(api::sizes(o), dtype, input);
  auto grad_weight = api::zeros_on(api::sizes(w), dtype, input);
  auto grad_mask = m ? api::empty_on(api::sizes(*m), dtype, input) : api::empty_on({0}, dtype, input);
  Tensor grad_bias = api::empty_on({0}, dtype, input);
  if (bias) {
    const int64_t dims[] = {0, 2, 3};
    grad_bias = torch::stable::sum(g, torch::headeronly::IntHeaderOnlyArrayRef(dims, 3));
  }
  if (s.batch == 0) return {grad_input, grad_offset, grad_weight, grad_bias, grad_mask};
  const cuda::Context context(input);
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  const int64_t per_group = s.in_channels / s.groups, out_per_group = s.out_channels / s.groups;
  const int64_t depth = per_group * taps;
  api::dispatch_floating(dtype, "opbridge::deform_conv2d_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t chunk = chunk_images(s, sizeof(T));
    auto columns = api::empty_on({s.in_channels * taps * chunk * pixels}, dtype, input);
    auto grad_buffer = api::empty_on({s.out_channels * chunk * pixels}, dtype, input);
    const bool chunked = chunk < s.batch;
    auto weight_partial = api::empty_on({chunked ? s.out_channels * depth : 0}, dtype, input);
    T* cols = api::data<T>(columns);
    T* gbuf = api::data<T>(grad_buffer);
    for (int64_t first = 0; first < s.batch; first += chunk) {
      const int64_t count = std::min(chunk, s.batch - first), width = count * pixels;
      const unsigned sample_blocks = cuda::blocks_for(s.in_channels * width);
      gather_grad_kernel<T><<<cuda::blocks_for(s.out_channels * width), cuda::kThreads, 0, context.stream>>>(
          api::data<T>(g), s, first, count, gbuf);
      cuda::check_launch("opbridge::deform_conv2d_backward");
      // grad_columns = weight[group]^T . grad_out[group], into the columns' buffer.
      for (int64_t group = 0; group < s.groups; ++group) {
        api::mm_out(input.device(), depth, width, out_per_group, api::data<T>(w) + group * out_per_group * depth, 1,
                    depth, gbuf + group * out_per_group * width, width, 1, cols + group * depth * width, width);
      }
      offset_grad_kernel<T>
          <<<cuda::blocks_for(count * s.offset_groups * taps * pixels), cuda::kThreads, 0, context.stream>>>(
              api::data<T>(x), api::data<T>(o), optional_data<T>(m), cols, s, first, count, api::data<T>(grad_offset),
              m ? api::data<T>(grad_mask) : nullptr);
      input_grad_kernel<T><<<sample_blocks, cuda::kThreads, 0, context.stream>>>(
          api::data<T>(o), optional_data<T>(m), cols, s, first, count, api::data<T>(grad_input));
      cuda::check_launch("opbridge::deform_conv2d_backward");
      // grad_weight[group] += grad_out[group] . columns[group]^T, the columns sampled again into the same buffer.
      im2col_kernel<T><<<sample_blocks, cuda::kThreads, 0, context.stream>>>(
          api::data<T>(x), api::data<T>(o), optional_data<T>(m), s, first, count, cols);
      cuda::check_launch("opbridge::deform_conv2d_backward");
      T* target = chunked ? api::data<T>(weight_partial) : api::data<T>(grad_weight);
      for (int64_t group = 0; group < s.groups; ++group) {
        api::mm_out(input.device(), out_per_group, depth, width, gbuf + group * out_per_group * width, width, 1,
                    cols + group * depth * width, 1, width, target + group * out_per_group * depth, depth);
      }
      if (chunked) {
        add_kernel<T><<<cuda::blocks_for(s.out_channels * depth), cuda::kThreads, 0, context.stream>>>(
            api::data<T>(grad_weight), target, s.out_channels * depth);
        cuda::check_launch("opbridge::deform_conv2d_backward");
      }
    }
  });
  return {grad_input, grad_offset, grad_weight, grad_bias, grad_mask};
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) {
  OPBRIDGE_IMPL(m, "deform_conv2d", deform_conv2d_cuda);
  OPBRIDGE_IMPL(m, "deform_conv2d_backward", deform_conv2d_backward_cuda);
}

}  // namespace opbridge
