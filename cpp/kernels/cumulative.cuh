// Running extremes along one axis on CUDA (kernels/cumulative.h's, whose `replaces` it shares): torch.cummax /
// torch.cummin and corner pooling, for the ORT CUDA library's mmcv::cummax, mmcv::cummin and mmcv::MMCVCornerPool.
// One thread walks one line (outer, inner) along the axis; neighbouring threads take neighbouring inner positions,
// so each step's reads and writes are coalesced where the axis is not the last.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_grid.cuh"
#include "kernels/cumulative.h"

namespace opbridge::kernels::cuda {
namespace cumulative_device {

template <bool Max, class T>
__global__ void extreme_kernel(const T* __restrict__ input, T* __restrict__ values, int64_t* __restrict__ indices,
                               CumulativeShape s, bool reverse) {
  OPBRIDGE_GRID_LOOP(line, s.outer * s.inner) {
    const int64_t o = line / s.inner, j = line % s.inner, base = o * s.length * s.inner + j;
    T best{};
    int64_t at = 0;
    for (int64_t step = 0; step < s.length; ++step) {
      const int64_t i = reverse ? s.length - 1 - step : step;
      const T value = input[base + i * s.inner];
      if (step == 0 || replaces<Max>(value, best)) {
        best = value;
        at = i;
      }
      values[base + i * s.inner] = best;
      if (indices != nullptr) indices[base + i * s.inner] = at;
    }
  }
}

}  // namespace cumulative_device

// values (and indices, when not null) along the axis, from index 0 up, or from the end down when `reverse`:
// kernels::cumulative_extreme's result.
template <bool Max, class T>
cudaError_t cumulative_extreme(const T* input, T* values, int64_t* indices, const CumulativeShape& s, bool reverse,
                               cudaStream_t stream) {
  const int64_t lines = s.outer * s.inner;
  if (lines == 0 || s.length == 0) return cudaSuccess;
  cumulative_device::extreme_kernel<Max, T>
      <<<blocks_for(lines), kThreads, 0, stream>>>(input, values, indices, s, reverse);
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
