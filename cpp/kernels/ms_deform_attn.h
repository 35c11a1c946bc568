// Multi-scale deformable attention (Deformable DETR), framework-free: the shape
// checks, the forward and the backward shared by the torch op and the ORT op.
//
// value               [N, S, M, D]      S = sum over levels of H_l * W_l (flattened maps)
// spatial_shapes      [L, 2]  int64     (H_l, W_l)
// level_start_index   [L]     int64     where level l starts in S
// sampling_locations  [N, Lq, M, L, P, 2]   normalized (x, y), 0..1 spans the map
// attention_weights   [N, Lq, M, L, P]
// out                 [N, Lq, M * D]
//
// out[n, q, m, :] = sum over l, p of attention_weights[n, q, m, l, p] *
//   bilinear(value level l of head m, pixel x = loc_x * W_l - 0.5, y = loc_y * H_l - 0.5),
// zero outside the map (grid_sample with align_corners=False, padding_mode="zeros").
// A sample contributes only if -1 < x < W_l and -1 < y < H_l; a NaN location fails
// that test and contributes nothing (as in Deformable DETR's and mmcv's kernels).
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

struct MSDeformAttnShape {
  int64_t batch = 0, keys = 0, heads = 0, channels = 0, queries = 0, levels = 0, points = 0;
};

// How the calling front end names the op and its inputs in error messages.
struct MSDeformAttnNames {
  const char* op;
  const char* value;
  const char* spatial_shapes;
  const char* level_start_index;
  const char* sampling_locations;
  const char* attention_weights;
};

// Checks the shapes of the five inputs and the level table (the data of spatial_shapes and
// level_start_index, int64, read on the host) and fills `shape`.
inline Status check_ms_deform_attn(const MSDeformAttnNames& names, const std::vector<int64_t>& value,
                                   const std::vector<int64_t>& spatial_shapes,
                                   const std::vector<int64_t>& level_start_index,
                                   const std::vector<int64_t>& sampling_locations,
                                   const std::vector<int64_t>& attention_weights, const int64_t* spatial_data,
                                   const int64_t* start_data, MSDeformAttnShape& shape) {
  const std::string op = names.op;
  auto fail = [&](const std::string& message) { return Status{op + ": " + message}; };
  if (value.size() != 4) {
    return fail(std::string(names.value) + " must be 4-D [batch, keys, heads, channels], got shape " +
                shape_to_string(value));
  }
  if (spatial_shapes.size() != 2 || spatial_shapes[1] != 2 || spatial_shapes[0] < 1) {
    return fail(std::string(names.spatial_shapes) + " must have shape [levels, 2] with levels >= 1, got " +
                shape_to_string(spatial_shapes));
  }
  const int64_t levels = spatial_shapes[0];
  if (level_start_index.size() != 1 || level_start_index[0] != levels) {
    return fail(std::string(names.level_start_index) + " must have shape [" + std::to_string(levels) +
                "] (one start per level), got " + shape_to_string(level_start_index));
  }
  const std::vector<int64_t> locations_want{value[0], -1, value[2], levels, -1, 2};
  bool locations_ok = sampling_locations.size() == 6;
  for (size_t i = 0; locations_ok && i < 6; ++i) {
    locations_ok = sampling_locations[i] >= 0 && (locations_want[i] < 0 || sampling_locations[i] == locations_want[i]);
  }
  if (!locations_ok) {
    return fail(std::string(names.sampling_locations) + " must have shape [batch " + std::to_string(value[0]) +
                ", queries, heads " + std::to_string(value[2]) + ", levels " + std::to_string(levels) +
                ", points, 2], got " + shape_to_string(sampling_locations));
  }
  const std::vector<int64_t> weights_want(sampling_locations.begin(), sampling_locations.end() - 1);
  if (attention_weights != weights_want) {
    return fail(std::string(names.attention_weights) + " must have shape " + shape_to_string(weights_want) +
                " (sampling_locations' without the last dimension), got " + shape_to_string(attention_weights));
  }
  for (int64_t size : value) {
    if (size < 0) return fail(std::string(names.value) + " has a negative size: " + shape_to_string(value));
  }
  // The level table: non-negative sizes whose areas tile S in order.
  constexpr int64_t kMaxSide = int64_t(1) << 31;
  int64_t total = 0;
  for (int64_t l = 0; l < levels; ++l) {
    const int64_t height = spatial_data[2 * l], width = spatial_data[2 * l + 1];
    if (height < 0 || width < 0 || height >= kMaxSide || width >= kMaxSide) {
      return fail(std::string(names.spatial_shapes) + "[" + std::to_string(l) + "] = (" + std::to_string(height) +
                  ", " + std::to_string(width) + ") must hold non-negative sizes (height, width) below 2^31");
    }
    if (start_data[l] != total) {
      return fail(std::string(names.level_start_index) + "[" + std::to_string(l) +
                  "] = " + std::to_string(start_data[l]) + " must be " + std::to_string(total) +
                  ", the sum of height * width of the levels before it (from " + names.spatial_shapes + ")");
    }
    total += height * width;
    if (total > value[1]) break;  // reported below; stops the sum from overflowing
  }
  if (total != value[1]) {
    return fail("the levels of " + std::string(names.spatial_shapes) + " cover " + std::to_string(total) +
                " keys (sum of height * width), but " + names.value + " has " + std::to_string(value[1]) +
                " (its dimension 1)");
  }
  shape.batch = value[0];
  shape.keys = value[1];
  shape.heads = value[2];
  shape.channels = value[3];
  shape.queries = sampling_locations[1];
  shape.levels = levels;
  shape.points = sampling_locations[4];
  return {};
}

