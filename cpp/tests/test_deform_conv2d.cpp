// deform_conv2d's kernel against a direct (per output element) evaluation, and
// its shape checks.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "kernels/deform_conv2d.h"
#include "kernels/deform_conv2d_backward.h"

namespace {

using opbridge::testing::expect;
using opbridge::testing::ThreadedFor;

// Direct evaluation of deformable convolution: one output element at a time.
double direct_bilinear(const std::vector<float>& x, int64_t plane, int64_t h, int64_t w, double y, double xx) {
  if (!(y > -1 && y < h && xx > -1 && xx < w)) return 0;
  const int64_t y0 = static_cast<int64_t>(std::floor(y)), x0 = static_cast<int64_t>(std::floor(xx));
  double value = 0;
  for (int64_t dy = 0; dy < 2; ++dy) {
    for (int64_t dx = 0; dx < 2; ++dx) {
      const int64_t yy = y0 + dy, xc = x0 + dx;
      if (yy < 0 || yy >= h || xc < 0 || xc >= w) continue;
      value += (dy ? y - y0 : 1 - (y - y0)) * (dx ? xx - x0 : 1 - (xx - x0)) * x[plane + yy * w + xc];
    }
  }
  return value;
}

// Regression (fuzzer, UBSan): huge pads were added before they were bounded.
void test_deform_conv2d_huge_attributes() {
  using namespace opbridge::kernels;
  const std::vector<int64_t> x{1, 2, 5, 5}, w{2, 2, 3, 3}, o{1, 18, 5, 5};
  for (const auto& pads : std::vector<std::vector<int64_t>>{
           {1, 0, INT64_MAX, 0}, {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX}, {0, INT64_MAX, 0, 1}}) {
    DeformConv2dAttributes attributes;
    attributes.pads = pads;
    DeformConv2dShape s;
    const Status status =
        check_deform_conv2d({"op", "x", "w", "offset", "mask", "bias"}, x, w, o, nullptr, nullptr, attributes, s);
    expect(status.message.find("too large") != std::string::npos, "huge pads are rejected: " + status.message);
  }
  DeformConv2dAttributes attributes;
  attributes.strides = {INT64_MAX, 1}, attributes.dilations = {INT64_MAX, INT64_MAX};
  DeformConv2dShape s;
  const Status status =
      check_deform_conv2d({"op", "x", "w", "offset", "mask", "bias"}, x, w, o, nullptr, nullptr, attributes, s);
  expect(!status.ok(), "huge dilations are rejected");
}

void test_deform_conv2d_direct() {
  using namespace opbridge::kernels;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(1, 3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t groups = small(rng), offset_groups = small(rng), batch = small(rng) - 1;
    DeformConv2dAttributes attributes;
    attributes.groups = groups, attributes.offset_groups = offset_groups;
    attributes.strides = {small(rng), small(rng)}, attributes.dilations = {small(rng), small(rng)};
    attributes.pads = {small(rng) - 1, small(rng) - 1, small(rng) - 1, small(rng) - 1};
    const int64_t in_channels = groups * offset_groups * small(rng), out_channels = groups * small(rng);
    const int64_t height = 2 + rng() % 9, width = 2 + rng() % 9, kh = small(rng), kw = small(rng);
    const int64_t out_h = (height + attributes.pads[0] + attributes.pads[2] - attributes.dilations[0] * (kh - 1) - 1);
    const int64_t out_w = (width + attributes.pads[1] + attributes.pads[3] - attributes.dilations[1] * (kw - 1) - 1);
    if (out_h < 0 || out_w < 0) continue;
    const int64_t oh = out_h / attributes.strides[0] + 1, ow = out_w / attributes.strides[1] + 1;
    const bool with_mask = trial % 2 == 0, with_bias = trial % 3 == 0;
    const std::vector<int64_t> x_shape{batch, in_channels, height, width},
        w_shape{out_channels, in_channels / groups, kh, kw}, o_shape{batch, 2 * offset_groups * kh * kw, oh, ow},
        m_shape{batch, offset_groups * kh * kw, oh, ow}, b_shape{out_channels};
    DeformConv2dShape s;
    const Status status =
        check_deform_conv2d({"op", "x", "w", "offset", "mask", "bias"}, x_shape, w_shape, o_shape,
                            with_mask ? &m_shape : nullptr, with_bias ? &b_shape : nullptr, attributes, s);
    expect(status.ok(), "valid deform_conv2d shapes are accepted: " + status.message);
    if (!status.ok()) continue;
    auto random = [&](const std::vector<int64_t>& shape, float scale) {
      int64_t n = 1;
      for (auto d : shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& e : v) e = scale * normal(rng);
      return v;
    };
    const auto x = random(x_shape, 1), w = random(w_shape, 1), offset = random(o_shape, 2.5f),
               mask = random(m_shape, 1), bias = random(b_shape, 1);
    std::vector<float> out(static_cast<size_t>(batch * out_channels * oh * ow), -1.0f);
    auto gemm = [](int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                   int64_t ldc) { gemm_reference(m, n, k, a, lda, b, ldb, c, ldc); };
    deform_conv2d(x.data(), w.data(), offset.data(), with_mask ? mask.data() : nullptr,
                  with_bias ? bias.data() : nullptr, out.data(), s, ThreadedFor{}, gemm);
    const int64_t taps = kh * kw, cin_g = in_channels / groups, cout_g = out_channels / groups;
    double worst = 0;
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t co = 0; co < out_channels; ++co) {
        for (int64_t y = 0; y < oh; ++y) {
          for (int64_t xo = 0; xo < ow; ++xo) {
            double sum = with_bias ? bias[co] : 0.0;
            const int64_t g = co / cout_g;
            for (int64_t ci = 0; ci < cin_g; ++ci) {
              const int64_t c = g * cin_g + ci, og = c / (in_channels / offset_groups);
              for (int64_t t = 0; t < taps; ++t) {
                const int64_t pixel = y * ow + xo, ki = t / kw, kj = t % kw;
                const int64_t o_base = ((n * offset_groups + og) * 2 * taps + 2 * t) * oh * ow;
                const double sy = y * attributes.strides[0] - attributes.pads[0] + ki * attributes.dilations[0] +
                                  offset[o_base + pixel];
                const double sx = xo * attributes.strides[1] - attributes.pads[1] + kj * attributes.dilations[1] +
                                  offset[o_base + oh * ow + pixel];
                double v = direct_bilinear(x, (n * in_channels + c) * height * width, height, width, sy, sx);
                if (with_mask) v *= mask[((n * offset_groups + og) * taps + t) * oh * ow + pixel];
                sum += w[(co * cin_g + ci) * taps + t] * v;
              }
            }
            worst = std::max(worst, std::abs(sum - out[((n * out_channels + co) * oh + y) * ow + xo]));
          }
        }
      }
    }
    expect(worst < 1e-4, "deform_conv2d matches the direct evaluation (trial " + std::to_string(trial) +
                             ", max error " + std::to_string(worst) + ")");
  }
}

