// Launch geometry shared by every CUDA kernel of opbridge (the torch CUDA ops in cpp/cuda and the ORT CUDA
// library in cpp/ort/cuda): threads a block, blocks for a piece of work, and the grid-stride loop. Torch-free and
// ORT-free, so both front ends launch the same kernels (kernels/<op>.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace opbridge::kernels::cuda {

constexpr int kThreads = 256;

// Loop bounds below which OPBRIDGE_GRID_LOOP_AS may count in int32: i + the grid's threads (at most 2^28, see
// blocks_for) stays below 2^31.
constexpr int64_t kInt32Loop = int64_t(1) << 30;

// Blocks for `work` items of `per_block` each, capped (kernels loop over the rest with a grid stride).
inline unsigned blocks_for(int64_t work, int64_t per_block = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, int64_t(1) << 20));
}

}  // namespace opbridge::kernels::cuda

// for (i = first thread; i < n; i += all threads), in int64 (tensors may pass 2^31 elements).
// OPBRIDGE_GRID_LOOP_AS(I, i, n): the same in index type I; int32 where n < kInt32Loop, whose divisions and
// remainders cost a fraction of int64's (emulated) ones.
#define OPBRIDGE_GRID_LOOP_AS(I, i, n)                                                                       \
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < (n); \
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x))
#define OPBRIDGE_GRID_LOOP(i, n)                                                         \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
