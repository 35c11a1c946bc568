// The deformable convolution's CUDA pieces shared by the torch CUDA op (cpp/cuda/deform_conv2d.cu) and the ORT
// CUDA library (cpp/ort/cuda): a tap's sample (kernels/deform_conv2d.h's position and BilinearPoint, as on the
// CPU), a fused forward that needs no matrix library, and the im2col forward's kernels (columns, then a GEMM by
// whichever matrix library the caller has: torch's matmul, or the ORT process's cuBLAS).
//
// The fused forward is an implicit GEMM: out[image, o, p] = sum over (c, tap) of W[o, c, tap] * column[(c, tap),
// (image, p)], where a block computes a 64 x 64 tile of (output channel, image pixel) and samples its 16-row slices
// of the columns into shared memory as it goes (no columns in device memory). Each output element is owned by one
// thread: deterministic. The im2col path is faster where a cuBLAS is at hand (the torch op's, and the ORT node's
// where the process has loaded one). Storage S is the
// arithmetic's type T, or __half (an ORT float16 model's tensors) beside float32 arithmetic: each value is read
// widened, the tiles and sums are float32, and the output is rounded once.
#pragma once

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda_grid.cuh"
#include "kernels/deform_conv2d.h"
#include "kernels/deform_conv2d_backward.h"

namespace opbridge::kernels::cuda {

// The sample of tap k = (i, j) for output pixel p = (oy, ox) of `image`, in offset group og. I: the integer type of
// the sample's arithmetic (int32 where deform_conv2d_int32_samples says so, else int64); S: the offsets' storage.
template <class T, class I = int64_t, class S = T>
__device__ inline BilinearPoint<T, I> sample_at(const DeformConv2dShape& s, const S* offset, int64_t image, int64_t og,
                                                int64_t k, I i, I j, int64_t p, I oy, I ox) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  const S* dy = offset + ((image * s.offset_groups + og) * taps + k) * 2 * pixels;
  T y, x;
  kernels::deform_conv2d_position<T, I>(s, oy, ox, i, j, static_cast<T>(dy[p]), static_cast<T>(dy[pixels + p]), y, x);
  return BilinearPoint<T, I>(y, x, static_cast<I>(s.height), static_cast<I>(s.width));
}

// Whether every integer of a sample fits in int32 (grid positions, corner coordinates, indices in the input plane):
// then the kernels convert between the positions' floats and int32, several times cheaper than int64.
inline bool deform_conv2d_int32_samples(const DeformConv2dShape& s) {
  constexpr int64_t kLimit = int64_t(1) << 30;
  return s.height * s.width < kLimit && s.out_h * s.stride_h + s.kernel_h * s.dilation_h < kLimit &&
         s.out_w * s.stride_w + s.kernel_w * s.dilation_w < kLimit && s.pad_top < kLimit && s.pad_left < kLimit;
}

// for each tap k = (i, j) of the kernel, without a division per tap.
#define OPBRIDGE_FOR_EACH_TAP(s, k, i, j)           \
  for (int64_t i = 0, k = 0; i < (s).kernel_h; ++i) \
    for (int64_t j = 0; j < (s).kernel_w; ++j, ++k)

// The mask of a sample (1 without a mask) as T, from its storage S.
template <class T, class S>
__device__ inline T mask_at(const DeformConv2dShape& s, const S* mask, int64_t image, int64_t og, int64_t k,
                            int64_t p) {
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w;
  return mask != nullptr ? static_cast<T>(mask[((image * s.offset_groups + og) * taps + k) * pixels + p]) : T(1);
}