// The backward against central differences of the forward (double): d sum(grad_out * out) / d every input.
void test_deform_conv2d_backward_finite_differences() {
  using namespace opbridge::kernels;
  std::mt19937 rng(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  DeformConv2dAttributes attributes;
  attributes.groups = 2, attributes.offset_groups = 2, attributes.strides = {1, 2}, attributes.pads = {1, 0, 1, 0};
  const std::vector<int64_t> x_shape{2, 4, 5, 6}, w_shape{4, 2, 2, 3}, o_shape{2, 24, 6, 2}, m_shape{2, 12, 6, 2},
      b_shape{4};
  DeformConv2dShape s;
  const Status status = check_deform_conv2d({"op", "x", "w", "offset", "mask", "bias"}, x_shape, w_shape, o_shape,
                                            &m_shape, &b_shape, attributes, s);
  expect(status.ok(), "backward test shapes: " + status.message);
  if (!status.ok()) return;
  auto random = [&](int64_t n, double scale) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& e : v) e = scale * normal(rng);
    return v;
  };
  std::vector<double> x = random(2 * 4 * 5 * 6, 1), w = random(4 * 2 * 2 * 3, 1), offset = random(2 * 24 * 12, 1.5),
                      mask = random(2 * 12 * 12, 1), bias = random(4, 1);
  const int64_t out_numel = 2 * 4 * 6 * 2;
  const std::vector<double> grad_out = random(out_numel, 1);
  auto gemm = [](int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
                 int64_t ldc) { gemm_reference(m, n, k, a, lda, b, ldb, c, ldc); };
  auto loss = [&] {
    std::vector<double> out(static_cast<size_t>(out_numel));
    deform_conv2d(x.data(), w.data(), offset.data(), mask.data(), bias.data(), out.data(), s, ThreadedFor{}, gemm);
    double sum = 0;
    for (int64_t i = 0; i < out_numel; ++i) sum += grad_out[i] * out[i];
    return sum;
  };
  std::vector<double> gx(x.size()), gw(w.size()), go(offset.size()), gm(mask.size()), gb(bias.size());
  DeformConv2dGrads<double> grads{gx.data(), go.data(), gm.data(), gw.data(), gb.data()};
  deform_conv2d_backward(x.data(), w.data(), offset.data(), mask.data(), grad_out.data(), s, grads, ThreadedFor{},
                         gemm);
  double worst = 0;
  for (auto [values, analytic] : {std::pair{&x, &gx}, {&w, &gw}, {&offset, &go}, {&mask, &gm}, {&bias, &gb}}) {
    for (size_t i = 0; i < values->size(); i += 3) {
      const double keep = (*values)[i], eps = 1e-6;
      (*values)[i] = keep + eps;
      const double up = loss();
      (*values)[i] = keep - eps;
      const double down = loss();
      (*values)[i] = keep;
      worst = std::max(worst, std::abs((up - down) / (2 * eps) - (*analytic)[i]));
    }
  }
  expect(worst < 1e-5, "deform_conv2d backward matches finite differences (max error " + std::to_string(worst) + ")");
  // Same bits on a second run: the backward is deterministic.
  std::vector<double> gx2(x.size()), gw2(w.size()), go2(offset.size()), gm2(mask.size()), gb2(bias.size());
  DeformConv2dGrads<double> again{gx2.data(), go2.data(), gm2.data(), gw2.data(), gb2.data()};
  deform_conv2d_backward(x.data(), w.data(), offset.data(), mask.data(), grad_out.data(), s, again, ThreadedFor{},
                         gemm);
  expect(gx == gx2 && gw == gw2 && go == go2 && gm == gm2 && gb == gb2, "deform_conv2d backward is deterministic");
}

