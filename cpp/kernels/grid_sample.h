// 2-D grid sampling with torch.nn.functional.grid_sample's semantics, framework-free: the kernel behind the
// grid_sampler nodes that mmcv's and mmdeploy's exporters write (mmcv::grid_sampler, mmdeploy::grid_sampler).
//
// input [N, C, H, W], grid [N, Ho, Wo, 2] holding (x, y) in [-1, 1] -> out [N, C, Ho, Wo].
// - A coordinate maps to pixels as ((g + 1) / 2) * (size - 1) with align_corners, else ((g + 1) * size - 1) / 2.
// - padding: zeros (taps outside the map read 0), border (the coordinate is clamped onto [0, size - 1]),
//   reflection (reflected about the border pixels' centers with align_corners, their edges without, then
//   clamped).
// - interpolation: bilinear (4 taps), nearest (1 tap, ties to even as torch's nearbyint), bicubic (16 taps,
//   Keys' convolution with A = -0.75; padding applies to each tap, as in torch).
// - A NaN or infinite grid coordinate reads nothing: the output is 0 there (torch's CUDA kernel does the same;
//   its CPU kernel is not consistent about it).
// Arithmetic is in T, as torch's kernels compute in the input's type.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/broadcast.h"
#include "kernels/grid_sample_taps.h"
#include "kernels/scratch.h"

namespace opbridge::kernels {

namespace grid_sample_detail {

// One output pixel's taps as the channel loop reads them: K offsets into a plane and K weights (0 for a tap
// outside the map, whose offset is 0), and a bit per tap that lies on the map.
template <class T, int K, class Index>
struct PackedTaps {
  Index offset[K];
  T weight[K];
  uint32_t inside = 0;
};

// Output pixels [begin, end) of `count` channels (`Group` at a time, a compile-time count so that a pixel's taps stay
// in registers across its channels) from their planes at source + i * plane into target + i * pixels.
template <int Group, class T, int K, class Index>
void sample_channels(const PackedTaps<T, K, Index>* packed, int64_t begin, int64_t end, const T* source, int64_t plane,
                     T* target, int64_t pixels, int64_t count) {
  constexpr uint32_t kAll = K == 32 ? ~0u : (1u << K) - 1;
  for (int64_t first = 0; first + Group <= count; first += Group) {
    const T* planes = source + first * plane;
    T* rows = target + first * pixels;
    for (int64_t p = begin; p < end; ++p) {
      const auto& t = packed[p];
      if (t.inside == kAll) {  // the common case: every tap on the map
        for (int g = 0; g < Group; ++g) {
          const T* map = planes + g * plane;
          T sum = 0;
          for (int k = 0; k < K; ++k) sum += t.weight[k] * map[t.offset[k]];
          rows[g * pixels + p] = sum;
        }
      } else {  // a tap outside adds nothing (not 0 times pixel 0: a NaN there would show)
        for (int g = 0; g < Group; ++g) {
          const T* map = planes + g * plane;
          T sum = 0;
          for (int k = 0; k < K; ++k) {
            if ((t.inside >> k) & 1u) sum += t.weight[k] * map[t.offset[k]];
          }
          rows[g * pixels + p] = sum;
        }
      }
    }
  }
}

// Image by image and span by span of output pixels: the taps of every pixel first (in parallel over pixel
// blocks), then the channels (in parallel over channel group x block, channel-major), so the coordinate
// arithmetic does not repeat per channel and one image with many channels still spreads over the threads.
template <int K, class Index, class T, class ParallelFor>
void grid_sample_with(const T* input, const T* grid, T* out, const GridSampleShape& s, const GridSampleAttributes& a,
                      ParallelFor&& parallel_for) {
  constexpr int64_t kBlock = 2048, kChannels = 4;
  // The taps of at most this many pixels are held at once (a bicubic tap set is 132 bytes).
  constexpr int64_t kSpan = 32 * kBlock;
  const int64_t pixels = s.out_height * s.out_width, plane = s.height * s.width;
  std::vector<PackedTaps<T, K, Index>> packed(static_cast<size_t>(std::min(pixels, kSpan)));
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t span = 0; span < pixels; span += kSpan) {
      const int64_t span_size = std::min(kSpan, pixels - span), blocks = (span_size + kBlock - 1) / kBlock;
      parallel_for(blocks, [&](int64_t block) {
        const int64_t begin = block * kBlock, end = std::min(begin + kBlock, span_size);
        const T* g = grid + (n * pixels + span + begin) * 2;
        for (int64_t p = begin; p < end; ++p, g += 2) {
          const auto t = taps_at<T, K>(g[0], g[1], s, a);
          auto& out_taps = packed[p];
          out_taps.inside = 0;
          for (int k = 0; k < K; ++k) {
            out_taps.offset[k] = static_cast<Index>(t.offset[k]);
            out_taps.weight[k] = t.valid[k] ? t.weight[k] : T(0);
            out_taps.inside |= static_cast<uint32_t>(t.valid[k]) << k;
          }
        }
      });
      // Channel-major tasks of kChannels channels x one block of pixels: the random reads go to a few planes that
      // stay in L1/L2 while the taps stream past in order, read once per group (measured on the MSDA level case,
      // 8 x 32 channels of 100 x 100, 1 thread: 2.3x faster than block-major single channels, whose reads went to
      // an image's 32 planes (1.3 MB) afresh for every block; groups of 4 beat 1 and 8).
      const int64_t groups = (s.channels + kChannels - 1) / kChannels;
      parallel_for(groups * blocks, [&](int64_t task) {
        const int64_t c = task / blocks * kChannels, begin = task % blocks * kBlock;
        const int64_t end = std::min(begin + kBlock, span_size);
        const T* source = input + (n * s.channels + c) * plane;
        T* target = out + (n * s.channels + c) * pixels + span;
        if (c + kChannels <= s.channels) {
          sample_channels<kChannels>(packed.data(), begin, end, source, plane, target, pixels, kChannels);
        } else {
          sample_channels<1>(packed.data(), begin, end, source, plane, target, pixels, s.channels - c);
        }
      });
    }
  }
}

