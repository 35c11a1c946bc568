// The backward of deformable convolution v1/v2 (torchvision's semantics): the
// gradients of input, offset, mask, weight and bias, behind
// torch.ops.opbridge.deform_conv2d_backward (the autograd formula of
// opbridge::deform_conv2d).
//
// Per image, with columns[c, k, p] = mask * bilinear(input[c], position(k, p)) (stored in the forward's
// (group, tap, channel of the group) order):
//   grad_weight[group]   += grad_out[group] . columns[group]^T          (GEMM)
//   grad_columns[group]   = weight[group]^T . grad_out[group]           (GEMM)
//   grad_mask[g, k, p]    = sum over the offset group's channels of grad_columns * bilinear
//   grad_offset[g, k, p]  = sum of grad_columns * mask * d bilinear / d (y, x)
//   grad_input[c]        += grad_columns * mask * corner weight, at the four corners
// The bilinear derivative at a position is that of the cell [floor, floor + 1],
// also at integer positions, with corners outside the image counting as zero, as
// in the forward. A sample outside (y <= -1, y >= H, x <= -1 or x >= W) has zero
// value and zero derivative: mmcv's convention, on which its published DCNv2
// gradients depend. torchvision differs on that border only (y or x exactly -1):
// it takes the one-sided derivative from inside.
//
// Deterministic: every output element is written by one task, in a fixed order,
// and the tasks do not depend on the number of threads (the GEMM partial sums
// are split into fixed chunks and added in order). No atomics, no races: the
// input gradient is scattered by one task per run of at most 16 channels (each
// element's shares added in the same (tap, pixel, corner) order whatever the runs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/deform_conv2d.h"

namespace opbridge::kernels {

// Bilinear sample of a plane at (y, x) and its derivatives, torchvision's conventions. I: the integer type of the
// corners' coordinates and plane indices (int64; the CUDA kernels use int32 where the plane has fewer than 2^30
// elements: the same values, converted to and from T faster).
template <class T, class I = int64_t>
struct BilinearPoint {
  bool inside = false;
  I y_low = 0, x_low = 0;
  T ly = 0, lx = 0;
  bool corner[4] = {false, false, false, false};  // (low, low), (low, high), (high, low), (high, high)

  OPBRIDGE_HD BilinearPoint(T y, T x, I height, I width) {
    if (!(y > T(-1) && y < T(height) && x > T(-1) && x < T(width))) return;  // also rejects NaN
    inside = true;
    y_low = y >= T(0) ? static_cast<I>(y) : I(-1);
    x_low = x >= T(0) ? static_cast<I>(x) : I(-1);
    ly = y - T(y_low), lx = x - T(x_low);
    const bool top = y_low >= 0, bottom = y_low + 1 < height, left = x_low >= 0, right = x_low + 1 < width;
    corner[0] = top && left, corner[1] = top && right, corner[2] = bottom && left, corner[3] = bottom && right;
  }

  OPBRIDGE_HD I index(int corner_index, I width) const {
    return (y_low + corner_index / 2) * width + x_low + corner_index % 2;
  }

  OPBRIDGE_HD T weight(int corner_index) const {
    const T wy = corner_index / 2 ? ly : T(1) - ly, wx = corner_index % 2 ? lx : T(1) - lx;
    return wy * wx;
  }

  // The four corner values (zero outside the image), read from a plane stored as S (T, or a half type widened).
  template <class S>
  OPBRIDGE_HD void values(const S* plane, I width, T v[4]) const {
    for (int corner_index = 0; corner_index < 4; ++corner_index)
      v[corner_index] = corner[corner_index] ? static_cast<T>(plane[index(corner_index, width)]) : T(0);
  }

  // The sample's value from its corner values (zero outside).
  OPBRIDGE_HD T value(const T v[4]) const {
    T sum = T(0);
    if (inside) {
      for (int corner_index = 0; corner_index < 4; ++corner_index) sum += weight(corner_index) * v[corner_index];
    }
    return sum;
  }

