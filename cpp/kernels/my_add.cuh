// my_add on CUDA, shared by the torch CUDA op (cpp/cuda/my_add.cu) and the ORT CUDA library (cpp/ort/cuda):
// kernels/my_add.h's my_add_one per element, inputs addressed through their own (broadcast) strides as on the CPU
// (kernels/broadcast.h's BinaryLoop); float32, float64, float16 and bfloat16 (__half, __nv_bfloat16: computed in float,
// rounded once).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/broadcast.h"
#include "kernels/cuda_grid.cuh"
#include "kernels/my_add.h"

namespace opbridge::kernels::cuda {

constexpr int kMaxAddRank = 16;

// The output's (merged) sizes and each input's strides, by value.
struct AddIndexer {
  int rank = 0;
  int64_t sizes[kMaxAddRank], a_strides[kMaxAddRank], b_strides[kMaxAddRank];
};

template <class T, class Acc>
__global__ void my_add_kernel(const T* a, const T* b, T* out, AddIndexer ix, int64_t n) {
  OPBRIDGE_GRID_LOOP(i, n) {
    int64_t rest = i, a_offset = 0, b_offset = 0;
    for (int d = ix.rank - 1; d >= 0; --d) {
      const int64_t index = rest % ix.sizes[d];
      rest /= ix.sizes[d];
      a_offset += index * ix.a_strides[d];
      b_offset += index * ix.b_strides[d];
    }
    out[i] = my_add_one<T, Acc>(a[a_offset], b[b_offset]);
  }
}

template <class T, class Acc>
__global__ void my_add_contiguous_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                         int64_t n) {
  OPBRIDGE_GRID_LOOP(i, n) { out[i] = my_add_one<T, Acc>(a[i], b[i]); }
}

// Whether the launcher takes `loop` (up to kMaxAddRank dimensions after merging).
inline bool my_add_fits(const BinaryLoop& loop) { return loop.sizes.size() <= kMaxAddRank; }

// out = 2 a + b over `loop` (my_add_fits(loop)), on `stream`; returns the launch's error.
template <class T, class Acc>
cudaError_t my_add(const T* a, const T* b, T* out, const BinaryLoop& loop, cudaStream_t stream) {
  AddIndexer ix;
  ix.rank = static_cast<int>(loop.sizes.size());
  for (int d = 0; d < ix.rank; ++d) {
    ix.sizes[d] = loop.sizes[d], ix.a_strides[d] = loop.a_strides[d], ix.b_strides[d] = loop.b_strides[d];
  }
  const unsigned blocks = blocks_for(loop.numel);
  if (ix.rank == 1 && ix.a_strides[0] == 1 && ix.b_strides[0] == 1) {
    my_add_contiguous_kernel<T, Acc><<<blocks, kThreads, 0, stream>>>(a, b, out, loop.numel);
  } else {
    my_add_kernel<T, Acc><<<blocks, kThreads, 0, stream>>>(a, b, out, ix, loop.numel);
  }
  return cudaGetLastError();
}

}  // namespace opbridge::kernels::cuda
