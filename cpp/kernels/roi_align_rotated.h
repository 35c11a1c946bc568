// RoIAlign over rotated regions (mmcv's roi_align_rotated semantics), framework-free: the checks, the forward
// and the backward shared by the torch op and the ORT ops.
//
// input [N, C, H, W]; rois [K, 6] = (batch index, cx, cy, w, h, angle in radians); out [K, C, PH, PW].
// For roi k (coordinates times spatial_scale; minus 0.5 from the center when `aligned`; without `aligned`,
// w and h at least 1), bin (i, j) averages a grid of gh x gw bilinear samples, gh = sampling_ratio if > 0
// else ceil(h / PH) (gw likewise), at the points
//   (yy, xx) = (-h/2 + (i + (iy + 0.5) / gh) * h / PH,  -w/2 + (j + (ix + 0.5) / gw) * w / PW)
//   y = yy * cos(t) - xx * sin(t) + cy,   x = yy * sin(t) + xx * cos(t) + cx,   t = clockwise ? -angle : angle.
// A sample reads 0 beyond one pixel outside the map (y < -1, y > H, x < -1 or x > W); inside that margin the
// position is clamped onto the map (mmcv's and torchvision's bilinear_interpolate).
// A roi with a NaN or infinite number (after scaling) gives NaN. The batch index must be an integer in [0, N).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/broadcast.h"
#include "kernels/device.h"

