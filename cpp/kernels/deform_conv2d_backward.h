// The backward of deformable convolution v1/v2 (torchvision's semantics): the
// gradients of input, offset, mask, weight and bias, behind
// torch.ops.opbridge.deform_conv2d_backward (the autograd formula of
// opbridge::deform_conv2d).
//
// Per image, with columns[c * K + k, p] = mask * bilinear(input[c], position(k, p)):
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
// input gradient is scattered by one task per channel plane.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
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

// One sample (offset group, tap, pixel) of an image, for the input gradient's scatter: the index of its
// (low, low) corner in the plane, its four bilinear weights and mask, and which corners are on the image
// (bit c: corner c; 0 for a sample outside).
template <class T>
struct SampledTap {
  int64_t base;
  T weight[4];
  T mask;
  uint8_t corners;
};

// Pixels per task of the per-pixel passes, and the fixed number of partial sums of grad_weight per image.
constexpr int64_t kBackwardPixelChunk = 256;
constexpr int64_t kWeightGradChunks = 8;

// Gradients for a shape that passed check_deform_conv2d, given grad_out [N, C_out, H_out, W_out]; every
// gradient buffer is written in full (zeroed first). gemm as in deform_conv2d: c = a * b^T, row-major.
template <class T, class ParallelFor, class Gemm>
void deform_conv2d_backward(const T* input, const T* weight, const T* offset, const T* mask, const T* grad_out,
                            const DeformConv2dShape& s, const DeformConv2dGrads<T>& grads, ParallelFor&& parallel_for,
                            Gemm&& gemm) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const int64_t per_group = s.in_channels / s.groups, out_per_group = s.out_channels / s.groups;
  const int64_t per_offset_group = s.in_channels / s.offset_groups, depth = per_group * taps;
  const int64_t rows = s.in_channels * taps;  // rows of the columns: c * K + k
  std::fill(grads.input, grads.input + s.batch * s.in_channels * plane, T(0));
  std::fill(grads.weight, grads.weight + s.out_channels * depth, T(0));
  if (grads.bias != nullptr) std::fill(grads.bias, grads.bias + s.out_channels, T(0));
  if (s.batch == 0) return;

  // weight[group]^T: [depth, C_out / groups] per group.
  std::vector<T> weight_t(static_cast<size_t>(s.out_channels * depth));
  for (int64_t g = 0; g < s.groups; ++g)
    for (int64_t o = 0; o < out_per_group; ++o)
      for (int64_t d = 0; d < depth; ++d)
        weight_t[(g * depth + d) * out_per_group + o] = weight[(g * out_per_group + o) * depth + d];

  std::vector<T> columns(static_cast<size_t>(rows * pixels)), grad_columns(columns.size());
  std::vector<T> grad_out_t(static_cast<size_t>(pixels * s.out_channels));
  const int64_t weight_chunks = std::min(kWeightGradChunks, pixels);
  const int64_t weight_chunk = (pixels + weight_chunks - 1) / weight_chunks;
  std::vector<T> partial(static_cast<size_t>(weight_chunks * s.out_channels * depth));
  const int64_t pixel_chunks = (pixels + kBackwardPixelChunk - 1) / kBackwardPixelChunk;
  std::vector<SampledTap<T>> sampled(static_cast<size_t>(s.offset_groups * taps * pixels));

  for (int64_t n = 0; n < s.batch; ++n) {
    const T* image = input + n * s.in_channels * plane;
    const T* image_offset = offset + n * 2 * s.offset_groups * taps * pixels;
    const T* image_mask = mask != nullptr ? mask + n * s.offset_groups * taps * pixels : nullptr;
    const T* image_grad = grad_out + n * s.out_channels * pixels;
    auto position = [&](int64_t og, int64_t k, int64_t p) {
      const int64_t oy = p / s.out_w, ox = p % s.out_w, i = k / s.kernel_w, j = k % s.kernel_w;
      const T* dy = image_offset + (og * taps + k) * 2 * pixels;
      T y, x;
      deform_conv2d_position(s, oy, ox, i, j, dy[p], dy[pixels + p], y, x);
      return BilinearPoint<T>(y, x, s.height, s.width);
    };
    auto mask_at = [&](int64_t og, int64_t k, int64_t p) {
      return image_mask != nullptr ? image_mask[(og * taps + k) * pixels + p] : T(1);
    };

    // Every sample (offset group, tap, pixel), in tasks of (offset group, tap, pixel chunk) that each own
    // the elements they write.
    auto for_each_sample = [&](const auto& body) {
      parallel_for(s.offset_groups * taps * pixel_chunks, [&](int64_t task) {
        const int64_t og = task / (taps * pixel_chunks), k = task / pixel_chunks % taps;
        const int64_t first = task % pixel_chunks * kBackwardPixelChunk;
        const int64_t last = std::min(pixels, first + kBackwardPixelChunk);
        for (int64_t p = first; p < last; ++p) body(og, k, p, position(og, k, p), mask_at(og, k, p));
      });
    };

    // 1. columns (channel-major), the samples' table, and grad_out^T.
    for_each_sample([&](int64_t og, int64_t k, int64_t p, const BilinearPoint<T>& point, T m) {
      SampledTap<T>& tap = sampled[(og * taps + k) * pixels + p];
      tap.corners = 0;
      if (point.inside) {
        tap.base = point.index(0, s.width), tap.mask = m;
        for (int corner = 0; corner < 4; ++corner) {
          tap.weight[corner] = point.weight(corner);
          tap.corners |= static_cast<uint8_t>(point.corner[corner] ? 1 << corner : 0);
        }
      }
      for (int64_t c = og * per_offset_group; c < (og + 1) * per_offset_group; ++c) {
        T v[4];
        point.values(image + c * plane, s.width, v);
        columns[(c * taps + k) * pixels + p] = point.value(v) * m;
      }
    });
    parallel_for(s.out_channels, [&](int64_t o) {
      for (int64_t p = 0; p < pixels; ++p) grad_out_t[p * s.out_channels + o] = image_grad[o * pixels + p];
    });

    // 2. grad_weight += grad_out . columns^T, in fixed pixel chunks added in order.
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
      for (int64_t chunk = 0; chunk < weight_chunks; ++chunk) {
        const T* source = partial.data() + (chunk * s.out_channels + o) * depth;
        T* target = grads.weight + o * depth;
        for (int64_t d = 0; d < depth; ++d) target[d] += source[d];
      }
      if (grads.bias != nullptr) {
        T sum = T(0);
        for (int64_t p = 0; p < pixels; ++p) sum += image_grad[o * pixels + p];
        grads.bias[o] += sum;
      }
    });

    // 3. grad_columns = weight^T . grad_out, per group and pixel chunk.
    parallel_for(s.groups * pixel_chunks, [&](int64_t task) {
      const int64_t g = task / pixel_chunks, first = task % pixel_chunks * kBackwardPixelChunk;
      const int64_t count = std::min(kBackwardPixelChunk, pixels - first);
      gemm(depth, count, out_per_group, weight_t.data() + g * depth * out_per_group, out_per_group,
           grad_out_t.data() + first * s.out_channels + g * out_per_group, s.out_channels,
           grad_columns.data() + g * depth * pixels + first, pixels);
    });

    // 4. grad_offset and grad_mask: one task per (offset group, tap, pixel chunk) owns its elements.
    T* image_grad_offset = grads.offset + n * 2 * s.offset_groups * taps * pixels;
    T* image_grad_mask = grads.mask != nullptr ? grads.mask + n * s.offset_groups * taps * pixels : nullptr;
    for_each_sample([&](int64_t og, int64_t k, int64_t p, const BilinearPoint<T>& point, T m) {
      T grad_y = T(0), grad_x = T(0), grad_m = T(0);
      if (point.inside) {
        for (int64_t c = og * per_offset_group; c < (og + 1) * per_offset_group; ++c) {
          T v[4];
          point.values(image + c * plane, s.width, v);
          point.add_gradients(v, grad_columns[(c * taps + k) * pixels + p], grad_y, grad_x, grad_m);
        }
      }
      image_grad_offset[(og * taps + k) * 2 * pixels + p] = grad_y * m;
      image_grad_offset[(og * taps + k) * 2 * pixels + pixels + p] = grad_x * m;
      if (image_grad_mask != nullptr) image_grad_mask[(og * taps + k) * pixels + p] = grad_m;
    });

    // 5. grad_input: one task per channel plane scatters into it.
    T* image_grad_input = grads.input + n * s.in_channels * plane;
    // The samples come from the table of step 1: their positions are computed once per (offset group, tap,
    // pixel), not once per channel.
    const int64_t corner_offset[4] = {0, 1, s.width, s.width + 1};
    parallel_for(s.in_channels, [&](int64_t c) {
      const int64_t og = c / per_offset_group;
      T* target = image_grad_input + c * plane;
      for (int64_t k = 0; k < taps; ++k) {
        const T* g = grad_columns.data() + (c * taps + k) * pixels;
        const SampledTap<T>* tap = sampled.data() + (og * taps + k) * pixels;
        for (int64_t p = 0; p < pixels; ++p) {
          const SampledTap<T>& t = tap[p];
          if (t.corners == 0) continue;
          const T scaled = g[p] * t.mask;
          for (int corner = 0; corner < 4; ++corner) {
            if (t.corners & (1 << corner)) target[t.base + corner_offset[corner]] += t.weight[corner] * scaled;
          }
        }
      }
    });
  }
}

}  // namespace opbridge::kernels