// The (up to) four corners of one bilinear sample that lie inside its level's map.
template <class T>
struct MSDeformAttnSample {
  int64_t key[4];  // rows of the level in value (start + y * W + x)
  T weight[4];     // bilinear weights
  bool inside[4];
  T high_y, low_y, high_x, low_x;  // 1 - ly, ly, 1 - lx, lx
  bool any = false;
};

template <class T>
OPBRIDGE_HD inline MSDeformAttnSample<T> ms_deform_attn_sample(T loc_x, T loc_y, int64_t height, int64_t width,
                                                               int64_t start) {
  MSDeformAttnSample<T> s;
  const T x = loc_x * static_cast<T>(width) - T(0.5), y = loc_y * static_cast<T>(height) - T(0.5);
  if (!(x > T(-1) && y > T(-1) && x < static_cast<T>(width) && y < static_cast<T>(height))) return s;  // NaN: out
  // floor(x) for x > -1: truncate x + 1 (cheaper than std::floor), corrected where x + 1 rounded up.
  int64_t x0 = static_cast<int64_t>(x + T(1)) - 1, y0 = static_cast<int64_t>(y + T(1)) - 1;
  x0 -= static_cast<T>(x0) > x;
  y0 -= static_cast<T>(y0) > y;
  s.low_x = x - static_cast<T>(x0);
  s.low_y = y - static_cast<T>(y0);
  s.high_x = T(1) - s.low_x;
  s.high_y = T(1) - s.low_y;
  const bool top = y0 >= 0, bottom = y0 + 1 < height, left = x0 >= 0, right = x0 + 1 < width;
  s.inside[0] = top && left;
  s.inside[1] = top && right;
  s.inside[2] = bottom && left;
  s.inside[3] = bottom && right;
  const int64_t base = start + y0 * width + x0;  // keys of corners outside the map are never read
  s.key[0] = base;
  s.key[1] = base + 1;
  s.key[2] = base + width;
  s.key[3] = base + width + 1;
  s.weight[0] = s.inside[0] ? s.high_y * s.high_x : T(0);
  s.weight[1] = s.inside[1] ? s.high_y * s.low_x : T(0);
  s.weight[2] = s.inside[2] ? s.low_y * s.high_x : T(0);
  s.weight[3] = s.inside[3] ? s.low_y * s.low_x : T(0);
  s.any = true;  // inside (-1, W) x (-1, H) at least one corner is on the map
  return s;
}

