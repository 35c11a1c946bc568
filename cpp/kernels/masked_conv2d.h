// mmcv's masked convolution (Guided Anchoring's heads), framework-free: the kernel behind mmcv::MMCVMaskedConv2d.
//
// features [1, C, H, W], mask [1, H, W], weight [O, C, kh, kw], bias [O] (optional) -> out [1, O, Ho, Wo] with
// Ho = H + 2 pad_h - kh + 1 (stride 1 only, as mmcv): at each position (h, w) where mask > 0, the convolution's
// value there, bias[o] + sum over (c, i, j) of weight[o, c, i, j] * features[c, h - pad_h + i, w - pad_w + j]
// (features outside the map read 0); 0 at every other position. A masked position must lie inside the output.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/broadcast.h"

namespace opbridge::kernels {

struct MaskedConv2dShape {
  int64_t channels = 0, height = 0, width = 0, out_channels = 0, kernel_h = 0, kernel_w = 0, pad_h = 0, pad_w = 0,
          out_h = 0, out_w = 0;
};

inline Status check_masked_conv2d(const char* op, const std::vector<int64_t>& features,
                                  const std::vector<int64_t>& mask, const std::vector<int64_t>& weight,
                                  const std::vector<int64_t>* bias, const std::vector<int64_t>& padding,
                                  const std::vector<int64_t>& stride, MaskedConv2dShape& s) {
  const std::string prefix = std::string(op) + ": ";
  if (stride.size() != 2 || stride[0] != 1 || stride[1] != 1) {
    return {prefix + "attribute 'stride' must be 1 (mmcv's masked convolution has no other), got " +
            shape_to_string(stride)};
  }
  if (padding.size() != 2 || padding[0] < 0 || padding[1] < 0 || padding[0] > (1 << 20) || padding[1] > (1 << 20)) {
    return {prefix + "attribute 'padding' must be one or two integers in [0, 2^20], got " + shape_to_string(padding)};
  }
  if (features.size() != 4 || features[0] != 1) {
    return {prefix +
            "input features (index 0) must have shape [1, channels, height, width] (one image, as mmcv), got " +
            shape_to_string(features)};
  }
  if (mask.size() != 3 || mask[0] != 1 || mask[1] != features[2] || mask[2] != features[3]) {
    return {prefix + "input mask (index 1) must have shape [1, height, width] = [1, " + std::to_string(features[2]) +
            ", " + std::to_string(features[3]) + "], got " + shape_to_string(mask)};
  }
  if (weight.size() != 4 || weight[1] != features[1] || weight[2] < 1 || weight[3] < 1) {
    return {prefix + "input weight (index 2) must have shape [out_channels, channels = " + std::to_string(features[1]) +
            ", kernel_h >= 1, kernel_w >= 1], got " + shape_to_string(weight)};
  }
  if (bias != nullptr && (bias->size() != 1 || (*bias)[0] != weight[0])) {
    return {prefix + "input bias (index 3) must have shape [out_channels] = [" + std::to_string(weight[0]) + "], got " +
            shape_to_string(*bias)};
  }
  s = {features[1], features[2], features[3], weight[0], weight[2], weight[3], padding[0], padding[1], 0, 0};
  s.out_h = s.height + 2 * s.pad_h - s.kernel_h + 1;
  s.out_w = s.width + 2 * s.pad_w - s.kernel_w + 1;
  int64_t numel = 0;
  if (s.out_h < 0 || s.out_w < 0 || !checked_numel(weight, numel) || !checked_numel(features, numel) ||
      !checked_numel({s.out_channels, s.out_h, s.out_w}, numel) ||
      !checked_numel({s.channels, s.kernel_h, s.kernel_w, 64}, numel)) {
    return {prefix + "the kernel " + shape_to_string(weight) + " with padding " + shape_to_string(padding) +
            " does not fit the features " + shape_to_string(features)};
  }
  return {};
}

// The masked positions (flat h * W + w), or an error naming the first one outside the output.
template <class M>
Status masked_positions(const char* op, const M* mask, const MaskedConv2dShape& s, std::vector<int64_t>& positions) {
  for (int64_t h = 0; h < s.height; ++h) {
    for (int64_t w = 0; w < s.width; ++w) {
      if (!(mask[h * s.width + w] > M(0))) continue;
      if (h >= s.out_h || w >= s.out_w) {
        return {std::string(op) + ": input mask (index 1) selects position (" + std::to_string(h) + ", " +
                std::to_string(w) + "), outside the output [" + std::to_string(s.out_h) + ", " +
                std::to_string(s.out_w) + "] of this kernel and padding"};
      }
      positions.push_back(h * s.width + w);
    }
  }
  return {};
}

// `out` [O, Ho, Wo] zeroed by the caller. Tasks are chunks of 64 positions: their columns [64, C*kh*kw] are
// gathered, multiplied by the weight (gemm: c[m, n] = a[m, k] * b[n, k]^T) and scattered with the bias.
template <class T, class ParallelFor, class Gemm>
void masked_conv2d(const T* features, const std::vector<int64_t>& positions, const T* weight, const T* bias, T* out,
                   const MaskedConv2dShape& s, ParallelFor&& parallel_for, Gemm&& gemm) {
  constexpr int64_t kChunk = 64;
  const int64_t depth = s.channels * s.kernel_h * s.kernel_w, count = static_cast<int64_t>(positions.size());
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  parallel_for(chunks, [&](int64_t chunk) {
    const int64_t begin = chunk * kChunk, size = std::min(kChunk, count - begin);
    std::vector<T> columns(static_cast<size_t>(size * depth)), product(static_cast<size_t>(s.out_channels * size));
    for (int64_t q = 0; q < size; ++q) {
      const int64_t h = positions[begin + q] / s.width, w = positions[begin + q] % s.width;
      T* column = columns.data() + q * depth;
      for (int64_t c = 0; c < s.channels; ++c) {
        for (int64_t i = 0; i < s.kernel_h; ++i) {
          const int64_t y = h - s.pad_h + i;
          for (int64_t j = 0; j < s.kernel_w; ++j) {
            const int64_t x = w - s.pad_w + j;
            const bool inside = y >= 0 && y < s.height && x >= 0 && x < s.width;
            *column++ = inside ? features[(c * s.height + y) * s.width + x] : T(0);
          }
        }
      }
    }
    gemm(s.out_channels, size, depth, weight, depth, columns.data(), depth, product.data(), size);
    for (int64_t o = 0; o < s.out_channels; ++o) {
      for (int64_t q = 0; q < size; ++q) {
        const int64_t h = positions[begin + q] / s.width, w = positions[begin + q] % s.width;
        out[(o * s.out_h + h) * s.out_w + w] = product[o * size + q] + (bias != nullptr ? bias[o] : T(0));
      }
    }
  });
}

}  // namespace opbridge::kernels
