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

// One axis of an axis-aligned roi: for each bin along it, the map lines (rows or columns) its samples read, each
// once, ascending, with the sum of the bilinear weights the samples give it. Bilinear sampling on a grid of
// positions is separable: a bin's sum over its gh x gw samples of hy hx m[y0, x0] + hy lx m[y0, x1] + ly hx
// m[y1, x0] + ly lx m[y1, x1] is sum_r a_r (sum_c b_c m[r, c]), over the rows r and columns c the samples read,
// which reads the same pixels ((gh + 1) x (gw + 1) of them, rather than 4 gh gw reads). A sample counts only where
// both of its coordinates are on the map, as in bilinear(): an axis' position off the map adds no line, and so
// no pixel in that row or column of samples is read.
template <class T>
struct AxisLines {
  std::vector<int64_t> begin;  // bins + 1 entries into line and weight
  std::vector<int64_t> line;
  std::vector<T> weight;

  // `position(bin, g)`: the coordinate of sample g of `bin` along this axis; `size`: the map's extent along it.
  template <class Position>
  void fill(int64_t bins, int64_t grid, int64_t size, Position&& position) {
    begin.assign(1, 0);
    line.clear();
    weight.clear();
    struct Tap {
      int64_t low;
      double fraction;  // the weight of line low + 1 (1 - fraction: of line low)
    };
    std::vector<Tap> taps;
    std::vector<double> dense;  // the bin's lines, from its lowest one
    std::vector<char> read;
    for (int64_t bin = 0; bin < bins; ++bin) {
      taps.clear();
      int64_t low = INT64_MAX, high = -1;
      for (int64_t g = 0; g < grid; ++g) {
        double x = position(bin, g);
        if (!(x >= -1.0 && x <= static_cast<double>(size)) || size <= 0) continue;  // the sample reads nothing
        x = std::max(x, 0.0);
        int64_t x0 = static_cast<int64_t>(x);
        if (x0 >= size - 1) {  // both taps on the last line, all weight on the first
          taps.push_back({size - 1, 0.0});
          low = std::min(low, size - 1);
          high = std::max(high, size - 1);
          continue;
        }
        taps.push_back({x0, x - static_cast<double>(x0)});
        low = std::min(low, x0);
        high = std::max(high, x0 + 1);
      }
      if (!taps.empty()) {
        dense.assign(static_cast<size_t>(high - low + 1), 0.0);
        read.assign(dense.size(), 0);
        // A line some sample gives weight 0 (a position on a line, or clamped onto the last one) is read with
        // weight 0 too, once more: 0 times an infinity there is NaN, as it is sample by sample.
        const auto add = [&](int64_t at, double w) {
          dense[at] += w;
          read[at] |= w == 0.0 ? 3 : 1;
        };
        for (const Tap& tap : taps) {
          add(tap.low - low, 1 - tap.fraction);
          add(tap.low - low + (tap.low < size - 1 ? 1 : 0), tap.fraction);  // the clamped tap reads its line twice
        }
        for (int64_t x = low; x <= high; ++x) {
          if (read[x - low] & 1) {
            line.push_back(x);
            weight.push_back(static_cast<T>(dense[x - low]));
          }
          if (read[x - low] & 2) {
            line.push_back(x);
            weight.push_back(T(0));
          }
        }
      }
      begin.push_back(static_cast<int64_t>(line.size()));
    }
  }
};

}  // namespace roi_align_detail

// One task per roi: its samples are computed once, then every channel reads them. Average pooling takes the
// separable form of AxisLines (about 3x fewer reads than sample by sample on an adaptive grid); the maximum
// needs every sample's value.
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
    if (!max_pool) {
      // The positions roi_samples() computes at angle 0 (y = yy * 1 - xx * 0 + cy = yy + cy, bit for bit).
      const double bin_h = r.h / shape.pooled_height, bin_w = r.w / shape.pooled_width;
      roi_align_detail::AxisLines<T> rows, columns;
      rows.fill(shape.pooled_height, r.grid_h, shape.height,
                [&](int64_t i, int64_t g) { return (-0.5 * r.h + i * bin_h + (g + 0.5) * bin_h / r.grid_h) + r.cy; });
      columns.fill(shape.pooled_width, r.grid_w, shape.width, [&](int64_t j, int64_t g) {
        return (-0.5 * r.w + j * bin_w + (g + 0.5) * bin_w / r.grid_w) + r.cx;
      });
      const T divisor = static_cast<T>(std::max<int64_t>(r.grid_h * r.grid_w, 1));
      for (int64_t c = 0; c < shape.channels; ++c) {
        const T* map = input + (r.batch * shape.channels + c) * plane;
        T* target = y + c * bins;
        for (int64_t i = 0; i < shape.pooled_height; ++i) {
          for (int64_t j = 0; j < shape.pooled_width; ++j) {
            T sum = 0;
            for (int64_t a = rows.begin[i]; a < rows.begin[i + 1]; ++a) {
              const T* line = map + rows.line[a] * shape.width;
              T partial = 0;
              for (int64_t b = columns.begin[j]; b < columns.begin[j + 1]; ++b) {
                partial += columns.weight[b] * line[columns.line[b]];
              }
              sum += rows.weight[a] * partial;
            }
            target[i * shape.pooled_width + j] = sum / divisor;
          }
        }
      }
      return;
    }
    std::vector<Sample> samples;
    roi_samples(r, shape, samples);
    roi_align_detail::CompactSamples<T> compact;
    compact.fill(samples, bins, r.grid_h * r.grid_w);
    for (int64_t c = 0; c < shape.channels; ++c) {
      const T* map = input + (r.batch * shape.channels + c) * plane;
      for (int64_t bin = 0; bin < bins; ++bin) {
        T result = static_cast<T>(kRoiAlignMaxStart);
        if (compact.outside[bin] && result < T(0)) result = T(0);
        for (int64_t t = compact.begin[bin]; t < compact.begin[bin + 1]; ++t) {
          const auto& tap = compact.taps[t];
          const T value = tap.weight[0] * map[tap.index[0]] + tap.weight[1] * map[tap.index[1]] +
                          tap.weight[2] * map[tap.index[2]] + tap.weight[3] * map[tap.index[3]];
          if (value > result) result = value;  // a NaN sample is passed over, as in mmcv
        }
        y[c * bins + bin] = result;
      }
    }
  });
}

}  // namespace opbridge::kernels
