// opbridge::deform_conv2d and its backward on CUDA: the deformable im2col and its gradients per sample with
// kernels/deform_conv2d*.h's arithmetic (tap position, BilinearPoint), and the weight products on torch's matmul
// (cuBLAS) over chunks of images.
//
// Columns are [C_in * K, images * pixels] (row c * K + k, column image * pixels + p), so one product per weight
// group covers a whole chunk of images. The forward and the gradients of offset, mask, weight and bias own their
// elements; grad_input is scattered with atomics (four corners per sample), so its last bits can vary between
// runs (python/opbridge/ops/deform_conv2d.py raises or warns under torch.use_deterministic_algorithms).
#include <algorithm>
#include <limits>
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
using kernels::DeformConv2dShape;

using kernels::cuda::chunk_images;
using kernels::cuda::im2col_kernel;
using kernels::cuda::im2col_threads;
using kernels::cuda::mask_at;
using kernels::cuda::sample_at;
using kernels::cuda::scatter_out_kernel;
using kernels::cuda::with_index_type;

// The kernels count their threads in I: int32 where every loop bound is below kInt32Loop (index_type below; a
// chunk's columns always are), int64 otherwise. Pointer offsets are formed in int64.

// buffer[o, b * P + p] = grad_out[first + b, o, p].
template <class T, class I>
__global__ void gather_grad_kernel(const T* __restrict__ grad_out, DeformConv2dShape s, int64_t first, int64_t count,
                                   T* __restrict__ buffer) {
  const I pixels = s.out_h * s.out_w, width = count * pixels;
  OPBRIDGE_GRID_LOOP_AS(I, t, s.out_channels * width) {
    const I o = t / width, column = t - o * width, b = column / pixels, p = column - b * pixels;
    buffer[t] = grad_out[((first + b) * s.out_channels + o) * pixels + p];
  }
}

// grad_offset and grad_mask: one thread per (image, offset group, tap, pixel) sums over its group's channels.
template <class T, class I>
__global__ void offset_grad_kernel(const T* __restrict__ input, const T* __restrict__ offset,
                                   const T* __restrict__ mask, const T* __restrict__ grad_columns, DeformConv2dShape s,
                                   int64_t first, int64_t count, T* __restrict__ grad_offset,
                                   T* __restrict__ grad_mask) {
  const I taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, out_w = s.out_w, kernel_w = s.kernel_w;
  const I width = count * pixels, per_offset_group = s.in_channels / s.offset_groups, groups = s.offset_groups;
  const int64_t plane = s.height * s.width;
  OPBRIDGE_GRID_LOOP_AS(I, t, count * s.offset_groups * taps * pixels) {
    const I rest = t / pixels, p = t - rest * pixels, rest2 = rest / taps, k = rest - rest2 * taps;
    const I b = rest2 / groups, og = rest2 - b * groups;
    const I oy = p / out_w, ox = p - oy * out_w, i = k / kernel_w, j = k - i * kernel_w;
    const int64_t image = first + b;
    const auto point = sample_at<T, I>(s, offset, image, og, k, I(i), I(j), p, oy, ox);
    T grad_y = T(0), grad_x = T(0), grad_m = T(0);
    if (point.inside) {
      const T* column = grad_columns + static_cast<int64_t>(k) * width + b * pixels + p;
      for (I c = og * per_offset_group; c < (og + 1) * per_offset_group; ++c) {
        T v[4];
        point.values(input + (image * s.in_channels + c) * plane, static_cast<I>(s.width), v);
        point.add_gradients(v, column[static_cast<int64_t>(c) * taps * width], grad_y, grad_x, grad_m);
      }
    }
    const T m = mask_at<T>(s, mask, image, og, k, p);
    T* target = grad_offset + ((image * s.offset_groups + og) * taps + k) * 2 * pixels;
    target[p] = grad_y * m;
    target[pixels + p] = grad_x * m;
    if (grad_mask != nullptr) grad_mask[((image * s.offset_groups + og) * taps + k) * pixels + p] = grad_m;
  }
}