namespace opbridge::kernels {

struct RoiAlignRotatedAttributes {
  int64_t pooled_height = 1, pooled_width = 1, sampling_ratio = 0;
  double spatial_scale = 1.0;
  bool aligned = true, clockwise = false;
};

struct RoiAlignRotatedShape {
  int64_t batch = 0, channels = 0, height = 0, width = 0, rois = 0, pooled_height = 0, pooled_width = 0;
};

// How the calling front end names the op and its inputs in error messages.
struct RoiAlignRotatedNames {
  const char* op;
  const char* input;
  const char* rois;
};

// The most samples one roi may take (bins x grid): an adaptive grid of a huge roi would run for hours.
constexpr int64_t kMaxRoiSamples = int64_t{1} << 26;

inline Status check_roi_align_rotated(const RoiAlignRotatedNames& names, const std::vector<int64_t>& input,
                                      const std::vector<int64_t>& rois, const RoiAlignRotatedAttributes& a,
                                      RoiAlignRotatedShape& shape) {
  const std::string prefix = std::string(names.op) + ": ";
  if (input.size() != 4) {
    return {prefix + names.input + " must be 4-D [batch, channels, height, width], got shape " +
            shape_to_string(input)};
  }
  if (rois.size() != 2 || rois[1] != 6) {
    return {prefix + names.rois + " must have shape [rois, 6] (batch index, cx, cy, w, h, angle), got " +
            shape_to_string(rois)};
  }
  if (a.pooled_height < 1 || a.pooled_width < 1 || a.pooled_height > (1 << 16) || a.pooled_width > (1 << 16)) {
    return {prefix + "the output size must be two integers in [1, 65536], got (" + std::to_string(a.pooled_height) +
            ", " + std::to_string(a.pooled_width) + ")"};
  }
  if (a.sampling_ratio > (1 << 12)) {
    return {prefix + "sampling_ratio must be at most 4096 (<= 0: adaptive), got " + std::to_string(a.sampling_ratio)};
  }
  if (!(std::isfinite(a.spatial_scale) && a.spatial_scale > 0)) {
    return {prefix + "spatial_scale must be a positive finite number, got " + std::to_string(a.spatial_scale)};
  }
  int64_t numel = 0;
  if (!checked_numel({rois[0], input[1], a.pooled_height, a.pooled_width}, numel) || !checked_numel(input, numel)) {
    return {prefix + "the output [" + std::to_string(rois[0]) + ", " + std::to_string(input[1]) + ", " +
            std::to_string(a.pooled_height) + ", " + std::to_string(a.pooled_width) + "] has too many elements"};
  }
  shape = {input[0], input[1], input[2], input[3], rois[0], a.pooled_height, a.pooled_width};
  return {};
}

namespace roi_align_rotated_detail {

// One roi's geometry, in feature-map pixels.
struct Roi {
  int64_t batch = 0, grid_h = 1, grid_w = 1;
  double cx = 0, cy = 0, w = 0, h = 0, cos_t = 1, sin_t = 0;
  bool finite = true;
};

// One bilinear sample: four flat offsets into a map and their weights (all zero when outside).
struct Sample {
  int64_t index[4] = {0, 0, 0, 0};
  double weight[4] = {0, 0, 0, 0};
  bool inside = false;  // outside, the sample is 0 and reads nothing
};

// The sampling grid of a roi: sampling_ratio x sampling_ratio, or (adaptive, sampling_ratio <= 0) ceil(size /
// output size) per dimension, clamped before the conversion (a huge roi's count does not fit in int64; above
// the limit check_samples refuses it).
OPBRIDGE_HD inline void set_grid(Roi& r, int64_t sampling_ratio, int64_t pooled_height, int64_t pooled_width) {
  if (sampling_ratio > 0) {
    r.grid_h = r.grid_w = sampling_ratio;
  } else if (r.finite) {
    const double limit = static_cast<double>(kMaxRoiSamples) + 1;
    r.grid_h = static_cast<int64_t>(std::clamp(std::ceil(r.h / pooled_height), 0.0, limit));
    r.grid_w = static_cast<int64_t>(std::clamp(std::ceil(r.w / pooled_width), 0.0, limit));
    if (r.grid_h == 0 || r.grid_w == 0) r.grid_h = r.grid_w = 0;  // no samples: no loop over the other dimension
  }
}

template <class T>
OPBRIDGE_HD Roi read_roi(const T* roi, const RoiAlignRotatedAttributes& a) {
  Roi r;
  const double offset = a.aligned ? 0.5 : 0.0;
  r.cx = roi[1] * a.spatial_scale - offset;
  r.cy = roi[2] * a.spatial_scale - offset;
  r.w = roi[3] * a.spatial_scale;
  r.h = roi[4] * a.spatial_scale;
  const double angle = a.clockwise ? -static_cast<double>(roi[5]) : static_cast<double>(roi[5]);
  r.finite =
      std::isfinite(r.cx) && std::isfinite(r.cy) && std::isfinite(r.w) && std::isfinite(r.h) && std::isfinite(angle);
  if (!a.aligned) {  // mmcv's legacy mode: at least one pixel
    r.w = std::max(r.w, 1.0);
    r.h = std::max(r.h, 1.0);
  }
  r.cos_t = std::cos(angle);
  r.sin_t = std::sin(angle);
  set_grid(r, a.sampling_ratio, a.pooled_height, a.pooled_width);
  return r;
}

// The batch index of roi k: an integer in [0, batch).
inline Status check_batch_index(const RoiAlignRotatedNames& names, int64_t k, double index, int64_t batch) {
  if (index >= 0 && index < static_cast<double>(batch) && std::floor(index) == index) return {};
  return {std::string(names.op) + ": " + names.rois + "[" + std::to_string(k) +
          ", 0] (the batch index) must be an integer in [0, " + std::to_string(batch) + "), got " +
          std::to_string(index)};
}

// An adaptive grid of a huge roi would run for hours: more than kMaxRoiSamples samples are refused.
inline Status check_samples(const RoiAlignRotatedNames& names, int64_t k, const Roi& r,
                            const RoiAlignRotatedShape& shape) {
  const double samples = static_cast<double>(r.grid_h) * r.grid_w * shape.pooled_height * shape.pooled_width;
  if (samples <= static_cast<double>(kMaxRoiSamples)) return {};
  return {std::string(names.op) + ": roi " + std::to_string(k) + " (w " + std::to_string(r.w) + ", h " +
          std::to_string(r.h) + " feature pixels) would take " + std::to_string(r.grid_h) + " x " +
          std::to_string(r.grid_w) + " samples per bin with sampling_ratio <= 0 (adaptive); pass a " +
          "sampling_ratio > 0 or rois on the feature map's scale"};
}

OPBRIDGE_HD inline Sample bilinear(double y, double x, int64_t height, int64_t width) {
  Sample s;
  if (!(y >= -1.0 && y <= height && x >= -1.0 && x <= width) || height <= 0 || width <= 0) return s;
  s.inside = true;
  y = std::max(y, 0.0);
  x = std::max(x, 0.0);
  int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x), y1 = y0 + 1, x1 = x0 + 1;
  if (y0 >= height - 1) {
    y0 = y1 = height - 1;
    y = static_cast<double>(y0);
  }
  if (x0 >= width - 1) {
    x0 = x1 = width - 1;
    x = static_cast<double>(x0);
  }
  const double ly = y - y0, lx = x - x0, hy = 1 - ly, hx = 1 - lx;
  s.index[0] = y0 * width + x0;
  s.index[1] = y0 * width + x1;
  s.index[2] = y1 * width + x0;
  s.index[3] = y1 * width + x1;
  s.weight[0] = hy * hx;
  s.weight[1] = hy * lx;
  s.weight[2] = ly * hx;
  s.weight[3] = ly * lx;
  return s;
}

// Sample (iy, ix) of bin (i, j) of roi r: the one place its position is computed (CPU and CUDA kernels).
OPBRIDGE_HD inline Sample sample_at(const Roi& r, const RoiAlignRotatedShape& shape, int64_t i, int64_t j, int64_t iy,
                                    int64_t ix) {
  const double bin_h = r.h / shape.pooled_height, bin_w = r.w / shape.pooled_width;
  const double yy = -0.5 * r.h + i * bin_h + (iy + 0.5) * bin_h / r.grid_h;
  const double xx = -0.5 * r.w + j * bin_w + (ix + 0.5) * bin_w / r.grid_w;
  return bilinear(yy * r.cos_t - xx * r.sin_t + r.cy, yy * r.sin_t + xx * r.cos_t + r.cx, shape.height, shape.width);
}

// A sample's value in one map (0 outside).
template <class T>
OPBRIDGE_HD double sample_value(const Sample& s, const T* map) {
  if (!s.inside) return 0;
  return s.weight[0] * map[s.index[0]] + s.weight[1] * map[s.index[1]] + s.weight[2] * map[s.index[2]] +
         s.weight[3] * map[s.index[3]];
}

// A roi's grid size as the divisor of its bins' sums (1 for an empty grid).
OPBRIDGE_HD inline double bin_divisor(const Roi& r) {
  return static_cast<double>(r.grid_h * r.grid_w > 1 ? r.grid_h * r.grid_w : 1);
}

// The samples of every bin of a roi, bin-major ([PH * PW][grid]).
inline void roi_samples(const Roi& r, const RoiAlignRotatedShape& shape, std::vector<Sample>& samples) {
  const int64_t grid = r.grid_h * r.grid_w;
  samples.assign(static_cast<size_t>(shape.pooled_height * shape.pooled_width * grid), Sample{});
  Sample* s = samples.data();
  for (int64_t i = 0; i < shape.pooled_height; ++i) {
    for (int64_t j = 0; j < shape.pooled_width; ++j) {
      for (int64_t iy = 0; iy < r.grid_h; ++iy) {
        for (int64_t ix = 0; ix < r.grid_w; ++ix) *s++ = sample_at(r, shape, i, j, iy, ix);
      }
    }
  }
}

}  // namespace roi_align_rotated_detail

