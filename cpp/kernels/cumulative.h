// Running extremes along one axis, framework-free: torch.cummax / torch.cummin (values and indices) and corner
// pooling (CornerNet's top, bottom, left and right pools: a running maximum from one edge of the map), behind
// mmcv's cummax, cummin and MMCVCornerPool nodes.
//
// As torch: along the axis, the running value is replaced when the new element is >= it (cummax) or <= it
// (cummin), so among equal values the index is the last one; a NaN is kept once met, its index that of the last
// NaN so far.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/broadcast.h"
#include "kernels/device.h"

namespace opbridge::kernels {

// A tensor seen as [outer, length, inner] around its running axis.
struct CumulativeShape {
  int64_t outer = 1, length = 1, inner = 1;
};

// `axis` may be negative (counted from the end); a 0-d tensor has the one axis 0 or -1, as torch.cummax.
inline Status check_cumulative(const char* op, const char* input, const std::vector<int64_t>& shape, int64_t axis,
                               const char* attribute, CumulativeShape& out) {
  const auto rank = static_cast<int64_t>(shape.size());
  const int64_t effective_rank = std::max<int64_t>(rank, 1);
  if (axis < -effective_rank || axis >= effective_rank) {
    return {std::string(op) + ": attribute '" + attribute + "' must be in [" + std::to_string(-effective_rank) + ", " +
            std::to_string(effective_rank - 1) + "] for " + input + " of shape " + shape_to_string(shape) + ", got " +
            std::to_string(axis)};
  }
  if (axis < 0) axis += effective_rank;
  out = {};
  int64_t numel = 0;
  if (!checked_numel(shape, numel)) return {std::string(op) + ": " + input + " has too many elements"};
  for (int64_t d = 0; d < rank; ++d) {
    (d < axis ? out.outer : d == axis ? out.length : out.inner) *= shape[d];
  }
  return {};
}

// Whether `value` replaces the running `best` (see the header comment). Also the CUDA kernel's
// (kernels/cumulative.cuh).
template <bool Max, class T>
OPBRIDGE_HD_INLINE bool replaces(T value, T best) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(value)) return true;
    if (std::isnan(best)) return false;
  }
  return Max ? value >= best : value <= best;
}

// values (and indices, when not null) along the axis, from index 0 upwards, or from the end downwards when
// `reverse` (a corner pool from the far edge). Tasks are (outer, block of inner) pairs, so each thread walks
// contiguous rows.
template <bool Max, class T, class ParallelFor>
void cumulative_extreme(const T* input, T* values, int64_t* indices, const CumulativeShape& s, bool reverse,
                        ParallelFor&& parallel_for) {
  if (s.outer == 0 || s.length == 0 || s.inner == 0) return;
  constexpr int64_t kBlock = 1024;
  const int64_t blocks = (s.inner + kBlock - 1) / kBlock;
  parallel_for(s.outer * blocks, [&](int64_t task) {
    const int64_t o = task / blocks, begin = task % blocks * kBlock, end = std::min(begin + kBlock, s.inner);
    const int64_t base = o * s.length * s.inner;
    for (int64_t step = 0; step < s.length; ++step) {
      const int64_t i = reverse ? s.length - 1 - step : step;
      const int64_t row = base + i * s.inner, previous = row + (reverse ? s.inner : -s.inner);
      for (int64_t j = begin; j < end; ++j) {
        const T value = input[row + j];
        const bool first = step == 0;
        const bool take = first || replaces<Max>(value, values[previous + j]);
        values[row + j] = take ? value : values[previous + j];
        if (indices != nullptr) indices[row + j] = take ? i : indices[previous + j];
      }
    }
  });
}

}  // namespace opbridge::kernels
