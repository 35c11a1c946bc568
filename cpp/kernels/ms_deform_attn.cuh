// Multi-scale deformable attention's CUDA kernels, shared by the torch CUDA op (cpp/cuda/ms_deform_attn.cu) and
// the ORT CUDA library (cpp/ort/cuda): kernels/ms_deform_attn.h's sample arithmetic (corners, bilinear weights)
// per (image, query, head) row, as on the CPU.
//
// A row's channels are spread over `lanes` threads (a power of two up to a warp; each thread owns 16-byte vectors
// of channels lane, lane + lanes, ...), so a corner's value row is read in one coalesced access. The row's samples
// are computed once, not once a lane: the lanes take `lanes` samples at a time, one each (its location and
// attention weight read coalesced), and leave its corner keys and weights in a shared-memory slot that the row's
// lanes then read (a broadcast); every sample's four corners are loaded before their multiply-adds, which follow
// the CPU kernel's order (acc += w0 v0 + w1 v1 + w2 v2 + w3 v3). The forward owns its output elements:
// deterministic.
//
// The level table reaches a launch either by value, checked on the host (the ORT node reads it in host memory), or
// as device tensors (the torch op's usual case: spatial_shapes on the GPU as the model made it), which every block
// copies into shared memory and checks before it reads value: a table that does not tile value's keys stops the
// kernel with a device-side assertion (as torch's own CUDA kernels do for an index out of range) instead of a copy
// to the host and a synchronization on every call.
#pragma once

#include <cassert>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda_grid.cuh"
#include "kernels/ms_deform_attn.h"

// glibc's __assert_fail, which CUDA device code may call (the bad level table's assertion): <assert.h> declares it
// only without NDEBUG, so it is declared here as torch's c10 headers declare it (the same declaration as glibc's,
// __host__ __device__ in the device pass).
#if defined(NDEBUG)
extern "C" {
#if defined(__CUDA_ARCH__)
__host__ __device__
#endif
    void __assert_fail(const char* assertion, const char* file, unsigned int line, const char* function) noexcept
    __attribute__((__noreturn__));
}
#endif

