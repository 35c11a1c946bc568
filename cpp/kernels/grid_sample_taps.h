// The arithmetic of 2-D grid sampling (torch.nn.functional.grid_sample's semantics; see grid_sample.h): the
// checks, and each output pixel's taps (offsets into its plane and weights). OPBRIDGE_HD: the CPU kernels
// (grid_sample.h) and the CUDA kernel (grid_sample.cuh, the ORT CUDA library's grid_sampler nodes) compute the same
// taps with the same arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/broadcast.h"
#include "kernels/device.h"

namespace opbridge::kernels {

enum class GridInterpolation : int64_t { bilinear = 0, nearest = 1, bicubic = 2 };
enum class GridPadding : int64_t { zeros = 0, border = 1, reflection = 2 };

struct GridSampleAttributes {
  int64_t interpolation = 0;  // GridInterpolation
  int64_t padding = 0;        // GridPadding
  bool align_corners = false;
};

struct GridSampleShape {
  int64_t batch = 0, channels = 0, height = 0, width = 0, out_height = 0, out_width = 0;
};

inline Status check_grid_sample(const char* op, const std::vector<int64_t>& input, const std::vector<int64_t>& grid,
                                const GridSampleAttributes& a, GridSampleShape& shape) {
  const std::string prefix = std::string(op) + ": ";
  if (a.interpolation < 0 || a.interpolation > 2) {
    return {prefix + "attribute 'interpolation_mode' must be 0 (bilinear), 1 (nearest) or 2 (bicubic), got " +
            std::to_string(a.interpolation)};
  }
  if (a.padding < 0 || a.padding > 2) {
    return {prefix + "attribute 'padding_mode' must be 0 (zeros), 1 (border) or 2 (reflection), got " +
            std::to_string(a.padding)};
  }
  if (input.size() != 4) {
    return {prefix + "input input (index 0) must be 4-D [batch, channels, height, width], got shape " +
            shape_to_string(input)};
  }
  if (grid.size() != 4 || grid[3] != 2 || grid[0] != input[0]) {
    return {prefix + "input grid (index 1) must have shape [batch, out_height, out_width, 2] with batch = " +
            std::to_string(input[0]) + " (the input's), got " + shape_to_string(grid)};
  }
  int64_t numel = 0;
  if (!checked_numel(input, numel) || !checked_numel(grid, numel) ||
      !checked_numel({input[0], input[1], grid[1], grid[2]}, numel)) {
    return {prefix + "the output [" + std::to_string(input[0]) + ", " + std::to_string(input[1]) + ", " +
            std::to_string(grid[1]) + ", " + std::to_string(grid[2]) + "] has too many elements"};
  }
  if ((input[2] == 0 || input[3] == 0) && numel > 0) {
    return {prefix + "input input (index 0) must have a non-empty spatial size to sample from, got shape " +
            shape_to_string(input)};
  }
  shape = {input[0], input[1], input[2], input[3], grid[1], grid[2]};
  return {};
}

namespace grid_sample_detail {

template <class T>
OPBRIDGE_HD T unnormalize(T coordinate, int64_t size, bool align_corners) {
  return align_corners ? (coordinate + 1) / 2 * static_cast<T>(size - 1)
                       : ((coordinate + 1) * static_cast<T>(size) - 1) / 2;
}

// Reflects x into [low, high] (twice the bounds, as torch passes them), by whole periods. The parity of the
// period count is taken in floating point: converting floor(x / span) to an integer is undefined past int64 (a grid
// value of 1e30), and x86 and CUDA answer differently (the smallest int64, even, against the largest, odd), so the
// CPU and CUDA nodes would reflect such a point to opposite sides.
template <class T>
OPBRIDGE_HD T reflect(T x, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return 0;
  const T low = static_cast<T>(twice_low) / 2, span = static_cast<T>(twice_high - twice_low) / 2;
  x = std::fabs(x - low);
  const T extra = std::fmod(x, span);
  const T odd = std::fmod(std::floor(x / span), T(2));
  return odd == 0 ? extra + low : span - extra + low;
}

template <class T>
OPBRIDGE_HD T pad(T x, int64_t size, GridPadding padding, bool align_corners) {
  if (padding == GridPadding::zeros) return x;
  if (padding == GridPadding::reflection) {
    x = align_corners ? reflect(x, 0, 2 * (size - 1)) : reflect(x, -1, 2 * size - 1);
  }
  return std::clamp(x, T(0), static_cast<T>(size - 1));
}

// The taps of one output pixel: K flat offsets into its plane and their weights. A tap outside the map is not
// read (valid false): its value is 0, even where the map holds a NaN or an infinity.
template <class T, int K>
struct Taps {
  int64_t offset[K];
  T weight[K];
  bool valid[K];
  int next = 0;
  OPBRIDGE_HD void add(int64_t y, int64_t x, T w, int64_t height, int64_t width) {
    valid[next] = y >= 0 && y < height && x >= 0 && x < width;
    offset[next] = valid[next] ? y * width + x : 0;
    weight[next] = w;
    ++next;
  }
  OPBRIDGE_HD void skip(int count) {
    for (int k = 0; k < count; ++k) add(-1, -1, T(0), 0, 0);
  }
};

// Keys' cubic convolution weights of the four taps around a point at fraction t past the second one.
template <class T>
OPBRIDGE_HD void cubic_weights(T t, T weights[4]) {
  constexpr T A = T(-0.75);
  const auto near = [](T x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };       // |x| <= 1
  const auto far = [](T x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };  // 1 < |x| < 2
  weights[0] = far(t + 1);
  weights[1] = near(t);
  weights[2] = near(1 - t);
  weights[3] = far(2 - t);
}

// Coordinates beyond this many pixels are treated as the sampling of nothing (their floor would not fit an
// int64); every interpolation reads 0 that far outside.
constexpr double kFarAway = 1e15;

template <class T, int K>
OPBRIDGE_HD_INLINE Taps<T, K> taps_at(T gx, T gy, const GridSampleShape& s, const GridSampleAttributes& a) {
  Taps<T, K> taps;
  const auto padding = static_cast<GridPadding>(a.padding);
  T x = unnormalize(gx, s.width, a.align_corners), y = unnormalize(gy, s.height, a.align_corners);
  if (!std::isfinite(x) || !std::isfinite(y)) {
    taps.skip(K);
    return taps;
  }
  if constexpr (K == 16) {  // bicubic
    if ((std::fabs(x) > kFarAway || std::fabs(y) > kFarAway) && padding == GridPadding::zeros) {
      taps.skip(K);
      return taps;
    }
    const T x0 = std::floor(x), y0 = std::floor(y);
    T wx[4], wy[4];
    cubic_weights(x - x0, wx);
    cubic_weights(y - y0, wy);
    for (int i = 0; i < 4; ++i) {
      const T ty = pad(y0 - 1 + i, s.height, padding, a.align_corners);
      for (int j = 0; j < 4; ++j) {
        const T tx = pad(x0 - 1 + j, s.width, padding, a.align_corners);
        if (std::fabs(tx) > kFarAway || std::fabs(ty) > kFarAway) {
          taps.skip(1);
        } else {
          taps.add(static_cast<int64_t>(ty), static_cast<int64_t>(tx), wy[i] * wx[j], s.height, s.width);
        }
      }
    }
    return taps;
  }
  x = pad(x, s.width, padding, a.align_corners);
  y = pad(y, s.height, padding, a.align_corners);
  if (std::fabs(x) > kFarAway || std::fabs(y) > kFarAway) {
    taps.skip(K);
    return taps;
  }
  if constexpr (K == 1) {  // nearest
    taps.add(static_cast<int64_t>(std::nearbyint(y)), static_cast<int64_t>(std::nearbyint(x)), T(1), s.height, s.width);
    return taps;
  }
  const T x0 = std::floor(x), y0 = std::floor(y);
  const T fx = x - x0, fy = y - y0;
  const auto ix = static_cast<int64_t>(x0), iy = static_cast<int64_t>(y0);
  taps.add(iy, ix, (1 - fy) * (1 - fx), s.height, s.width);
  taps.add(iy, ix + 1, (1 - fy) * fx, s.height, s.width);
  taps.add(iy + 1, ix, fy * (1 - fx), s.height, s.width);
  taps.add(iy + 1, ix + 1, fy * fx, s.height, s.width);
  return taps;
}

}  // namespace grid_sample_detail

}  // namespace opbridge::kernels