// The bfloat16 columns' blend (16 channels a vector) gives, channel by channel, the float blend rounded to nearest
// even (bf16_bits): every length around the vector width, with and without the mask's scale, on values whose sums
// fall on ties, round past the largest finite bfloat16 to infinity, are infinite or zero (channels 0-15 and from
// 32 on: vectors the AVX512-BF16 path rounds by vcvtneps2bf16), and NaN or subnormal (channels 16-31: the vector
// it rounds lane by lane instead).
void test_blend4_bfloat16_rounds_the_float_blend() {
  using opbridge::kernels::BFloat16;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-2, 2);
  const float plain[] = {1.00390625f,    // 1 + 2^-8: a tie, to the even 1
                         1.01171875f,    // 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6
                         3.4028235e38f,  // the largest float: to infinity
                         3.3895314e38f,  // the largest finite bfloat16
                         INFINITY,      -INFINITY, -0.0f, -1.01171875f};
  const float fallback[] = {std::nanf(""),  1e-40f, -1e-40f, 1.1754942e-38f /* largest subnormal */,
                            -std::nanf(""), 1.0f,   1e-45f,  2.0f};
  for (const int64_t n : {1, 15, 16, 17, 31, 32, 33, 64, 70}) {
    std::vector<float> rows[4];
    for (auto& row : rows) {
      row.resize(static_cast<size_t>(n));
      for (auto& v : row) v = uniform(rng);
    }
    // Every row the same special value: the weights sum to 1 and scale by powers of two, so the blend is that value
    // (times the scale) where the sums are exact, ties included.
    for (int64_t c = 0; c < n; c += 2) {
      const float value = c >= 16 && c < 32 ? fallback[(c / 2) % 8] : plain[(c / 2) % 8];
      for (auto& row : rows) row[static_cast<size_t>(c)] = value;
    }
    for (const bool scaled : {false, true}) {
      const float w[4] = {0.25f, 0.5f, 0.125f, 0.125f}, scale = scaled ? 0.5f : 1.0f;
      // Each implementation this build has (the AVX512-BF16 one where the CPU has the instructions), and blend4's
      // choice.
      using Blend = void (*)(BFloat16*, const float*, const float*, const float*, const float*, float, float, float,
                             float, bool, float, int64_t);
      std::vector<std::pair<const char*, Blend>> paths{{"blend4", static_cast<Blend>(&opbridge::kernels::blend4)},
                                                       {"vectors", &opbridge::kernels::blend4_bf16_vectors}};
      // The one-call-per-tap forms im2col runs, for one pixel (rows and weights as arrays).
      paths.emplace_back("vectors, per tap",
                         [](BFloat16* out, const float* r0, const float* r1, const float* r2, const float* r3, float w0,
                            float w1, float w2, float w3, bool scaled, float scale, int64_t n) {
                           const float* rows[4] = {r0, r1, r2, r3};
                           opbridge::kernels::blend4_bf16_vectors_pixels(out, 0, rows, 0, &w0, &w1, &w2, &w3,
                                                                         scaled ? &scale : nullptr, 1, n);
                         });
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
      if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512dq")) {
        paths.emplace_back("instructions", &opbridge::kernels::blend4_bf16_instructions);
        paths.emplace_back("instructions, per tap",
                           [](BFloat16* out, const float* r0, const float* r1, const float* r2, const float* r3,
                              float w0, float w1, float w2, float w3, bool scaled, float scale, int64_t n) {
                             const float* rows[4] = {r0, r1, r2, r3};
                             opbridge::kernels::blend4_bf16_instructions_pixels(out, 0, rows, 0, &w0, &w1, &w2, &w3,
                                                                                scaled ? &scale : nullptr, 1, n);
                           });
      }
#endif
      for (const auto& [name, blend] : paths) {
        std::vector<BFloat16> out(static_cast<size_t>(n));
        blend(out.data(), rows[0].data(), rows[1].data(), rows[2].data(), rows[3].data(), w[0], w[1], w[2], w[3],
              scaled, scale, n);
        bool same = true;
        for (int64_t c = 0; c < n; ++c) {
          const auto k = static_cast<size_t>(c);
          float v = w[0] * rows[0][k] + w[1] * rows[1][k] + w[2] * rows[2][k] + w[3] * rows[3][k];
          if (scaled) v = v * scale;
          same = same && out[k].bits == opbridge::kernels::bf16_bits(v);
        }
        expect(same, std::string(name) + " into bfloat16 rounds the float blend to nearest even, n = " +
                         std::to_string(n) + (scaled ? ", scaled" : ""));
      }
    }
  }
}

