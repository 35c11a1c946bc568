// Deformable convolution v1/v2 (torchvision.ops.deform_conv2d, ONNX DeformConv):
// the one implementation behind torch.ops.opbridge.deform_conv2d and ORT's
// opbridge::DeformConv2d.
//
// For each image: a deformable im2col gathers, for every input channel c and
// kernel tap k, the input bilinearly sampled at the tap's position plus its
// learned offset (times the mask, when given) into a column matrix
// [C_in * K, H_out * W_out]; each weight group then is one GEMM against its
// rows of that matrix. The GEMM is a parameter: each front end passes the best
// it has (torch's matmul; a BLAS or the reference loop below for ORT).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/broadcast.h"

namespace opbridge::kernels {

struct DeformConv2dShape {
  int64_t batch = 0, in_channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t groups = 1, offset_groups = 1;
  int64_t out_h = 0, out_w = 0;
  bool has_bias = false, has_mask = false;
};

// Attributes as given by the front end (torch: symmetric padding, groups
// inferred from shapes; ONNX: pads [top, left, bottom, right], group attributes).
struct DeformConv2dAttributes {
  std::vector<int64_t> strides{1, 1}, dilations{1, 1}, pads{0, 0, 0, 0};
  int64_t groups = 1, offset_groups = 1;
  std::vector<int64_t> kernel_shape;  // empty: taken from the weight
};

struct DeformConv2dNames {
  const char* op;
  const char* input;
  const char* weight;
  const char* offset;
  const char* mask;
  const char* bias;
};

// Checks every shape and attribute relation before any memory is touched; the
// message names the op, the argument and what was expected.
inline Status check_deform_conv2d(const DeformConv2dNames& names, const std::vector<int64_t>& input,
                                  const std::vector<int64_t>& weight, const std::vector<int64_t>& offset,
                                  const std::vector<int64_t>* mask, const std::vector<int64_t>* bias,
                                  const DeformConv2dAttributes& attributes, DeformConv2dShape& s) {
  const std::string op = names.op;
  auto fail = [&](const std::string& message) { return Status{op + ": " + message}; };
  auto rank4 = [&](const char* name, const std::vector<int64_t>& shape) -> std::string {
    if (shape.size() != 4) {
      return std::string(name) + " must be 4-D, got shape " + shape_to_string(shape);
    }
    return {};
  };
  for (auto [name, shape] : {std::pair{names.input, &input}, {names.weight, &weight}, {names.offset, &offset}}) {
    if (auto message = rank4(name, *shape); !message.empty()) return fail(message);
  }
  if (mask != nullptr) {
    if (auto message = rank4(names.mask, *mask); !message.empty()) return fail(message);
  }
  if (bias != nullptr && bias->size() != 1) {
    return fail(std::string(names.bias) + " must be 1-D, got shape " + shape_to_string(*bias));
  }
  if (attributes.strides.size() != 2 || attributes.dilations.size() != 2 || attributes.pads.size() != 4) {
    return fail("strides and dilations need 2 values and pads 4 (top, left, bottom, right), got " +
                shape_to_string(attributes.strides) + ", " + shape_to_string(attributes.dilations) + " and " +
                shape_to_string(attributes.pads));
  }
  s.batch = input[0], s.in_channels = input[1], s.height = input[2], s.width = input[3];
  s.out_channels = weight[0], s.kernel_h = weight[2], s.kernel_w = weight[3];
  s.stride_h = attributes.strides[0], s.stride_w = attributes.strides[1];
  s.dilation_h = attributes.dilations[0], s.dilation_w = attributes.dilations[1];
  s.pad_top = attributes.pads[0], s.pad_left = attributes.pads[1];
  s.pad_bottom = attributes.pads[2], s.pad_right = attributes.pads[3];
  s.groups = attributes.groups, s.offset_groups = attributes.offset_groups;
  s.has_mask = mask != nullptr, s.has_bias = bias != nullptr;
  if (s.stride_h <= 0 || s.stride_w <= 0 || s.dilation_h <= 0 || s.dilation_w <= 0) {
    return fail("strides and dilations must be positive, got " + shape_to_string(attributes.strides) + " and " +
                shape_to_string(attributes.dilations));
  }
  if (*std::min_element(attributes.pads.begin(), attributes.pads.end()) < 0) {
    return fail("pads must not be negative, got " + shape_to_string(attributes.pads));
  }
  if (!attributes.kernel_shape.empty() &&
      (attributes.kernel_shape.size() != 2 || attributes.kernel_shape[0] != s.kernel_h ||
       attributes.kernel_shape[1] != s.kernel_w)) {
    return fail("kernel_shape " + shape_to_string(attributes.kernel_shape) + " does not match " + names.weight +
                " of shape " + shape_to_string(weight));
  }
  if (s.kernel_h <= 0 || s.kernel_w <= 0 || s.out_channels <= 0) {
    return fail(std::string(names.weight) + " must have positive output channels and kernel size, got shape " +
                shape_to_string(weight));
  }
  if (s.groups <= 0 || s.in_channels % s.groups != 0 || s.out_channels % s.groups != 0 ||
      weight[1] * s.groups != s.in_channels) {
    return fail(std::to_string(s.groups) + " group(s) must divide the " + std::to_string(s.in_channels) +
                " input channels of " + names.input + " and the " + std::to_string(s.out_channels) +
                " output channels, with " + names.weight + ".shape[1] == in_channels / groups; got " + names.weight +
                " of shape " + shape_to_string(weight));
  }
  if (s.offset_groups <= 0 || s.in_channels % s.offset_groups != 0) {
    return fail(std::to_string(s.offset_groups) + " offset group(s) must divide the " + std::to_string(s.in_channels) +
                " input channels");
  }
  // Output size, in checked arithmetic: a huge dilation or pad must not overflow.
  int64_t span_h = 0, span_w = 0, padded_h = 0, padded_w = 0;
  if (__builtin_mul_overflow(s.dilation_h, s.kernel_h - 1, &span_h) ||
      __builtin_mul_overflow(s.dilation_w, s.kernel_w - 1, &span_w) ||
      __builtin_add_overflow(s.height, s.pad_top + s.pad_bottom, &padded_h) ||
      __builtin_add_overflow(s.width, s.pad_left + s.pad_right, &padded_w) || s.pad_top > (int64_t(1) << 40) ||
      s.pad_left > (int64_t(1) << 40) || s.pad_bottom > (int64_t(1) << 40) || s.pad_right > (int64_t(1) << 40)) {
    return fail("dilations, pads or kernel size are too large");
  }
  s.out_h = padded_h - span_h - 1 < 0 ? 0 : (padded_h - span_h - 1) / s.stride_h + 1;
  s.out_w = padded_w - span_w - 1 < 0 ? 0 : (padded_w - span_w - 1) / s.stride_w + 1;
  if (s.out_h <= 0 || s.out_w <= 0) {
    return fail("the kernel (with dilation) does not fit in the padded input: " + std::string(names.input) +
                " of shape " + shape_to_string(input) + ", kernel " + std::to_string(s.kernel_h) + "x" +
                std::to_string(s.kernel_w));
  }
  const int64_t taps = s.kernel_h * s.kernel_w;
  const std::vector<int64_t> want_offset{s.batch, 2 * s.offset_groups * taps, s.out_h, s.out_w};
  if (offset != want_offset) {
    return fail(std::string(names.offset) + " must have shape " + shape_to_string(want_offset) +
                " (batch, 2 * offset_groups * kernel_h * kernel_w, out_h, out_w), got " + shape_to_string(offset));
  }
  if (mask != nullptr) {
    const std::vector<int64_t> want_mask{s.batch, s.offset_groups * taps, s.out_h, s.out_w};
    if (*mask != want_mask) {
      return fail(std::string(names.mask) + " must have shape " + shape_to_string(want_mask) +
                  " (batch, offset_groups * kernel_h * kernel_w, out_h, out_w), got " + shape_to_string(*mask));
    }
  }
  if (bias != nullptr && (*bias)[0] != s.out_channels) {
    return fail(std::string(names.bias) + " must have " + std::to_string(s.out_channels) +
                " elements (the output channels), got shape " + shape_to_string(*bias));
  }
  // Every buffer the kernel indexes must be addressable in int64.
  int64_t elements = 0;
  for (const auto* shape : {&input, &weight, &offset}) {
    if (!checked_numel(*shape, elements)) return fail("a tensor has too many elements");
  }
  const std::vector<int64_t> columns{s.in_channels, taps, s.out_h, s.out_w};
  const std::vector<int64_t> output{s.batch, s.out_channels, s.out_h, s.out_w};
  if (!checked_numel(columns, elements) || !checked_numel(output, elements)) {
    return fail("the output or the sampling buffer would have too many elements");
  }
  return {};
}

// Bilinear sample of one channel at (y, x); zero outside, as torchvision.
template <class T>
inline T bilinear(const T* channel, int64_t height, int64_t width, T y, T x) {
  if (!(y > T(-1) && y < T(height) && x > T(-1) && x < T(width))) return T(0);  // also rejects NaN
  const int64_t y_low = static_cast<int64_t>(std::floor(y)), x_low = static_cast<int64_t>(std::floor(x));
  const int64_t y_high = y_low + 1, x_high = x_low + 1;
  const T ly = y - T(y_low), lx = x - T(x_low), hy = T(1) - ly, hx = T(1) - lx;
  const T v1 = (y_low >= 0 && x_low >= 0) ? channel[y_low * width + x_low] : T(0);
  const T v2 = (y_low >= 0 && x_high <= width - 1) ? channel[y_low * width + x_high] : T(0);
  const T v3 = (y_high <= height - 1 && x_low >= 0) ? channel[y_high * width + x_low] : T(0);
  const T v4 = (y_high <= height - 1 && x_high <= width - 1) ? channel[y_high * width + x_high] : T(0);
  return hy * hx * v1 + hy * lx * v2 + ly * hx * v3 + ly * lx * v4;
}

// columns[(c * K + k) * HW + p] for one image: the sampled input of channel c at
// kernel tap k for output pixel p. Rows are independent: parallel over them.
template <class T, class ParallelFor>
void deformable_im2col(const T* input, const T* offset, const T* mask, T* columns, const DeformConv2dShape& s,
                       ParallelFor&& parallel_for) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  const int64_t channels_per_offset_group = s.in_channels / s.offset_groups;
  parallel_for(s.in_channels, [&](int64_t c) {
    const int64_t group = c / channels_per_offset_group;
    const T* channel = input + c * s.height * s.width;
    const T* group_offset = offset + group * 2 * taps * pixels;
    const T* group_mask = mask != nullptr ? mask + group * taps * pixels : nullptr;
    for (int64_t i = 0; i < s.kernel_h; ++i) {
      for (int64_t j = 0; j < s.kernel_w; ++j) {
        const int64_t tap = i * s.kernel_w + j;
        const T* dy = group_offset + 2 * tap * pixels;
        const T* dx = dy + pixels;
        T* row = columns + (c * taps + tap) * pixels;
        for (int64_t oy = 0; oy < s.out_h; ++oy) {
          const T base_y = T(oy * s.stride_h - s.pad_top + i * s.dilation_h);
          for (int64_t ox = 0; ox < s.out_w; ++ox) {
            const int64_t p = oy * s.out_w + ox;
            const T base_x = T(ox * s.stride_w - s.pad_left + j * s.dilation_w);
            T value = bilinear(channel, s.height, s.width, base_y + dy[p], base_x + dx[p]);
            if (group_mask != nullptr) value *= group_mask[tap * pixels + p];
            row[p] = value;
          }
        }
      }
    }
  });
}