// grad_input: one thread per (channel, image, pixel) adds its taps' four corners (the general kernel, where
// input_grad_tiled_kernel's window would not fit in shared memory).
template <class T, class I>
__global__ void input_grad_kernel(const T* __restrict__ offset, const T* __restrict__ mask,
                                  const T* __restrict__ grad_columns, DeformConv2dShape s, int64_t first, int64_t count,
                                  T* grad_input) {
  const I taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, out_w = s.out_w;
  const I width = count * pixels, per_offset_group = s.in_channels / s.offset_groups;
  const int64_t plane = s.height * s.width;
  OPBRIDGE_GRID_LOOP_AS(I, t, s.in_channels * width) {
    const I c = t / width, column = t - c * width, b = column / pixels, p = column - b * pixels;
    const I og = c / per_offset_group, oy = p / out_w, ox = p - oy * out_w;
    const int64_t image = first + b;
    T* target = grad_input + (image * s.in_channels + c) * plane;
    const T* source = grad_columns + static_cast<int64_t>(c) * taps * width + column;
    OPBRIDGE_FOR_EACH_TAP(s, k, i, j) {
      const auto point = sample_at<T, I>(s, offset, image, og, k, I(i), I(j), p, oy, ox);
      if (!point.inside) continue;
      const T scaled = source[k * width] * mask_at<T>(s, mask, image, og, k, p);
      for (int corner = 0; corner < 4; ++corner) {
        if (point.corner[corner])
          atomicAdd(target + point.index(corner, static_cast<I>(s.width)), point.weight(corner) * scaled);
      }
    }
  }
}

// grad_input by tiles: a block per (tile of kGradTile x kGradTile output pixels, channel, image of the chunk). Its
// threads (one per pixel) add their taps' corner terms into a window of the input plane held in shared memory: the
// tile's receptive field and kGradMargin pixels around it for the offsets (corners outside it are added to
// grad_input directly); then the window is added to grad_input, one atomic per touched position instead of one
// per sample and corner (9 taps x 4 corners a pixel, most landing on positions that neighbouring pixels' samples
// share).
constexpr int kGradTile = 16, kGradMargin = 4;
constexpr int64_t kGradWindowBytes = 32 << 10;

struct GradWindow {
  int64_t height = 0, width = 0;
};

// The window of a tile for this geometry (height and width in input pixels).
GradWindow grad_window(const DeformConv2dShape& s) {
  return {(kGradTile - 1) * s.stride_h + (s.kernel_h - 1) * s.dilation_h + 2 + 2 * kGradMargin,
          (kGradTile - 1) * s.stride_w + (s.kernel_w - 1) * s.dilation_w + 2 + 2 * kGradMargin};
}

template <class T, class I>
__global__ void __launch_bounds__(kGradTile* kGradTile)
    input_grad_tiled_kernel(const T* __restrict__ offset, const T* __restrict__ mask,
                            const T* __restrict__ grad_columns, DeformConv2dShape s, int64_t first, int64_t count,
                            GradWindow w, T* grad_input) {
  extern __shared__ unsigned char window_bytes[];
  T* window = reinterpret_cast<T*>(window_bytes);
  const I taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, out_w = s.out_w;
  const I width = count * pixels, per_offset_group = s.in_channels / s.offset_groups;
  const I tiles_x = (s.out_w + kGradTile - 1) / kGradTile, window_size = w.height * w.width;
  const I tile_y = blockIdx.x / tiles_x, tile_x = blockIdx.x - tile_y * tiles_x;
  const I c = blockIdx.y, b = blockIdx.z, og = c / per_offset_group;
  const int64_t image = first + b;
  // The window's first input position (may lie off the image; positions off it receive nothing).
  const int64_t wy0 = static_cast<int64_t>(tile_y) * kGradTile * s.stride_h - s.pad_top - kGradMargin;
  const int64_t wx0 = static_cast<int64_t>(tile_x) * kGradTile * s.stride_w - s.pad_left - kGradMargin;
  T* target = grad_input + (image * s.in_channels + c) * s.height * s.width;
  for (I e = threadIdx.x; e < window_size; e += blockDim.x) window[e] = T(0);
  __syncthreads();
  const I oy = tile_y * kGradTile + static_cast<I>(threadIdx.x) / kGradTile;
  const I ox = tile_x * kGradTile + static_cast<I>(threadIdx.x) % kGradTile;
  if (oy < s.out_h && ox < s.out_w) {
    const I p = oy * out_w + ox;
    const T* source = grad_columns + static_cast<int64_t>(c) * taps * width + b * pixels + p;
    OPBRIDGE_FOR_EACH_TAP(s, k, i, j) {
      const auto point = sample_at<T, I>(s, offset, image, og, k, I(i), I(j), p, oy, ox);
      if (!point.inside) continue;
      const T scaled = source[k * width] * mask_at<T>(s, mask, image, og, k, p);
      for (int corner = 0; corner < 4; ++corner) {
        if (!point.corner[corner]) continue;
        const int64_t y = point.y_low + corner / 2, x = point.x_low + corner % 2;
        const int64_t wy = y - wy0, wx = x - wx0;
        const T add = point.weight(corner) * scaled;
        if (wy >= 0 && wy < w.height && wx >= 0 && wx < w.width) {
          atomicAdd(window + wy * w.width + wx, add);
        } else {
          atomicAdd(target + y * s.width + x, add);
        }
      }
    }
  }
  __syncthreads();
  for (I e = threadIdx.x; e < window_size; e += blockDim.x) {
    const T sum = window[e];
    if (sum == T(0)) continue;  // nothing added here (or terms that cancelled exactly): adding zero changes nothing
    const I wy = e / static_cast<I>(w.width), wx = e - wy * static_cast<I>(w.width);
    atomicAdd(target + (wy0 + wy) * s.width + wx0 + wx, sum);  // on the image: only its corners were added
  }
}

