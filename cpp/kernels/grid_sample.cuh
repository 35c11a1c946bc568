// 2-D grid sampling on CUDA (the ORT CUDA library's mmcv::grid_sampler and mmdeploy::grid_sampler nodes): one thread
// an output pixel, whose taps (grid_sample_taps.h, the CPU kernels' arithmetic) are computed once and read for every
// channel; each channel's sum adds the taps on the map in tap order from 0, as the CPU kernels do, so both devices
// give the same bits (no fused multiply-adds on either). Storage S is the arithmetic's type T, or __half (an ORT
// float16 model's input, grid and output) beside float32 arithmetic: read widened, the sum rounded once.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda_grid.cuh"
#include "kernels/grid_sample_taps.h"

namespace opbridge::kernels::cuda {

template <class S, class T, int K>
__global__ void grid_sample_kernel(const S* __restrict__ input, const S* __restrict__ grid, S* __restrict__ out,
                                   GridSampleShape s, GridSampleAttributes a) {
  const int64_t pixels = s.out_height * s.out_width, plane = s.height * s.width;
  OPBRIDGE_GRID_LOOP(t, s.batch * pixels) {
    const int64_t n = t / pixels, p = t % pixels;
    const auto taps =
        grid_sample_detail::taps_at<T, K>(static_cast<T>(grid[2 * t]), static_cast<T>(grid[2 * t + 1]), s, a);
    const S* image = input + n * s.channels * plane;
    S* target = out + n * s.channels * pixels + p;
    for (int64_t c = 0; c < s.channels; ++c) {
      const S* map = image + c * plane;
      T sum = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (taps.valid[k]) sum += taps.weight[k] * static_cast<T>(map[taps.offset[k]]);
      }
      target[c * pixels] = static_cast<S>(sum);
    }
  }
}

// Queues the sampling on `stream`; returns the launch's error. S: float, double, or __half (float32 arithmetic).
template <class S>
cudaError_t grid_sample_forward(const S* input, const S* grid, S* out, const GridSampleShape& s,
                                const GridSampleAttributes& a, cudaStream_t stream) {
  using T = std::conditional_t<std::is_same_v<S, double>, double, float>;
  const int64_t work = s.batch * s.out_height * s.out_width;
  if (work == 0 || s.channels == 0) return cudaSuccess;
  switch (static_cast<GridInterpolation>(a.interpolation)) {
    case GridInterpolation::nearest:
      grid_sample_kernel<S, T, 1><<<blocks_for(work), kThreads, 0, stream>>>(input, grid, out, s, a);
      break;
    case GridInterpolation::bicubic:
      grid_sample_kernel<S, T, 16><<<blocks_for(work), kThreads, 0, stream>>>(input, grid, out, s, a);
      break;
    default:
      grid_sample_kernel<S, T, 4><<<blocks_for(work), kThreads, 0, stream>>>(input, grid, out, s, a);
  }
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