// deformable_im2col_block (positions in vectors across 16-pixel chunks) against deformable_im2col_block_scalar (one
// pixel and tap at a time), bit for bit, into float, double and bfloat16 columns: groups and offset groups, strides,
// padding and dilation, blocks that start and end inside a chunk and an output row, and offsets that put samples
// on cell edges, on -1 and the image's far edge exactly, just inside and outside them, far outside, at +-inf and NaN.
template <class T, class C>
void im2col_vectors_match_the_scalar_loop(const char* what) {
  using namespace opbridge::kernels;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(1, 3), size(1, 9), coin(0, 1);
  std::normal_distribution<T> normal(T(0), T(2));
  const T specials[] = {T(-1),  T(0),    T(1),        T(-0.5),      T(3),   T(-1) + T(1e-6), T(-1) - T(1e-6),
                        T(100), -T(100), T(INFINITY), -T(INFINITY), T(NAN), T(2.5),          T(-2)};
  int checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    DeformConv2dShape s;
    s.groups = small(rng), s.offset_groups = small(rng);
    s.in_channels = s.groups * s.offset_groups * small(rng) * (coin(rng) ? 1 : 7);
    s.height = size(rng), s.width = size(rng), s.kernel_h = small(rng), s.kernel_w = small(rng);
    s.stride_h = small(rng) % 2 + 1, s.stride_w = small(rng) % 2 + 1;
    s.dilation_h = small(rng) % 2 + 1, s.dilation_w = small(rng) % 2 + 1;
    s.pad_top = small(rng) - 1, s.pad_left = small(rng) - 1, s.pad_bottom = small(rng) - 1, s.pad_right = 0;
    const int64_t span_h = s.height + s.pad_top + s.pad_bottom - (s.dilation_h * (s.kernel_h - 1) + 1);
    const int64_t span_w = s.width + s.pad_left + s.pad_right - (s.dilation_w * (s.kernel_w - 1) + 1);
    if (span_h < 0 || span_w < 0) continue;
    s.out_h = span_h / s.stride_h + 1, s.out_w = span_w / s.stride_w + 1;
    s.has_mask = coin(rng) != 0;
    const int64_t taps = s.kernel_h * s.kernel_w, pixels = s.out_h * s.out_w, ld = s.in_channels * taps;
    std::vector<T> input(static_cast<size_t>(s.height * s.width * s.in_channels)), zeros(s.in_channels, T(0));
    for (auto& v : input) v = normal(rng);
    std::vector<T> offset(static_cast<size_t>(2 * s.offset_groups * taps * pixels));
    std::uniform_int_distribution<size_t> pick(0, std::size(specials) - 1);
    for (auto& v : offset) v = coin(rng) ? specials[pick(rng)] : normal(rng);
    std::vector<T> mask(static_cast<size_t>(s.offset_groups * taps * pixels));
    for (auto& v : mask) v = normal(rng);
    const int64_t first = std::uniform_int_distribution<int64_t>(0, pixels - 1)(rng);
    const int64_t count = std::uniform_int_distribution<int64_t>(1, pixels - first)(rng);
    std::vector<C> vectors(static_cast<size_t>(count * ld)), scalar(vectors.size());
    const T* m = s.has_mask ? mask.data() : nullptr;
    deformable_im2col_block(input.data(), zeros.data(), offset.data(), m, s, first, count, vectors.data(), ld);
    deformable_im2col_block_scalar(input.data(), zeros.data(), offset.data(), m, s, first, count, scalar.data(), ld);
    expect(std::memcmp(vectors.data(), scalar.data(), sizeof(C) * vectors.size()) == 0,
           std::string(what) + ": im2col in vectors gives the scalar loop's bits, trial " + std::to_string(trial));
    ++checked;
  }
  expect(checked > 100, std::string(what) + ": enough im2col shapes were valid");
}

