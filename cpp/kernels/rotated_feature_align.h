// Rotated feature alignment (S2A-Net / R3Det's feature refinement; mmcv's rotated_feature_align semantics),
// framework-free: the checks, the forward and the backward shared by the torch op and the ORT op.
//
// features [N, C, H, W]; best_rboxes [N, H, W, 5] = (y, x, w, h, angle) per pixel, in image coordinates
// (mmcv reads the first two numbers as y, then x); out [N, C, H, W]:
//   out[n, c, h, w] = features[n, c, h, w] + sum over the points p of bilinear(features[n, c], y_p, x_p)
// with (y, x, w, h) times spatial_scale; points = 1: the box center; points = 5: the center and the four
// corners, center + (+-w/2) * (cos a, sin a) + (+-h/2) * (-sin a, cos a) in (x, y). Bilinear sampling as
// roi_align_rotated.h's (0 beyond one pixel outside, clamped inside that margin). A box with a NaN or infinite
// number gives NaN at its pixel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/roi_align_rotated.h"

namespace opbridge::kernels {

struct RotatedFeatureAlignShape {
  int64_t batch = 0, channels = 0, height = 0, width = 0, points = 1;
};

struct RotatedFeatureAlignNames {
  const char* op;
  const char* features;
  const char* best_rboxes;
};

inline Status check_rotated_feature_align(const RotatedFeatureAlignNames& names, const std::vector<int64_t>& features,
                                          const std::vector<int64_t>& boxes, double spatial_scale, int64_t points,
                                          RotatedFeatureAlignShape& shape) {
  const std::string prefix = std::string(names.op) + ": ";
  if (features.size() != 4) {
    return {prefix + names.features + " must be 4-D [batch, channels, height, width], got shape " +
            shape_to_string(features)};
  }
  const std::vector<int64_t> expected{features[0], features[2], features[3], 5};
  if (boxes != expected) {
    return {prefix + names.best_rboxes + " must have shape [batch, height, width, 5] = " + shape_to_string(expected) +
            " (one box per pixel of " + names.features + "), got " + shape_to_string(boxes)};
  }
  if (points != 1 && points != 5) {
    return {prefix + "points must be 1 (the box center) or 5 (the center and the corners), got " +
            std::to_string(points)};
  }
  if (!(std::isfinite(spatial_scale) && spatial_scale > 0)) {
    return {prefix + "spatial_scale must be a positive finite number, got " + std::to_string(spatial_scale)};
  }
  int64_t numel = 0;
  if (!checked_numel(features, numel)) return {prefix + names.features + " has too many elements"};
  shape = {features[0], features[1], features[2], features[3], points};
  return {};
}

namespace rotated_feature_align_detail {

using roi_align_rotated_detail::bilinear;
using roi_align_rotated_detail::Sample;
using roi_align_rotated_detail::sample_value;

// The samples of one pixel (`points` of them) from its box; false where the box has a NaN or infinite number.
template <class T>
OPBRIDGE_HD bool box_samples(const T* box, int64_t points, int64_t height, int64_t width, double scale, Sample* out) {
  const double y = box[0] * scale, x = box[1] * scale, w = box[2] * scale, h = box[3] * scale;
  const double angle = box[4];
  if (!(std::isfinite(y) && std::isfinite(x) && std::isfinite(w) && std::isfinite(h) && std::isfinite(angle))) {
    return false;
  }
  out[0] = bilinear(y, x, height, width);
  if (points == 5) {
    const double c = std::cos(angle), sn = std::sin(angle);
    const double wx = c * w / 2, wy = sn * w / 2, hx = -sn * h / 2, hy = c * h / 2;
    out[1] = bilinear(y + wy + hy, x + wx + hx, height, width);
    out[2] = bilinear(y - wy + hy, x - wx + hx, height, width);
    out[3] = bilinear(y - wy - hy, x - wx - hx, height, width);
    out[4] = bilinear(y + wy - hy, x + wx - hx, height, width);
  }
  return true;
}

// The samples of every pixel of image n: [H * W][points]; `finite[pixel]` false where the box is not.
template <class T>
void pixel_samples(const T* boxes, const RotatedFeatureAlignShape& s, double scale, std::vector<Sample>& samples,
                   std::vector<char>& finite) {
  const int64_t pixels = s.height * s.width;
  samples.assign(static_cast<size_t>(pixels * s.points), Sample{});
  finite.assign(static_cast<size_t>(pixels), 1);
  for (int64_t p = 0; p < pixels; ++p) {
    finite[p] = box_samples(boxes + 5 * p, s.points, s.height, s.width, scale, samples.data() + p * s.points);
  }
}

}  // namespace rotated_feature_align_detail

template <class T, class ParallelFor>
void rotated_feature_align(const T* features, const T* boxes, T* out, const RotatedFeatureAlignShape& s,
                           double spatial_scale, ParallelFor&& parallel_for) {
  using namespace rotated_feature_align_detail;
  const int64_t plane = s.height * s.width;
  for (int64_t n = 0; n < s.batch; ++n) {
    std::vector<Sample> samples;
    std::vector<char> finite;
    pixel_samples(boxes + n * plane * 5, s, spatial_scale, samples, finite);
    parallel_for(s.channels, [&](int64_t c) {
      const T* map = features + (n * s.channels + c) * plane;
      T* y = out + (n * s.channels + c) * plane;
      for (int64_t p = 0; p < plane; ++p) {
        if (!finite[p]) {
          y[p] = std::numeric_limits<T>::quiet_NaN();
          continue;
        }
        double value = map[p];
        const Sample* sample = samples.data() + p * s.points;
        for (int64_t i = 0; i < s.points; ++i) value += sample_value(sample[i], map);
        y[p] = static_cast<T>(value);
      }
    });
  }
}

// grad_features [N, C, H, W] from grad_output: the identity term plus each sample's share at its four pixels.
template <class T, class ParallelFor>
void rotated_feature_align_backward(const T* grad_output, const T* boxes, T* grad_features,
                                    const RotatedFeatureAlignShape& s, double spatial_scale,
                                    ParallelFor&& parallel_for) {
  using namespace rotated_feature_align_detail;
  const int64_t plane = s.height * s.width;
  for (int64_t n = 0; n < s.batch; ++n) {
    std::vector<Sample> samples;
    std::vector<char> finite;
    pixel_samples(boxes + n * plane * 5, s, spatial_scale, samples, finite);
    parallel_for(s.channels, [&](int64_t c) {
      const T* g = grad_output + (n * s.channels + c) * plane;
      T* grad = grad_features + (n * s.channels + c) * plane;
      std::copy(g, g + plane, grad);
      for (int64_t p = 0; p < plane; ++p) {
        if (!finite[p]) continue;
        const Sample* sample = samples.data() + p * s.points;
        for (int64_t i = 0; i < s.points; ++i, ++sample) {
          if (!sample->inside) continue;
          for (int corner = 0; corner < 4; ++corner) {
            grad[sample->index[corner]] += static_cast<T>(g[p] * sample->weight[corner]);
          }
        }
      }
    });
  }
}

}  // namespace opbridge::kernels
