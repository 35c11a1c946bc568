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
#include "kernels/device.h"

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

// Where output element (channel q, row a, column b) of an image comes from: its input element's index within the
// image's input [hm * wm, H, W], or -1 where no window reaches it (the output is 0 there). Collect: q is the map
// position (y, x) and (a, b) the window's centre (h, w); distribute: q is the centre and (a, b) the position. The
// CPU kernel below and the CUDA one (kernels/psa_mask.cuh) both gather through it.
OPBRIDGE_HD_INLINE int64_t psa_mask_source(const PsaMaskShape& s, int64_t q, int64_t a, int64_t b) {
  const int64_t qy = q / s.width, qx = q - qy * s.width;
  const int64_t half_h = (s.mask_h - 1) / 2, half_w = (s.mask_w - 1) / 2;
  // The window cell (i, j) centred on (h, w) that covers (y, x): i = y - h + half_h, j = x - w + half_w.
  const int64_t i = s.distribute ? a - qy + half_h : qy - a + half_h;
  const int64_t j = s.distribute ? b - qx + half_w : qx - b + half_w;
  if (i < 0 || i >= s.mask_h || j < 0 || j >= s.mask_w) return -1;
  const int64_t centre = s.distribute ? q : a * s.width + b;
  return (i * s.mask_w + j) * s.height * s.width + centre;
}

// out [N, H * W, H, W]: every element written. One task per (image, output channel).
template <class T, class ParallelFor>
void psa_mask(const T* input, T* out, const PsaMaskShape& s, ParallelFor&& parallel_for) {
  const int64_t pixels = s.height * s.width;
  parallel_for(s.batch * pixels, [&](int64_t task) {
    const int64_t n = task / pixels, q = task % pixels;
    const T* in = input + n * s.mask_h * s.mask_w * pixels;
    T* o = out + task * pixels;
    for (int64_t a = 0; a < s.height; ++a) {
      for (int64_t b = 0; b < s.width; ++b) {
        const int64_t from = psa_mask_source(s, q, a, b);
        o[a * s.width + b] = from < 0 ? T(0) : in[from];
      }
    }
  });
}

}  // namespace opbridge::kernels