// Reads every roi and checks its batch index and sampling grid. Fills `rois_out`.
template <class T>
Status read_rotated_rois(const RoiAlignRotatedNames& names, const T* rois, const RoiAlignRotatedShape& shape,
                         const RoiAlignRotatedAttributes& a, std::vector<roi_align_rotated_detail::Roi>& out) {
  out.resize(static_cast<size_t>(shape.rois));
  for (int64_t k = 0; k < shape.rois; ++k) {
    const T* roi = rois + 6 * k;
    const double index = roi[0];
    auto status = roi_align_rotated_detail::check_batch_index(names, k, index, shape.batch);
    if (!status.ok()) return status;
    auto& r = out[k] = roi_align_rotated_detail::read_roi(roi, a);
    r.batch = static_cast<int64_t>(index);
    status = roi_align_rotated_detail::check_samples(names, k, r, shape);
    if (!status.ok()) return status;
  }
  return {};
}

template <class T, class ParallelFor>
void roi_align_rotated(const T* input, const std::vector<roi_align_rotated_detail::Roi>& rois, T* out,
                       const RoiAlignRotatedShape& shape, ParallelFor&& parallel_for) {
  using namespace roi_align_rotated_detail;
  const int64_t bins = shape.pooled_height * shape.pooled_width, plane = shape.height * shape.width;
  parallel_for(shape.rois, [&](int64_t k) {
    const Roi& r = rois[k];
    T* y = out + k * shape.channels * bins;
    if (!r.finite) {
      std::fill(y, y + shape.channels * bins, std::numeric_limits<T>::quiet_NaN());
      return;
    }
    std::vector<Sample> samples;
    roi_samples(r, shape, samples);
    const int64_t grid = r.grid_h * r.grid_w;
    const double divisor = bin_divisor(r);
    for (int64_t c = 0; c < shape.channels; ++c) {
      const T* map = input + (r.batch * shape.channels + c) * plane;
      for (int64_t bin = 0; bin < bins; ++bin) {
        double sum = 0;
        const Sample* s = samples.data() + bin * grid;
        for (int64_t g = 0; g < grid; ++g, ++s) sum += sample_value(*s, map);
        y[c * bins + bin] = static_cast<T>(sum / divisor);
      }
    }
  });
}

