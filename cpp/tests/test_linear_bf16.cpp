// kernels/linear_bf16.h: the bfloat16 GEMM of the ORT library's bfloat16 deformable convolutions, against a float64
// evaluation (within float32 sums and one rounding) and, on CPUs with AVX512-BF16, the instruction path against the
// portable loop bit for bit (normal values: the instruction flushes only subnormals).
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/linear_bf16.h"

namespace {

using opbridge::testing::expect;

uint16_t bf16_of(std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  return opbridge::kernels::bf16_bits(normal(rng));
}

void test_linear_bf16_shapes() {
  using namespace opbridge::kernels;
  std::mt19937 rng(11);
  // (n, m, k): tiles of 12 rows and pairs of 16-output panels, with tails of each; odd k; k zero; bias or none.
  const int64_t shapes[][3] = {{1, 1, 1},   {12, 32, 2},   {13, 33, 3}, {25, 64, 576}, {7, 20, 27},
                               {40, 17, 9}, {3, 100, 145}, {24, 16, 0}, {5, 48, 1},    {30, 31, 64}};
  for (const auto& shape : shapes) {
    for (const bool with_bias : {false, true}) {
      const int64_t n = shape[0], m = shape[1], k = shape[2], lda = k + 3, ldb = k + 1;
      std::vector<uint16_t> a(static_cast<size_t>(n * lda + 1)), b(static_cast<size_t>(m * ldb + 1)), bias(m);
      for (auto& v : a) v = bf16_of(rng, 1.0f);
      for (auto& v : b) v = bf16_of(rng, 0.1f);
      for (auto& v : bias) v = bf16_of(rng, 1.0f);
      // Output channel-major with a gap after each row (c_col = n + 2), as deform_conv2d's output rows are.
      const int64_t c_col = n + 2;
      std::vector<uint16_t> fast(static_cast<size_t>(m * c_col), 0x7fc1), portable(fast);
      const uint16_t* bias_or_null = with_bias ? bias.data() : nullptr;
      linear_bf16(n, m, k, a.data(), lda, b.data(), ldb, bias_or_null, fast.data(), 1, c_col);
      linear_bf16(n, m, k, a.data(), lda, b.data(), ldb, bias_or_null, portable.data(), 1, c_col, true);
      const std::string name = "linear_bf16 " + std::to_string(n) + "x" + std::to_string(m) + "x" + std::to_string(k) +
                               (with_bias ? " bias" : "");
      expect(fast == portable, name + ": the instruction path gives the portable loop's bits (gaps untouched)");
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) {
          double exact = with_bias ? bf16_value(bias[j]) : 0.0, magnitude = std::fabs(exact);
          for (int64_t p = 0; p < k; ++p) {
            const double product = double(bf16_value(a[i * lda + p])) * bf16_value(b[j * ldb + p]);
            exact += product, magnitude += std::fabs(product);
          }
          const double got = bf16_value(portable[j * c_col + i]);
          // One bfloat16 rounding (2^-8 relative) plus float32 sums (k + 1 additions of 2^-24 each).
          const double bound = std::ldexp(std::fabs(exact), -8) + (k + 2) * std::ldexp(magnitude, -24) * 1.01;
          if (!(std::fabs(got - exact) <= bound)) {
            expect(false, name + ": output " + std::to_string(i) + "," + std::to_string(j) + " is " +
                              std::to_string(got) + ", float64 " + std::to_string(exact));
            return;
          }
        }
      }
      for (int64_t j = 0; j < m; ++j) {
        expect(portable[j * c_col + n] == 0x7fc1 && portable[j * c_col + n + 1] == 0x7fc1, name + ": gap written");
      }
    }
  }
}

void test_linear_bf16_special_values() {
  using namespace opbridge::kernels;
  // NaN and infinity propagate (a NaN sum stays NaN after rounding); a zero k gives the bias.
  const uint16_t one = bf16_bits(1.0f), nan = 0x7fc0, inf = 0x7f80;
  const std::vector<uint16_t> a{one, nan, one, one, inf, one}, b{one, one, one};
  std::vector<uint16_t> c(2, 0);
  linear_bf16(2, 1, 3, a.data(), 3, b.data(), 3, nullptr, c.data(), 1, 1);
  expect(std::isnan(bf16_value(c[0])), "a NaN input gives NaN");
  expect(std::isinf(bf16_value(c[1])) && bf16_value(c[1]) > 0, "an infinite input gives infinity");
  const uint16_t bias = bf16_bits(2.5f);
  linear_bf16(1, 1, 0, a.data(), 0, b.data(), 0, &bias, c.data(), 1, 1);
  expect(c[0] == bias, "k = 0: the bias");
}

}  // namespace

int main() {
  test_linear_bf16_shapes();
  test_linear_bf16_special_values();
  return opbridge::testing::report(opbridge::kernels::linear_bf16_has_instructions()
                                       ? "linear_bf16 kernel tests (AVX512-BF16 and portable)"
                                       : "linear_bf16 kernel tests (portable only: no AVX512-BF16 here)");
}
