// Multi-scale deformable attention's CUDA forward, shared by the torch CUDA op (cpp/cuda/ms_deform_attn.cu) and
// the ORT CUDA library (cpp/ort/cuda): kernels/ms_deform_attn.h's sample arithmetic (corners, bilinear weights)
// per (image, query, head) row, as on the CPU.
//
// A row's channels are spread over `lanes` threads (a power of two up to a warp; each thread owns 16-byte vectors
// of channels lane, lane + lanes, ...), so a corner's value row is read in one coalesced access; every sample's
// four corners are loaded before their multiply-adds, which follow the CPU kernel's order
// (acc += w0 v0 + w1 v1 + w2 v2 + w3 v3). The forward owns its output elements: deterministic.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda_grid.cuh"
#include "kernels/ms_deform_attn.h"

namespace opbridge::kernels::cuda {

constexpr int kMaxLevels = 32;

// The checked level table, by value: the kernels read no table from device memory.
struct MSDeformAttnLevels {
  int64_t height[kMaxLevels], width[kMaxLevels], start[kMaxLevels];
};

// The table from host copies of spatial_shapes [L, 2] and level_start_index [L] (already checked against value
// by check_ms_deform_attn); false where there are more than kMaxLevels levels.
inline bool ms_deform_attn_levels(const MSDeformAttnShape& s, const int64_t* spatial_shapes,
                                  const int64_t* level_start_index, MSDeformAttnLevels& levels) {
  if (s.levels > kMaxLevels) return false;
  levels = MSDeformAttnLevels{};
  for (int64_t l = 0; l < s.levels; ++l) {
    levels.height[l] = spatial_shapes[2 * l], levels.width[l] = spatial_shapes[2 * l + 1];
    levels.start[l] = level_start_index[l];
  }
  return true;
}

// Threads per row for rows of `units` (channels, or vectors of them): up to a warp.
inline int ms_deform_attn_lanes(int64_t units) {
  int lanes = 1;
  while (lanes < 32 && lanes < units) lanes *= 2;
  return lanes;
}

// Loops a warp's threads over rows * lanes work items together (the bound is the same for the whole warp, so
// shuffles are never reached by part of a warp).
#define OPBRIDGE_WARP_LOOP(t, total)                                            \
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       t - static_cast<int64_t>(threadIdx.x & 31) < (total); t += static_cast<int64_t>(gridDim.x) * blockDim.x)

// T values moved as one aligned load (16 bytes for float x 4 or double x 2).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Whether the vector kernels can serve: whole vectors a row, every vector accessed 16-byte aligned.
template <class T>
bool ms_deform_attn_vectors(const MSDeformAttnShape& s, std::initializer_list<const void*> data) {
  if (s.channels % (16 / sizeof(T)) != 0) return false;
  for (const void* pointer : data) {
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) return false;
  }
  return true;
}

template <class T, int kVec>
__global__ void ms_deform_attn_forward_kernel(const T* __restrict__ value, const T* __restrict__ locations,
                                              const T* __restrict__ weights, T* __restrict__ out, MSDeformAttnShape s,
                                              MSDeformAttnLevels levels, int lanes) {
  using V = Vec<T, kVec>;
  const int64_t rows = s.batch * s.queries * s.heads, lp = s.levels * s.points, d = s.channels;
  const int64_t key_stride = s.heads * d;
  OPBRIDGE_WARP_LOOP(t, rows * lanes) {
    if (t >= rows * lanes) continue;
    const int64_t row = t / lanes, lane = t % lanes, m = row % s.heads, n = row / (s.heads * s.queries);
    const T* value_nm = value + (n * s.keys * s.heads + m) * d;
    const T* loc = locations + row * lp * 2;
    const T* attn = weights + row * lp;
    for (int64_t c0 = lane * kVec; c0 < d; c0 += lanes * kVec) {
      T acc[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = T(0);
      for (int64_t l = 0; l < s.levels; ++l) {
        for (int64_t p = 0; p < s.points; ++p) {
          const int64_t i = l * s.points + p;
          const auto sample =
              ms_deform_attn_sample(loc[2 * i], loc[2 * i + 1], levels.height[l], levels.width[l], levels.start[l]);
          if (!sample.any) continue;
          const T a = attn[i];
          T w[4];
          V v[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            w[k] = sample.inside[k] ? a * sample.weight[k] : T(0);
            if (sample.inside[k]) {
              v[k] = *reinterpret_cast<const V*>(value_nm + sample.key[k] * key_stride + c0);
            } else {
#pragma unroll
              for (int j = 0; j < kVec; ++j) v[k].v[j] = T(0);
            }
          }
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            acc[j] += w[0] * v[0].v[j] + w[1] * v[1].v[j] + w[2] * v[2].v[j] + w[3] * v[3].v[j];
          }
        }
      }
      V result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) result.v[j] = acc[j];
      *reinterpret_cast<V*>(out + row * d + c0) = result;
    }
  }
}

// Launches the forward on `stream` (contiguous value [N, S, M, D], locations [N, Q, M, L, P, 2], weights
// [N, Q, M, L, P], out [N, Q, M * D]); returns the launch's error (cudaSuccess when it started).
template <class T>
cudaError_t ms_deform_attn_forward(const T* value, const T* locations, const T* weights, T* out,
                                   const MSDeformAttnShape& s, const MSDeformAttnLevels& levels, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vectors = ms_deform_attn_vectors<T>(s, {value, out});
  const int lanes = ms_deform_attn_lanes(vectors ? s.channels / kVec : s.channels);
  const unsigned blocks = blocks_for(s.batch * s.queries * s.heads * lanes);
  auto kernel = vectors ? ms_deform_attn_forward_kernel<T, kVec> : ms_deform_attn_forward_kernel<T, 1>;
  kernel<<<blocks, kThreads, 0, stream>>>(value, locations, weights, out, s, levels, lanes);
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