// One sample's gradients of its attention weight and location, from dots[c] = g . v_c (the output gradient
// times corner c's value row; zero for a corner off the map) and its attention weight a.
template <class T>
OPBRIDGE_HD inline void ms_deform_attn_sample_grads(const MSDeformAttnSample<T>& sample, const T dots[4], T a,
                                                    int64_t height, int64_t width, T& grad_attn, T& grad_x, T& grad_y) {
  grad_attn =
      sample.weight[0] * dots[0] + sample.weight[1] * dots[1] + sample.weight[2] * dots[2] + sample.weight[3] * dots[3];
  // d(sample)/dx = hy * (v01 - v00) + ly * (v11 - v10); x = loc_x * W - 0.5.
  const T dx = sample.high_y * (dots[1] - dots[0]) + sample.low_y * (dots[3] - dots[2]);
  const T dy = sample.high_x * (dots[2] - dots[0]) + sample.low_x * (dots[3] - dots[1]);
  grad_x = a * dx * static_cast<T>(width);
  grad_y = a * dy * static_cast<T>(height);
}

// Queries per forward task: enough work to amortize the scheduling.
inline int64_t ms_deform_attn_block_queries(const MSDeformAttnShape& s) {
  const int64_t per_query = std::max<int64_t>(1, s.heads * s.levels * s.points * s.channels);
  return std::clamp<int64_t>((int64_t(1) << 16) / per_query, 1, 256);
}

// out [N, Lq, M * D]. spatial_shapes and level_start_index as checked by check_ms_deform_attn.
// parallel_for(tasks, task) runs task(0..tasks-1), in any order and on any threads.
//
// Per (query, head) the channels accumulate in a buffer of the task's; each sample adds its four
// corners in one pass over the channels (a corner outside the map reads a row of zeros with weight 0),
// which the compiler vectorizes: no branch and no aliasing inside the channel loop.
template <class T, class ParallelFor>
void ms_deform_attn(const T* value, const int64_t* spatial_shapes, const int64_t* level_start_index,
                    const T* sampling_locations, const T* attention_weights, T* out, const MSDeformAttnShape& s,
                    ParallelFor&& parallel_for) {
  const int64_t d = s.channels, m_count = s.heads, lp = s.levels * s.points;
  const int64_t block = ms_deform_attn_block_queries(s);
  const int64_t blocks = (s.queries + block - 1) / block;
  const std::vector<T> zeros(static_cast<size_t>(d), T(0));
  parallel_for(s.batch * blocks, [&](int64_t task) {
    const int64_t n = task / blocks, first = task % blocks * block, last = std::min(s.queries, first + block);
    const T* value_n = value + n * s.keys * m_count * d;
    std::vector<T> buffer(static_cast<size_t>(d));
    T* __restrict acc = buffer.data();
    for (int64_t q = first; q < last; ++q) {
      for (int64_t m = 0; m < m_count; ++m) {
        std::fill(acc, acc + d, T(0));
        const int64_t row = (n * s.queries + q) * m_count + m;
        const T* loc = sampling_locations + row * lp * 2;
        const T* attn = attention_weights + row * lp;
        for (int64_t l = 0; l < s.levels; ++l) {
          const int64_t height = spatial_shapes[2 * l], width = spatial_shapes[2 * l + 1];
          for (int64_t p = 0; p < s.points; ++p) {
            const int64_t i = l * s.points + p;
            const auto sample = ms_deform_attn_sample(loc[2 * i], loc[2 * i + 1], height, width, level_start_index[l]);
            if (!sample.any) continue;
            const T* r[4];
            T w[4];
            for (int c = 0; c < 4; ++c) {
              r[c] = sample.inside[c] ? value_n + (sample.key[c] * m_count + m) * d : zeros.data();
              w[c] = sample.inside[c] ? attn[i] * sample.weight[c] : T(0);  // an infinite weight times 0: NaN
            }
            const T* __restrict r0 = r[0];
            const T* __restrict r1 = r[1];
            const T* __restrict r2 = r[2];
            const T* __restrict r3 = r[3];
            for (int64_t k = 0; k < d; ++k) acc[k] += w[0] * r0[k] + w[1] * r1[k] + w[2] * r2[k] + w[3] * r3[k];
          }
        }
        std::copy(acc, acc + d, out + row * d);
      }
    }
  });
}