namespace opbridge::kernels::cuda {

constexpr int kMaxLevels = 32;

// The checked level table, by value.
struct MSDeformAttnLevels {
  int64_t height[kMaxLevels], width[kMaxLevels], start[kMaxLevels];
};

// Where a launch reads the level table: `levels` when `shapes` is null, else the int64 device tensors `shapes`
// [L, 2] and `starts` [L] (checked by the kernels).
struct MSDeformAttnTable {
  MSDeformAttnLevels levels{};
  const int64_t* shapes = nullptr;
  const int64_t* starts = nullptr;
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

// Why the CUDA kernels cannot take a problem of this shape (nullptr: they can): the level table lives in shared
// memory, and a sample's corner keys are held as int32.
inline const char* ms_deform_attn_unsupported(const MSDeformAttnShape& s) {
  if (s.levels > kMaxLevels) return "the CUDA kernels take up to 32 levels";
  if (s.keys >= (int64_t(1) << 31)) return "the CUDA kernels take fewer than 2^31 keys (value's dimension 1)";
  return nullptr;
}

// Threads per row for rows of `units` (channels, or vectors of them): up to a warp.
inline int ms_deform_attn_lanes(int64_t units) {
  int lanes = 1;
  while (lanes < 32 && lanes < units) lanes *= 2;
  return lanes;
}

// Loops a warp's threads over rows * lanes work items together (the bound is the same for the whole warp, so
// shuffles and __syncwarp are never reached by part of a warp).
#define OPBRIDGE_WARP_LOOP(t, total)                                            \
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       t - static_cast<int64_t>(threadIdx.x & 31) < (total); t += static_cast<int64_t>(gridDim.x) * blockDim.x)

// T values moved as one aligned load (16 bytes for float x 4 or double x 2; 8 for half x 4).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Elements a lane moves at once: 16 bytes of float or double; 4 of a half type (8 bytes), so that a row of half
// storage gets as many lanes as a float32 row and the backward's grad_value (float32 beside half) takes one float4
// atomic per vector (with 8 halves a lane, rows of 32 channels had half the lanes, and each lane twice the serial
// work: the half backward ran 0.6x the float32 one on an H200, 2026-11-28).
template <class S>
constexpr int ms_deform_attn_vector() {
  return sizeof(S) == 2 ? 4 : static_cast<int>(16 / sizeof(S));
}

// Whether the vector kernels can serve: whole vectors a row, every vector accessed aligned to its size.
template <class T>
bool ms_deform_attn_vectors(const MSDeformAttnShape& s, std::initializer_list<const void*> data) {
  constexpr int kVec = ms_deform_attn_vector<T>();
  if (s.channels % kVec != 0) return false;
  for (const void* pointer : data) {
    if (reinterpret_cast<uintptr_t>(pointer) % (sizeof(T) * kVec) != 0) return false;
  }
  return true;
}

// The level table in a block's shared memory.
struct MSDeformAttnLevelTile {
  int64_t height[kMaxLevels], width[kMaxLevels], start[kMaxLevels];
};

// Fills `tile` from `table` (needs blockDim.x >= kMaxLevels; every thread of the block calls it). A device table is
// checked as check_ms_deform_attn checks a host one: sizes in [0, 2^31), each level starting where the ones before
// it end, the levels covering value's keys exactly; anything else is a device-side assertion, before any thread
// reads value with it.
__device__ inline void ms_deform_attn_load_levels(const MSDeformAttnTable& table, const MSDeformAttnShape& s,
                                                  MSDeformAttnLevelTile& tile) {
  const int l = threadIdx.x;
  if (l < s.levels) {
    tile.height[l] = table.shapes != nullptr ? table.shapes[2 * l] : table.levels.height[l];
    tile.width[l] = table.shapes != nullptr ? table.shapes[2 * l + 1] : table.levels.width[l];
    tile.start[l] = table.shapes != nullptr ? table.starts[l] : table.levels.start[l];
  }
  __syncthreads();
  if (table.shapes != nullptr && threadIdx.x == 0) {
    constexpr int64_t kMaxSide = int64_t(1) << 31;
    int64_t total = 0;
    bool tiles = true;
    for (int64_t level = 0; tiles && level < s.levels; ++level) {
      const int64_t height = tile.height[level], width = tile.width[level];
      tiles = height >= 0 && width >= 0 && height < kMaxSide && width < kMaxSide && tile.start[level] == total;
      total += tiles ? height * width : 0;
      tiles = tiles && total <= s.keys;
    }
    if (!tiles || total != s.keys) {
      __assert_fail(
          "opbridge::ms_deform_attn: spatial_shapes [L, 2] must hold sizes in [0, 2^31) whose areas tile value's "
          "keys (dimension 1) in order, level_start_index[l] being the sum of height * width of the levels before "
          "l; pass the level table on the CPU to have it checked there with a RuntimeError",
          __FILE__, __LINE__, __func__);
    }
  }
  __syncthreads();
}

// One sample as the row's lanes read it: its corners' keys in the level's map (-1: off the map, read as zeros) and
// their weights (the forward's: attention weight times bilinear weight).
template <class T>
struct alignas(16) MSDeformAttnSlot {
  int32_t key[4];
  T weight[4];
};

// Sample i of a row (i < L * P): kernels/ms_deform_attn.h's arithmetic on its location and level, in integer
// type I (int32 where ms_deform_attn_int32_samples, else int64). P: the location's storage (T, or float16 beside
// float T: an ORT float16 model's, widened exactly).
template <class T, class I, class P = T>
__device__ inline MSDeformAttnSample<T, I> ms_deform_attn_sample_at(const P* loc, int64_t i, int64_t points,
                                                                    const MSDeformAttnLevelTile& levels) {
  const int64_t l = i / points;
  return ms_deform_attn_sample<T, I>(static_cast<T>(loc[2 * i]), static_cast<T>(loc[2 * i + 1]),
                                     static_cast<I>(levels.height[l]), static_cast<I>(levels.width[l]),
                                     static_cast<I>(levels.start[l]));
}

// Whether a sample's integers fit in int32: with fewer than 2^30 keys, a level that has any sample on it has sides
// and a start below 2^30, and its corners' keys (up to start + (y + 1) * W + x + 1) stay below 2^31.
inline bool ms_deform_attn_int32_samples(const MSDeformAttnShape& s) { return s.keys < (int64_t(1) << 30); }

// Sample i of a row as its slot (P: the storage of loc and attn, as in ms_deform_attn_sample_at).
template <class T, class I, class P = T>
__device__ inline MSDeformAttnSlot<T> ms_deform_attn_slot(const P* loc, const P* attn, int64_t i, int64_t points,
                                                          const MSDeformAttnLevelTile& levels) {
  const auto sample = ms_deform_attn_sample_at<T, I>(loc, i, points, levels);
  const T a = static_cast<T>(attn[i]);
  MSDeformAttnSlot<T> slot;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const bool inside = sample.any && sample.inside[k];
    slot.key[k] = inside ? static_cast<int32_t>(sample.key[k]) : -1;
    slot.weight[k] = inside ? a * sample.weight[k] : T(0);
  }
  return slot;
}

// The slot's four corner vectors at channel c0 of a row's value (zeros for corners off the map), their loads issued
// together before any use. S is value's storage type (T, or float16/bfloat16 beside float32 slots).
template <class S, class T, int kVec>
__device__ inline void ms_deform_attn_corners(const S* __restrict__ value_nm, const MSDeformAttnSlot<T>& slot,
                                              int64_t key_stride, int64_t c0, Vec<S, kVec> (&v)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (slot.key[k] >= 0) {
      v[k] = *reinterpret_cast<const Vec<S, kVec>*>(value_nm + static_cast<int64_t>(slot.key[k]) * key_stride + c0);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[k].v[j] = S(0.0f);
    }
  }
}

template <class T>
__device__ inline MSDeformAttnSlot<T> ms_deform_attn_empty_slot() {
  MSDeformAttnSlot<T> slot;
#pragma unroll
  for (int k = 0; k < 4; ++k) slot.key[k] = -1, slot.weight[k] = T(0);
  return slot;
}

