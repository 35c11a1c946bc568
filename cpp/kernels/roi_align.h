// RoIAlign over axis-aligned rois with mmcv's semantics (mmcv::MMCVRoiAlign: average or maximum pooling),
// framework-free. The bilinear samples are roi_align_rotated.h's at angle 0; the roi geometry and the pooling
// loops are this file's.
//
// input [N, C, H, W]; rois [K, 5] = (batch index, x1, y1, x2, y2); out [K, C, PH, PW].
// For roi k: start = (x1, y1) * spatial_scale - (0.5 if aligned), size = (x2 - x1, y2 - y1) * spatial_scale, at
// least 1 x 1 without `aligned` (mmdetection's legacy mode; the start stays). Bin (i, j) takes a grid of gh x gw
// bilinear samples, gh = sampling_ratio if > 0 else ceil(roi height / PH) (gw likewise), at
//   y = start_y + (i + (iy + 0.5) / gh) * height / PH,   x = start_x + (j + (ix + 0.5) / gw) * width / PW;
// a sample more than one pixel outside the map reads 0 (and takes part in the maximum as 0).
// - avg: the mean of the samples (0 for an empty grid);
// - max: their maximum, starting from -10000 as mmcv's CPU kernels do: an empty grid (a roi of zero size with
//   `aligned`) gives -10000, as it does in mmcv; NaN samples are passed over.
// A roi with a NaN or infinite number (after scaling) gives NaN. The batch index must be an integer in [0, N).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/roi_align_rotated.h"

namespace opbridge::kernels {

struct RoiAlignAttributes {
  int64_t pooled_height = 1, pooled_width = 1, sampling_ratio = 0;
  double spatial_scale = 1.0;
  bool aligned = true, max_pool = false;
};

// mmcv's max pooling starts from this value (its CPU and ONNX Runtime kernels).
constexpr double kRoiAlignMaxStart = -10000.0;

// The checks of roi_align_rotated.h with 5-column rois. Fills `shape`.
inline Status check_roi_align(const RoiAlignRotatedNames& names, const std::vector<int64_t>& input,
                              const std::vector<int64_t>& rois, const RoiAlignAttributes& a,
                              RoiAlignRotatedShape& shape) {
  if (rois.size() != 2 || rois[1] != 5) {
    return {std::string(names.op) + ": " + names.rois +
            " must have shape [rois, 5] (batch index, x1, y1, x2, y2), got " + shape_to_string(rois)};
  }
  RoiAlignRotatedAttributes rotated;
  rotated.pooled_height = a.pooled_height;
  rotated.pooled_width = a.pooled_width;
  rotated.sampling_ratio = a.sampling_ratio;
  rotated.spatial_scale = a.spatial_scale;
  return check_roi_align_rotated(names, input, {rois[0], 6}, rotated, shape);
}

// Reads every roi into roi_align_rotated.h's geometry (angle 0) and checks its batch index and grid.
template <class T>
Status read_rois(const RoiAlignRotatedNames& names, const T* rois, const RoiAlignRotatedShape& shape,
                 const RoiAlignAttributes& a, std::vector<roi_align_rotated_detail::Roi>& out) {
  out.resize(static_cast<size_t>(shape.rois));
  const double offset = a.aligned ? 0.5 : 0.0;
  for (int64_t k = 0; k < shape.rois; ++k) {
    const T* roi = rois + 5 * k;
    const double index = roi[0];
    auto status = roi_align_rotated_detail::check_batch_index(names, k, index, shape.batch);
    if (!status.ok()) return status;
    roi_align_rotated_detail::Roi& r = out[k];
    r.batch = static_cast<int64_t>(index);
    const double x0 = roi[1] * a.spatial_scale - offset, y0 = roi[2] * a.spatial_scale - offset;
    r.w = (roi[3] * a.spatial_scale - offset) - x0;
    r.h = (roi[4] * a.spatial_scale - offset) - y0;
    r.finite = std::isfinite(x0) && std::isfinite(y0) && std::isfinite(r.w) && std::isfinite(r.h);
    if (!a.aligned) {  // the legacy mode: at least one pixel, from the roi's start
      r.w = std::max(r.w, 1.0);
      r.h = std::max(r.h, 1.0);
    }
    r.cx = x0 + 0.5 * r.w;
    r.cy = y0 + 0.5 * r.h;
    r.cos_t = 1.0;
    r.sin_t = 0.0;
    // A negative size (x2 < x1 with `aligned`) samples nothing, as in mmcv.
    roi_align_rotated_detail::set_grid(r, a.sampling_ratio, a.pooled_height, a.pooled_width);
    status = roi_align_rotated_detail::check_samples(names, k, r, shape);
    if (!status.ok()) return status;
  }
  return {};
}

namespace roi_align_detail {

// A roi's samples that lie on the map, compacted, with weights in T (the type mmcv's and torchvision's kernels
// accumulate in); per bin, the range of its samples and whether any sample fell outside (worth 0 to the max).
template <class T>
struct CompactSamples {
  struct Tap {
    int64_t index[4];
    T weight[4];
  };
  std::vector<Tap> taps;
  std::vector<int64_t> begin;  // bins + 1 entries
  std::vector<char> outside;