// grad_input [N, C, H, W] (zeroed by the caller) from grad_output [K, C, PH, PW]. One task per block of
// channels: every task writes its own channels only, so the result is deterministic.
template <class T, class ParallelFor>
void roi_align_rotated_backward(const T* grad_output, const std::vector<roi_align_rotated_detail::Roi>& rois,
                                T* grad_input, const RoiAlignRotatedShape& shape, ParallelFor&& parallel_for) {
  using namespace roi_align_rotated_detail;
  const int64_t bins = shape.pooled_height * shape.pooled_width, plane = shape.height * shape.width;
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (shape.channels + kBlock - 1) / kBlock;
  parallel_for(blocks, [&](int64_t block) {
    const int64_t c_begin = block * kBlock, c_end = std::min(shape.channels, c_begin + kBlock);
    std::vector<Sample> samples;
    for (int64_t k = 0; k < shape.rois; ++k) {
      const Roi& r = rois[k];
      if (!r.finite) continue;  // a NaN output: its gradient reaches no pixel
      roi_samples(r, shape, samples);
      const int64_t grid = r.grid_h * r.grid_w;
      const double divisor = bin_divisor(r);
      for (int64_t c = c_begin; c < c_end; ++c) {
        T* map = grad_input + (r.batch * shape.channels + c) * plane;
        const T* g = grad_output + (k * shape.channels + c) * bins;
        for (int64_t bin = 0; bin < bins; ++bin) {
          const double share = g[bin] / divisor;
          const Sample* s = samples.data() + bin * grid;
          for (int64_t q = 0; q < grid; ++q, ++s) {
            if (!s->inside) continue;
            for (int corner = 0; corner < 4; ++corner) {
              map[s->index[corner]] += static_cast<T>(share * s->weight[corner]);
            }
          }
        }
      }
    }
  });
}

}  // namespace opbridge::kernels