  // Adds one channel's terms of the gradients of y, x and the mask, given that channel's column gradient g
  // and corner values v (the sample must be inside).
  OPBRIDGE_HD void add_gradients(const T v[4], T g, T& grad_y, T& grad_x, T& grad_mask) const {
    const T hy = T(1) - ly, hx = T(1) - lx;
    grad_y += g * (hx * (v[2] - v[0]) + lx * (v[3] - v[1]));
    grad_x += g * (hy * (v[1] - v[0]) + ly * (v[3] - v[2]));
    grad_mask += g * (hy * hx * v[0] + hy * lx * v[1] + ly * hx * v[2] + ly * lx * v[3]);
  }
};

template <class T>
struct DeformConv2dGrads {
  T* input = nullptr;   // [N, C_in, H, W]
  T* offset = nullptr;  // like offset
  T* mask = nullptr;    // like mask, or nullptr (no mask)
  T* weight = nullptr;  // like weight
  T* bias = nullptr;    // [C_out], or nullptr
};

// One sample (offset group, tap, pixel) of an image, for the offset, mask and input gradients: its cell's top-left
// pixel (y_low * W + x_low), fractional parts, four bilinear weights and mask, and which corners are on the image
// (bit c: corner c; 0 for a sample outside).
template <class T>
struct SampledTap {
  int64_t base;
  T ly, lx;
  T weight[4];
  T mask;
  uint8_t corners;
  bool inside;
};

#if !defined(__CUDACC__)
// One sample's sums over a run of n channels, for its offset and mask gradients: with g the channels' column
// gradients and r0..r3 its corner rows (the zero row for a corner off the image), sums[0] += g . (r2 - r0),
// sums[1] += g . (r3 - r1) (y), sums[2] += g . (r1 - r0), sums[3] += g . (r3 - r2) (x), sums[4] += g . (the
// bilinear value) (mask). 16 lanes each, added in a fixed order: the same sums on every CPU and thread count.
#define OPBRIDGE_DEFINE_SAMPLE_SUMS(T)                                                                            \
  [[maybe_unused]] OPBRIDGE_VECTOR_CLONES static void sample_gradient_sums(                                       \
      const T* __restrict g, const T* __restrict r0, const T* __restrict r1, const T* __restrict r2,              \
      const T* __restrict r3, T w0, T w1, T w2, T w3, int64_t n, T* __restrict sums) {                            \
    T lanes[5][16] = {};                                                                                          \
    int64_t c = 0;                                                                                                \
    for (; c + 16 <= n; c += 16) {                                                                                \
      for (int l = 0; l < 16; ++l) {                                                                              \
        const T a0 = r0[c + l], a1 = r1[c + l], a2 = r2[c + l], a3 = r3[c + l], gc = g[c + l];                    \
        lanes[0][l] += gc * (a2 - a0), lanes[1][l] += gc * (a3 - a1);                                             \
        lanes[2][l] += gc * (a1 - a0), lanes[3][l] += gc * (a3 - a2);                                             \
        lanes[4][l] += gc * (w0 * a0 + w1 * a1 + w2 * a2 + w3 * a3);                                              \
      }                                                                                                           \
    }                                                                                                             \
    for (int k = 0; k < 5; ++k) {                                                                                 \
      T sum = T(0);                                                                                               \
      for (int l = 0; l < 16; ++l) sum += lanes[k][l];                                                            \
      sums[k] += sum;                                                                                             \
    }                                                                                                             \
    for (; c < n; ++c) {                                                                                          \
      const T a0 = r0[c], a1 = r1[c], a2 = r2[c], a3 = r3[c], gc = g[c];                                          \
      sums[0] += gc * (a2 - a0), sums[1] += gc * (a3 - a1), sums[2] += gc * (a1 - a0), sums[3] += gc * (a3 - a2); \
      sums[4] += gc * (w0 * a0 + w1 * a1 + w2 * a2 + w3 * a3);                                                    \
    }                                                                                                             \
  }
OPBRIDGE_DEFINE_SAMPLE_SUMS(float)
OPBRIDGE_DEFINE_SAMPLE_SUMS(double)
#undef OPBRIDGE_DEFINE_SAMPLE_SUMS

// to[c] += weight * (g[c] * mask) for c < n: one corner's share of a sample's column gradients, scattered into the
// channels-last input gradient.
#define OPBRIDGE_DEFINE_SCATTER(T)                                                                            \
  [[maybe_unused]] OPBRIDGE_VECTOR_CLONES static void scatter_corner(T* __restrict to, const T* __restrict g, \
                                                                     T weight, T mask, int64_t n) {           \
    for (int64_t c = 0; c < n; ++c) to[c] += weight * (g[c] * mask);                                          \
  }
OPBRIDGE_DEFINE_SCATTER(float)
OPBRIDGE_DEFINE_SCATTER(double)
#undef OPBRIDGE_DEFINE_SCATTER
#endif  // !defined(__CUDACC__)

// to[j * to_row + i] = from[i * from_row + j]: transpose_floats for float, one element at a time otherwise.
template <class T>
void transpose_block(const T* from, int64_t from_row, T* to, int64_t to_row, int64_t rows, int64_t cols) {
  if constexpr (std::is_same_v<T, float>) {
    transpose_floats(from, from_row, to, to_row, rows, cols);
  } else {
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t i = 0; i < rows; ++i) to[j * to_row + i] = from[i * from_row + j];
    }
  }
}

