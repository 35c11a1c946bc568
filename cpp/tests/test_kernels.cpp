// Kernel tests without torch or ORT: my_add against a naive broadcasting loop
// over random shapes, the shape checks' messages, and deform_conv2d against a
// direct (per output element) evaluation.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/deform_conv2d.h"
#include "kernels/my_add.h"

namespace {

int failures = 0;

void expect(bool condition, const std::string& what) {
  if (!condition) {
    ++failures;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

// Naive reference: for every output index, map to each input's index.
std::vector<double> reference(const std::vector<double>& a, const std::vector<int64_t>& a_shape,
                              const std::vector<double>& b, const std::vector<int64_t>& b_shape,
                              const std::vector<int64_t>& out_shape) {
  int64_t numel = 1;
  for (auto d : out_shape) numel *= d;
  std::vector<double> out(static_cast<size_t>(numel));
  const auto a_strides = opbridge::kernels::broadcast_strides(a_shape, out_shape);
  const auto b_strides = opbridge::kernels::broadcast_strides(b_shape, out_shape);
  for (int64_t i = 0; i < numel; ++i) {
    int64_t rest = i, a_index = 0, b_index = 0;
    for (int64_t d = static_cast<int64_t>(out_shape.size()) - 1; d >= 0; --d) {
      const int64_t coordinate = rest % out_shape[d];
      rest /= out_shape[d];
      a_index += coordinate * a_strides[d];
      b_index += coordinate * b_strides[d];
    }
    out[i] = 2 * a[a_index] + b[b_index];
  }
  return out;
}

// A parallel_for that really uses threads, to exercise chunk boundaries.
struct ThreadedFor {
  template <class Task>
  void operator()(int64_t tasks, const Task& task) const {
    std::vector<std::thread> threads;
    for (int w = 0; w < 3; ++w) {
      threads.emplace_back([&, w] {
        for (int64_t t = w; t < tasks; t += 3) task(t);
      });
    }
    for (auto& thread : threads) thread.join();
  }
};

void test_random_broadcasts() {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> rank_dist(0, 5), size_dist(0, 6), coin(0, 3);
  std::normal_distribution<double> value(0.0, 1.0);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> out_shape(rank_dist(rng));
    for (auto& d : out_shape) d = size_dist(rng) == 0 ? 1 : size_dist(rng);
    // Now and then a long last row, so that rows span several parallel chunks.
    if (trial % 50 == 0) out_shape = {3, 2, opbridge::kernels::kMyAddChunk + 7};
    // Each input: a suffix of the output shape with some dimensions set to 1.
    auto make_input = [&] {
      std::vector<int64_t> shape(out_shape.begin() + (out_shape.empty() ? 0 : coin(rng) % (out_shape.size() + 1)),
                                 out_shape.end());
      for (auto& d : shape)
        if (coin(rng) == 0) d = 1;
      return shape;
    };
    const auto a_shape = make_input(), b_shape = make_input();
    std::vector<int64_t> shape;
    const auto status = opbridge::kernels::broadcast_shapes("t", "a", a_shape, "b", b_shape, shape);
    expect(status.ok(), "broadcast of compatible shapes: " + status.message);
    int64_t a_numel = 0, b_numel = 0, numel = 0;
    opbridge::kernels::checked_numel(a_shape, a_numel);
    opbridge::kernels::checked_numel(b_shape, b_numel);
    opbridge::kernels::checked_numel(shape, numel);
    std::vector<double> a(a_numel), b(b_numel), out(numel, -1.0);
    for (auto& x : a) x = value(rng);
    for (auto& x : b) x = value(rng);
    const auto loop = opbridge::kernels::make_binary_loop(shape, opbridge::kernels::broadcast_strides(a_shape, shape),
                                                          opbridge::kernels::broadcast_strides(b_shape, shape));
    opbridge::kernels::my_add(a.data(), b.data(), out.data(), loop, ThreadedFor{});
    const auto expected = reference(a, a_shape, b, b_shape, shape);
    bool same = true;
    for (int64_t i = 0; i < numel; ++i) same = same && out[i] == expected[i];
    expect(same, "my_add " + opbridge::kernels::shape_to_string(a_shape) + " + " +
                     opbridge::kernels::shape_to_string(b_shape));
  }
}

void test_errors() {
  std::vector<int64_t> shape;
  auto status = opbridge::kernels::broadcast_shapes("opbridge::MyAdd", "input A", {2, 3}, "input B", {4}, shape);
  expect(!status.ok(), "[2, 3] and [4] must not broadcast");
  expect(status.message.find("input A of shape [2, 3] and input B of shape [4]") != std::string::npos,
         "message names inputs and shapes: " + status.message);
  status = opbridge::kernels::broadcast_shapes("op", "a", {int64_t(1) << 40, int64_t(1) << 40}, "b", {1}, shape);
  expect(!status.ok() && status.message.find("too many elements") != std::string::npos, "overflow is reported");
}

#ifdef OPBRIDGE_HAS_FLOAT16
void test_float16_rounds_once() {
  using opbridge::kernels::float16;
  // 2 * 1000 + 0.5 = 2000.5 rounds to 2000 in half precision (spacing 1 at 2048 > x >= 1024).
  const float16 a[] = {float16(1000.0f)}, b[] = {float16(0.5f)};
  float16 out[1];
  const auto loop = opbridge::kernels::make_binary_loop({1}, {0}, {0});
  opbridge::kernels::my_add(a, b, out, loop, ThreadedFor{});
  expect(static_cast<float>(out[0]) == 2000.0f, "float16 result");
}
#endif

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

}  // namespace

int main() {
  test_random_broadcasts();
  test_errors();
  test_deform_conv2d_huge_attributes();
  test_deform_conv2d_direct();
#ifdef OPBRIDGE_HAS_FLOAT16
  test_float16_rounds_once();
#endif
  std::printf("%s\n", failures == 0 ? "kernel tests passed" : "kernel tests FAILED");
  return failures == 0 ? 0 : 1;
}