// transpose_floats against the definition, for sizes around its 4 x 4 tiles and strides past the sizes (the gaps
// between destination rows untouched).
void test_transpose_floats() {
  for (const int64_t rows : {1, 3, 4, 5, 8, 17, 64}) {
    for (const int64_t cols : {1, 3, 4, 7, 32}) {
      const int64_t from_row = cols + 3, to_row = rows + 5;
      std::vector<float> from(static_cast<size_t>(rows * from_row)), to(static_cast<size_t>(cols * to_row), -1.0f);
      for (size_t k = 0; k < from.size(); ++k) from[k] = static_cast<float>(k) * 0.5f + 1.0f;
      opbridge::kernels::transpose_floats(from.data(), from_row, to.data(), to_row, rows, cols);
      bool same = true, untouched = true;
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < rows; ++i) same = same && to[j * to_row + i] == from[i * from_row + j];
        for (int64_t i = rows; i < to_row; ++i) untouched = untouched && to[j * to_row + i] == -1.0f;
      }
      expect(same && untouched, "transpose_floats " + std::to_string(rows) + " x " + std::to_string(cols));
    }
  }
}

// Coordinates past 32 bits (a stride and bottom padding of 2^32 + 1, which the shape check accepts): the guard sends
// them to the scalar loop. Cut to 32 bits, the second output row's position 2^32 + 1 would wrap to row 1 of the
// image and read it, where it lies far below the image and reads zeros.
void test_im2col_huge_coordinates_take_the_scalar_loop() {
  using namespace opbridge::kernels;
  const int64_t big = (int64_t(1) << 32) + 1;
  DeformConv2dAttributes attributes;
  attributes.pads = {0, 1, big, 1}, attributes.strides = {big, 1};
  DeformConv2dShape s;
  const Status status = check_deform_conv2d({"op", "x", "w", "offset", "mask", "bias"}, {1, 2, 5, 5}, {2, 2, 3, 3},
                                            {1, 18, 2, 5}, nullptr, nullptr, attributes, s);
  expect(status.ok() && s.out_h == 2, "a 2^32 + 1 padding and stride pass the shape check: " + status.message);
  if (!status.ok()) return;
  expect(!deform_conv2d_coordinates_fit_int32(s), "2^32 coordinates do not fit in 32 bits");
  DeformConv2dShape small = s;
  small.pad_bottom = 1, small.stride_h = 1;
  expect(deform_conv2d_coordinates_fit_int32(small), "a 5 x 5 image's coordinates fit in 32 bits");
  const int64_t taps = 9, pixels = s.out_h * s.out_w, ld = s.in_channels * taps;
  std::vector<float> input(static_cast<size_t>(25 * s.in_channels)), zeros(s.in_channels, 0.0f);
  for (size_t k = 0; k < input.size(); ++k) input[k] = 1.0f + static_cast<float>(k);
  std::vector<float> offset(static_cast<size_t>(2 * taps * pixels));
  for (size_t k = 0; k < offset.size(); ++k) offset[k] = 0.25f * static_cast<float>(k % 7) - 0.5f;
  std::vector<float> vectors(static_cast<size_t>(pixels * ld), -1.0f), scalar(vectors.size(), -2.0f);
  deformable_im2col_block(input.data(), zeros.data(), offset.data(), static_cast<const float*>(nullptr), s, 0, pixels,
                          vectors.data(), ld);
  deformable_im2col_block_scalar(input.data(), zeros.data(), offset.data(), static_cast<const float*>(nullptr), s, 0,
                                 pixels, scalar.data(), ld);
  expect(std::memcmp(vectors.data(), scalar.data(), sizeof(float) * vectors.size()) == 0,
         "im2col with 2^32 coordinates gives the scalar loop's values");
  // The first output row samples the image; the second, far below it, reads zeros only.
  bool sampled = false, below = true;
  for (int64_t q = 0; q < pixels; ++q) {
    for (int64_t d = 0; d < ld; ++d) {
      const float v = scalar[static_cast<size_t>(q * ld + d)];
      if (q < s.out_w) sampled = sampled || v != 0.0f;
      if (q >= s.out_w) below = below && v == 0.0f;
    }
  }
  expect(sampled && below, "im2col with 2^32 coordinates: the first row sampled, the second all zeros");
}

}  // namespace

int main() {
  test_im2col_huge_coordinates_take_the_scalar_loop();
  test_transpose_floats();
  im2col_vectors_match_the_scalar_loop<float, float>("float");
  im2col_vectors_match_the_scalar_loop<double, double>("double");
  im2col_vectors_match_the_scalar_loop<float, opbridge::kernels::BFloat16>("bfloat16 columns");
  test_blend4_bfloat16_rounds_the_float_blend();
  test_deform_conv2d_huge_attributes();
  test_deform_conv2d_direct();
  test_deform_conv2d_backward_finite_differences();
  return opbridge::testing::report("deform_conv2d kernel tests");
}