// Channels-last sampling, for grids that read every input pixel several times (out_pixels >= plane; Mask2Former's
// and DINO's MSDA levels through grid_sample: 40,000 samples of a 100 x 100 map per head): each image is first
// copied channels-last, [plane, C], so a tap reads one contiguous row of C channels and the channel loop is a
// vector loop; each pixel's taps are computed once, right where they are used. Blocks of pixels collect their
// outputs in a tile [pixels, C] on the stack, then written out channel by channel. Every output sums the same
// products in the same order as sample_channels (0, then each tap on the map, in tap order), so both layouts give
// the same bits. That MSDA level (8 x 32 channels, 1 thread, AMD EPYC Zen 5, best of 30 in a C++ driver, grid
// points near their query): 14.4 ms planar, 11.4 ms channels-last (16-channel vectors across the taps, 4 x 4
// transposes out of the tile); in ORT against its own GridSample (bench, uniform grid) 0.99-1.08x -> 1.15x, 1.32x
// at 2 threads.
constexpr int64_t kTileFloats = 4096;
typedef float Float4 __attribute__((vector_size(16)));  // NOLINT: GCC/Clang vector extension, any x86-64 or Arm

template <class V, class T>
inline V load_vector(const T* from) {
  V v;
  std::memcpy(&v, from, sizeof v);
  return v;
}

