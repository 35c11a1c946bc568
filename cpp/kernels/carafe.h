// CARAFE's content-aware reassembly (mmcv's carafe and carafe_naive: the same arithmetic), framework-free: the
// kernel behind mmcv::MMCVCARAFE and mmcv::MMCVCARAFENaive.
//
// features [N, C, H, W], masks [N, group * k * k, H * s, W * s] -> out [N, C, H * s, W * s], s the integer scale
// factor, k the odd kernel size, r = (k - 1) / 2:
//   out[n, c, y, x] = sum over (i, j) in [0, k)^2 of masks[n, (g * k + i) * k + j, y, x] *
//                     features[n, c, y / s + i - r, x / s + j - r]
// with g = c / (C / group) and features outside the map left out. The terms add in (i, j) order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/broadcast.h"

namespace opbridge::kernels {

struct CarafeShape {
  int64_t batch = 0, channels = 0, height = 0, width = 0, kernel = 0, group = 0, scale = 0;
};

inline Status check_carafe(const char* op, const std::vector<int64_t>& features, const std::vector<int64_t>& masks,
                           int64_t kernel, int64_t group, double scale_factor, CarafeShape& s) {
  const std::string prefix = std::string(op) + ": ";
  if (kernel < 1 || kernel % 2 == 0 || kernel > 255) {
    return {prefix + "attribute 'kernel_size' must be an odd integer in [1, 255], got " + std::to_string(kernel)};
  }
  if (!(scale_factor >= 1 && scale_factor <= 1024 && std::floor(scale_factor) == scale_factor)) {
    return {prefix + "attribute 'scale_factor' must be an integer in [1, 1024] (mmcv writes it as a float), got " +
            std::to_string(scale_factor)};
  }
  if (features.size() != 4) {
    return {prefix + "input features (index 0) must be 4-D [batch, channels, height, width], got shape " +
            shape_to_string(features)};
  }
  if (group < 1 || features[1] % group != 0) {
    return {prefix + "attribute 'group_size' must be a positive divisor of the channels (" +
            std::to_string(features[1]) + "), got " + std::to_string(group)};
  }
  const auto scale = static_cast<int64_t>(scale_factor);
  int64_t numel = 0, taps = 0;
  if (!checked_numel({group, kernel, kernel}, taps) || !checked_numel(features, numel) ||
      !checked_numel({features[0], features[1], features[2], scale, features[3], scale}, numel)) {
    return {prefix + "the output of features " + shape_to_string(features) + " at scale " + std::to_string(scale) +
            " has too many elements"};
  }
  const std::vector<int64_t> want{features[0], taps, features[2] * scale, features[3] * scale};
  if (masks != want) {
    return {prefix + "input masks (index 1) must have shape [batch, group_size * kernel_size^2, height * scale, " +
            "width * scale] = " + shape_to_string(want) + ", got " + shape_to_string(masks)};
  }
  s = {features[0], features[1], features[2], features[3], kernel, group, scale};
  return {};
}

// One task per (image, channel) plane of the output.
template <class T, class ParallelFor>
void carafe(const T* features, const T* masks, T* out, const CarafeShape& s, ParallelFor&& parallel_for) {
  const int64_t out_h = s.height * s.scale, out_w = s.width * s.scale, radius = (s.kernel - 1) / 2;
  const int64_t plane = s.height * s.width, out_plane = out_h * out_w, per_group = s.channels / s.group;
  parallel_for(s.batch * s.channels, [&](int64_t task) {
    const int64_t n = task / s.channels, c = task % s.channels, g = c / per_group;
    const T* feature = features + task * plane;
    const T* mask = masks + (n * s.group + g) * s.kernel * s.kernel * out_plane;
    T* y = out + task * out_plane;
    std::fill(y, y + out_plane, T(0));
    for (int64_t i = 0; i < s.kernel; ++i) {
      for (int64_t j = 0; j < s.kernel; ++j) {
        const T* weight = mask + (i * s.kernel + j) * out_plane;
        for (int64_t oy = 0; oy < out_h; ++oy) {
          const int64_t fy = oy / s.scale + i - radius;
          if (fy < 0 || fy >= s.height) continue;
          for (int64_t ox = 0; ox < out_w; ++ox) {
            const int64_t fx = ox / s.scale + j - radius;
            if (fx < 0 || fx >= s.width) continue;
            y[oy * out_w + ox] += feature[fy * s.width + fx] * weight[oy * out_w + ox];
          }
        }
      }
    }
  });
}

}  // namespace opbridge::kernels
