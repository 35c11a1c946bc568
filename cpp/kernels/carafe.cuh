// CARAFE's reassembly on CUDA (mmcv::MMCVCARAFE and MMCVCARAFENaive in the ORT CUDA library): one thread an
// output element, its k x k taps added in kernels/carafe.h's (i, j) order from 0, out-of-map taps left out, so that
// with --fmad=false (as the CPU build's -ffp-contract=off) both devices give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/carafe.h"
#include "kernels/cuda_grid.cuh"

namespace opbridge::kernels::cuda {
namespace carafe_device {

template <class T>
__global__ void reassemble_kernel(const T* __restrict__ features, const T* __restrict__ masks, T* __restrict__ out,
                                  CarafeShape s, int64_t total) {
  const int64_t out_h = s.height * s.scale, out_w = s.width * s.scale, radius = (s.kernel - 1) / 2;
  const int64_t plane = s.height * s.width, out_plane = out_h * out_w, per_group = s.channels / s.group;
  OPBRIDGE_GRID_LOOP(e, total) {
    const int64_t ox = e % out_w, oy = e / out_w % out_h, task = e / out_plane;  // task: (image, channel)
    const int64_t n = task / s.channels, c = task % s.channels, g = c / per_group;
    const T* feature = features + task * plane;
    const T* weight = masks + (n * s.group + g) * s.kernel * s.kernel * out_plane + oy * out_w + ox;
    T y = T(0);
    for (int64_t i = 0; i < s.kernel; ++i) {
      const int64_t fy = oy / s.scale + i - radius;
      if (fy < 0 || fy >= s.height) continue;
      for (int64_t j = 0; j < s.kernel; ++j) {
        const int64_t fx = ox / s.scale + j - radius;
        if (fx < 0 || fx >= s.width) continue;
        y += feature[fy * s.width + fx] * weight[(i * s.kernel + j) * out_plane];
      }
    }
    out[e] = y;
  }
}

}  // namespace carafe_device

template <class T>
cudaError_t carafe(const T* features, const T* masks, T* out, const CarafeShape& s, cudaStream_t stream) {
  const int64_t total = s.batch * s.channels * s.height * s.scale * s.width * s.scale;
  if (total == 0) return cudaSuccess;
  carafe_device::reassemble_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(features, masks, out, s, total);
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