template <int K, class T, class ParallelFor>
void grid_sample_channels_last(const T* input, const T* grid, T* out, const GridSampleShape& s,
                               const GridSampleAttributes& a, ParallelFor&& parallel_for) {
  const int64_t pixels = s.out_height * s.out_width, plane = s.height * s.width, channels = s.channels;
  // The image's channels-last copy: scratch memory the thread keeps (not zeroed, not mapped afresh per call).
  const ThreadScratch copy(sizeof(T) * static_cast<size_t>(plane * channels));
  T* const rows = copy.get<T>();
  constexpr int64_t kCopyBlock = 64;
  const int64_t block = std::max<int64_t>(1, kTileFloats / channels);
  for (int64_t n = 0; n < s.batch; ++n) {
    const T* image = input + n * channels * plane;
    parallel_for((plane + kCopyBlock - 1) / kCopyBlock, [&](int64_t task) {
      const int64_t begin = task * kCopyBlock, end = std::min(begin + kCopyBlock, plane);
      for (int64_t c = 0; c < channels; ++c) {
        const T* from = image + c * plane;
        for (int64_t i = begin; i < end; ++i) rows[i * channels + c] = from[i];
      }
    });
    const T* g = grid + n * pixels * 2;
    T* image_out = out + n * channels * pixels;
    parallel_for((pixels + block - 1) / block, [&](int64_t task) {
      alignas(64) T tile[kTileFloats];
      const int64_t begin = task * block, end = std::min(begin + block, pixels);
      for (int64_t p = begin; p < end; ++p) {
        const auto t = taps_at<T, K>(g[2 * p], g[2 * p + 1], s, a);
        const T* tap_rows[K];
        T weights[K];
        int used = 0;
        for (int k = 0; k < K; ++k) {
          if (!t.valid[k]) continue;  // adds nothing (not 0 times pixel 0: a NaN there would show)
          tap_rows[used] = rows + t.offset[k] * channels;
          weights[used++] = t.weight[k];
        }
        T* sum = tile + (p - begin) * channels;
        int64_t c = 0;
        if constexpr (std::is_same_v<T, float>) {  // 16 sums in four 16-byte vectors across the taps
          using V = Float4;
          for (; c + 16 <= channels; c += 16) {
            V acc[4] = {};
            for (int k = 0; k < used; ++k) {
              const V weight = V{} + weights[k];
              for (int j = 0; j < 4; ++j) acc[j] += weight * load_vector<V>(tap_rows[k] + c + 4 * j);
            }
            std::memcpy(sum + c, acc, sizeof acc);
          }
        }
        for (; c < channels; ++c) {
          T acc = 0;
          for (int k = 0; k < used; ++k) acc += weights[k] * tap_rows[k][c];
          sum[c] = acc;
        }
      }
      int64_t c = 0;
      if constexpr (std::is_same_v<T, float>) {  // 4 x 4 blocks: 4 pixels' 4 channels to 4 channels' 4 pixels
        for (; c + 4 <= channels; c += 4) {
          T* target = image_out + c * pixels;
          int64_t p = begin;
          for (; p + 4 <= end; p += 4) {
            const T* from = tile + (p - begin) * channels + c;
            const Float4 r0 = load_vector<Float4>(from), r1 = load_vector<Float4>(from + channels);
            const Float4 r2 = load_vector<Float4>(from + 2 * channels), r3 = load_vector<Float4>(from + 3 * channels);
            for (int j = 0; j < 4; ++j) {
              const Float4 column = {r0[j], r1[j], r2[j], r3[j]};
              std::memcpy(target + j * pixels + p, &column, sizeof column);
            }
          }
          for (; p < end; ++p) {
            for (int j = 0; j < 4; ++j) target[j * pixels + p] = tile[(p - begin) * channels + c + j];
          }
        }
      }
      for (; c < channels; ++c) {
        T* target = image_out + c * pixels;
        for (int64_t p = begin; p < end; ++p) target[p] = tile[(p - begin) * channels + c];
      }
    });
  }
}

// Channels-last where the grid reads every input pixel a few times over and a tile holds a pixel's channels.
inline bool grid_sample_channels_last_pays(const GridSampleShape& s) {
  return s.channels >= 4 && s.channels <= kTileFloats && s.out_height * s.out_width >= 2 * s.height * s.width;
}

template <class Index, class T, class ParallelFor>
void grid_sample_dispatch(const T* input, const T* grid, T* out, const GridSampleShape& s,
                          const GridSampleAttributes& a, ParallelFor&& parallel_for) {
  if (grid_sample_channels_last_pays(s)) {
    switch (static_cast<GridInterpolation>(a.interpolation)) {
      case GridInterpolation::nearest:
        return grid_sample_channels_last<1>(input, grid, out, s, a, parallel_for);
      case GridInterpolation::bicubic:
        return grid_sample_channels_last<16>(input, grid, out, s, a, parallel_for);
      default:
        return grid_sample_channels_last<4>(input, grid, out, s, a, parallel_for);
    }
  }
  switch (static_cast<GridInterpolation>(a.interpolation)) {
    case GridInterpolation::nearest:
      return grid_sample_with<1, Index>(input, grid, out, s, a, parallel_for);
    case GridInterpolation::bicubic:
      return grid_sample_with<16, Index>(input, grid, out, s, a, parallel_for);
    default:
      return grid_sample_with<4, Index>(input, grid, out, s, a, parallel_for);
  }
}

}  // namespace grid_sample_detail

template <class T, class ParallelFor>
void grid_sample(const T* input, const T* grid, T* out, const GridSampleShape& s, const GridSampleAttributes& a,
                 ParallelFor&& parallel_for) {
  if (s.batch == 0 || s.out_height * s.out_width == 0 || s.channels == 0) return;
  // 32-bit offsets where a plane allows them: smaller taps, less to read per channel.
  if (s.height * s.width <= INT32_MAX) {
    grid_sample_detail::grid_sample_dispatch<int32_t>(input, grid, out, s, a, parallel_for);
  } else {
    grid_sample_detail::grid_sample_dispatch<int64_t>(input, grid, out, s, a, parallel_for);
  }
}

}  // namespace opbridge::kernels