  void fill(const std::vector<roi_align_rotated_detail::Sample>& samples, int64_t bins, int64_t grid) {
    taps.clear();
    begin.assign(static_cast<size_t>(bins + 1), 0);
    outside.assign(static_cast<size_t>(bins), 0);
    for (int64_t bin = 0; bin < bins; ++bin) {
      for (int64_t g = 0; g < grid; ++g) {
        const auto& sample = samples[bin * grid + g];
        if (!sample.inside) {
          outside[bin] = 1;
          continue;
        }
        Tap tap;
        for (int corner = 0; corner < 4; ++corner) {
          tap.index[corner] = sample.index[corner];
          tap.weight[corner] = static_cast<T>(sample.weight[corner]);
        }
        taps.push_back(tap);
      }
      begin[bin + 1] = static_cast<int64_t>(taps.size());
    }
  }
};

}  // namespace roi_align_detail

// One task per roi: its samples are computed once, then every channel reads them.
template <class T, class ParallelFor>
void roi_align(const T* input, const std::vector<roi_align_rotated_detail::Roi>& rois, T* out,
               const RoiAlignRotatedShape& shape, bool max_pool, ParallelFor&& parallel_for) {
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
    roi_align_detail::CompactSamples<T> compact;
    compact.fill(samples, bins, r.grid_h * r.grid_w);
    const T divisor = static_cast<T>(std::max<int64_t>(r.grid_h * r.grid_w, 1));
    for (int64_t c = 0; c < shape.channels; ++c) {
      const T* map = input + (r.batch * shape.channels + c) * plane;
      for (int64_t bin = 0; bin < bins; ++bin) {
        T result;
        if (max_pool) {
          result = static_cast<T>(kRoiAlignMaxStart);
          if (compact.outside[bin] && result < T(0)) result = T(0);
          for (int64_t t = compact.begin[bin]; t < compact.begin[bin + 1]; ++t) {
            const auto& tap = compact.taps[t];
            const T value = tap.weight[0] * map[tap.index[0]] + tap.weight[1] * map[tap.index[1]] +
                            tap.weight[2] * map[tap.index[2]] + tap.weight[3] * map[tap.index[3]];
            if (value > result) result = value;  // a NaN sample is passed over, as in mmcv
          }
        } else {
          T sum = 0;
          for (int64_t t = compact.begin[bin]; t < compact.begin[bin + 1]; ++t) {
            const auto& tap = compact.taps[t];
            sum += tap.weight[0] * map[tap.index[0]] + tap.weight[1] * map[tap.index[1]] +
                   tap.weight[2] * map[tap.index[2]] + tap.weight[3] * map[tap.index[3]];
          }
          result = sum / divisor;
        }
        y[c * bins + bin] = result;
      }
    }
  });
}

}  // namespace opbridge::kernels
