// PSANet's attention masks on CUDA (mmcv::MMCVPSAMask in the ORT CUDA library): one thread an output element,
// gathering through kernels/psa_mask.h's psa_mask_source, the CPU kernel's own mapping.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_grid.cuh"
#include "kernels/psa_mask.h"

namespace opbridge::kernels::cuda {
namespace psa_mask_device {

template <class T>
__global__ void gather_kernel(const T* __restrict__ input, T* __restrict__ out, PsaMaskShape s, int64_t total) {
  const int64_t pixels = s.height * s.width, per_image = pixels * pixels;
  OPBRIDGE_GRID_LOOP(e, total) {
    const int64_t n = e / per_image, rest = e - n * per_image, q = rest / pixels, at = rest - q * pixels;
    const int64_t a = at / s.width, b = at - a * s.width;
    const int64_t from = psa_mask_source(s, q, a, b);
    out[e] = from < 0 ? T(0) : input[n * s.mask_h * s.mask_w * pixels + from];
  }
}

}  // namespace psa_mask_device

// out [N, H * W, H, W], every element written.
template <class T>
cudaError_t psa_mask(const T* input, T* out, const PsaMaskShape& s, cudaStream_t stream) {
  const int64_t pixels = s.height * s.width, total = s.batch * pixels * pixels;
  if (total == 0) return cudaSuccess;
  psa_mask_device::gather_kernel<T><<<blocks_for(total), kThreads, 0, stream>>>(input, out, s, total);
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