// Pixels per task of the per-pixel passes, and the fixed number of partial sums of grad_weight per image.
constexpr int64_t kBackwardPixelChunk = 256;
constexpr int64_t kWeightGradChunks = 8;

// Gradients for a shape that passed check_deform_conv2d, given grad_out [N, C_out, H_out, W_out]; every
// gradient buffer is written in full (zeroed first). gemm as in deform_conv2d: c = a * b^T, row-major.
//
// The input is read channels-last (deform_conv2d_layouts, as the forward reads it), so that a sample's four corners
// are four contiguous rows of channels. The columns and their gradients are ordered as the forward's, (group, tap,
// channel of the group): the columns channel-major [C_in * K, pixels] for grad_weight's product over pixels (the
// forward's pixel-major im2col, transposed), the column gradients pixel-major [pixels, C_in * K] for the per-sample
// sums over channels. grad_weight comes out in that (tap, channel) order and is written back in torch's.
template <class T, class ParallelFor, class Gemm>
void deform_conv2d_backward(const T* input, const T* weight, const T* offset, const T* mask, const T* grad_out,
                            const DeformConv2dShape& s, const DeformConv2dGrads<T>& grads, ParallelFor&& parallel_for,
                            Gemm&& gemm) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const int64_t per_group = s.in_channels / s.groups, out_per_group = s.out_channels / s.groups;
  const int64_t per_offset_group = s.in_channels / s.offset_groups, depth = per_group * taps;
  const int64_t ld = s.in_channels * taps;  // a pixel's columns: (g * K + k) * C_g + ci
  std::fill(grads.input, grads.input + s.batch * s.in_channels * plane, T(0));
  std::fill(grads.weight, grads.weight + s.out_channels * depth, T(0));
  if (grads.bias != nullptr) std::fill(grads.bias, grads.bias + s.out_channels, T(0));
  if (s.batch == 0) return;

  // The input channels-last and the weight as [C_out, K, C_in / groups], as the forward lays them out.
  // One image at a time: a copy of the whole batch would add the input's size to the backward's peak memory.
  DeformConv2dShape one_image = s;
  one_image.batch = 1;
  std::vector<T> input_hwc(static_cast<size_t>(plane * s.in_channels));
  std::vector<T> weight_k(static_cast<size_t>(s.out_channels * depth));
  deform_conv2d_layouts(input, weight, one_image, input_hwc.data(), weight_k.data(), parallel_for);
  // weight_k[group]^T: [depth, C_out / groups] per group.
  std::vector<T> weight_t(static_cast<size_t>(s.out_channels * depth));
  for (int64_t g = 0; g < s.groups; ++g)
    for (int64_t o = 0; o < out_per_group; ++o)
      for (int64_t d = 0; d < depth; ++d)
        weight_t[(g * depth + d) * out_per_group + o] = weight_k[(g * out_per_group + o) * depth + d];

  const ChannelSegments split(s);
  const std::vector<ChannelSegment>& segments = split.segments;
  const std::vector<size_t>& starts = split.starts;
  // The input gradient's tasks: runs of at most 16 channels within one segment (a vector each).
  std::vector<std::pair<size_t, int64_t>> blocks;  // (segment, first channel)
  for (size_t k = 0; k < segments.size(); ++k) {
    for (int64_t c = segments[k].channel; c < segments[k].channel + segments[k].count; c += 16)
      blocks.push_back({k, c});
  }
  const std::vector<T> zeros(static_cast<size_t>(s.in_channels), T(0));

  std::vector<T> columns(static_cast<size_t>(ld * pixels)), grad_columns(columns.size());
  std::vector<T> grad_out_t(static_cast<size_t>(pixels * s.out_channels));
  std::vector<T> grad_input_hwc(static_cast<size_t>(plane * s.in_channels));
  const int64_t weight_chunks = std::min(kWeightGradChunks, pixels);
  const int64_t weight_chunk = (pixels + weight_chunks - 1) / weight_chunks;
  std::vector<T> partial(static_cast<size_t>(weight_chunks * s.out_channels * depth));
  const int64_t pixel_chunks = (pixels + kBackwardPixelChunk - 1) / kBackwardPixelChunk;
  // The im2col blocks' pixels: their columns within the forward's 4 MiB per task (deform_conv2d_block_pixels).
  const int64_t im2col_pixels = std::min(kBackwardPixelChunk, deform_conv2d_block_pixels(s, sizeof(T)));
  const int64_t im2col_blocks = (pixels + im2col_pixels - 1) / im2col_pixels;
  std::vector<SampledTap<T>> sampled(static_cast<size_t>(s.offset_groups * taps * pixels));
  const int64_t corner_offset[4] = {0, 1, s.width, s.width + 1};

  for (int64_t n = 0; n < s.batch; ++n) {
    if (n > 0) {
      deform_conv2d_layouts(input + n * s.in_channels * plane, weight, one_image, input_hwc.data(), weight_k.data(),
                            parallel_for);
    }
    const T* image_hwc = input_hwc.data();
    const T* image_offset = offset + n * 2 * s.offset_groups * taps * pixels;
    const T* image_mask = mask != nullptr ? mask + n * s.offset_groups * taps * pixels : nullptr;
    const T* image_grad = grad_out + n * s.out_channels * pixels;

    // 1. The samples' table, in tasks of (offset group, tap, pixel chunk).
    parallel_for(s.offset_groups * taps * pixel_chunks, [&](int64_t task) {
      const int64_t og = task / (taps * pixel_chunks), k = task / pixel_chunks % taps;
      const int64_t first = task % pixel_chunks * kBackwardPixelChunk;
      const int64_t last = std::min(pixels, first + kBackwardPixelChunk);
      const T* dy = image_offset + (og * taps + k) * 2 * pixels;
      for (int64_t p = first; p < last; ++p) {
        T y, x;
        deform_conv2d_position(s, p / s.out_w, p % s.out_w, k / s.kernel_w, k % s.kernel_w, dy[p], dy[pixels + p], y,
                               x);
        const BilinearPoint<T> point(y, x, s.height, s.width);
        SampledTap<T>& tap = sampled[(og * taps + k) * pixels + p];
        tap.inside = point.inside, tap.corners = 0;
        tap.mask = image_mask != nullptr ? image_mask[(og * taps + k) * pixels + p] : T(1);
        if (point.inside) {
          tap.base = point.index(0, s.width), tap.ly = point.ly, tap.lx = point.lx;
          for (int corner = 0; corner < 4; ++corner) {
            tap.weight[corner] = point.weight(corner);
            tap.corners |= static_cast<uint8_t>(point.corner[corner] ? 1 << corner : 0);
          }
        }
      }
    });

    // 2. The columns channel-major (the forward's pixel-major im2col of a block, transposed), and grad_out^T.
    parallel_for(im2col_blocks, [&](int64_t chunk) {
      const int64_t first = chunk * im2col_pixels, count = std::min(im2col_pixels, pixels - first);
      const ThreadScratch block(sizeof(T) * static_cast<size_t>(count * ld));  // im2col writes all of it
      deformable_im2col_block(image_hwc, zeros.data(), image_offset, image_mask, s, first, count, block.get<T>(), ld);
      transpose_block(static_cast<const T*>(block.get<T>()), ld, columns.data() + first, pixels, count, ld);
    });
    parallel_for(s.out_channels, [&](int64_t o) {
      for (int64_t p = 0; p < pixels; ++p) grad_out_t[p * s.out_channels + o] = image_grad[o * pixels + p];
    });

    // 3. grad_weight += grad_out . columns^T, in fixed pixel chunks added in order ((tap, channel) order).
    parallel_for(s.groups * weight_chunks, [&](int64_t task) {
      const int64_t g = task / weight_chunks, chunk = task % weight_chunks;
      const int64_t first = chunk * weight_chunk, count = std::min(weight_chunk, pixels - first);
      T* target = partial.data() + (chunk * s.out_channels + g * out_per_group) * depth;
      if (count <= 0) {
        std::fill(target, target + out_per_group * depth, T(0));
        return;
      }
      gemm(out_per_group, depth, count, image_grad + g * out_per_group * pixels + first, pixels,
           columns.data() + g * depth * pixels + first, pixels, target, depth);
    });
    parallel_for(s.out_channels, [&](int64_t o) {
      T* target = grads.weight + o * depth;  // torch's order: channel ci, then tap k
      for (int64_t chunk = 0; chunk < weight_chunks; ++chunk) {
        const T* source = partial.data() + (chunk * s.out_channels + o) * depth;  // tap k, then channel ci
        for (int64_t k = 0; k < taps; ++k) {
          for (int64_t ci = 0; ci < per_group; ++ci) target[ci * taps + k] += source[k * per_group + ci];
        }
      }
      if (grads.bias != nullptr) {
        T sum = T(0);
        for (int64_t p = 0; p < pixels; ++p) sum += image_grad[o * pixels + p];
        grads.bias[o] += sum;
      }
    });

    // 4. grad_columns = grad_out^T . weight, pixel-major, per group and pixel chunk.
    parallel_for(s.groups * pixel_chunks, [&](int64_t task) {
      const int64_t g = task / pixel_chunks, first = task % pixel_chunks * kBackwardPixelChunk;
      const int64_t count = std::min(kBackwardPixelChunk, pixels - first);
      gemm(count, depth, out_per_group, grad_out_t.data() + first * s.out_channels + g * out_per_group, s.out_channels,
           weight_t.data() + g * depth * out_per_group, out_per_group, grad_columns.data() + first * ld + g * depth,
           ld);
    });

    // 5. grad_offset and grad_mask: one task per (offset group, tap, pixel chunk) owns its elements.
    T* image_grad_offset = grads.offset + n * 2 * s.offset_groups * taps * pixels;
    T* image_grad_mask = grads.mask != nullptr ? grads.mask + n * s.offset_groups * taps * pixels : nullptr;
    parallel_for(s.offset_groups * taps * pixel_chunks, [&](int64_t task) {
      const int64_t og = task / (taps * pixel_chunks), k = task / pixel_chunks % taps;
      const int64_t first = task % pixel_chunks * kBackwardPixelChunk;
      const int64_t last = std::min(pixels, first + kBackwardPixelChunk);
      for (int64_t p = first; p < last; ++p) {
        const SampledTap<T>& tap = sampled[(og * taps + k) * pixels + p];
        T grad_y = T(0), grad_x = T(0), grad_m = T(0);
        if (tap.inside) {
          T sums[5] = {T(0), T(0), T(0), T(0), T(0)};
          for (size_t index = starts[og]; index < starts[og + 1]; ++index) {
            const ChannelSegment& segment = segments[index];
            const T* rows[4];
            for (int corner = 0; corner < 4; ++corner) {
              rows[corner] = tap.corners & (1 << corner)
                                 ? image_hwc + ((tap.base + corner_offset[corner]) * s.in_channels + segment.channel)
                                 : zeros.data();
            }
            sample_gradient_sums(grad_columns.data() + p * ld + segment.column + k * per_group, rows[0], rows[1],
                                 rows[2], rows[3], tap.weight[0], tap.weight[1], tap.weight[2], tap.weight[3],
                                 segment.count, sums);
          }
          const T hy = T(1) - tap.ly, hx = T(1) - tap.lx;
          grad_y = hx * sums[0] + tap.lx * sums[1];
          grad_x = hy * sums[2] + tap.ly * sums[3];
          grad_m = sums[4];
        }
        image_grad_offset[(og * taps + k) * 2 * pixels + p] = grad_y * tap.mask;
        image_grad_offset[(og * taps + k) * 2 * pixels + pixels + p] = grad_x * tap.mask;
        if (image_grad_mask != nullptr) image_grad_mask[(og * taps + k) * pixels + p] = grad_m;
      }
    });

    // 6. grad_input, channels-last: one task per run of channels scatters its samples' shares (for each tap, each
    // pixel, each corner in order), then the image is transposed back to [C_in, H, W].
    std::fill(grad_input_hwc.begin(), grad_input_hwc.end(), T(0));
    parallel_for(static_cast<int64_t>(blocks.size()), [&](int64_t task) {
      const ChannelSegment& segment = segments[blocks[static_cast<size_t>(task)].first];
      const int64_t c0 = blocks[static_cast<size_t>(task)].second;
      const int64_t count = std::min<int64_t>(16, segment.channel + segment.count - c0);
      const int64_t og = c0 / per_offset_group;
      const int64_t column = segment.column + (c0 - segment.channel);
      for (int64_t k = 0; k < taps; ++k) {
        const SampledTap<T>* tap = sampled.data() + (og * taps + k) * pixels;
        for (int64_t p = 0; p < pixels; ++p) {
          const SampledTap<T>& t = tap[p];
          if (t.corners == 0) continue;
          const T* g = grad_columns.data() + p * ld + column + k * per_group;
          for (int corner = 0; corner < 4; ++corner) {
            if (t.corners & (1 << corner)) {
              scatter_corner(grad_input_hwc.data() + (t.base + corner_offset[corner]) * s.in_channels + c0, g,
                             t.weight[corner], t.mask, count);
            }
          }
        }
      }
    });
    T* image_grad_input = grads.input + n * s.in_channels * plane;
    const int64_t tiles = (plane + kTransposeTile - 1) / kTransposeTile;
    parallel_for(tiles, [&](int64_t tile) {
      const int64_t first = tile * kTransposeTile, count = std::min(kTransposeTile, plane - first);
      transpose_block(static_cast<const T*>(grad_input_hwc.data()) + first * s.in_channels, s.in_channels,
                      image_grad_input + first, plane, count, s.in_channels);
    });
  }
}

}  // namespace opbridge::kernels