// S: value's and out's storage type; T: the arithmetic's; P: locations' and weights' storage (S == P == T, or S
// float16/bfloat16 and T float: half storage read and written in vectors, float32 arithmetic and accumulation, one
// rounding; P float32 as autocast gives them, or float16 as in an ORT float16 model, widened exactly).
template <class S, class T, int kVec, class I, class P>
__global__ void __launch_bounds__(kThreads)
    ms_deform_attn_forward_kernel(const S* __restrict__ value, const P* __restrict__ locations,
                                  const P* __restrict__ weights, S* __restrict__ out, MSDeformAttnShape s,
                                  MSDeformAttnTable table, int lanes) {
  using V = Vec<S, kVec>;
  __shared__ MSDeformAttnLevelTile levels;
  __shared__ MSDeformAttnSlot<T> slots[kThreads];
  ms_deform_attn_load_levels(table, s, levels);
  const int64_t rows = s.batch * s.queries * s.heads, lp = s.levels * s.points, d = s.channels;
  const int64_t key_stride = s.heads * d;
  const int lane = static_cast<int>(threadIdx.x) & (lanes - 1);
  MSDeformAttnSlot<T>* group = slots + (threadIdx.x - lane);  // the row's lanes' slots
  OPBRIDGE_WARP_LOOP(t, rows * lanes) {
    const bool active = t < rows * lanes;
    const int64_t row = active ? t / lanes : 0, m = row % s.heads, n = row / (s.heads * s.queries);
    const S* value_nm = value + (n * s.keys * s.heads + m) * d;
    const P* loc = locations + row * lp * 2;
    const P* attn = weights + row * lp;
    for (int64_t c_base = 0; c_base < d; c_base += static_cast<int64_t>(lanes) * kVec) {
      const int64_t c0 = c_base + lane * kVec;
      const bool mine = active && c0 < d;
      T acc[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = T(0);
      for (int64_t first = 0; first < lp; first += lanes) {
        group[lane] = active && first + lane < lp
                          ? ms_deform_attn_slot<T, I, P>(loc, attn, first + lane, s.points, levels)
                          : ms_deform_attn_empty_slot<T>();
        __syncwarp();
        const int count = static_cast<int>(lp - first < lanes ? lp - first : lanes);
        if (mine) {
#pragma unroll 2
          for (int i = 0; i < count; ++i) {
            const MSDeformAttnSlot<T> slot = group[i];
            V v[4];
            ms_deform_attn_corners(value_nm, slot, key_stride, c0, v);
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              acc[j] += slot.weight[0] * static_cast<T>(v[0].v[j]) + slot.weight[1] * static_cast<T>(v[1].v[j]) +
                        slot.weight[2] * static_cast<T>(v[2].v[j]) + slot.weight[3] * static_cast<T>(v[3].v[j]);
            }
          }
        }
        __syncwarp();  // the slots are read before the next samples overwrite them
      }
      if (mine) {
        V result;
#pragma unroll
        for (int j = 0; j < kVec; ++j) result.v[j] = S(acc[j]);
        *reinterpret_cast<V*>(out + row * d + c0) = result;
      }
    }
  }
}

// Launches the forward on `stream` (contiguous value [N, S, M, D], locations [N, Q, M, L, P, 2], weights
// [N, Q, M, L, P], out [N, Q, M * D]; ms_deform_attn_unsupported(s) == nullptr); returns the launch's error
// (cudaSuccess when it started). value and out in storage type S, locations and weights in P: all float or all
// double, or S __half/__nv_bfloat16 beside P float32 (autocast's) or P == S __half (an ORT float16 model's); the
// arithmetic T is float for all but double.
template <class S, class P>
cudaError_t ms_deform_attn_forward(const S* value, const P* locations, const P* weights, S* out,
                                   const MSDeformAttnShape& s, const MSDeformAttnTable& table, cudaStream_t stream) {
  using T = std::conditional_t<std::is_same_v<S, double>, double, float>;
  static_assert(std::is_same_v<P, T> || std::is_same_v<P, S>, "locations and weights: value's type or float32");
  constexpr int kVec = ms_deform_attn_vector<S>();
  const bool vectors = ms_deform_attn_vectors<S>(s, {value, out});
  const int lanes = ms_deform_attn_lanes(vectors ? s.channels / kVec : s.channels);
  const unsigned blocks = blocks_for(s.batch * s.queries * s.heads * lanes);
  const bool int32 = ms_deform_attn_int32_samples(s);
  auto kernel = vectors ? (int32 ? ms_deform_attn_forward_kernel<S, T, kVec, int32_t, P>
                                 : ms_deform_attn_forward_kernel<S, T, kVec, int64_t, P>)
                        : (int32 ? ms_deform_attn_forward_kernel<S, T, 1, int32_t, P>
                                 : ms_deform_attn_forward_kernel<S, T, 1, int64_t, P>);
  kernel<<<blocks, kThreads, 0, stream>>>(value, locations, weights, out, s, table, lanes);
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