// Gradients of value [N, S, M, D] (must be zero on entry), sampling_locations and attention_weights
// (written in full) from grad_out [N, Lq, M * D]. One task per (image, head): a task owns the
// value rows of its head, so the scatter into grad_value has no races, and its order is fixed
// (queries, levels, points in turn): the same bits for the same inputs at any thread count.
template <class T, class ParallelFor>
void ms_deform_attn_backward(const T* grad_out, const T* value, const int64_t* spatial_shapes,
                             const int64_t* level_start_index, const T* sampling_locations, const T* attention_weights,
                             const MSDeformAttnShape& s, T* grad_value, T* grad_sampling_locations,
                             T* grad_attention_weights, ParallelFor&& parallel_for) {
  const int64_t d = s.channels, m_count = s.heads, lp = s.levels * s.points;
  const std::vector<T> zeros(static_cast<size_t>(d), T(0));
  parallel_for(s.batch * m_count, [&](int64_t task) {
    const int64_t n = task / m_count, m = task % m_count;
    const T* value_n = value + n * s.keys * m_count * d;
    T* grad_value_n = grad_value + n * s.keys * m_count * d;
    // Rows a corner outside the map writes to and never reads back: one per corner, so the four rows of a
    // sample never alias.
    std::vector<T> scratch(static_cast<size_t>(4 * d));
    for (int64_t q = 0; q < s.queries; ++q) {
      const int64_t row = (n * s.queries + q) * m_count + m;
      const T* __restrict g = grad_out + row * d;
      const T* loc = sampling_locations + row * lp * 2;
      const T* attn = attention_weights + row * lp;
      T* grad_loc = grad_sampling_locations + row * lp * 2;
      T* grad_attn = grad_attention_weights + row * lp;
      for (int64_t l = 0; l < s.levels; ++l) {
        const int64_t height = spatial_shapes[2 * l], width = spatial_shapes[2 * l + 1];
        for (int64_t p = 0; p < s.points; ++p) {
          const int64_t i = l * s.points + p;
          const auto sample = ms_deform_attn_sample(loc[2 * i], loc[2 * i + 1], height, width, level_start_index[l]);
          grad_loc[2 * i] = grad_loc[2 * i + 1] = grad_attn[i] = T(0);
          if (!sample.any) continue;
          const T* r[4];
          T* gr[4];
          for (int c = 0; c < 4; ++c) {
            const int64_t offset = (sample.key[c] * m_count + m) * d;
            r[c] = sample.inside[c] ? value_n + offset : zeros.data();
            gr[c] = sample.inside[c] ? grad_value_n + offset : scratch.data() + c * d;
          }
          // g . v_c for the four corners (zero outside the map) give every gradient but value's.
          T dot0 = T(0), dot1 = T(0), dot2 = T(0), dot3 = T(0);
          {
            const T* __restrict r0 = r[0];
            const T* __restrict r1 = r[1];
            const T* __restrict r2 = r[2];
            const T* __restrict r3 = r[3];
            for (int64_t k = 0; k < d; ++k) {
              dot0 += g[k] * r0[k];
              dot1 += g[k] * r1[k];
              dot2 += g[k] * r2[k];
              dot3 += g[k] * r3[k];
            }
          }
          // Corners off the map read zeros; an infinite gradient times those zeros would be NaN.
          dot0 = sample.inside[0] ? dot0 : T(0);
          dot1 = sample.inside[1] ? dot1 : T(0);
          dot2 = sample.inside[2] ? dot2 : T(0);
          dot3 = sample.inside[3] ? dot3 : T(0);
          const T a = attn[i];
          const T dots[4] = {dot0, dot1, dot2, dot3};
          ms_deform_attn_sample_grads(sample, dots, a, height, width, grad_attn[i], grad_loc[2 * i],
                                      grad_loc[2 * i + 1]);
          const T w0 = a * sample.weight[0], w1 = a * sample.weight[1], w2 = a * sample.weight[2],
                  w3 = a * sample.weight[3];
          T* __restrict g0 = gr[0];
          T* __restrict g1 = gr[1];
          T* __restrict g2 = gr[2];
          T* __restrict g3 = gr[3];
          for (int64_t k = 0; k < d; ++k) {
            g0[k] += w0 * g[k];
            g1[k] += w1 * g[k];
            g2[k] += w2 * g[k];
            g3[k] += w3 * g[k];
          }
        }
      }
    }
  });
}

}  // namespace opbridge::kernels
