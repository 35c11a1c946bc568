// mmcv's masked convolution on CUDA (mmcv::MMCVMaskedConv2d in the ORT CUDA library): the masked positions found
// on the host (kernels/masked_conv2d.h's masked_positions, which also checks them), then one thread an (output
// channel, position) pair, its dot product over (c, i, j) in T with the CPU kernel's column order and the bias
// added after it, as the CPU kernel does. The CPU's product runs in a GEMM whose summation order is its own, so the
// devices agree to rounding, not bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_grid.cuh"
#include "kernels/masked_conv2d.h"

namespace opbridge::kernels::cuda {
namespace masked_conv2d_device {

template <class T>
__global__ void masked_conv_kernel(const T* __restrict__ features, const int64_t* __restrict__ positions, int64_t count,
                                   const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out,
                                   MaskedConv2dShape s) {
  const int64_t depth = s.channels * s.kernel_h * s.kernel_w;
  OPBRIDGE_GRID_LOOP(e, s.out_channels * count) {
    const int64_t o = e / count, q = e % count;  // neighbouring threads: one filter, neighbouring positions
    const int64_t h = positions[q] / s.width, w = positions[q] % s.width;
    const T* filter = weight + o * depth;
    T sum = T(0);
    for (int64_t c = 0; c < s.channels; ++c) {
      for (int64_t i = 0; i < s.kernel_h; ++i) {
        const int64_t y = h - s.pad_h + i;
        if (y < 0 || y >= s.height) continue;
        for (int64_t j = 0; j < s.kernel_w; ++j) {
          const int64_t x = w - s.pad_w + j;
          if (x < 0 || x >= s.width) continue;
          sum += filter[(c * s.kernel_h + i) * s.kernel_w + j] * features[(c * s.height + y) * s.width + x];
        }
      }
    }
    out[(o * s.out_h + h) * s.out_w + w] = sum + (bias != nullptr ? bias[o] : T(0));
  }
}

}  // namespace masked_conv2d_device

// out [O, Ho, Wo]: zero, then the `count` masked positions (flat h * W + w, device memory) computed.
template <class T>
cudaError_t masked_conv2d(const T* features, const int64_t* positions, int64_t count, const T* weight, const T* bias,
                          T* out, const MaskedConv2dShape& s, cudaStream_t stream) {
  const int64_t outputs = s.out_channels * s.out_h * s.out_w;
  cudaError_t error = cudaMemsetAsync(out, 0, sizeof(T) * static_cast<size_t>(outputs), stream);
  if (error != cudaSuccess || count == 0 || s.out_channels == 0) return error;
  masked_conv2d_device::masked_conv_kernel<T>
      <<<blocks_for(s.out_channels * count), kThreads, 0, stream>>>(features, positions, count, weight, bias, out, s);
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