template <class S, class T>
__global__ void deform_conv2d_fused_kernel(const S* __restrict__ input, const S* __restrict__ weight,
                                           const S* __restrict__ offset, const S* __restrict__ mask,
                                           const S* __restrict__ bias, DeformConv2dShape s, S* __restrict__ out) {
  constexpr int kTile = 64, kDepth = 16;
  __shared__ T w_tile[kDepth][kTile];  // [tap row, output channel]
  __shared__ T c_tile[kDepth][kTile];  // [tap row, column]
  const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, plane = s.height * s.width;
  const int64_t columns = s.batch * pixels, per_group = s.in_channels / s.groups;
  const int64_t out_per_group = s.out_channels / s.groups, depth = per_group * taps;
  const int64_t per_offset_group = s.in_channels / s.offset_groups;
  const int64_t group = blockIdx.z, o0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t column0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // 4 x 4 outputs each: columns tx * 4.., rows ty * 4..
  T acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = T(0);
  }
  for (int64_t k0 = 0; k0 < depth; k0 += kDepth) {
    for (int e = threadIdx.x; e < kDepth * kTile; e += blockDim.x) {
      const int kk = e % kDepth, oo = e / kDepth;  // a row's taps by neighbouring threads
      const int64_t o = o0 + oo, k = k0 + kk;
      w_tile[kk][oo] =
          o < out_per_group && k < depth ? static_cast<T>(weight[(group * out_per_group + o) * depth + k]) : T(0);
    }
    for (int e = threadIdx.x; e < kDepth * kTile; e += blockDim.x) {
      const int kk = e / kTile, cc = e % kTile;  // neighbouring pixels by neighbouring threads
      const int64_t k = k0 + kk, column = column0 + cc;
      T sampled = T(0);
      if (k < depth && column < columns) {
        const int64_t c = group * per_group + k / taps, tap = k % taps, image = column / pixels, p = column % pixels;
        const int64_t og = c / per_offset_group;
        const auto point = sample_at<T, int64_t>(s, offset, image, og, tap, tap / s.kernel_w, tap % s.kernel_w, p,
                                                 p / s.out_w, p % s.out_w);
        T v[4];
        point.values(input + (image * s.in_channels + c) * plane, s.width, v);
        sampled = point.value(v) * mask_at<T>(s, mask, image, og, tap, p);
      }
      c_tile[kk][cc] = sampled;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; ++kk) {
      T a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = w_tile[kk][ty * 4 + i], b[i] = c_tile[kk][tx * 4 + i];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t o = o0 + ty * 4 + i;
    if (o >= out_per_group) continue;
    const int64_t channel = group * out_per_group + o;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t column = column0 + tx * 4 + j;
      if (column >= columns) continue;
      const int64_t image = column / pixels, p = column % pixels;
      out[(image * s.out_channels + channel) * pixels + p] =
          static_cast<S>(acc[i][j] + (bias != nullptr ? static_cast<T>(bias[channel]) : T(0)));
    }
  }
}

// The fused forward on `stream` over contiguous NCHW input, weight [C_out, C_in / groups, kh, kw], offset, mask
// (or null) and bias (or null); returns the launch's error (cudaErrorInvalidConfiguration beyond the grid's
// limits: more than 65535 groups or 65535 * 64 output channels a group). S: float, double, or __half (float32
// arithmetic).
template <class S>
cudaError_t deform_conv2d_forward(const S* input, const S* weight, const S* offset, const S* mask, const S* bias,
                                  const DeformConv2dShape& s, S* out, cudaStream_t stream) {
  using T = std::conditional_t<std::is_same_v<S, double>, double, float>;
  const int64_t columns = s.batch * s.out_h * s.out_w, out_per_group = s.out_channels / s.groups;
  const int64_t x = (columns + 63) / 64, y = (out_per_group + 63) / 64;
  if (x > 0x7fffffff || y > 65535 || s.groups > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(s.groups));
  deform_conv2d_fused_kernel<S, T><<<grid, kThreads, 0, stream>>>(input, weight, offset, mask, bias, s, out);
  return cudaGetLastError();
}

// --- im2col + a matrix library: the torch op's forward (torch's matmul) and the ORT node's (the process's cuBLAS)

// Bytes of columns per chunk of images.
constexpr int64_t kColumnBudget = int64_t(256) << 20;

// columns[(c * K + k), b * P + p] for images [first, first + count): one thread per (block of up to
// kIm2colChannels channels of one offset group, tap, image, pixel). A tap's sample (position, cell, corners,
// weights) belongs to the offset group, not the channel: it is computed once and read from each channel's plane
// (one thread per channel recomputed it for every channel: most of the kernel's time).
constexpr int64_t kIm2colChannels = 16;

inline int64_t im2col_threads(const DeformConv2dShape& s, int64_t width) {
  const int64_t per_offset_group = s.in_channels / s.offset_groups;
  const int64_t blocks = (per_offset_group + kIm2colChannels - 1) / kIm2colChannels;
  return s.offset_groups * blocks * s.kernel_h * s.kernel_w * width;
}