template <class T>
__global__ void add_kernel(T* __restrict__ target, const T* __restrict__ source, int64_t n) {
  OPBRIDGE_GRID_LOOP(i, n) { target[i] += source[i]; }
}

template <class T>
const T* optional_data(const std::optional<Tensor>& tensor) {
  return tensor ? api::data<T>(*tensor) : nullptr;
}

Tensor deform_conv2d_cuda(const Tensor& input, const Tensor& offset, const Tensor& weight,
                          const std::optional<Tensor>& bias, IntList stride, IntList padding, IntList dilation,
                          const std::optional<Tensor>& mask) {
  const auto s = deform_conv2d_op::checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  if (api::is_half(input.scalar_type())) {  // half storage: float32 arithmetic, one rounding at the end
    return api::to(deform_conv2d_cuda(api::widened(input), api::widened(offset), api::widened(weight),
                                      api::widened(bias), stride, padding, dilation, api::widened(mask)),
                   input.scalar_type());
  }
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
    with_index_type(s, chunk, [&](auto index) {
      using I = decltype(index);
      for (int64_t first = 0; first < s.batch; first += chunk) {
        const int64_t count = std::min(chunk, s.batch - first), width = count * pixels;
        im2col_kernel<T, I><<<cuda::blocks_for(im2col_threads(s, width)), cuda::kThreads, 0, context.stream>>>(
            api::data<T>(x), api::data<T>(o), optional_data<T>(m), s, first, count, api::data<T>(columns));
        cuda::check_launch("opbridge::deform_conv2d");
        for (int64_t g = 0; g < s.groups; ++g) {
          api::mm_out(input.device(), out_per_group, width, depth, api::data<T>(w) + g * out_per_group * depth, depth,
                      1, api::data<T>(columns) + g * depth * width, width, 1,
                      api::data<T>(buffer) + g * out_per_group * width, width);
        }
        scatter_out_kernel<T, I><<<cuda::blocks_for(s.out_channels * width), cuda::kThreads, 0, context.stream>>>(
            api::data<T>(buffer), optional_data<T>(b), s, first, count, api::data<T>(out));
        cuda::check_launch("opbridge::deform_conv2d");
      }
    });
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_backward_cuda(
    const Tensor& grad_out, const Tensor& input, const Tensor& offset, const Tensor& weight,
    const std::optional<Tensor>& bias, IntList stride, IntList padding, IntList dilation,
    const std::optional<Tensor>& mask) {
  const auto s = deform_conv2d_op::checked_shape(input, offset, weight, bias, stride, padding, dilation, mask);
  if (api::is_half(input.scalar_type())) {
    // Half storage: float32 arithmetic and float32 gradient buffers (sums over pixels, taps and the batch), each
    // gradient rounded once to its input's dtype.
    OPBRIDGE_CHECK(grad_out.scalar_type() == input.scalar_type(),
                   "opbridge::deform_conv2d_backward: grad_out must have the input's dtype (",
                   api::dtype_name(input.scalar_type()), "), got ", api::dtype_name(grad_out.scalar_type()));
    auto [grad_input, grad_offset, grad_weight, grad_bias, grad_mask] = deform_conv2d_backward_cuda(
        api::widened(grad_out), api::widened(input), api::widened(offset), api::widened(weight), api::widened(bias),
        stride, padding, dilation, api::widened(mask));
    return {api::to(grad_input, input.scalar_type()), api::to(grad_offset, offset.scalar_type()),
            api::to(grad_weight, weight.scalar_type()),
            api::to(grad_bias, bias ? bias->scalar_type() : input.scalar_type()),
            api::to(grad_mask, mask ? mask->scalar_type() : input.scalar_type())};
  }
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
    const GradWindow window = grad_window(s);
    const int64_t window_bytes = window.height * window.width * static_cast<int64_t>(sizeof(T));
    const int64_t tiles = (s.out_h + kGradTile - 1) / kGradTile * ((s.out_w + kGradTile - 1) / kGradTile);
    const bool tiled = window_bytes <= kGradWindowBytes && s.in_channels <= 65535 && chunk <= 65535 &&
                       tiles <= std::numeric_limits<int32_t>::max();
    with_index_type(s, chunk, [&](auto index) {
      using I = decltype(index);
      for (int64_t first = 0; first < s.batch; first += chunk) {
        const int64_t count = std::min(chunk, s.batch - first), width = count * pixels;
        const unsigned sample_blocks = cuda::blocks_for(s.in_channels * width);
        gather_grad_kernel<T, I><<<cuda::blocks_for(s.out_channels * width), cuda::kThreads, 0, context.stream>>>(
            api::data<T>(g), s, first, count, gbuf);
        cuda::check_launch("opbridge::deform_conv2d_backward");
        // grad_columns = weight[group]^T . grad_out[group], into the columns' buffer.
        for (int64_t group = 0; group < s.groups; ++group) {
          api::mm_out(input.device(), depth, width, out_per_group, api::data<T>(w) + group * out_per_group * depth, 1,
                      depth, gbuf + group * out_per_group * width, width, 1, cols + group * depth * width, width);
        }
        offset_grad_kernel<T, I>
            <<<cuda::blocks_for(count * s.offset_groups * taps * pixels), cuda::kThreads, 0, context.stream>>>(
                api::data<T>(x), api::data<T>(o), optional_data<T>(m), cols, s, first, count, api::data<T>(grad_offset),
                m ? api::data<T>(grad_mask) : nullptr);
        if (tiled) {
          const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(s.in_channels),
                          static_cast<unsigned>(count));
          input_grad_tiled_kernel<T, I>
              <<<grid, kGradTile * kGradTile, static_cast<size_t>(window_bytes), context.stream>>>(
                  api::data<T>(o), optional_data<T>(m), cols, s, first, count, window, api::data<T>(grad_input));
        } else {
          input_grad_kernel<T, I><<<sample_blocks, cuda::kThreads, 0, context.stream>>>(
              api::data<T>(o), optional_data<T>(m), cols, s, first, count, api::data<T>(grad_input));
        }
        cuda::check_launch("opbridge::deform_conv2d_backward");
        // grad_weight[group] += grad_out[group] . columns[group]^T, the columns sampled again into the same buffer.
        im2col_kernel<T, I><<<cuda::blocks_for(im2col_threads(s, width)), cuda::kThreads, 0, context.stream>>>(
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
  });
  return {grad_input, grad_offset, grad_weight, grad_bias, grad_mask};
}

}  // namespace

OPBRIDGE_LIBRARY_IMPL_CUDA(m) {
  OPBRIDGE_IMPL(m, "deform_conv2d", deform_conv2d_cuda);
  OPBRIDGE_IMPL(m, "deform_conv2d_backward", deform_conv2d_backward_cuda);
}

}  // namespace opbridge
