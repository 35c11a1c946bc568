// The deformable convolution's CUDA pieces shared by the torch CUDA op (cpp/cuda/deform_conv2d.cu) and the ORT
// CUDA library (cpp/ort/cuda): a tap's sample (kernels/deform_conv2d.h's position and BilinearPoint, as on the
// CPU) and a fused forward that needs no matrix library.
//
// The fused forward is an implicit GEMM: out[image, o, p] = sum over (c, tap) of W[o, c, tap] * column[(c, tap),
// (image, p)], where a block computes a 64 x 64 tile of (output channel, image pixel) and samples its 16-row slices
// of the columns into shared memory as it goes (no columns in device memory). Each output element is owned by one
// thread: deterministic. The torch op keeps its im2col + cuBLAS path (cuBLAS is there). Storage S is the
// arithmetic's type T, or __half (an ORT float16 model's tensors) beside float32 arithmetic: each value is read
// widened, the tiles and sums are float32, and the output is rounded once.
#pragma once

#include <cuda_fp16.h>

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

}  // namespace opbridge::kernels::cuda