template <class T, class I>
__global__ void im2col_kernel(const T* __restrict__ input, const T* __restrict__ offset, const T* __restrict__ mask,
                              DeformConv2dShape s, int64_t first, int64_t count, T* __restrict__ columns) {
  const I taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, out_w = s.out_w, kernel_w = s.kernel_w;
  const I width = count * pixels, per_offset_group = s.in_channels / s.offset_groups;
  const I blocks = (per_offset_group + kIm2colChannels - 1) / kIm2colChannels;  // channel blocks an offset group
  const int64_t plane = s.height * s.width;
  OPBRIDGE_GRID_LOOP_AS(I, t, s.offset_groups * blocks * taps * width) {
    const I rest = t / width, column = t - rest * width;  // rest = (og * blocks + block) * taps + k
    const I group_block = rest / taps, k = rest - group_block * taps;
    const I og = group_block / blocks, block = group_block - og * blocks;
    const I b = column / pixels, p = column - b * pixels, oy = p / out_w, ox = p - oy * out_w;
    const I i = k / kernel_w, j = k - i * kernel_w;
    const int64_t image = first + b;
    const auto point = sample_at<T, I>(s, offset, image, og, k, i, j, p, oy, ox);
    const T m = mask_at<T>(s, mask, image, og, k, p);
    // The sample's corners and weights, as BilinearPoint::values and ::value form them for every channel.
    I corner_offset[4];
    T weight[4];
#pragma unroll
    for (int corner = 0; corner < 4; ++corner) {
      corner_offset[corner] = point.corner[corner] ? point.index(corner, static_cast<I>(s.width)) : I(0);
      weight[corner] = point.weight(corner);
    }
    const I c_first = og * per_offset_group + block * static_cast<I>(kIm2colChannels);
    const I c_end = min(c_first + static_cast<I>(kIm2colChannels), (og + 1) * per_offset_group);
    const T* source = input + (image * s.in_channels + c_first) * plane;
    T* target = columns + (static_cast<int64_t>(c_first) * taps + k) * width + column;
    const int64_t target_step = static_cast<int64_t>(taps) * width;
#pragma unroll 4
    for (I c = c_first; c < c_end; ++c, source += plane, target += target_step) {
      T v[4];
#pragma unroll
      for (int corner = 0; corner < 4; ++corner)
        v[corner] = point.corner[corner] ? source[corner_offset[corner]] : T(0);
      T sum = T(0);
      if (point.inside) {
#pragma unroll
        for (int corner = 0; corner < 4; ++corner) sum += weight[corner] * v[corner];
      }
      *target = sum * m;
    }
  }
}

// out[first + b, o, p] = buffer[o, b * P + p] (+ bias[o]).
template <class T, class I>
__global__ void scatter_out_kernel(const T* __restrict__ buffer, const T* __restrict__ bias, DeformConv2dShape s,
                                   int64_t first, int64_t count, T* __restrict__ out) {
  const I pixels = s.out_h * s.out_w, width = count * pixels;
  OPBRIDGE_GRID_LOOP_AS(I, t, s.out_channels * width) {
    const I o = t / width, column = t - o * width, b = column / pixels, p = column - b * pixels;
    out[((first + b) * s.out_channels + o) * pixels + p] = buffer[t] + (bias != nullptr ? bias[o] : T(0));
  }
}

// Images per chunk: as many as keep the columns within the budget.
inline int64_t chunk_images(const DeformConv2dShape& s, size_t element_size) {
  const int64_t per_image =
      s.in_channels * s.kernel_h * s.kernel_w * s.out_h * s.out_w * static_cast<int64_t>(element_size);
  return std::clamp<int64_t>(kColumnBudget / std::max<int64_t>(1, per_image), 1, std::max<int64_t>(1, s.batch));
}

// Calls f(int32_t{}) where every loop of the kernels over a chunk of `chunk` images counts below kInt32Loop and a
// sample's integers fit in int32 (deform_conv2d_int32_samples), else f(int64_t{}).
template <class F>
void with_index_type(const DeformConv2dShape& s, int64_t chunk, F&& f) {
  const int64_t width = chunk * s.out_h * s.out_w, taps = s.kernel_h * s.kernel_w;
  const int64_t largest = std::max(
      {s.in_channels * width, s.out_channels * width, s.offset_groups * taps * width, im2col_threads(s, width)});
  if (largest < kernels::cuda::kInt32Loop && kernels::cuda::deform_conv2d_int32_samples(s)) {
    f(int32_t{});
  } else {
    f(int64_t{});
  }
}

}  // namespace opbridge::kernels::cuda
