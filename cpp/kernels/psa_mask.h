// PSANet's point-wise spatial attention masks (mmcv's PSAMask), framework-free: the kernel behind
// mmcv::MMCVPSAMask.
//
// input [N, hm * wm, H, W] holds, at each position (h, w), an hm x wm window of attention weights centred on it
// (centre ((hm - 1) / 2, (wm - 1) / 2), integer division); output [N, H * W, H, W], zero where no window reaches:
// - collect (psa_type 0): out[n, y * W + x, h, w] = in[n, i * wm + j, h, w],
// - distribute (psa_type 1): out[n, h * W + w, y, x] = in[n, i * wm + j, h, w],
// for every window cell (i, j) whose map position (y, x) = (h + i - (hm - 1) / 2, w + j - (wm - 1) / 2) lies on
// the map.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/broadcast.h"

namespace opbridge::kernels {

struct PsaMaskShape {
  int64_t batch = 0, height = 0, width = 0, mask_h = 0, mask_w = 0;
  bool distribute = false;
};

inline Status check_psa_mask(const char* op, const std::vector<int64_t>& input, int64_t psa_type,
                             const std::vector<int64_t>& mask_size, PsaMaskShape& shape) {
  const std::string prefix = std::string(op) + ": ";
  if (psa_type != 0 && psa_type != 1) {
    return {prefix + "attribute 'psa_type' must be 0 (collect) or 1 (distribute), got " + std::to_string(psa_type)};
  }
  if (mask_size.size() != 2 || mask_size[0] < 1 || mask_size[1] < 1 || mask_size[0] > 4096 || mask_size[1] > 4096) {
    return {prefix + "attribute 'mask_size' must be two integers (height, width) in [1, 4096], got " +
            shape_to_string(mask_size)};
  }
  if (input.size() != 4 || input[1] != mask_size[0] * mask_size[1]) {
    return {prefix + "input input (index 0) must have shape [batch, mask_h * mask_w = " +
            std::to_string(mask_size[0] * mask_size[1]) + ", height, width], got " + shape_to_string(input)};
  }
  int64_t numel = 0, pixels = 0;
  if (!checked_numel(input, numel) || !checked_numel({input[2], input[3]}, pixels) ||
      !checked_numel({input[0], pixels, pixels}, numel)) {
    return {prefix + "the output [batch, height * width, height, width] of input " + shape_to_string(input) +
            " has too many elements"};
  }
  shape = {input[0], input[2], input[3], mask_size[0], mask_size[1], psa_type == 1};
  return {};
}

// `out` must be zeroed by the caller. One task per (image, row h): collect writes the elements at (h, w) of
// every channel, distribute the channels h * W + w; no two tasks write the same element.
template <class T, class ParallelFor>
void psa_mask(const T* input, T* out, const PsaMaskShape& s, ParallelFor&& parallel_for) {
  const int64_t pixels = s.height * s.width;
  const int64_t half_h = (s.mask_h - 1) / 2, half_w = (s.mask_w - 1) / 2;
  parallel_for(s.batch * s.height, [&](int64_t task) {
    const int64_t n = task / s.height, h = task % s.height;
    const T* in = input + n * s.mask_h * s.mask_w * pixels;
    T* o = out + n * pixels * pixels;
    const int64_t i_begin = std::max<int64_t>(0, half_h - h), i_end = std::min(s.mask_h, s.height + half_h - h);
    for (int64_t w = 0; w < s.width; ++w) {
      const int64_t j_begin = std::max<int64_t>(0, half_w - w), j_end = std::min(s.mask_w, s.width + half_w - w);
      for (int64_t i = i_begin; i < i_end; ++i) {
        for (int64_t j = j_begin; j < j_end; ++j) {
          const int64_t position = (h + i - half_h) * s.width + (w + j - half_w);
          const T value = in[(i * s.mask_w + j) * pixels + h * s.width + w];
          if (s.distribute) {
            o[(h * s.width + w) * pixels + position] = value;
          } else {
            o[position * pixels + h * s.width + w] = value;
          }
        }
      }
    }
  });
}

}  // namespace opbridge::kernels
