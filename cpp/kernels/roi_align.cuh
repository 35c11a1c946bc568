// mmcv's RoIAlign (kernels/roi_align.h: average or maximum pooling over axis-aligned rois) on CUDA, for the ORT CUDA
// library's MMCVRoiAlign nodes: one thread an output bin, its samples from roi_align_rotated.h's sample_at at angle
// 0 (the positions the CPU kernel takes), the average summed in double sample by sample (the CPU kernel's
// separable sums round differently: the two agree to float rounding), the maximum as the CPU kernel takes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "kernels/cuda_grid.cuh"
#include "kernels/roi_align.h"

namespace opbridge::kernels::cuda {

template <class T>
__global__ void roi_align_kernel(const T* __restrict__ input, const roi_align_rotated_detail::Roi* __restrict__ rois,
                                 RoiAlignRotatedShape s, bool max_pool, T* __restrict__ out) {
  namespace detail = roi_align_rotated_detail;
  const int64_t bins = s.pooled_height * s.pooled_width, total = s.rois * s.channels * bins;
  OPBRIDGE_GRID_LOOP(t, total) {
    const int64_t bin = t % bins, c = (t / bins) % s.channels, k = t / (bins * s.channels);
    const detail::Roi r = rois[k];
    if (!r.finite) {
      out[t] = std::numeric_limits<T>::quiet_NaN();
      continue;
    }
    const T* map = input + (r.batch * s.channels + c) * s.height * s.width;
    const int64_t i = bin / s.pooled_width, j = bin % s.pooled_width;
    if (!max_pool) {
      double sum = 0;
      for (int64_t iy = 0; iy < r.grid_h; ++iy) {
        for (int64_t ix = 0; ix < r.grid_w; ++ix)
          sum += detail::sample_value(detail::sample_at(r, s, i, j, iy, ix), map);
      }
      out[t] = static_cast<T>(sum / detail::bin_divisor(r));
      continue;
    }
    T result = static_cast<T>(kRoiAlignMaxStart);
    for (int64_t iy = 0; iy < r.grid_h; ++iy) {
      for (int64_t ix = 0; ix < r.grid_w; ++ix) {
        const auto sample = detail::sample_at(r, s, i, j, iy, ix);
        if (!sample.inside) {
          if (result < T(0)) result = T(0);  // a sample off the map counts as 0
          continue;
        }
        const T value = static_cast<T>(sample.weight[0]) * map[sample.index[0]] +
                        static_cast<T>(sample.weight[1]) * map[sample.index[1]] +
                        static_cast<T>(sample.weight[2]) * map[sample.index[2]] +
                        static_cast<T>(sample.weight[3]) * map[sample.index[3]];
        if (value > result) result = value;  // a NaN sample is passed over, as in mmcv
      }
    }
    out[t] = result;
  }
}

// rois: read and checked on the host (read_rois), in device memory.
template <class T>
cudaError_t roi_align_forward(const T* input, const roi_align_rotated_detail::Roi* rois, T* out,
                              const RoiAlignRotatedShape& s, bool max_pool, cudaStream_t stream) {
  const int64_t total = s.rois * s.channels * s.pooled_height * s.pooled_width;
  if (total == 0) return cudaSuccess;
  roi_align_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(input, rois, s, max_pool, out);
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