// C[M, N] = A[M, K] * B[K, N], row-major, parallel over rows of C: the portable
// GEMM for front ends without a better one. The k-outer, j-inner order keeps
// the innermost loop a contiguous axpy the compiler vectorizes.
template <class T, class ParallelFor>
void gemm_reference(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, ParallelFor&& parallel_for) {
  constexpr int64_t kRowsPerTask = 4;
  parallel_for((m + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task) {
    for (int64_t row = task * kRowsPerTask; row < std::min(m, (task + 1) * kRowsPerTask); ++row) {
      T* __restrict out = c + row * n;
      std::fill(out, out + n, T(0));
      for (int64_t p = 0; p < k; ++p) {
        const T scale = a[row * k + p];
        const T* __restrict source = b + p * n;
        for (int64_t col = 0; col < n; ++col) out[col] += scale * source[col];
      }
    }
  });
}

// out [N, C_out, H_out, W_out] from input [N, C_in, H, W], weight
// [C_out, C_in / groups, kh, kw], offset, optional mask and bias (nullptr when
// absent). `columns` holds C_in * kh * kw * H_out * W_out elements.
// gemm(m, n, k, a, b, c) computes c = a * b (row-major).
template <class T, class ParallelFor, class Gemm>
void deform_conv2d(const T* input, const T* weight, const T* offset, const T* mask, const T* bias, T* out, T* columns,
                   const DeformConv2dShape& s, ParallelFor&& parallel_for, Gemm&& gemm) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  const int64_t out_per_group = s.out_channels / s.groups;
  const int64_t depth = s.in_channels / s.groups * taps;  // GEMM inner dimension per group
  for (int64_t image = 0; image < s.batch; ++image) {
    deformable_im2col(
        input + image * s.in_channels * s.height * s.width, offset + image * 2 * s.offset_groups * taps * pixels,
        mask != nullptr ? mask + image * s.offset_groups * taps * pixels : nullptr, columns, s, parallel_for);
    T* image_out = out + image * s.out_channels * pixels;
    for (int64_t group = 0; group < s.groups; ++group) {
      gemm(out_per_group, pixels, depth, weight + group * out_per_group * depth, columns + group * depth * pixels,
           image_out + group * out_per_group * pixels);
    }
    if (bias != nullptr) {
      parallel_for(s.out_channels, [&](int64_t channel) {
        T* plane = image_out + channel * pixels;
        for (int64_t p = 0; p < pixels; ++p) plane[p] += bias[channel];
      });
    }
  }
}

}  // namespace opbridge::kernels
